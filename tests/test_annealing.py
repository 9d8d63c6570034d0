"""Tests for ising.annealing: Trotterised DQA against an independent Schrodinger solution and limits."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import scipy.linalg
import torch

from boltzmann_attention.ising import annealing, reference
from boltzmann_attention.ising.annealing import (
    anneal_distribution,
    dqa_draw,
    dqa_exact_marginals,
    dqa_marginals,
    schedule_values,
)

DT = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_problem(n: int, seed: int, scale: float = 1.0, batch: tuple = ()):
    g = gen(seed)
    h = torch.randn(*batch, n, generator=g, dtype=DT) * scale
    W = torch.randn(n, n, generator=g, dtype=DT).triu(1) * scale
    return h, W + W.T


def schrodinger(h: np.ndarray, J: np.ndarray, anneal_time_ns: float, schedule: str) -> np.ndarray:
    """|psi(T)|^2 from an adaptive Runge-Kutta (DOP853) solution of i dpsi/dt = 2 pi H(t/T) psi.

    H = -A/2 sum_j X_j + B/2 H_P built from Kronecker products of Pauli matrices; basis index bit j is
    qubit j (np.kron puts the last factor on the lowest bit) and bit 1 means s_j = +1, so Z = diag(-1, 1).
    """
    solve_ivp = pytest.importorskip("scipy.integrate").solve_ivp

    n = len(h)
    X = np.array([[0.0, 1.0], [1.0, 0.0]])
    Z = np.diag([-1.0, 1.0])

    def op(single, j):
        out = np.eye(1)
        for q in reversed(range(n)):
            out = np.kron(out, single if q == j else np.eye(2))
        return out

    SX = sum(op(X, j) for j in range(n))
    HP = -sum(h[j] * op(Z, j) for j in range(n))
    for j in range(n):
        for k in range(j + 1, n):
            HP = HP - J[j, k] * op(Z, j) @ op(Z, k)

    def rhs(t, psi):
        a, b = schedule_values(schedule, np.array([t / anneal_time_ns]))
        return -2j * math.pi * ((-a[0] / 2) * (SX @ psi) + (b[0] / 2) * (HP @ psi))

    psi0 = np.full(2**n, 2 ** (-n / 2), dtype=complex)
    sol = solve_ivp(rhs, (0.0, anneal_time_ns), psi0, method="DOP853", rtol=1e-10, atol=1e-12)
    return np.abs(sol.y[:, -1]) ** 2


@pytest.mark.parametrize("n, scale, anneal_time_ns, schedule, steps, at_middle", [
    (4, 1.0, 1.0, "dwave_quadratic", (50, 200, 800), 1e-2),  # diabatic: max p ~ 0.83
    (4, 0.5, 5.0, "linear", (200, 800, 3200), 1e-3),  # the defaults (5 ns, linear)
])
def test_trotter_converges_to_schrodinger(n, scale, anneal_time_ns, schedule, steps, at_middle):
    h, J = random_problem(n, 0, scale)
    exact = schrodinger(h.numpy(), J.numpy(), anneal_time_ns, schedule)
    errors = []
    for s in steps:
        p = anneal_distribution(h, J, anneal_time_ns=anneal_time_ns, trotter_steps=s, schedule=schedule)
        assert p.dtype == DT and p.shape == (2**n,)
        assert abs(float(p.sum()) - 1.0) < 1e-12
        errors.append(float((p - torch.from_numpy(exact)).abs().max()))
    assert errors[1] < at_middle
    # first-order splitting: error ~ 1/steps at least, so 4x the steps gives at least ~4x less error
    assert errors[0] > errors[1] > errors[2]
    assert errors[0] / errors[1] > 2.5 and errors[1] / errors[2] > 2.5


def test_lanl_single_qubit_reference():
    """QuantumAnnealing.jl test: one spin, D-Wave h = +1 (ours h = -1), 1 ns, AS_DW_QUADRATIC.

    Their density matrix has 0.0162536 on |up> (Z = +1, our s = +1) and 0.983746 on |down>.
    """
    target = 0.0162536
    errors = []
    for steps in (500, 2000):
        p = anneal_distribution(torch.tensor([-1.0], dtype=DT), anneal_time_ns=1.0, trotter_steps=steps,
                                schedule="dwave_quadratic")
        errors.append(abs(float(p[1]) - target))
    assert errors[1] < 1e-4 and errors[0] / errors[1] > 3


def test_schedules():
    a, b = schedule_values("dwave_quadratic", np.array([0.0, 0.5, 0.6899, 0.69, 1.0]))
    assert a[0] == pytest.approx(6.366401) and b[-1] == pytest.approx(14.55571) and b[0] == 0.0
    assert 0 <= a[2] < 1e-3 and a[3] == 0.0 and a[4] == 0.0
    a, b = schedule_values("linear", np.array([0.0, 0.25, 1.0]), a_max_ghz=2.0, b_max_ghz=4.0)
    assert a.tolist() == [2.0, 1.5, 0.0] and b.tolist() == [0.0, 1.0, 4.0]
    a, b = schedule_values("dwave_quadratic", np.array([0.0, 1.0]), a_max_ghz=1.0, b_max_ghz=2.0)
    assert a[0] == pytest.approx(1.0) and b[1] == pytest.approx(2.0)


def test_mixer_matches_dense_exponential_and_walsh_hadamard_form():
    """exp(i theta sum_j X_j) in blocks of 4 bits = scipy's dense expm = W D W / 2^n (W the Hadamard)."""
    X = np.array([[0.0, 1.0], [1.0, 0.0]])
    H1 = np.array([[1.0, 1.0], [1.0, -1.0]])
    for n in (1, 5, 9):  # whole 4-bit blocks plus a remainder block
        theta = 0.37 + 0.1 * n
        x = torch.randn(3, 2**n, dtype=torch.complex128, generator=gen(n))
        sizes = [min(4, n - d) for d in range(0, n, 4)]
        blocks = [annealing._rotations(np.array([theta]), k, "cpu")[0] for k in sizes]
        got = annealing._mix(x, blocks)
        sum_x = sum(np.kron(np.kron(np.eye(2**(n - 1 - j)), X), np.eye(2**j)) for j in range(n))
        dense = torch.from_numpy(scipy.linalg.expm(1j * theta * sum_x))
        assert torch.allclose(got, x @ dense.T, atol=1e-12)
        W = np.ones((1, 1))
        for _ in range(n):
            W = np.kron(H1, W)
        x_eigen = n - 2 * np.array([bin(c).count("1") for c in range(2**n)])
        hadamard_form = W @ np.diag(np.exp(1j * theta * x_eigen)) @ W / 2**n
        assert np.allclose(hadamard_form, dense.numpy(), atol=1e-12)


