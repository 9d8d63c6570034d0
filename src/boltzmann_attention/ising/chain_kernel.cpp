// Method chain's compiled CPU kernel (option kernel="cpp"): the recursion of chain.py for every query in one
// call, in scaled probabilities carried in float64 (the weights and gradients in the input's dtype), with a
// hand-written backward. Built on first use by _chain_kernel.py.
//
// The chain: local (Q, n, S), S = 2^w, the field on spin p in each state x before it (x's bits: the w previous
// spins, the newest the leading bit). A step from state x with spin s goes to x' = (s = +1 ? S/2 : 0) | (x >> 1)
// with weight exp(s local[p, x]). Input: those weights relative to the step's largest, plus = exp(local - top)
// and minus = exp(-local - top) with top[p] = max_x |local[p, x]|, so that nothing overflows; lengths (Q,): each
// chain's spins, the rest ignored.
//
// Forward: a[p] (state before spin p) and b[p + 1] (state after spin p), each normalised to sum 1, with the
// normalisers kept.
// m_p = <s_p>; log Z includes the S virtual start states of weight 1 (as chain.py's recursion).
//
// Backward (the gradient of sum_p g_p m_p + g_Z log Z with respect to local[p, x]): d log Z / d local[p, x] =
// mu_p(x) = <s_p [x_p = x]>, and d <G> / d local[p, x] = <G s_p [x_p = x]> - <G> mu_p(x) for G = sum_q g_q s_q.
// <G s_p [x_p = x]> comes from the expectation semiring: A[p] (x) carries the forward weight times the sum of
// g_q s_q over the spins before p, B[p + 1] the backward weight times that sum over the spins after p, both
// scaled by a's and b's normalisers.

#include <torch/extension.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <typename scalar_t>
void forward_chains(const scalar_t* pp, const scalar_t* np, const scalar_t* tp, const int64_t* Lp, int64_t Q,
                    int64_t n, int64_t S, double* mp, double* zp, double* ap, double* bp, double* zap,
                    double* zbp) {
    const int64_t half = S / 2;
    at::parallel_for(0, Q, 1, [&](int64_t begin, int64_t end) {
        for (int64_t q = begin; q < end; ++q) {
            const int64_t len = Lp[q];
            double *aq = ap + q * (n + 1) * S, *bq = bp + q * (n + 1) * S;
            double logc = std::log(static_cast<double>(S));
            std::fill(aq, aq + S, 1.0 / S);
            for (int64_t p = 0; p < len; ++p) {
                const scalar_t *up = pp + (q * n + p) * S, *down = np + (q * n + p) * S;
                const double* cur = aq + p * S;
                double* next = aq + (p + 1) * S;
                std::fill(next, next + S, 0.0);
                for (int64_t x = 0; x < S; ++x) {
                    next[half | (x >> 1)] += cur[x] * up[x];
                    next[x >> 1] += cur[x] * down[x];
                }
                double z = 0.0;
                for (int64_t x = 0; x < S; ++x) z += next[x];
                for (int64_t x = 0; x < S; ++x) next[x] /= z;
                zap[q * n + p] = z;
                logc += std::log(z) + tp[q * n + p];
            }
            zp[q] = logc;
            std::fill(bq + len * S, bq + (len + 1) * S, 1.0 / S);
            for (int64_t p = len - 1; p >= 0; --p) {
                const scalar_t *ep = pp + (q * n + p) * S, *em = np + (q * n + p) * S;
                const double *after = bq + (p + 1) * S, *cur = aq + p * S;
                double* before = bq + p * S;
                double z = 0.0, num = 0.0;
                for (int64_t x = 0; x < S; ++x) {
                    const double up = ep[x] * after[half | (x >> 1)], down = em[x] * after[x >> 1];
                    before[x] = up + down;
                    z += up + down;
                    num += cur[x] * (up - down);
                }
                double den = 0.0;
                for (int64_t x = 0; x < S; ++x) den += cur[x] * before[x];
                for (int64_t x = 0; x < S; ++x) before[x] /= z;
                zbp[q * n + p] = z;
                mp[q * n + p] = num / den;
            }
            std::fill(mp + q * n + len, mp + (q + 1) * n, 0.0);
        }
    });
}

