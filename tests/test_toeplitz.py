"""Mean field / TAP with Toeplitz couplings applied as a banded operator: the same fixed point and the same
implicit gradients as the dense solver, gradcheck, the causal split, the layer, and the errors."""

import pytest
import torch

from boltzmann_attention import BoltzmannAttention, RelativeCouplings, boltzmann_attention
from boltzmann_attention.ising import meanfield, reference, toeplitz


def _inputs(n=23, w=3, scale=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2, 3, 4, n, dtype=torch.float64, generator=g)
    profile = scale * torch.randn(3, 1, w, dtype=torch.float64, generator=g)  # one per "head"
    mask = torch.rand(2, 3, 4, n, generator=g) > 0.25
    return h, profile, mask


def test_dense_is_the_relative_couplings_matrix():
    rel = RelativeCouplings(2, 5, init_std=1.0)
    assert toeplitz.Toeplitz(rel.weight.detach()).dense(9).equal(rel(9).detach())


@pytest.mark.parametrize("tap", [False, True])
@pytest.mark.parametrize("block", [4, 64])  # 4: many blocks, couplings across block boundaries (w = 3)
def test_same_fixed_point_and_gradients_as_the_dense_solver(tap, block):
    h, profile, mask = _inputs()
    g = torch.randn_like(h)
    results = []
    for structured in (True, False):
        hh, pp = h.clone().requires_grad_(), profile.clone().requires_grad_()
        if structured:
            m = toeplitz.marginals(hh, toeplitz.Toeplitz(pp), mask, tap=tap, tol=1e-12, block=block, damping=0.0)
        else:
            m = meanfield.marginals(hh, toeplitz.Toeplitz(pp).dense(h.shape[-1]), None, mask, tap=tap, tol=1e-12,
                                    damping=0.0)
        results.append((m, *torch.autograd.grad((m * g).sum(), (hh, pp))))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    assert (results[0][0][~mask] == 0).all()


@pytest.mark.parametrize("tap", [False, True])
def test_gradcheck(tap):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 7, dtype=torch.float64, generator=g).requires_grad_()
    profile = (0.3 * torch.randn(2, dtype=torch.float64, generator=g)).requires_grad_()
    mask = torch.tensor([[True] * 7, [True, False, True, True, True, False, True]])

    def f(h, profile):
        return toeplitz.marginals(h, toeplitz.Toeplitz(profile), mask, tap=tap, tol=1e-13, block=3)

    assert torch.autograd.gradcheck(f, (h, profile), atol=1e-7)