def test_batching_and_energy_scale():
    n = 3
    h, J = random_problem(n, 1, 0.7, batch=(2, 3))
    Jb = torch.stack([J, 0.5 * J])[:, None]  # (2, 1, n, n), broadcasts against h (2, 3, n)
    p = anneal_distribution(h, Jb, trotter_steps=60)
    assert p.shape == (2, 3, 2**n)
    for i in range(2):
        for k in range(3):
            one = anneal_distribution(h[i, k], Jb[i, 0], trotter_steps=60)
            assert torch.allclose(p[i, k], one, atol=1e-12)
    scaled = anneal_distribution(h, J, trotter_steps=60, energy_scale=2.0)
    assert torch.allclose(scaled, anneal_distribution(2 * h, 2 * J, trotter_steps=60), atol=1e-12)


def test_adiabatic_limit_ends_in_ground_state():
    h = torch.tensor([0.6, -0.4, 0.3], dtype=DT)
    J = torch.tensor([[0.0, 0.5, -0.3], [0.5, 0.0, 0.4], [-0.3, 0.4, 0.0]], dtype=DT)
    energies = -reference.negative_energies(h, J, None, reference.configurations(3))
    ground = int(energies.argmin())
    assert (energies.sort().values[1] - energies.min()) > 0.15  # unique, gapped
    p = anneal_distribution(h, J, anneal_time_ns=50.0, trotter_steps=4000)
    assert float(p[ground]) > 0.9


