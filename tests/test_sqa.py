"""Tests for ising.sqa: path-integral Monte Carlo against exact transverse-field thermal states, and limits.

Statistical bounds: the P slices of one chain are strongly correlated, but chains are independent, so
the error of a mean is estimated from the C per-chain slice averages: SE = std(chain means) / sqrt(C),
with the two-sided Student-t threshold (C - 1 dof) at a family-wise level ALPHA = 1e-3, Bonferroni-
corrected over the compared entries. Systematic allowances (Trotter error, freezing) are stated where used.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.linalg import expm

from boltzmann_attention import ising
from boltzmann_attention.ising import reference
from boltzmann_attention.ising.sqa import sqa_draw, sqa_marginals

DT = torch.float64
ALPHA = 1e-3


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_problem(n: int, seed: int, h_scale: float, j_scale: float):
    g = gen(seed)
    h = torch.randn(n, generator=g, dtype=DT) * h_scale
    W = torch.randn(n, n, generator=g, dtype=DT).triu(1) * j_scale
    return h, W + W.T


def _operators(h: torch.Tensor, J: torch.Tensor):
    """E(z) as a vector, sum_j X_j as a dense matrix and the +-1 spin table, over the 2^n basis states.

    Basis index bit j = 1 means s_j = +1 (reference.configurations); X_j flips bit j.
    """
    n = h.shape[-1]
    conf = reference.configurations(n)
    energy = -reference.negative_energies(h, J, None, conf).numpy()
    index = np.arange(2**n)
    sum_x = np.zeros((2**n, 2**n))
    for j in range(n):
        sum_x[index ^ (1 << j), index] += 1.0
    return energy, sum_x, conf.numpy()


def quantum_marginals(h: torch.Tensor, J: torch.Tensor, gamma: float, beta: float) -> torch.Tensor:
    """Tr(Z_j rho) for rho = exp(-beta H) / Tr exp(-beta H), H = -gamma sum_j X_j + diag(E(z)), by expm."""
    energy, sum_x, conf = _operators(h, J)
    rho = expm(-beta * (np.diag(energy) - gamma * sum_x))
    return torch.from_numpy(np.diag(rho) @ conf / np.trace(rho))


def trotter_moments(h: torch.Tensor, J: torch.Tensor, gamma: float, beta: float, slices: int):
    """The exact P-slice targets: <s_j^k> = Tr(Z_j T^P) / Tr(T^P) and <s_j^k s_j^{k+1}> = Tr(Z_j T Z_j T^{P-1})
    / Tr(T^P), with T = e^{-beta E/P} e^{beta gamma sum_j X_j / P} (its entries are the slice weights)."""
    energy, sum_x, conf = _operators(h, J)
    T = np.diag(np.exp(-beta * energy / slices)) @ expm(beta * gamma / slices * sum_x)
    rest, Z = np.linalg.matrix_power(T, slices - 1), np.trace(np.linalg.matrix_power(T, slices))
    m = np.diag(T @ rest) @ conf / Z
    neighbour = [np.trace(np.diag(conf[:, j]) @ T @ np.diag(conf[:, j]) @ rest) / Z for j in range(len(m))]
    return torch.from_numpy(m), torch.tensor(neighbour, dtype=DT)


def chain_estimate(spins: torch.Tensor, slices: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """spins (S, n), sample i = slice i % P of chain i // P -> (mean, SE from chain means, chains)."""
    cm = spins.reshape(-1, slices, spins.shape[-1]).mean(1)
    return cm.mean(0), cm.std(0) / math.sqrt(cm.shape[0]), cm.shape[0]


def t_bound(se: torch.Tensor, chains: int, count: int) -> torch.Tensor:
    return float(stats.t.ppf(1 - ALPHA / (2 * count), chains - 1)) * se


# Fixed-Gamma PIMC settings. P = 8, not more: single-spin moves relax a worldline by kink diffusion, in
# ~P^2 sweeps, so from random spins P = 32 needs > 2000 sweeps (measured bias 0.27 after 300 sweeps),
# while P = 8 is equilibrated after 300 for this instance (bias < 0.01 at 600; a more strongly coupled
# one, |J| ~ 1, still showed 0.07 after 300 and needed ~1000). Its Trotter error here is 1.6e-3 (checked
# exactly below), covered by TROTTER = 5e-3.
GAMMA, SLICES, SWEEPS, TROTTER = 0.7, 8, 300, 5e-3
PIMC = dict(sweeps=SWEEPS, trotter_slices=SLICES, gamma_start=GAMMA, gamma_end=GAMMA, beta=1.0)