template <typename scalar_t>
void backward_chains(const scalar_t* pp, const scalar_t* np, const int64_t* Lp, int64_t Q, int64_t n, int64_t S,
                     const double* mp, const double* ap, const double* bp, const double* zap, const double* zbp,
                     const scalar_t* gmp, const scalar_t* gzp, scalar_t* gp) {
    const int64_t half = S / 2;
    at::parallel_for(0, Q, 1, [&](int64_t begin, int64_t end) {
        std::vector<double> A((n + 1) * S), B(S), Bnext(S);
        for (int64_t q = begin; q < end; ++q) {
            const int64_t len = Lp[q];
            const double *aq = ap + q * (n + 1) * S, *bq = bp + q * (n + 1) * S;
            const scalar_t* g = gmp + q * n;
            double mean = 0.0;  // <G>
            for (int64_t p = 0; p < len; ++p) mean += g[p] * mp[q * n + p];
            std::fill(A.begin(), A.begin() + S, 0.0);
            for (int64_t p = 0; p < len; ++p) {  // A[p + 1] from A[p], scaled as a
                const scalar_t *up = pp + (q * n + p) * S, *down = np + (q * n + p) * S;
                const double *cur = A.data() + p * S, *ac = aq + p * S;
                double* next = A.data() + (p + 1) * S;
                std::fill(next, next + S, 0.0);
                for (int64_t x = 0; x < S; ++x) {
                    next[half | (x >> 1)] += (cur[x] + ac[x] * g[p]) * up[x];
                    next[x >> 1] += (cur[x] - ac[x] * g[p]) * down[x];
                }
                for (int64_t x = 0; x < S; ++x) next[x] /= zap[q * n + p];
            }
            std::fill(B.begin(), B.end(), 0.0);  // B[len]
            for (int64_t p = len - 1; p >= 0; --p) {
                const scalar_t *ep = pp + (q * n + p) * S, *em = np + (q * n + p) * S;
                const double *ac = aq + p * S, *Ac = A.data() + p * S, *after = bq + (p + 1) * S;
                double norm = 0.0;
                for (int64_t x = 0; x < S; ++x)
                    norm += ac[x] * (ep[x] * after[half | (x >> 1)] + em[x] * after[x >> 1]);
                scalar_t* out = gp + (q * n + p) * S;
                for (int64_t x = 0; x < S; ++x) {
                    const int64_t xp = half | (x >> 1), xm = x >> 1;
                    const double up = ep[x], down = em[x];
                    const double mu = ac[x] * (up * after[xp] - down * after[xm]) / norm;
                    const double joint = (up * (Ac[x] * after[xp] + ac[x] * g[p] * after[xp] + ac[x] * B[xp]) -
                                          down * (Ac[x] * after[xm] - ac[x] * g[p] * after[xm] + ac[x] * B[xm])) /
                                         norm;
                    out[x] = static_cast<scalar_t>(joint - mean * mu + gzp[q] * mu);
                    Bnext[x] = (up * (B[xp] + g[p] * after[xp]) + down * (B[xm] - g[p] * after[xm])) /
                               zbp[q * n + p];
                }
                std::swap(B, Bnext);
            }
            std::fill(gp + (q * n + len) * S, gp + (q + 1) * n * S, scalar_t(0));
        }
    });
}

void check(const torch::Tensor& t, const torch::Tensor& like, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == like.scalar_type(), name,
                ": a contiguous CPU tensor of plus's dtype");
}

}  // namespace

std::vector<torch::Tensor> chain_forward(torch::Tensor plus, torch::Tensor minus, torch::Tensor top,
                                         torch::Tensor lengths) {
    TORCH_CHECK(plus.dim() == 3 && plus.size(2) >= 2, "plus: (Q, n, S) with S = 2^w >= 2");
    check(plus, plus, "plus");
    check(minus, plus, "minus");
    check(top, plus, "top");
    const int64_t Q = plus.size(0), n = plus.size(1), S = plus.size(2);
    auto opts = plus.options().dtype(torch::kFloat64);
    auto m = torch::empty({Q, n}, opts), logz = torch::empty({Q}, opts);
    auto a = torch::empty({Q, n + 1, S}, opts), b = torch::empty({Q, n + 1, S}, opts);
    auto za = torch::empty({Q, n}, opts), zb = torch::empty({Q, n}, opts);
    auto L = lengths.to(torch::kInt64).contiguous();
    AT_DISPATCH_FLOATING_TYPES(plus.scalar_type(), "chain_forward", [&] {
        forward_chains<scalar_t>(plus.data_ptr<scalar_t>(), minus.data_ptr<scalar_t>(), top.data_ptr<scalar_t>(),
                                 L.data_ptr<int64_t>(), Q, n, S, m.data_ptr<double>(), logz.data_ptr<double>(),
                                 a.data_ptr<double>(), b.data_ptr<double>(), za.data_ptr<double>(),
                                 zb.data_ptr<double>());
    });
    return {m, logz, a, b, za, zb};
}

torch::Tensor chain_backward(torch::Tensor plus, torch::Tensor minus, torch::Tensor lengths, torch::Tensor m,
                             torch::Tensor a, torch::Tensor b, torch::Tensor za, torch::Tensor zb, torch::Tensor gm,
                             torch::Tensor gz) {
    const int64_t Q = plus.size(0), n = plus.size(1), S = plus.size(2);
    gm = gm.to(plus.scalar_type()).contiguous();
    gz = gz.to(plus.scalar_type()).contiguous();
    auto grad = torch::empty_like(plus);
    auto L = lengths.to(torch::kInt64).contiguous();
    AT_DISPATCH_FLOATING_TYPES(plus.scalar_type(), "chain_backward", [&] {
        backward_chains<scalar_t>(plus.data_ptr<scalar_t>(), minus.data_ptr<scalar_t>(), L.data_ptr<int64_t>(), Q,
                                  n, S, m.data_ptr<double>(), a.data_ptr<double>(), b.data_ptr<double>(),
                                  za.data_ptr<double>(), zb.data_ptr<double>(), gm.data_ptr<scalar_t>(),
                                  gz.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>());
    });
    return grad;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    module.def("forward", &chain_forward, "method chain: marginals, log Z and the saved sweeps");
    module.def("backward", &chain_backward, "method chain: the gradient with respect to the local fields");
}