def test_instantaneous_limit_is_uniform():
    h, J = random_problem(4, 2, 2.0)
    p = anneal_distribution(h, J, anneal_time_ns=1e-7, trotter_steps=10)
    assert torch.allclose(p, torch.full_like(p, 1 / 16), atol=1e-6)


def test_sign_convention():
    """E = -h.s - J s s: a strong positive field favours s = +1, positive J favours alignment."""
    slow = dict(anneal_time_ns=20.0, trotter_steps=1000)
    h = torch.tensor([2.0, -2.0, 0.0], dtype=DT)
    m = dqa_exact_marginals(h, None, None, None, **slow)
    assert m[0] > 0.98 and m[1] < -0.98 and abs(float(m[2])) < 1e-9
    J = torch.zeros(3, 3, dtype=DT)
    J[0, 2] = J[2, 0] = 1.5  # ferromagnetic in our convention: s_2 follows s_0 = +1
    m = dqa_exact_marginals(h, J, None, None, **slow)
    assert m[2] > 0.95
    p = anneal_distribution(h, J, **slow)
    assert int(p.argmax()) == 0b101  # s = (+1, -1, +1)


def test_masked_equals_smaller_system():
    h, J = random_problem(5, 3, 0.8, batch=(2,))
    mask = torch.tensor([[True, False, True, True, False], [True, True, True, True, True]])
    m = dqa_exact_marginals(h, J, None, mask, trotter_steps=100)
    keep = [0, 2, 3]
    small = dqa_exact_marginals(h[0, keep], J[keep][:, keep], None, None, trotter_steps=100)
    assert torch.allclose(m[0, keep], small, atol=1e-10)
    assert (m[0, [1, 4]] == 0).all()
    assert torch.allclose(m[1], dqa_exact_marginals(h[1], J, None, None, trotter_steps=100), atol=1e-12)


def test_sampled_marginals_match_exact():
    h, J = random_problem(5, 4, 0.6, batch=(3,))
    mask = torch.tensor([[True] * 5, [True, True, False, True, True], [False, True, True, True, False]])
    S = 4000
    exact = dqa_exact_marginals(h, J, None, mask, anneal_time_ns=1.0)
    sampled = dqa_marginals(h, J, None, mask, num_samples=S, seed=0, anneal_time_ns=1.0)
    assert sampled.shape == h.shape
    assert (sampled[~mask] == 0).all() and (exact[~mask] == 0).all()
    assert (sampled - exact).abs().max() < 5 / math.sqrt(S)
    again = dqa_marginals(h, J, None, mask, num_samples=S, generator=gen(0), anneal_time_ns=1.0)
    assert torch.equal(sampled, again)


def test_draw_contract():
    h, J = random_problem(4, 5, 0.5, batch=(3,))
    spins = dqa_draw(h.float(), J.float()[None], None, 7, gen(1), trotter_steps=20)
    assert spins.shape == (3, 7, 4) and spins.dtype == torch.float32
    assert ((spins == 1) | (spins == -1)).all()
    shared = dqa_draw(h, J[None], None, 50, gen(2), trotter_steps=20)
    per_query = dqa_draw(h, J.expand(3, 4, 4), None, 50, gen(2), trotter_steps=20)
    assert torch.equal(shared, per_query)