def test_fixed_gamma_matches_transverse_field_thermal_state():
    h, J = random_problem(3, 0, 0.5, 0.5)
    exact = quantum_marginals(h, J, GAMMA, 1.0)
    trotter, neighbour = trotter_moments(h, J, GAMMA, 1.0, SLICES)
    assert (trotter - exact).abs().max() < TROTTER  # the finite-P target is the continuum one, up to TROTTER
    chains = 8000
    spins = sqa_draw(h[None], J[None], None, SLICES * chains, gen(1), **PIMC)[0]
    estimate, se, C = chain_estimate(spins, SLICES)
    bound = t_bound(se, C, 6)
    assert ((estimate - exact).abs() <= bound + TROTTER).all(), (estimate - exact, bound)
    # imaginary-time structure: s_j^k s_j^{k+1}, averaged over the P neighbour pairs of a chain (ring)
    paths = spins.reshape(chains, SLICES, 3)
    pairs = (paths * paths.roll(-1, 1)).reshape(-1, 3)
    estimate_pairs, se_pairs, _ = chain_estimate(pairs, SLICES)
    assert ((estimate_pairs - neighbour).abs() <= t_bound(se_pairs, C, 6)).all(), (estimate_pairs - neighbour)
    # ... and the quantum effect is resolved: the classical Boltzmann marginals (what a sampler ignoring
    # Gamma would give) differ by up to 0.07 and fail the same test
    classical = reference.marginals(h, J)
    assert (classical - exact).abs().max() > 0.06
    assert ((estimate - classical).abs() > bound + TROTTER).any(), (estimate - classical, bound)


def test_low_temperature_anneal_finds_ground_state():
    h, J = random_problem(6, 2, 0.5, 1.0)  # instance with a unique ground state, gap 1.9 to the next level
    conf = reference.configurations(6)
    energy, order = (-reference.negative_energies(h, J, None, conf)).sort()
    assert energy[1] - energy[0] > 1.0
    spins = sqa_draw(h[None], J[None], None, 1024, gen(0), beta=10.0)[0]  # default schedule: 3 -> 0.05, P = 16
    hit = (spins == conf[order[0]]).all(-1).double().mean()
    assert hit >= 0.9, hit  # measured 0.96 .. 0.99 over 10 seeds; a uniform guess gives 1/64


def test_classical_limit_approaches_boltzmann():
    # beta = 1 and gamma_end = 0.05, weak couplings. P = 4 and 500 sweeps: with few slices the worldlines
    # keep mixing down to small Gamma (kink pairs cost 4 J_perp, which grows with P / (beta Gamma)), so the
    # chains freeze near Gamma ~ 0.3, where the quantum correction to <s_j> is ~0.02 (measured bias with
    # 20000 chains: <= 0.019). The defaults (P = 16, 200 sweeps) freeze earlier: bias up to 0.15 here.
    h, J = random_problem(4, 0, 0.5, 0.2)
    P, chains, freeze = 4, 8000, 0.03
    spins = sqa_draw(h[None], J[None], None, P * chains, gen(3), sweeps=500, trotter_slices=P, gamma_end=0.05)[0]
    estimate, se, C = chain_estimate(spins, P)
    exact = reference.marginals(h, J)
    assert ((estimate - exact).abs() <= t_bound(se, C, 4) + freeze).all(), (estimate - exact, se)


def test_absent_spins_are_zero_and_inert():
    h3, J3 = random_problem(3, 0, 0.5, 0.5)
    keep = [0, 2, 3]  # spin 1 of the 4-spin system gets a strong field and strong couplings, then is masked
    h4 = torch.full((4,), 3.0, dtype=DT)
    J4 = torch.full((4, 4), 2.0, dtype=DT)
    h4[keep] = h3
    J4[np.ix_(keep, keep)] = J3
    J4.fill_diagonal_(0.0)
    mask = torch.tensor([[True, False, True, True], [True, True, True, True]])
    chains = 2000
    spins = sqa_draw(h4.expand(2, 4), J4[None], mask, SLICES * chains, gen(4), **PIMC)
    assert (spins[0, :, 1] == 0).all() and (spins[1].abs() == 1).all()
    exact = quantum_marginals(h3, J3, GAMMA, 1.0)
    alone = sqa_draw(h3[None], J3[None], None, SLICES * chains, gen(5), **PIMC)[0]
    for sample in (spins[0][:, keep], alone):
        estimate, se, C = chain_estimate(sample, SLICES)
        assert ((estimate - exact).abs() <= t_bound(se, C, 6) + TROTTER).all(), (estimate - exact, se)
    # the same spin, present, moves the others a lot (so the check above can fail)
    full, _, _ = chain_estimate(spins[1][:, keep], SLICES)
    assert (full - exact).abs().max() > 0.3
    m = sqa_marginals(h4.expand(2, 4), J4, None, mask, num_samples=64, sweeps=10, seed=0)
    assert m.shape == (2, 4) and m[0, 1] == 0


