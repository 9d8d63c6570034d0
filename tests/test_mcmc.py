"""Gibbs and parallel tempering (ising.mcmc) and the sampled-gradient layer (ising._sampling).

Statistical bounds. Every comparison with an exact value uses a standard error computed from the samples
themselves, never a tuned tolerance:

* MCMC samples are autocorrelated, so the error of a mean is estimated from C independent chains: the
  estimate is the mean of the C per-chain means, SE = std(chain means) / sqrt(C), valid whatever the
  autocorrelation time (each chain runs >= 500 sweeps after warm-up, so its mean is close to normal).
  The threshold is the two-sided Student-t quantile (C - 1 dof) at a family-wise level ALPHA = 1e-3,
  Bonferroni-corrected over all compared entries: a correct sampler fails with probability <= 1e-3.
* Where samples are exactly independent (J = 0; the product s1 s2 of a two-spin Gibbs chain; the exact
  sampler below) SE = std / sqrt(S) with the exact variance, and the normal quantile is used.
* Gradients: the covariance estimator is compared entry by entry (iid samples, SE of its influence
  function), and in norm against 3 predicted standard deviations (chain spread); the nudged estimator's
  bias is computed exactly from the reference (finite difference of exact moments) and its noise from
  the per-chain (or per-sample-pair) spread of the two phases.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from conftest import symmetric_couplings
from scipy import stats

from boltzmann_attention.ising import mcmc, reference
from boltzmann_attention.ising._sampling import sample_moments, sampled_marginals

DT = torch.float64
ALPHA = 1e-3


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def t_quantile(count: int, dof: int | None = None) -> float:
    """Two-sided Bonferroni threshold for ``count`` comparisons (normal when dof is None)."""
    q = 1 - ALPHA / (2 * count)
    return float(stats.norm.ppf(q) if dof is None else stats.t.ppf(q, dof))


def chain_means(x: torch.Tensor, chains: int) -> torch.Tensor:
    """(..., S, k) with sample i from chain i % chains -> per-chain means (..., chains, k)."""
    S = x.shape[-2]
    return x.reshape(*x.shape[:-2], S // chains, chains, x.shape[-1]).mean(-3)


def assert_within_chain_bound(stat: torch.Tensor, exact: torch.Tensor, chains: int) -> torch.Tensor:
    """stat: (..., S, k) per-sample statistic; exact: (..., k). Returns the standard errors."""
    cm = chain_means(stat, chains)
    estimate, se = cm.mean(-2), cm.std(-2) / math.sqrt(chains)
    bound = t_quantile(exact.numel(), chains - 1) * se
    assert ((estimate - exact).abs() <= bound + 1e-12).all(), float(((estimate - exact).abs() - bound).max())
    return se


def pair_products(spins: torch.Tensor) -> torch.Tensor:
    """s_j s_k for j < k: (..., S, n) -> (..., S, n(n-1)/2)."""
    j, k = torch.triu_indices(spins.shape[-1], spins.shape[-1], 1)
    return spins[..., j] * spins[..., k]


def upper(C: torch.Tensor) -> torch.Tensor:
    j, k = torch.triu_indices(C.shape[-1], C.shape[-1], 1)
    return C[..., j, k]


def exact_draw(h, J, mask, num_samples, generator):
    """An exact iid sampler (enumeration + multinomial) obeying the draw contract."""
    n = h.shape[-1]
    conf = reference.configurations(n, h.dtype)
    if mask is not None:
        h = h * mask
        J = None if J is None else J * mask[:, :, None] * mask[:, None, :]
    p = torch.softmax(reference.negative_energies(h, J, None, conf), -1)
    return conf[torch.multinomial(p, num_samples, replacement=True, generator=generator)]


class Recorder:
    """Wraps a draw and keeps what it was given and returned (forward call first, nudged phase second)."""

    def __init__(self, draw):
        self.draw, self.calls = draw, []

    def __call__(self, h, J, mask, num_samples, generator):
        spins = self.draw(h, J, mask, num_samples, generator)
        self.calls.append(dict(h=h.clone(), J=J, mask=mask, spins=spins.clone()))
        return spins


def exact_gradients(h, J, mask, w):
    """d/dh and d/dJ of sum(w * <s>) by autograd through the float64 reference."""
    h, J = h.detach().requires_grad_(True), J.detach().requires_grad_(True)
    (w * reference.marginals(h, J, None, mask)).sum().backward()
    return h.grad, J.grad


def rel(a, b):
    return float((a - b).norm() / b.norm())


def cosine(a, b):
    return float((a * b).sum() / (a.norm() * b.norm()))


# ---------------------------------------------------------------------------------------------------
# Marginals and correlations against the reference


def test_gibbs_matches_reference_with_mask():
    g = gen(0)
    n, chains = 7, 32
    h = 0.7 * torch.randn(2, 3, n, dtype=DT, generator=g)
    J = symmetric_couplings(n, 2, 1, scale=0.4, generator=g)  # one J per leading entry, shared by 3 queries
    mask = torch.rand(2, 3, n, generator=g) > 0.25
    res = mcmc.gibbs_marginals(h, J, mask=mask, num_samples=chains * 600, num_chains=chains, seed=1,
                               return_samples=True, return_correlations=True)
    assert res.samples.shape == (2, 3, chains * 600, n)
    assert (res.marginals[~mask] == 0).all() and (res.samples[~mask.unsqueeze(-2).expand_as(res.samples)] == 0).all()
    torch.testing.assert_close(res.marginals, res.samples.mean(-2))
    torch.testing.assert_close(res.correlations, sample_moments(res.samples)[1])
    m_ref, C_ref = reference.marginals(h, J, None, mask), reference.correlations(h, J, None, mask)
    assert_within_chain_bound(res.samples, m_ref, chains)
    assert_within_chain_bound(pair_products(res.samples), upper(C_ref), chains)


def test_pt_matches_reference_on_frustrated_couplings():
    """SK-like couplings with std 1.5 at n = 8 (beta * J far beyond the SK transition at std 1/sqrt(n))."""
    g = gen(1)
    n, chains = 8, 16
    h = 0.3 * torch.randn(3, n, dtype=DT, generator=g)
    J = symmetric_couplings(n, 3, scale=1.5, generator=g)
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, 2] = mask[2, 5] = False
    res = mcmc.pt_marginals(h, J, mask=mask, num_samples=chains * 4000, num_chains=chains, seed=2,
                            return_samples=True, return_swap_rates=True)
    assert res.swap_acceptance.shape == (3, 7)
    assert ((res.swap_acceptance > 0) & (res.swap_acceptance <= 1)).all()
    m_ref, C_ref = reference.marginals(h, J, None, mask), reference.correlations(h, J, None, mask)
    se = assert_within_chain_bound(res.samples, m_ref, chains)
    se_c = assert_within_chain_bound(pair_products(res.samples), upper(C_ref), chains)
    assert se.max() < 0.03 and se_c.max() < 0.03  # the test has power: chains agree with each other
    # and the couplings are hard: plain Gibbs chains with the same budget disagree with each other
    gibbs = mcmc.gibbs_marginals(h, J, mask=mask, num_samples=chains * 4000, num_chains=chains, seed=2,
                                 return_samples=True).samples
    assert chain_means(gibbs, chains).std(-2).max() / math.sqrt(chains) > 3 * se.max()


@pytest.mark.parametrize("method", ["gibbs", "pt"])
def test_no_couplings_gives_tanh(method):
    """J = 0: every sweep redraws each spin from its exact marginal, so samples are iid (PT swaps included)."""
    h = 1.5 * torch.randn(5, 8, dtype=DT, generator=gen(2))
    S = 2000
    fn = mcmc.gibbs_marginals if method == "gibbs" else partial(mcmc.pt_marginals, num_replicas=3)
    for J in (None, torch.zeros(8, 8, dtype=DT)):
        m = fn(h, J, num_samples=S, warmup=0, seed=3)
        se = torch.sqrt((1 - torch.tanh(h) ** 2) / S)
        assert ((m - torch.tanh(h)).abs() <= t_quantile(h.numel()) * se).all()


def test_two_spins_correlation_is_tanh_J():
    """h = 0, two spins: <s1 s2> = tanh(J) (J > 0 aligns). In a sequential sweep s2 = s1 with probability
    sigmoid(2J) whatever came before, so the recorded products are iid: SE = sqrt((1 - tanh^2 J) / S)."""
    Jv = torch.tensor([0.7, -1.2, 2.0], dtype=DT)
    J = torch.zeros(3, 2, 2, dtype=DT)
    J[:, 0, 1] = J[:, 1, 0] = Jv
    S = 8000
    res = mcmc.gibbs_marginals(torch.zeros(3, 2, dtype=DT), J, num_samples=S, seed=4, return_correlations=True)
    se = torch.sqrt((1 - torch.tanh(Jv) ** 2) / S)
    assert ((res.correlations[:, 0, 1] - torch.tanh(Jv)).abs() <= t_quantile(3) * se).all()
    assert (torch.sign(res.correlations[:, 0, 1]) == torch.sign(Jv)).all()


# ---------------------------------------------------------------------------------------------------
# The sampler-agnostic layer, with an exact iid sampler


def test_layer_shapes_and_shared_couplings():
    g = gen(5)
    n = 5
    h = torch.randn(2, 3, n, dtype=DT, generator=g)
    mask = torch.rand(2, 3, n, generator=g) > 0.3
    for J, J_shape in [(symmetric_couplings(n, generator=g), (1, n, n)),
                       (symmetric_couplings(n, 2, 1, generator=g), (6, n, n))]:
        rec = Recorder(exact_draw)
        m, spins = sampled_marginals(h, J, mask, rec, num_samples=50, generator=gen(0), return_samples=True)
        call = rec.calls[0]
        assert call["h"].shape == (6, n) and call["J"].shape == J_shape and call["mask"].shape == (6, n)
        assert m.shape == h.shape and spins.shape == (2, 3, 50, n)
        assert (m[~mask] == 0).all() and set(spins.unique().tolist()) <= {-1.0, 0.0, 1.0}


def test_covariance_gradient_entrywise_with_exact_sampler():
    g = gen(6)
    n, S = 6, 40000
    h = 0.5 * torch.randn(4, n, dtype=DT, generator=g)
    J = symmetric_couplings(n, scale=0.4, generator=g)  # shared by the 4 queries: gradients sum over them
    mask = torch.rand(4, n, generator=g) > 0.2
    w = torch.randn(4, n, dtype=DT, generator=g)
    hh, JJ = h.clone().requires_grad_(True), J.clone().requires_grad_(True)
    m, spins = sampled_marginals(hh, JJ, mask, exact_draw, num_samples=S, generator=gen(7), return_samples=True)
    (w * m).sum().backward()
    gh, gJ = exact_gradients(h, J, mask, w)
    # influence functions: (a - mean a)(s_k - m_k) and (a - mean a)(s_k s_l - C_kl) / 2, with a = w.s
    a = spins @ w.unsqueeze(-1)
    a = a - a.mean(-2, keepdim=True)
    xh = a * (spins - spins.mean(-2, keepdim=True))  # (Q, S, n)
    prods = spins.unsqueeze(-1) * spins.unsqueeze(-2)
    xJ = 0.5 * a.unsqueeze(-1) * (prods - prods.mean(-3, keepdim=True))  # (Q, S, n, n)
    se_h = xh.std(-2) / math.sqrt(S)
    se_J = torch.sqrt((xJ.var(1) / S).sum(0))  # summed over independent queries: variances add
    z = t_quantile(gh.numel() + gJ.numel())
    assert ((hh.grad - gh).abs() <= z * se_h + 1e-12).all()
    assert ((JJ.grad - gJ).abs() <= z * se_J + 1e-12).all()
    assert cosine(hh.grad, gh) > 0.95 and cosine(JJ.grad, gJ) > 0.95


def test_nudged_gradient_with_exact_sampler():
    """Bias from exact moments at h + eps w; noise from the paired (common random number) samples."""
    g = gen(8)
    n, S, nudge = 6, 40000, 0.1
    h = 0.5 * torch.randn(3, n, dtype=DT, generator=g)
    J = symmetric_couplings(n, scale=0.4, generator=g)
    w = torch.randn(3, n, dtype=DT, generator=g)
    hh, JJ = h.clone().requires_grad_(True), J.clone().requires_grad_(True)
    rec = Recorder(exact_draw)
    m = sampled_marginals(hh, JJ, None, rec, num_samples=S, gradient="nudged", nudge=nudge, generator=gen(9))
    (w * m).sum().backward()
    assert len(rec.calls) == 2
    eps = nudge / w.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(rec.calls[1]["h"], h + eps * w)
    # the estimator is exactly the mean over sample pairs i of d_i = (x(s'_i) - x(s_i)) / eps
    s0, s1 = rec.calls[0]["spins"], rec.calls[1]["spins"]
    dh = (s1 - s0) / eps.unsqueeze(-1)
    dJ = 0.5 * (s1.unsqueeze(-1) * s1.unsqueeze(-2) - s0.unsqueeze(-1) * s0.unsqueeze(-2)) / eps[..., None, None]
    torch.testing.assert_close(hh.grad, dh.mean(1))
    torch.testing.assert_close(JJ.grad, dJ.mean(1).sum(0))
    fd_h = (reference.marginals(h + eps * w, J) - reference.marginals(h, J)) / eps
    fd_J = 0.5 * ((reference.correlations(h + eps * w, J) - reference.correlations(h, J)) / eps.unsqueeze(-1)).sum(0)
    se_h, se_J = dh.std(1) / math.sqrt(S), torch.sqrt((dJ.var(1) / S).sum(0))
    z = t_quantile(fd_h.numel() + fd_J.numel())
    assert ((hh.grad - fd_h).abs() <= z * se_h + 1e-12).all()
    assert ((JJ.grad - fd_J).abs() <= z * se_J + 1e-12).all()
    gh, gJ = exact_gradients(h, J, None, w)
    assert rel(fd_h, gh) < nudge and rel(fd_J, gJ) < nudge  # the O(nudge) bias, measured about nudge / 2
    assert cosine(hh.grad, gh) > 0.95 and cosine(JJ.grad, gJ) > 0.95


# ---------------------------------------------------------------------------------------------------
# Gradients end to end through Gibbs


def covariance_formula(spins, w):
    """The documented covariance estimator of d sum(w m)/d(h, J) from samples (Q, S, n); J shared."""
    S = spins.shape[-2]
    a = spins @ w.unsqueeze(-1)
    a = (a - a.mean(-2, keepdim=True)) / (S - 1)
    gh = (a * spins).sum(-2)
    gJ = 0.5 * ((a * spins).transpose(-1, -2) @ spins).sum(0)
    return gh, gJ - torch.diag_embed(gJ.diagonal())


def test_gibbs_covariance_gradient():
    g = gen(10)
    n, chains, per_chain = 6, 32, 1000
    h = 0.5 * torch.randn(4, n, dtype=DT, generator=g)
    J = symmetric_couplings(n, scale=0.4, generator=g)
    mask = torch.rand(4, n, generator=g) > 0.2
    w = torch.randn(4, n, dtype=DT, generator=g)
    hh, JJ = h.clone().requires_grad_(True), J.clone().requires_grad_(True)
    res = mcmc.gibbs_marginals(hh, JJ, mask=mask, num_samples=chains * per_chain, num_chains=chains, seed=11,
                               return_samples=True)
    (w * res.marginals).sum().backward()
    fh, fJ = covariance_formula(res.samples, w)
    torch.testing.assert_close(hh.grad, fh, rtol=1e-10, atol=1e-12)  # exactly the documented formula
    torch.testing.assert_close(JJ.grad, fJ, rtol=1e-10, atol=1e-12)
    gh, gJ = exact_gradients(h, J, mask, w)
    # noise: spread of the same estimator on each chain alone, over sqrt(chains)
    per = [covariance_formula(res.samples[:, c::chains], w) for c in range(chains)]
    noise_h = float(torch.stack([p[0] for p in per]).std(0).norm()) / math.sqrt(chains) / float(gh.norm())
    noise_J = float(torch.stack([p[1] for p in per]).std(0).norm()) / math.sqrt(chains) / float(gJ.norm())
    assert noise_h < 0.05 and noise_J < 0.05
    assert rel(hh.grad, gh) < 3 * noise_h and rel(JJ.grad, gJ) < 3 * noise_J
    assert cosine(hh.grad, gh) > 0.95 and cosine(JJ.grad, gJ) > 0.95


def test_gibbs_nudged_gradient():
    g = gen(12)
    n, chains, per_chain, nudge = 6, 32, 3000, 0.1
    h = 0.5 * torch.randn(4, n, dtype=DT, generator=g)
    J = symmetric_couplings(n, scale=0.4, generator=g)
    w = torch.randn(4, n, dtype=DT, generator=g)
    hh, JJ = h.clone().requires_grad_(True), J.clone().requires_grad_(True)
    rec = Recorder(partial(mcmc.gibbs_draw, num_chains=chains))
    m = sampled_marginals(hh, JJ, None, rec, num_samples=chains * per_chain, gradient="nudged", nudge=nudge,
                          generator=gen(13))
    (w * m).sum().backward()
    eps = nudge / w.abs().amax(-1, keepdim=True)
    s0, s1 = (c["spins"] for c in rec.calls)  # (Q, S, n), sample i from chain i % chains
    # per-chain estimates (Q, chains, n) and (chains, n, n); their mean is exactly the estimator
    per_h = (chain_means(s1, chains) - chain_means(s0, chains)) / eps.unsqueeze(-1)
    products = (chain_means(pair_products(s1), chains) - chain_means(pair_products(s0), chains))
    per_J = 0.5 * (products / eps.unsqueeze(-1)).sum(0)  # upper triangle, summed over queries
    torch.testing.assert_close(hh.grad, per_h.mean(1))
    torch.testing.assert_close(upper(JJ.grad), per_J.mean(0))
    fd_h = (reference.marginals(h + eps * w, J) - reference.marginals(h, J)) / eps
    fd_J = 0.5 * ((reference.correlations(h + eps * w, J) - reference.correlations(h, J)) / eps.unsqueeze(-1)).sum(0)
    t = t_quantile(fd_h.numel() + per_J.shape[-1], chains - 1)
    assert ((hh.grad - fd_h).abs() <= t * per_h.std(1) / math.sqrt(chains)).all()
    assert ((upper(JJ.grad) - upper(fd_J)).abs() <= t * per_J.std(0) / math.sqrt(chains)).all()
    gh, gJ = exact_gradients(h, J, None, w)
    noise_h = float(per_h.std(1).norm()) / math.sqrt(chains) / float(gh.norm())
    noise_J = math.sqrt(2) * float(per_J.std(0).norm()) / math.sqrt(chains) / float(gJ.norm())  # both triangles
    assert noise_h < 0.1 and noise_J < 0.1
    assert rel(hh.grad, gh) < rel(fd_h, gh) + 3 * noise_h
    assert rel(JJ.grad, gJ) < rel(fd_J, gJ) + 3 * noise_J
    assert cosine(hh.grad, gh) > 0.95 and cosine(JJ.grad, gJ) > 0.95


def test_ste_is_the_documented_surrogate():
    g = gen(14)
    n = 6
    h = torch.randn(3, n, dtype=DT, generator=g)
    J = symmetric_couplings(n, scale=0.5, generator=g)
    mask = torch.rand(3, n, generator=g) > 0.2
    w = torch.randn(3, n, dtype=DT, generator=g)
    hh, JJ = h.clone().requires_grad_(True), J.clone().requires_grad_(True)
    m = mcmc.gibbs_marginals(hh, JJ, mask=mask, num_samples=500, gradient="ste", seed=15)
    (w * m).sum().backward()
    m = m.detach()
    gd = w * (1 - torch.tanh(h + m @ J) ** 2) * mask
    outer = gd.T @ m
    expected_J = 0.5 * (outer + outer.T)
    expected_J = expected_J - torch.diag_embed(expected_J.diagonal())
    assert torch.isfinite(hh.grad).all() and torch.isfinite(JJ.grad).all()
    torch.testing.assert_close(hh.grad, gd)
    torch.testing.assert_close(JJ.grad, expected_J)
    # at J = 0 the surrogate's h-gradient is the exact one, w (1 - tanh^2 h)
    hh = h.clone().requires_grad_(True)
    (w * mcmc.gibbs_marginals(hh, None, num_samples=10, gradient="ste", seed=0)).sum().backward()
    torch.testing.assert_close(hh.grad, w * (1 - torch.tanh(h) ** 2))


def test_nudged_training_of_J_alone():
    """J-only mode: h is a fixed bias, only J is learned, from nudged gradients (samples only)."""
    g = gen(16)
    n = 5
    bias = torch.full((2, n), 0.3, dtype=DT)
    bias[1] = -0.2
    J_target = symmetric_couplings(n, scale=0.6, generator=g)
    target = reference.marginals(bias, J_target)
    A = torch.zeros(n, n, dtype=DT, requires_grad=True)
    opt = torch.optim.Adam([A], lr=0.1)

    def couplings():
        upper_part = A.triu(1)
        return upper_part + upper_part.T

    def exact_loss():
        return float(((reference.marginals(bias, couplings().detach()) - target) ** 2).sum())

    start = exact_loss()
    for step in range(10):
        opt.zero_grad()
        m = mcmc.gibbs_marginals(bias, couplings(), num_samples=2000, num_chains=8, warmup=20,
                                 gradient="nudged", seed=step)
        ((m - target) ** 2).sum().backward()
        assert A.grad is not None and torch.isfinite(A.grad).all()
        opt.step()
    assert exact_loss() < 0.5 * start


# ---------------------------------------------------------------------------------------------------
# Seeds, entry points, errors


def test_seeds_are_reproducible():
    g = gen(17)
    h = torch.randn(3, 5, dtype=DT, generator=g)
    J = symmetric_couplings(5, generator=g)
    for fn in (mcmc.gibbs_marginals, mcmc.pt_marginals):
        a, b = fn(h, J, num_samples=100, seed=5), fn(h, J, num_samples=100, seed=5)
        assert torch.equal(a, b)
        assert torch.equal(a, fn(h, J, num_samples=100, generator=gen(5)))
        assert not torch.equal(a, fn(h, J, num_samples=100, seed=6))
    hh = h.clone().requires_grad_(True)
    grads = []
    for _ in range(2):
        hh.grad = None
        (mcmc.gibbs_marginals(hh, J, num_samples=100, gradient="nudged", seed=1) ** 2).sum().backward()
        grads.append(hh.grad.clone())
    assert torch.equal(*grads)


def test_dispatcher_entry_points():
    h = torch.randn(2, 4, dtype=DT, generator=gen(18))
    J = symmetric_couplings(4, generator=gen(19))
    mask = torch.tensor([[True, True, False, True]] * 2)
    torch.testing.assert_close(mcmc.gibbs(h, J, None, mask, num_samples=50, seed=0),
                               mcmc.gibbs_marginals(h, J, mask=mask, num_samples=50, seed=0))
    torch.testing.assert_close(mcmc.pt(h, J, None, mask, num_samples=50, seed=0, betas=[0.5, 1.0]),
                               mcmc.pt_marginals(h, J, mask=mask, num_samples=50, seed=0, betas=[1.0, 0.5]))
    with pytest.raises(ValueError, match="return_samples"):
        mcmc.gibbs(h, J, None, mask, return_samples=True)
    with pytest.raises(ValueError, match="log Z.*'exact'.*'banded'"):
        mcmc.log_partition(h, J, None, mask)


@pytest.mark.parametrize("kwargs, match", [
    (dict(K=torch.zeros(4, 4, 4, dtype=DT)), "pairwise"),
    (dict(gradient="reinforce"), "gradient"),
    (dict(num_samples=0), "num_samples"),
    (dict(warmup=-1), "warmup"),
    (dict(sweeps_per_sample=0), "sweeps_per_sample"),
    (dict(num_chains=0), "num_chains"),
    (dict(nudge=0.0), "nudge"),
    (dict(seed=1, generator=torch.Generator()), "seed"),
    (dict(seed=1.5), "seed"),
])
def test_errors(kwargs, match):
    h = torch.zeros(4, dtype=DT)
    for fn in (mcmc.gibbs_marginals, mcmc.pt_marginals):
        with pytest.raises(ValueError, match=match):
            fn(h, **kwargs)


def test_input_and_ladder_errors():
    h = torch.zeros(4, dtype=DT)
    with pytest.raises(ValueError, match="NaN or inf"):
        mcmc.gibbs_marginals(torch.tensor([0.0, math.nan], dtype=DT))
    with pytest.raises(ValueError, match="NaN or inf"):
        mcmc.pt_marginals(h, torch.full((4, 4), math.inf, dtype=DT).fill_diagonal_(0))
    with pytest.raises(ValueError, match="symmetric"):
        mcmc.gibbs_marginals(h, torch.ones(4, 4, dtype=DT).triu(1))
    with pytest.raises(ValueError, match="1.0"):
        mcmc.pt_marginals(h, betas=[0.2, 0.5, 0.9])
    with pytest.raises(ValueError, match="> 0"):
        mcmc.pt_marginals(h, betas=[-0.5, 1.0])
    with pytest.raises(ValueError, match="beta_min"):
        mcmc.pt_marginals(h, beta_min=1.5)
    with pytest.raises(ValueError, match="num_replicas"):
        mcmc.pt_marginals(h, num_replicas=1)
    with pytest.raises(ValueError, match="not both"):
        mcmc.pt_marginals(h, betas=[0.5, 1.0], num_replicas=4)
    for bad in (dict(gradient="exact"), dict(num_samples=0), dict(nudge=-1.0)):
        with pytest.raises(ValueError):
            sampled_marginals(h, None, None, exact_draw, **{"num_samples": 10, **bad})


def test_a_tensor_of_betas_is_a_ladder():
    """A tensor ladder was refused as 'each of betas must be a finite number > 0, got tensor(0.3000)'."""
    h = torch.tensor([[0.3, -0.2, 0.5]], dtype=torch.float64)
    J = torch.tensor([[0.0, 0.4, 0.0], [0.4, 0.0, -0.3], [0.0, -0.3, 0.0]], dtype=torch.float64)
    from_list = mcmc.pt_marginals(h, J, betas=[0.3, 0.6, 1.0], num_samples=200, seed=0)
    from_tensor = mcmc.pt_marginals(h, J, betas=torch.tensor([0.3, 0.6, 1.0]), num_samples=200, seed=0)
    assert torch.equal(from_list, from_tensor)
    with pytest.raises(ValueError, match="each of betas must be a finite number > 0"):
        mcmc.pt_marginals(h, J, betas=torch.tensor([0.0, 1.0]), num_samples=10, seed=0)