def test_errors():
    h, J = random_problem(3, 6)
    with pytest.raises(ValueError, match="n <= 16"):
        anneal_distribution(torch.zeros(17, dtype=DT))
    with pytest.raises(ValueError, match="exact"):
        dqa_marginals(torch.zeros(2, 17, dtype=DT), None, None, None)
    bad = [dict(anneal_time_ns=0.0), dict(anneal_time_ns=-1.0), dict(anneal_time_ns=float("nan")),
           dict(trotter_steps=0), dict(trotter_steps=2.5), dict(a_max_ghz=-1.0), dict(b_max_ghz=float("inf")),
           dict(schedule="cubic"), dict(schedule=lambda s: (1 - s, s - 0.5)), dict(energy_scale=-1.0),
           dict(schedule=lambda s: (1 - s, s), a_max_ghz=1.0)]
    for options in bad:
        with pytest.raises(ValueError):
            anneal_distribution(h, J, **options)
    with pytest.raises(ValueError, match="unknown DQA option"):
        dqa_exact_marginals(h, J, None, None, steps=10)
    with pytest.raises(ValueError, match="pairwise"):
        dqa_marginals(h, J, torch.zeros(3, 3, 3, dtype=DT), None)
    with pytest.raises(ValueError, match="NaN"):
        anneal_distribution(torch.tensor([1.0, float("nan")], dtype=DT))
    with pytest.raises(ValueError, match="gradient"):
        dqa_marginals(h, J, None, None, gradient="exact")
    with torch.no_grad():
        dqa_exact_marginals(h.clone().requires_grad_(), J, None, None, trotter_steps=5)


def test_dqa_gradients_from_samples():
    """Through the method string, with the covariance estimator: finite, and zero for absent spins."""
    from boltzmann_attention import ising

    g = torch.Generator().manual_seed(0)
    h = (0.3 * torch.randn(2, 3, dtype=DT, generator=g)).requires_grad_()
    mask = torch.tensor([[True, True, False], [True, True, True]])
    m = ising.marginals(h, None, mask=mask, method="dqa", num_samples=200, seed=1, trotter_steps=50)
    (grad,) = torch.autograd.grad((m * torch.randn(2, 3, dtype=DT, generator=g)).sum(), h)
    assert torch.isfinite(grad).all() and grad[0, 2] == 0


@pytest.mark.parametrize("per_query_J", [False, True])
def test_masked_distribution_equals_full_width_with_absent_spins_zeroed(per_query_J):
    """Rows simulated on their present spins (grouped by width, n = 8 > the padded width 6) against the
    full-width simulation with the absent spins' field and couplings zeroed: the same probabilities over all
    2^n states, absent spins uniform."""
    n = 8
    h, J = random_problem(n, 4, 0.6, batch=(6,))
    if per_query_J:
        J = torch.stack([random_problem(n, 10 + q, 0.6)[1] for q in range(6)])
    mask = torch.tensor([[1, 0, 1, 1, 0, 1, 1, 1], [1] * 8, [0] * 8, [0, 1, 1, 1, 1, 1, 1, 1],
                         [1, 0, 1, 0, 0, 0, 0, 0], [1, 0, 1, 1, 0, 1, 1, 1]], dtype=torch.bool)
    p = anneal_distribution(h, J, mask=mask, trotter_steps=40)
    m = mask.to(DT)
    for q in range(6):
        Jq = (J[q] if per_query_J else J) * m[q][:, None] * m[q][None, :]
        full = anneal_distribution(h[q] * m[q], Jq, trotter_steps=40)
        assert torch.allclose(p[q], full, atol=1e-12), q
    assert torch.allclose(p[2], torch.full((2 ** n,), 2.0 ** -n, dtype=DT))


# ------------------------------------------------------------------- effective temperature and calibration

def test_fit_beta_recovers_planted_boltzmann_distributions():
    """p = exp(-beta E) / Z for planted betas (hot, cold, negative): the fit returns beta with KL ~ 0."""
    g = gen(20)
    E = 2.0 * torch.randn(4, 32, dtype=DT, generator=g)
    planted = torch.tensor([-0.7, 0.05, 1.0, 3.5], dtype=DT)
    p = torch.softmax(-planted[:, None] * E, -1)
    fit = annealing.fit_beta(p, E)
    assert torch.allclose(fit.beta, planted, rtol=1e-9, atol=1e-10)
    assert (fit.kl < 1e-12).all()