def test_weak_couplings_are_close_to_exact_and_tap_closer():
    """An independent check of the equations: errors against the brute force shrink like eps^2 (naive), eps^3 (TAP)."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(16, 10, dtype=torch.float64, generator=g)
    profile = torch.randn(3, dtype=torch.float64, generator=g)
    errors = {}
    for eps in (0.1, 0.05):
        T = toeplitz.Toeplitz(eps * profile)
        exact = reference.marginals(h, T.dense(10))
        errors[eps] = [float((toeplitz.marginals(h, T, tap=tap, tol=1e-12) - exact).abs().max())
                       for tap in (False, True)]
    naive_ratio, tap_ratio = (errors[0.1][i] / errors[0.05][i] for i in (0, 1))
    assert 3.0 < naive_ratio < 5.5 and 6.0 < tap_ratio < 11.0
    assert errors[0.05][1] < errors[0.05][0]


def test_info_reports_forward_and_backward_iterations():
    h, profile, mask = _inputs()
    h.requires_grad_()
    m, info = toeplitz.solve(h, toeplitz.Toeplitz(profile), mask, damping=0.0, tol=1e-9)
    assert info.iterations > 1 and info.max_residual < 1e-9 and bool(info.converged.all())
    assert info.converged.shape == h.shape[:-1] and info.backward_iterations is None
    m.sum().backward()
    assert info.backward_iterations >= 1 and info.backward_max_residual is not None


def test_causal_rows_in_chunks_equal_one_solve():
    g = torch.Generator().manual_seed(3)
    L = 13
    h = torch.randn(2, 1, L, L, dtype=torch.float64, generator=g)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    T = toeplitz.Toeplitz(0.3 * torch.randn(1, 1, 4, dtype=torch.float64, generator=g))
    m, infos = toeplitz.causal_marginals(h, T, causal, chunks=3, tol=1e-12)
    assert len(infos) == 3
    torch.testing.assert_close(m, toeplitz.marginals(h, T, causal, tol=1e-12), atol=1e-11, rtol=0)


@pytest.mark.parametrize("method", ["meanfield", "tap"])
def test_layer_with_toeplitz_couplings_equals_the_dense_matrix(method):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 9, 4, dtype=torch.float64, generator=g) for _ in range(3))
    profile = 0.15 * torch.randn(2, 3, dtype=torch.float64, generator=g)
    options = {"tol": 1e-11, "damping": 0.0}
    for causal in (True, False):
        out_t, w_t = boltzmann_attention(q, k, v, couplings=toeplitz.Toeplitz(profile), method=method, is_causal=causal,
                                         return_weights=True, method_options=options)
        out_d, w_d = boltzmann_attention(q, k, v, couplings=toeplitz.Toeplitz(profile).dense(9), method=method,
                                         is_causal=causal, return_weights=True, method_options=options)
        torch.testing.assert_close(w_t, w_d, atol=1e-10, rtol=0)
        torch.testing.assert_close(out_t, out_d, atol=1e-10, rtol=0)


def test_errors():
    h, profile, mask = _inputs()
    q = k = v = torch.randn(1, 3, 5, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="'meanfield' and 'tap'"):
        boltzmann_attention(q, k, v, couplings=toeplitz.Toeplitz(profile[:, 0]), method="exact")
    with pytest.raises(ValueError, match=r"shape \(H, w\)"):
        boltzmann_attention(q, k, v, couplings=toeplitz.Toeplitz(profile), method="meanfield")
    with pytest.raises(ValueError, match="profile of shape"):
        toeplitz.Toeplitz(torch.zeros(()))  # a scalar: no distance axis (width 0 is allowed: no couplings)
    with pytest.raises(ValueError, match="NaN or inf"):
        toeplitz.Toeplitz(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="does not broadcast"):
        toeplitz.solve(h, toeplitz.Toeplitz(torch.zeros(5, 1, 3, dtype=torch.float64)))
    with pytest.raises(ValueError, match="damping"):
        toeplitz.solve(h, toeplitz.Toeplitz(profile), damping=1.0)
    with pytest.raises(meanfield.ConvergenceError):
        toeplitz.solve(h, toeplitz.Toeplitz(3.0 * profile.abs()), max_iter=2, on_fail="raise")


@pytest.mark.parametrize("tap", [False, True])
def test_anderson_same_fixed_point_and_gradients_as_damped(tap):
    """solver="anderson" on the Toeplitz operator: the damped solver's answer and gradients, in fewer iterations
    (moderate couplings), forward and backward."""
    h, profile, mask = _inputs(n=40, w=4, scale=0.25, seed=5)
    g = torch.randn_like(h)
    out = {}
    for solver, options in (("damped", {}), ("anderson", {"solver": "anderson", "damping": 0.0})):
        hh, pp = h.clone().requires_grad_(), profile.clone().requires_grad_()
        m, info = toeplitz.solve(hh, toeplitz.Toeplitz(pp), mask, tap=tap, tol=1e-12, block=8, **options)
        out[solver] = (m, *torch.autograd.grad((m * g).sum(), (hh, pp)), info)
    for a, b in zip(out["damped"][:3], out["anderson"][:3]):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    damped, anderson = out["damped"][-1], out["anderson"][-1]
    assert bool(anderson.converged.all())
    assert anderson.iterations < damped.iterations and anderson.backward_iterations < damped.backward_iterations


def test_anderson_gradcheck():
    g = torch.Generator().manual_seed(6)
    h = torch.randn(2, 9, dtype=torch.float64, generator=g).requires_grad_()
    profile = (0.3 * torch.randn(3, dtype=torch.float64, generator=g)).requires_grad_()
    mask = torch.tensor([[True] * 9, [True, False, True, True, True, False, True, True, True]])

    def f(h, profile):
        return toeplitz.marginals(h, toeplitz.Toeplitz(profile), mask, tol=1e-13, block=3, solver="anderson",
                                  damping=0.0)

    assert torch.autograd.gradcheck(f, (h, profile), atol=1e-7)


def test_layer_takes_the_anderson_solver():
    """The layer passes solver="anderson" through method_options and gets the damped solver's output."""
    x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(0))
    out = {}
    for options in ({}, {"solver": "anderson", "damping": 0.0}):
        torch.manual_seed(1)
        m = BoltzmannAttention(16, 2, max_len=12, coupling="relative", coupling_range=3, method="meanfield",
                               coupling_init_std=0.2, method_options={**options, "tol": 1e-7})
        out[len(options)] = m(x)[0]
    torch.testing.assert_close(out[0], out[2], atol=1e-5, rtol=0)


@pytest.mark.parametrize("tap", [False, True])
def test_range_zero_means_no_couplings(tap):
    """A profile of width 0 is J = 0 (as exact and banded read coupling_range 0): m = tanh(h), masked."""
    g = torch.Generator().manual_seed(5)
    h = torch.randn(2, 3, 6, dtype=torch.float64, generator=g)
    mask = torch.rand(2, 3, 6, generator=g) > 0.3
    profile = torch.zeros(2, 1, 0, dtype=torch.float64, requires_grad=True)
    m, info = toeplitz.solve(h, toeplitz.Toeplitz(profile), mask, tap=tap)
    assert torch.allclose(m, torch.tanh(h) * mask, atol=1e-12) and bool(info.converged.all())
    m.sum().backward()
    assert profile.grad.shape == profile.shape
    assert torch.equal(toeplitz.Toeplitz(profile.detach()[0]).dense(4), torch.zeros(1, 4, 4, dtype=torch.float64))


@pytest.mark.parametrize("chunks", [0, -1, 2.5, True])
def test_causal_marginals_refuses_bad_chunks(chunks):
    h = torch.zeros(4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="chunks"):
        toeplitz.causal_marginals(h, toeplitz.Toeplitz(torch.zeros(1, dtype=torch.float64)), chunks=chunks)


@pytest.mark.parametrize("method", ["meanfield", "exact", "banded"])
def test_a_toeplitz_operator_given_to_ising_marginals_names_its_entry_points(method):
    from boltzmann_attention import ising

    h = torch.zeros(2, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="Toeplitz operator: solve it with ising.toeplitz.solve"):
        ising.marginals(h, toeplitz.Toeplitz(torch.full((2,), 0.1, dtype=torch.float64)), method=method)


@pytest.mark.parametrize("method", ["meanfield", "tap"])
def test_a_layer_with_relative_range_zero_is_sigmoid_attention(method):
    """coupling_range=0 means no couplings for every method (mean field failed on it at the first step)."""
    torch.manual_seed(0)
    layer = BoltzmannAttention(8, 2, max_len=6, mode="h+J", coupling="relative", coupling_range=0,
                               method=method).double()
    plain = BoltzmannAttention(8, 2, max_len=6, mode="h").double()
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if "couplings" not in k})
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x)[0], plain(x)[0], atol=1e-9, rtol=0)
