"""Tests for ising.meanfield: naive mean field and TAP, against the brute-force reference."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from boltzmann_attention import ising
from boltzmann_attention.ising import meanfield, reference
from boltzmann_attention.ising.meanfield import ConvergenceError, ConvergenceWarning

DT = torch.float64
TIGHT = dict(tol=1e-12, max_iter=5000)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sym_zero_diag(A: torch.Tensor) -> torch.Tensor:
    """Symmetric, zero-diagonal coupling matrix from a free tensor (differentiable)."""
    S = A + A.transpose(-1, -2)
    return S - torch.diag_embed(S.diagonal(dim1=-2, dim2=-1))


def gaussian_couplings(n: int, seed: int) -> torch.Tensor:
    return sym_zero_diag(torch.randn(n, n, generator=gen(seed), dtype=DT)) / math.sqrt(2.0)


def sym_three_body(A: torch.Tensor) -> torch.Tensor:
    n = A.shape[-1]
    S = sum(A.permute(*p) for p in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
    i = torch.arange(n)
    distinct = ((i[:, None, None] != i[None, :, None]) & (i[None, :, None] != i[None, None, :])
                & (i[:, None, None] != i[None, None, :]))
    return S * distinct


@pytest.mark.parametrize("tap", [False, True])
def test_no_couplings_is_exactly_tanh(tap):
    h = 3 * torch.randn(4, 7, generator=gen(0), dtype=DT)
    for J in (None, torch.zeros(7, 7, dtype=DT)):
        m, info = meanfield.solve(h, J, tap=tap)
        assert torch.equal(m, torch.tanh(h))
        assert info.iterations == 1 and bool(info.converged.all())


def test_error_scaling_with_coupling_strength():
    """Max error vs the exact marginals: naive ~ eps^2, TAP ~ eps^3.

    Measured with these seeds: slopes 1.97 and 2.96, errors naive 1.4e-3 / TAP 2.9e-5 at eps = 0.02
    (ratio 50), ratio 13 at eps = 0.08. Other seeds gave slopes 1.89-2.11 and 2.96-3.08.
    """
    n, eps = 8, [0.02, 0.04, 0.08]
    h = torch.randn(32, n, generator=gen(0), dtype=DT)
    G = gaussian_couplings(n, seed=1)
    errors = {False: [], True: []}
    for e in eps:
        exact = reference.marginals(h, e * G)
        for tap in (False, True):
            errors[tap].append(float((meanfield.marginals(h, e * G, None, None, tap=tap, **TIGHT)
                                      - exact).abs().max()))

    def slope(y):
        return np.polyfit(np.log(eps), np.log(y), 1)[0]

    assert 1.75 <= slope(errors[False]) <= 2.25, errors[False]
    assert 2.75 <= slope(errors[True]) <= 3.25, errors[True]
    for naive, tap in zip(errors[False], errors[True], strict=True):
        assert tap < naive / 5
    assert errors[True][0] < errors[False][0] / 20
    assert errors[False][0] < 2e-3 and errors[True][0] < 5e-5


def test_log_partition_lower_bound_and_limit():
    n = 8
    h = torch.randn(32, n, generator=gen(1), dtype=DT)
    G = gaussian_couplings(n, seed=1)
    gaps = {False: [], True: []}
    for e in [0.3, 0.1, 0.03, 0.01]:
        exact = reference.log_partition(h, e * G)
        naive = meanfield.log_partition(h, e * G, None, None, **TIGHT)
        assert (naive <= exact + 1e-12).all()  # Gibbs variational bound
        for tap, value in ((False, naive), (True, meanfield.log_partition(h, e * G, None, None, tap=True,
                                                                           **TIGHT))):
            gaps[tap].append(float((value - exact).abs().max()))
    for tap in (False, True):
        assert all(b < a for a, b in zip(gaps[tap], gaps[tap][1:], strict=False)), gaps[tap]
    assert gaps[False][-1] < 1e-3 and gaps[True][-1] < 1e-5
    # without couplings it is exact: sum_j log(2 cosh h_j)
    free = meanfield.log_partition(h, None, None, None)
    torch.testing.assert_close(free, torch.log(2 * torch.cosh(h)).sum(-1))


def test_three_body_couplings():
    """Lower bound with K, and the marginals' error shrinks like the square of the couplings."""
    n = 6
    h = torch.randn(16, n, generator=gen(2), dtype=DT)
    J = gaussian_couplings(n, seed=2)
    K = sym_three_body(torch.randn(n, n, n, generator=gen(3), dtype=DT))
    errors = []
    for e in (0.04, 0.02):
        exact = reference.log_partition(h, e * J, e * K)
        assert (meanfield.log_partition(h, e * J, e * K, None, **TIGHT) <= exact + 1e-12).all()
        m = meanfield.marginals(h, e * J, e * K, None, **TIGHT)
        errors.append(float((m - reference.marginals(h, e * J, e * K)).abs().max()))
    assert errors[1] < 0.02 and 3.0 < errors[0] / errors[1] < 5.0, errors