def test_options_are_validated():
    h, J = random_problem(3, 0, 0.5, 0.5)
    with pytest.raises(ValueError, match="pairwise.*exact.*reference"):
        sqa_marginals(h, J, torch.zeros(3, 3, 3, dtype=DT))
    bad = [(dict(sweeps=0), "sweeps must be an integer >= 1"), (dict(sweeps=2.0), "sweeps"),
           (dict(trotter_slices=3), "trotter_slices must be even"), (dict(trotter_slices=0), "trotter_slices"),
           (dict(gamma_start=0.0), "gamma_start must be a finite number > 0"),
           (dict(gamma_end=-1.0), "gamma_end"), (dict(gamma_end=math.nan), "gamma_end"),
           (dict(beta=math.inf), "beta must be a finite number > 0"), (dict(beta=True), "beta"),
           (dict(gradient="exact"), "unknown gradient"), (dict(num_samples=0), "num_samples")]
    for options, message in bad:
        with pytest.raises(ValueError, match=message):
            ising.marginals(h, J, method="sqa", **options)
    with pytest.raises(ValueError, match="trotter_slices must be even"):
        sqa_draw(h[None], J[None], None, 4, gen(0), trotter_slices=5)
    with pytest.raises(ValueError, match="either seed or generator"):
        sqa_marginals(h, J, seed=0, generator=gen(0))
    with pytest.raises(ValueError, match="log Z"):
        ising.log_partition(h, J, method="sqa")


def test_seeds_reproducible_and_draw_shape():
    h, J = random_problem(4, 1, 0.5, 0.5)
    options = dict(num_samples=10, sweeps=15, trotter_slices=4)  # 3 chains of 4 slices, 10 samples kept
    a = sqa_marginals(h, J, seed=7, **options)
    assert torch.equal(a, sqa_marginals(h, J, seed=7, **options))
    assert torch.equal(a, sqa_marginals(h, J, generator=gen(7), **options))
    assert not torch.equal(a, sqa_marginals(h, J, seed=8, **options))
    spins = sqa_draw(h.float().expand(2, 4), J.float()[None], None, 10, gen(0), sweeps=3, trotter_slices=4)
    assert spins.shape == (2, 10, 4) and spins.dtype == torch.float32 and (spins.abs() == 1).all()


def test_dispatch_broadcast_and_covariance_gradients():
    h, J = random_problem(4, 1, 0.5, 0.5)
    h = (h + torch.randn(2, 3, 4, generator=gen(2), dtype=DT)).requires_grad_()
    J = J.clone().requires_grad_()
    m = ising.marginals(h, J, method="sqa", seed=0, num_samples=64, sweeps=30, gradient="covariance")
    assert m.shape == (2, 3, 4) and (m.abs() <= 1).all()
    (m * torch.arange(4, dtype=DT)).sum().backward()
    assert torch.isfinite(h.grad).all() and h.grad.abs().sum() > 0
    assert torch.isfinite(J.grad).all() and J.grad.abs().sum() > 0
    assert torch.allclose(J.grad, J.grad.T) and (J.grad.diagonal() == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda():
    h, J = random_problem(4, 1, 0.5, 0.5)
    h, J = h.float().cuda(), J.float().cuda()
    mask = torch.tensor([True, True, False, True], device="cuda")
    m = sqa_marginals(h, J, None, mask, num_samples=32, sweeps=10, seed=0)
    assert m.device.type == "cuda" and m.shape == (4,) and m[2] == 0
    spins = sqa_draw(h[None], J[None], mask[None], 32, torch.Generator(device="cuda").manual_seed(0), sweeps=5)
    assert spins.device.type == "cuda" and (spins[..., 2] == 0).all() and (spins[..., [0, 1, 3]].abs() == 1).all()