def test_fit_beta_minimises_the_kl_against_a_grid_search():
    """Non-Boltzmann p: the fitted beta's KL is the minimum of a brute-force numpy grid of KL(p || p_beta)."""
    rng = np.random.default_rng(21)
    for _ in range(3):
        E = rng.normal(size=16) * 1.5
        p = rng.dirichlet(np.ones(16) * 0.5)
        betas = np.linspace(-5, 5, 100001)
        logits = -betas[:, None] * E[None]
        log_q = logits - np.logaddexp.reduce(logits, axis=1)[:, None]
        kl = (p[None] * (np.log(p)[None] - log_q)).sum(1)
        fit = annealing.fit_beta(torch.from_numpy(p), torch.from_numpy(E))
        assert abs(float(fit.beta) - betas[kl.argmin()]) < 2e-4
        assert float(fit.kl) <= kl.min() + 1e-12 and float(fit.kl) == pytest.approx(kl.min(), abs=1e-8)
        q = torch.softmax(-fit.beta * torch.from_numpy(E), -1)  # moment matching: <E>_beta = <E>_p
        assert float(q @ torch.from_numpy(E)) == pytest.approx(float(p @ E), abs=1e-10)


def test_fit_beta_limits_and_errors():
    E = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]], dtype=DT)
    p = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]], dtype=DT)
    fit = annealing.fit_beta(p, E, max_beta=50.0)
    assert float(fit.beta[0]) == pytest.approx(50.0, rel=1e-9)  # ground state only: as cold as allowed
    assert float(fit.beta[1]) == 0.0  # constant energy: every beta alike
    assert float(fit.kl[1]) == pytest.approx(float((p[1] * (p[1] * 3).log()).sum()), abs=1e-12)
    for bad in (dict(probabilities=p[:, :2], energies=E), dict(probabilities=-p, energies=E),
                dict(probabilities=p * 2, energies=E), dict(probabilities=p, energies=E * float("nan")),
                dict(probabilities=p, energies=E, max_beta=0.0)):
        with pytest.raises(ValueError):
            annealing.fit_beta(**bad)


def test_effective_beta_closed_forms():
    """One spin, and independent spins of one field: every distribution of theirs is Boltzmann, with
    beta = atanh(<s>) / h from the simulated marginal; KL 0. Masked = the smaller system."""
    options = dict(anneal_time_ns=1.0, trotter_steps=100)
    h = torch.tensor([[0.8], [-0.3]], dtype=DT)
    fit = annealing.effective_beta(h, **options)
    m = dqa_exact_marginals(h, None, None, None, **options)
    assert torch.allclose(fit.beta, torch.atanh(m[:, 0]) / h[:, 0], rtol=1e-9)
    assert (fit.kl < 1e-12).all()
    same = torch.full((3,), 0.6, dtype=DT)
    fit = annealing.effective_beta(same, torch.zeros(3, 3, dtype=DT), **options)
    m = dqa_exact_marginals(same, None, None, None, **options)
    assert float(fit.beta) == pytest.approx(float(torch.atanh(m[0]) / 0.6), rel=1e-9) and float(fit.kl) < 1e-12
    h, J = random_problem(5, 22, 0.5, batch=(2,))
    mask = torch.tensor([[True, False, True, True, False], [True] * 5])
    fit = annealing.effective_beta(h, J, mask=mask, **options)
    keep = [0, 2, 3]
    small = annealing.effective_beta(h[0, keep], J[keep][:, keep], **options)
    assert fit.beta.shape == (2,) and float(fit.beta[0]) == pytest.approx(float(small.beta), rel=1e-8)
    assert float(fit.kl[0]) == pytest.approx(float(small.kl), rel=1e-6, abs=1e-14)