def _free_inputs(n, batch, seed, scale=0.3):
    h = torch.randn(*batch, n, generator=gen(seed), dtype=DT, requires_grad=True)
    A = (scale * torch.randn(n, n, generator=gen(seed + 1), dtype=DT)).requires_grad_()
    mask = torch.rand(*batch, n, generator=gen(seed + 2)) < 0.7
    mask[..., 0] = True
    return h, A, mask


@pytest.mark.parametrize("fn", [meanfield.marginals, meanfield.log_partition])
@pytest.mark.parametrize("tap", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_gradcheck(fn, tap, masked):
    h, A, mask = _free_inputs(5, (3,), seed=10)
    mask = mask if masked else None

    def f(h, A):
        return fn(h, sym_zero_diag(A), None, mask, tap=tap, **TIGHT)

    assert torch.autograd.gradcheck(f, (h, A), atol=1e-7, rtol=1e-5)


def test_gradcheck_three_body_and_broadcast_couplings():
    n = 4
    h = torch.randn(2, 3, n, generator=gen(30), dtype=DT, requires_grad=True)
    A = (0.3 * torch.randn(2, 1, n, n, generator=gen(31), dtype=DT)).requires_grad_()
    B = (0.2 * torch.randn(n, n, n, generator=gen(32), dtype=DT)).requires_grad_()

    def f(h, A, B):
        return meanfield.marginals(h, sym_zero_diag(A), sym_three_body(B), None, **TIGHT)

    def g(h, A, B):
        return meanfield.log_partition(h, sym_zero_diag(A), sym_three_body(B), None, **TIGHT)

    assert torch.autograd.gradcheck(f, (h, A, B), atol=1e-7, rtol=1e-5, fast_mode=True)
    assert torch.autograd.gradcheck(g, (h, A, B), atol=1e-7, rtol=1e-5, fast_mode=True)


def test_log_partition_gradient_is_magnetisation():
    h, A, _ = _free_inputs(6, (4,), seed=40)
    J = sym_zero_diag(A).detach()
    for tap in (False, True):
        x = h.detach().clone().requires_grad_()
        meanfield.log_partition(x, J, None, None, tap=tap, **TIGHT).sum().backward()
        torch.testing.assert_close(x.grad, meanfield.marginals(h.detach(), J, None, None, tap=tap, **TIGHT))


@pytest.mark.parametrize("tap", [False, True])
def test_mask_equals_deleted_spins(tap, device):
    """Masked on ``device``, against the smaller systems solved on the CPU."""
    n = 7
    h = torch.randn(5, n, generator=gen(50), dtype=DT)
    J = 0.3 * gaussian_couplings(n, seed=50)
    mask = torch.rand(5, n, generator=gen(51)) < 0.6
    mask[:, 0] = True
    m = meanfield.marginals(h.to(device), J.to(device), None, mask.to(device), tap=tap, **TIGHT).cpu()
    logz = meanfield.log_partition(h.to(device), J.to(device), None, mask.to(device), tap=tap, **TIGHT).cpu()
    assert (m[~mask] == 0).all()
    for q in range(5):
        keep = mask[q].nonzero().squeeze(-1)
        small_h, small_J = h[q, keep], J[keep][:, keep]
        torch.testing.assert_close(m[q, keep], meanfield.marginals(small_h, small_J, None, None, tap=tap,
                                                                    **TIGHT))
        torch.testing.assert_close(logz[q], meanfield.log_partition(small_h, small_J, None, None, tap=tap,
                                                                     **TIGHT))


def test_masked_gradients_vanish_on_absent_spins():
    h, A, mask = _free_inputs(6, (4,), seed=60)
    J = sym_zero_diag(A)
    meanfield.marginals(h, J, None, mask, tap=True).sum().backward()
    assert (h.grad[~mask] == 0).all()


def test_broadcast_couplings_match_per_query_loop():
    """Attention layout: h (B, H, L, S), J (H, 1, S, S), causal mask (L, S)."""
    B, H, L, S = 2, 3, 4, 4
    h = torch.randn(B, H, L, S, generator=gen(70), dtype=DT)
    J = 0.3 * torch.stack([gaussian_couplings(S, seed=71 + k) for k in range(H)])[:, None]
    mask = torch.ones(L, S, dtype=torch.bool).tril()
    for tap in (False, True):
        m = ising.marginals(h, J, mask=mask, method="tap" if tap else "meanfield", **TIGHT)
        assert m.shape == (B, H, L, S)
        for b in range(B):
            for k in range(H):
                for i in range(L):
                    one = meanfield.marginals(h[b, k, i], J[k, 0], None, mask[i], tap=tap, **TIGHT)
                    torch.testing.assert_close(m[b, k, i], one)


def _frustrated():
    """Two spins with a strong antiferromagnetic bond: the undamped iteration has a period-2 cycle."""
    h = torch.tensor([[0.1, 0.1]], dtype=DT)
    J = torch.tensor([[0.0, -3.0], [-3.0, 0.0]], dtype=DT)
    return h, J


def test_non_convergence_warns_raises_and_reports():
    h, J = _frustrated()
    with pytest.warns(ConvergenceWarning, match="did not converge.*after 20 iterations"):
        m, info = meanfield.solve(h, J, damping=0.0, max_iter=20)
    assert not bool(info.converged.any()) and info.iterations == 20 and info.max_residual > 0.1
    assert torch.isfinite(m).all()
    with pytest.raises(ConvergenceError):
        meanfield.solve(h, J, damping=0.0, max_iter=20, on_fail="raise")
    # the adjoint iteration of the backward pass follows the same policy (one step is not enough)
    x = h.clone().requires_grad_()
    with pytest.warns(ConvergenceWarning, match="naive mean-field iteration"):
        m = meanfield.marginals(x, 0.1 * J, None, None, max_iter=1)
    with pytest.warns(ConvergenceWarning, match="adjoint"):
        m.sum().backward()
    assert torch.isfinite(x.grad).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        meanfield.marginals(h, J, None, None, damping=0.0, max_iter=20, on_fail="ignore")
        # damping removes the oscillation
        m, info = meanfield.solve(h, J, damping=0.9, max_iter=2000)
    assert bool(info.converged.all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tap", [False, True])
def test_extreme_couplings_stay_finite(dtype, tap):
    n = 6
    h = (1e4 * torch.randn(3, n, generator=gen(80), dtype=DT)).to(dtype).requires_grad_()
    J = (1e4 * gaussian_couplings(n, seed=81)).to(dtype)
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, 2:] = False
    m = meanfield.marginals(h, J, None, mask, tap=tap, on_fail="ignore", max_iter=50)
    logz = meanfield.log_partition(h, J, None, mask, tap=tap, on_fail="ignore", max_iter=50)
    assert torch.isfinite(m).all() and torch.isfinite(logz).all()
    (m.sum() + logz.sum()).backward()
    assert torch.isfinite(h.grad).all()


@pytest.mark.parametrize("options", [dict(damping=1.0), dict(damping=-0.1), dict(tol=0.0),
                                     dict(max_iter=0), dict(max_iter=2.5), dict(on_fail="ignor"),
                                     dict(tap="yes")])
def test_bad_options(options):
    h = torch.zeros(3, dtype=DT)
    with pytest.raises(ValueError):
        meanfield.solve(h, **options)
    with pytest.raises(ValueError):
        ising.marginals(h, method="meanfield", **options)


def test_tap_rejects_three_body():
    K = torch.zeros(3, 3, 3, dtype=DT)
    with pytest.raises(ValueError, match="tap supports pairwise couplings only"):
        ising.marginals(torch.zeros(3, dtype=DT), None, K, method="tap")


def test_dispatcher_methods():
    h = torch.randn(2, 5, generator=gen(90), dtype=DT)
    J = 0.2 * gaussian_couplings(5, seed=90)
    torch.testing.assert_close(ising.marginals(h, J, method="tap"),
                               meanfield.marginals(h, J, None, None, tap=True))
    torch.testing.assert_close(ising.log_partition(h, J, method="meanfield"),
                               meanfield.log_partition(h, J, None, None))


@pytest.mark.parametrize("solver", [{}, dict(solver="anderson", damping=0.0)])
@pytest.mark.parametrize("tap", [False, True])
def test_half_precision_converges_to_its_own_resolution(tap, solver):
    """float16 cannot resolve a residual of 1e-6: tol is raised to its epsilon, so a weakly coupled system
    converges without a warning, to the float32 answer within float16's precision."""
    g = torch.Generator().manual_seed(3)
    h = torch.randn(4, 6, generator=g)
    W = 0.1 * torch.randn(6, 6, generator=g).triu(1)
    J = W + W.T
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m16, info = meanfield.solve(h.half(), J.half(), tap=tap, **solver)
    m32, info32 = meanfield.solve(h, J, tap=tap, **solver)
    assert bool(info.converged.all()) and info.max_residual < torch.finfo(torch.float16).eps
    assert info32.max_residual < 1e-6  # float32 keeps the requested tol
    assert torch.allclose(m16.float(), m32, atol=5e-3)


# ---------------------------------------------------------------------------------------------------
# Anderson acceleration (solver="anderson")

ANDERSON = dict(solver="anderson", damping=0.0)


@pytest.mark.parametrize("tap", [False, True])
def test_anderson_finds_the_damped_fixed_point_in_fewer_iterations(tap):
    """Moderate couplings (a contraction, one fixed point): the same magnetisations, log Z and gradients as the
    damped iteration, in at most half its iterations at the default damping."""
    h = torch.randn(16, 12, generator=gen(100), dtype=DT).requires_grad_()
    J = (0.15 * gaussian_couplings(12, seed=101)).requires_grad_()
    g = torch.randn(16, 12, generator=gen(102), dtype=DT)
    out = {}
    for solver, options in (("damped", {}), ("anderson", ANDERSON)):
        m, info = meanfield.solve(h, J, tap=tap, tol=1e-12, **options)
        logz = meanfield.log_partition(h, J, None, None, tap=tap, tol=1e-12, **options)
        out[solver] = (m, logz, *torch.autograd.grad((m * g).sum(), (h, J)), info)
    for a, b in zip(out["damped"][:4], out["anderson"][:4]):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    damped, anderson = out["damped"][-1], out["anderson"][-1]
    assert bool(damped.converged.all()) and bool(anderson.converged.all())
    assert anderson.iterations <= damped.iterations / 2, (anderson.iterations, damped.iterations)


def test_anderson_converges_where_the_undamped_iteration_oscillates():
    """The period-2 cycle of the strong antiferromagnetic pair: Anderson reaches the fixed point m = tanh(h + J m)."""
    h, J = _frustrated()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m, info = meanfield.solve(h, J, max_iter=100, **ANDERSON)
    assert bool(info.converged.all()) and info.iterations < 100
    torch.testing.assert_close(m, torch.tanh(h + m @ J), atol=1e-6, rtol=0)
    _, plain = meanfield.solve(h, J, damping=0.0, max_iter=100, on_fail="ignore")
    assert not bool(plain.converged.any())


@pytest.mark.parametrize("tap", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_anderson_gradcheck(tap, masked):
    """Implicit gradients with the adjoint solved by Anderson too."""
    h = torch.randn(3, 6, generator=gen(103), dtype=DT).requires_grad_()
    J = (0.3 * gaussian_couplings(6, seed=104)).requires_grad_()
    mask = (torch.rand(3, 6, generator=gen(105)) > 0.3) if masked else None

    def f(h, J):
        return meanfield.marginals(h, J, None, mask, tap=tap, tol=1e-13, **ANDERSON)

    assert torch.autograd.gradcheck(f, (h, J), atol=1e-7)


def test_anderson_keeps_its_memory_and_options_checked():
    h = torch.randn(4, 10, generator=gen(106), dtype=DT)
    J = 0.2 * gaussian_couplings(10, seed=107)
    ms = [meanfield.solve(h, J, tol=1e-12, anderson_memory=k, **ANDERSON)[0] for k in (1, 3, 8)]
    for m in ms[1:]:
        torch.testing.assert_close(m, ms[0], atol=1e-10, rtol=0)
    for bad in (dict(solver="newton"), dict(solver="anderson", anderson_memory=0)):
        with pytest.raises(ValueError):
            meanfield.solve(h, J, **bad)
        with pytest.raises(ValueError):
            ising.marginals(h, J, method="tap", **bad)
    assert {"solver", "anderson_memory"} <= ising.OPTIONS["meanfield"] & ising.OPTIONS["tap"]