def test_effective_beta_is_linear_in_the_energy_scale_when_hot():
    """Fast-quench end: beta_eff -> 0 with the energy scale, proportionally (the high-temperature regime)."""
    h, J = random_problem(4, 23, 0.5, batch=(3,))
    b1 = annealing.effective_beta(h, J, energy_scale=1e-3).beta
    b2 = annealing.effective_beta(h, J, energy_scale=2e-3).beta
    assert (b1 > 0).all() and torch.allclose(b2 / b1, torch.full_like(b1, 2.0), rtol=1e-2)


FAST = dict(trotter_steps=50)  # cheap anneals for the calibration's contract tests


def test_calibration_is_the_minimum_and_cached():
    small = dict(sizes=(3,), num_systems=4, **FAST)
    annealing._calibrated_scale.cache_clear()
    c = annealing.calibrate_energy_scale(1.0, **small)
    assert annealing.calibrate_energy_scale(1.0, **small) == c
    assert annealing._calibrated_scale.cache_info().hits == 1
    systems = [annealing.calibration_systems(3, 4, **{k: annealing.CALIBRATION_SYSTEMS[k] for k in
                                                      ("field_mean", "field_std", "coupling_std", "seed")})]
    at = annealing.calibration_objective(c, systems=systems, **FAST)
    for factor in (0.97, 1.03):
        assert at <= annealing.calibration_objective(c * factor, systems=systems, **FAST)
    assert annealing.calibrate_energy_scale(2.0, **small) > c  # colder: a larger scale


def test_target_beta_uses_the_calibrated_scale():
    h, J = random_problem(4, 24, 0.5, batch=(2,))
    c = annealing.calibrate_energy_scale(1.0, **FAST)
    p = anneal_distribution(h, J, target_beta=1.0, **FAST)
    assert torch.equal(p, anneal_distribution(h, J, energy_scale=c, **FAST))
    m = dqa_marginals(h, J, None, None, num_samples=50, seed=0, target_beta=1.0, **FAST)
    assert torch.equal(m, dqa_marginals(h, J, None, None, num_samples=50, seed=0, energy_scale=c, **FAST))
    from boltzmann_attention import ising
    m = ising.marginals(h, J, method="dqa", num_samples=50, seed=0, target_beta=1.0, **FAST)
    assert torch.equal(m, dqa_marginals(h, J, None, None, num_samples=50, seed=0, energy_scale=c, **FAST))
    with pytest.raises(ValueError, match="not both"):
        anneal_distribution(h, J, target_beta=1.0, energy_scale=1.0)
    with pytest.raises(ValueError, match="not both"):
        ising.marginals(h, J, method="dqa", target_beta=1.0, energy_scale=0.1)
    for bad in (dict(target_beta=0.0), dict(target_beta=-1.0), dict(target_beta=float("inf")),
                dict(energy_scale=0.1), dict(target_beta=1.0, sizes=()), dict(sizes=(17,)), dict(num_systems=0),
                dict(field_std=-1.0), dict(coupling_std=float("nan")), dict(trotter_steps=0), dict(steps=3)):
        with pytest.raises(ValueError):
            annealing.calibrate_energy_scale(**bad)


def test_calibrated_dqa_is_near_boltzmann_on_held_out_systems():
    """At the default anneal (5 ns, 200 steps), DQA at the calibrated scale against exp(-E) on systems of the
    calibration's distribution with another seed (measured: beta_eff 0.95..1.07, KL to exp(-E) 0.0002..0.016
    at n = 4..8)."""
    c = annealing.calibrate_energy_scale(1.0)
    s = annealing.CALIBRATION_SYSTEMS
    for n in (4, 6):
        h, J = annealing.calibration_systems(n, 8, s["field_mean"], s["field_std"], s["coupling_std"], seed=7)
        fit = annealing.effective_beta(h, J, energy_scale=c)
        assert (fit.beta - 1.0).abs().max() < 0.1 and fit.kl.max() < 0.03
        p = anneal_distribution(h, J, energy_scale=c)
        kl_to_boltzmann = (p * (p.log() - torch.log_softmax(-annealing._energies(h, J, None), -1))).sum(-1)
        assert kl_to_boltzmann.max() < 0.04
        assert torch.allclose(annealing.boltzmann_kl(h, J, energy_scale=c), kl_to_boltzmann, atol=1e-12)


BAD_DQA_OPTIONS = [dict(target_beta=1.0, energy_scale=0.1), dict(target_beta=0.0), dict(target_beta=float("nan")),
                   dict(target_beta=True), dict(energy_scale=-1.0), dict(anneal_time_ns=0.0), dict(trotter_steps=2.5),
                   dict(schedule="cubic"), dict(a_max_ghz=-1.0), dict(schedule=lambda s: (1 - s, s), b_max_ghz=1.0),
                   dict(gradient="exact"), dict(num_samples=0), dict(nudge=0.0), dict(seed=1.5),
                   dict(seed=0, generator=torch.Generator())]


@pytest.mark.parametrize("options", BAD_DQA_OPTIONS, ids=lambda o: ",".join(o))
def test_validate_options_refuses_what_dqa_would(options):
    """ising.validate_options('dqa', ...) raises the error dqa_marginals raises at its first call, without
    annealing or calibrating anything (so BoltzmannAttention refuses the option when it is built)."""
    from boltzmann_attention import BoltzmannAttention, ising

    h, J = random_problem(3, 7)
    with pytest.raises(ValueError) as at_call:
        dqa_marginals(h, J, None, None, **{"trotter_steps": 5, **options})
    annealing._calibrated_scale.cache_clear()
    with pytest.raises(ValueError) as at_validation:
        ising.validate_options("dqa", options)
    assert str(at_validation.value) == str(at_call.value)
    assert annealing._calibrated_scale.cache_info().misses == 0
    with pytest.raises(ValueError, match=re.escape(str(at_call.value)[:40])):
        BoltzmannAttention(embed_dim=8, num_heads=1, max_len=4, mode="h+J", method="dqa", method_options=options)


def test_validate_options_accepts_the_training_settings():
    from boltzmann_attention import ising

    for gradient in ("ste", "covariance", "nudged"):
        ising.validate_options("dqa", dict(target_beta=1.0, gradient=gradient, num_samples=100))
    ising.validate_options("dqa", dict(energy_scale=0.0345, trotter_steps=800, schedule="dwave_quadratic", seed=3))
    ising.validate_options("dqa", {})


@pytest.mark.parametrize("gap", [1e-3, 1.0, 100.0, 1e4])
@pytest.mark.parametrize("beta", [5.0, -5.0, 0.01])
def test_fit_beta_two_levels_at_any_gap(gap, beta):
    """Two levels: p_1 / p_0 = exp(-beta gap), so beta = log(p_0 / p_1) / gap in closed form, as long as p_1 is
    representable; past that p is a point mass, colder (or hotter) than every beta: +-max_beta."""
    E = torch.tensor([3.0, 3.0 + gap], dtype=DT)
    p = torch.softmax(-beta * E, -1)
    fit = annealing.fit_beta(p, E)
    if bool((p > 0).all()):
        expected = float(torch.log(p[0] / p[1]) / gap)
        assert float(fit.beta) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    else:
        assert float(fit.beta) == math.copysign(1e3, beta)
    assert float(fit.kl) < 1e-12


@pytest.mark.parametrize("systems", [dict(field_mean=0.0, field_std=0.0, coupling_std=0.0, sizes=(4,)),
                                     dict(field_mean=0.0, field_std=0.0, coupling_std=0.5, sizes=(1,))])
def test_calibration_systems_without_energy_are_named_as_the_cause(systems):
    """E = 0 everywhere makes the KL flat in the scale: the error blamed the anneal ('smallest at the edge')."""
    with pytest.raises(ValueError, match="same at every energy scale.*no energy to scale"):
        annealing.calibrate_energy_scale(num_systems=2, **systems)
