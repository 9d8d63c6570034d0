"""Simulated diabatic quantum annealing (DQA): statevector, first-order Trotter, batched over queries.

Hamiltonian (D-Wave's form, docs/design.md "Samplers"), time t in ns, energies in GHz, s = t / t_anneal::

    H(s) = -A(s)/2 sum_j X_j + B(s)/2 H_P,     H_P = -sum_j h_j Z_j - sum_{j<k} J_jk Z_j Z_k,

so H_P is diagonal with entries E(z), the package's energy (E = -h.s - s.J.s/2) times
``energy_scale``. Z_j |z> = s_j |z> with s_j = +1 where bit j of the basis index is 1 (the order of
``enumeration.configurations``). The state starts in |+>^n, the ground state of -sum_j X_j, and follows
i d/dt psi = 2 pi H psi: A and B are frequencies in GHz, times are in ns, and 2 pi turns GHz * ns into
radians (``TWO_PI`` below; hbar = 1).

Trotter step k = 0..steps-1, dt = t_anneal / steps, at the midpoint s_k = (k + 1/2) / steps::

    psi <- exp(+i 2 pi dt A(s_k)/2 sum_j X_j) exp(-i 2 pi dt B(s_k)/2 E_P) psi.

The problem phase is diagonal (E_P over the 2^n basis states is built once per query). The mixer is a
product of one-spin rotations, exp(i theta sum_j X_j) = (x)_j R(theta) with R = cos(theta) 1 + i sin(theta) X
(theta = 2 pi dt A/2), so it is applied in blocks of 4 index bits: one (Q 2^n / 16, 16) x (16, 16) complex
GEMM with R^(x)4 per block, after which the bits are rotated so the next block is lowest (n bits of
rotation in all restore the order). O(n 2^n) per step and query, like a fast Walsh-Hadamard transform
(the mixer is diagonal in the Hadamard basis, W D W / 2^n; the tests check both forms against expm), but
in 2 GEMM passes at n = 8 instead of 4. The error of the first-order splitting is O(dt) globally: check
convergence against 2x or 4x the steps.

Step size: the problem phase is only known modulo 2 pi, so energies that differ by 2 / (dt B(s)) look alike
to the Trotterised dynamics (aliasing). With the defaults (dt = 25 ps, B(1) = 14.56 GHz) that is an energy
spread max E - min E of about 5.5 (in units of h and J): beyond it, 200 steps are not an approximation of
the continuous anneal but a different (digitised) dynamics. Example, n = 4 with h, J ~ N(0, 1) (spread 11):
the max error in the probabilities is 0.99 at 200 steps and 3e-6 at 800. Scale h and J (``energy_scale``) or
raise ``trotter_steps`` accordingly.
The statevector is complex128; probabilities come back in float64 whatever h's dtype (accuracy over
speed). The simulation itself is not differentiable; ``dqa_marginals`` gets gradients from its samples.

Schedules return (A(s), B(s)) in GHz for an array of s in [0, 1]:

* ``linear``: A(s) = a_max (1 - s), B(s) = b_max s.
* ``dwave_quadratic``: LANL's ``AS_DW_QUADRATIC`` from QuantumAnnealing.jl, src/dwave.jl
  (github.com/lanl-ansi/QuantumAnnealing.jl), A(s) = 6.366401 (1.449275^2 s^2 - 2.898551 s + 1) for
  s < 0.69 and 0 after, B(s) = 14.55571 (0.85 s^2 + 0.15 s). It is an analytic approximation of
  D-Wave's published per-QPU schedule tables (LANL's docstring says "approximating those used in
  hardware by D-Wave Systems" and recommends the real per-QPU files; which QPU, and whether the
  standard or the fast-anneal table, is not stated). No real table is shipped here.

Both take ``a_max_ghz`` = A(0) and ``b_max_ghz`` = B(1); the defaults 6.366401 and 14.55571 GHz are
the end points of ``dwave_quadratic``, so ``linear`` has the D-Wave scale. ``dwave_quadratic`` with
other values is the same shape rescaled. A callable s -> (A, B) may be passed instead of a name.

Absent spins (mask False) have no field and no couplings: such a spin stays in |+> (an eigenstate of
its X term) and measures +-1 with probability 1/2 each, and the other spins evolve exactly as without
it. So rows are simulated on their present spins (padded to a small common width, see ``_simulate``) and
the absent ones are put back as uniform bits. The limit ``MAX_SPINS`` applies to the full width n,
present or not.

Boltzmann regime (Gyhm et al., arXiv:2409.18126; docs/design.md "Samplers"): a fast anneal, or a small energy scale,
leaves the state near uniform, with log p(s) linear in E(s) to first order: an effective inverse temperature.
``effective_beta`` fits it per system (the beta minimising KL(p_DQA || p_beta), p_beta proportional to
exp(-beta E)) and reports the KL left; ``calibrate_energy_scale`` finds the energy scale at which DQA is
closest to exp(-target_beta E) on random systems like those training produces, and ``target_beta=`` uses it.
At the defaults (5 ns, linear, 200 steps) that scale is about 0.034, not 1: at energy_scale 1 the anneal is
near-adiabatic (beta_eff of several units, far from Boltzmann). Measurements: report/dqa_calibration/.

Cost: about n/4 GEMM passes with 16 x 16 blocks plus one complex exponential per amplitude and step, per
query: O(n 2^n) a step, more than exact enumeration at the same n (timings: ``boltzmann-attention-bench``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ._inputs import check_inputs
from ._sampling import check_options, check_seed, resolve_generator, sampled_marginals
from .enumeration import configurations, negative_energies
from .record import Method, keyword_options

MAX_SPINS = 16
TWO_PI = 2.0 * math.pi  # GHz * ns -> radians: phase = 2 pi * frequency[GHz] * time[ns]
A_MAX_GHZ = 6.366401  # A(0) of LANL AS_DW_QUADRATIC
B_MAX_GHZ = 14.55571  # B(1) of LANL AS_DW_QUADRATIC
_STATE_ELEMENTS = 2**22  # amplitudes simulated at once (64 MiB of complex128)
_BLOCK_BITS = 4  # the mixer is applied as 16 x 16 rotations on 4 index bits at a time
_PADDED_WIDTH = 6  # mask patterns with at most this many present spins are simulated together, at this width

Schedule = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def linear(s: np.ndarray, a_max_ghz: float = A_MAX_GHZ, b_max_ghz: float = B_MAX_GHZ):
    """A(s) = a_max (1 - s), B(s) = b_max s, in GHz."""
    s = np.asarray(s, dtype=np.float64)
    return a_max_ghz * (1.0 - s), b_max_ghz * s


def dwave_quadratic(s: np.ndarray, a_max_ghz: float = A_MAX_GHZ, b_max_ghz: float = B_MAX_GHZ):
    """LANL AS_DW_QUADRATIC (QuantumAnnealing.jl src/dwave.jl), an approximation of D-Wave's schedules.

    A(s) = a_max (1.449275^2 s^2 - 2.898551 s + 1) for s < 0.69 else 0; B(s) = b_max (0.85 s^2 + 0.15 s)
    (GHz). With the defaults a_max = 6.366401, b_max = 14.55571 these are LANL's numbers.
    """
    s = np.asarray(s, dtype=np.float64)
    a = np.where(s < 0.69, 1.449275**2 * s**2 - 2.898551 * s + 1.0, 0.0)
    return a_max_ghz * np.maximum(a, 0.0), b_max_ghz * (0.85 * s**2 + 0.15 * s)


SCHEDULES: dict[str, Schedule] = {"linear": linear, "dwave_quadratic": dwave_quadratic}


def schedule_values(schedule: str | Schedule, s: np.ndarray, a_max_ghz: float | None = None,
                    b_max_ghz: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(A(s), B(s)) in GHz as float64 arrays, validated: finite and >= 0."""
    s = np.asarray(s, dtype=np.float64)
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; choose one of {sorted(SCHEDULES)} or pass a "
                             f"callable s -> (A(s), B(s)) in GHz")
        a_max = A_MAX_GHZ if a_max_ghz is None else a_max_ghz
        b_max = B_MAX_GHZ if b_max_ghz is None else b_max_ghz
        for name, value in (("a_max_ghz", a_max), ("b_max_ghz", b_max)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{name} must be a finite energy >= 0 (GHz), got {value!r}")
        a, b = SCHEDULES[schedule](s, float(a_max), float(b_max))
    elif callable(schedule):
        if a_max_ghz is not None or b_max_ghz is not None:
            raise ValueError("a_max_ghz / b_max_ghz apply to named schedules only; scale your callable instead")
        a, b = schedule(s)
    else:
        raise ValueError(f"schedule must be a name in {sorted(SCHEDULES)} or a callable, got {schedule!r}")
    a = np.broadcast_to(np.asarray(a, dtype=np.float64), s.shape)
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), s.shape)
    if not (np.isfinite(a).all() and np.isfinite(b).all()) or (a < 0).any() or (b < 0).any():
        raise ValueError("the schedule must give finite A(s) >= 0 and B(s) >= 0 (GHz) for s in [0, 1]")
    return a, b


def _check_options(anneal_time_ns, trotter_steps, energy_scale) -> None:
    if isinstance(anneal_time_ns, bool) or not isinstance(anneal_time_ns, (int, float)) \
            or not math.isfinite(anneal_time_ns) or anneal_time_ns <= 0:
        raise ValueError(f"anneal_time_ns must be a finite time > 0 (ns), got {anneal_time_ns!r}")
    if isinstance(trotter_steps, bool) or not isinstance(trotter_steps, int) or trotter_steps < 1:
        raise ValueError(f"trotter_steps must be an integer >= 1, got {trotter_steps!r}")
    if isinstance(energy_scale, bool) or not isinstance(energy_scale, (int, float)) \
            or not math.isfinite(energy_scale) or energy_scale < 0:
        raise ValueError(f"energy_scale must be a finite number >= 0, got {energy_scale!r}")


def _check_size(n: int) -> None:
    if n > MAX_SPINS:
        raise ValueError(
            f"method 'dqa' simulates a 2^n statevector and is limited to n <= {MAX_SPINS} spins (got n = {n}, "
            f"absent spins included). For Boltzmann marginals use method='exact' (n <= 24); for sampling "
            f"use 'gibbs' or 'pt'; for hardware annealing use ising.DimodSampler.")


# ---------------------------------------------------------------------------------------------- core

def _rotations(thetas: np.ndarray, bits: int, device) -> Tensor:
    """R(theta)^(x)bits for each theta: (steps, 2^bits, 2^bits) complex128, R = cos(theta) 1 + i sin(theta) X.

    Entry (r, c) is cos(theta)^(bits - d) (i sin(theta))^d with d = popcount(r xor c); symmetric.
    """
    theta = torch.as_tensor(thetas, dtype=torch.float64, device=device)
    one = torch.stack([torch.complex(torch.cos(theta), torch.zeros_like(theta)),
                       torch.complex(torch.zeros_like(theta), torch.sin(theta))], -1)  # (steps, 2): 1, X
    R = torch.stack([one, one.flip(-1)], -2)                                      # (steps, 2, 2)
    M = torch.ones(len(thetas), 1, 1, dtype=torch.complex128, device=device)
    for _ in range(bits):
        M = (M[:, :, None, :, None] * R[:, None, :, None, :]).reshape(len(thetas), 2 * M.shape[1], -1)
    return M


def _mix(psi: Tensor, blocks: list[Tensor]) -> Tensor:
    """Apply (x)_j R to (Q, 2^n) psi. Each block M = R^(x)k (2^k, 2^k) acts on the lowest k index bits,
    then the bits are rotated by k so the next block's are lowest; the blocks' k sum to n, which restores
    the order."""
    Q, C = psi.shape
    for M in blocks:
        size = M.shape[-1]
        psi = (psi.view(Q, C // size, size) @ M).transpose(1, 2).reshape(Q, C)
    return psi


def _problem_diagonal(h: Tensor, J: Tensor | None, spins: Tensor) -> Tensor:
    """E(z) for every basis state: (N, 2^n) float64 from h (N, n) and J (N or 1, n, n)."""
    n = h.shape[-1]
    energy = -(h @ spins.T)  # -sum_j h_j s_j
    if J is None:
        return energy
    chunk = max(1, _STATE_ELEMENTS // (spins.shape[0] * max(n, 1)))
    # -sum_{j<k} J_jk s_j s_k = -s.J.s / 2, (P, 2^n), through (P, 2^n, n) products in chunks
    coupling = torch.cat([-0.5 * ((spins @ J[i:i + chunk]) * spins).sum(-1) for i in range(0, J.shape[0], chunk)])
    return energy + coupling


def _simulate(h: Tensor, J: Tensor | None, mask: Tensor | None, anneal_time_ns: float, trotter_steps: int,
              schedule: str | Schedule, a_max_ghz: float | None, b_max_ghz: float | None,
              energy_scale: float) -> Tensor:
    """Final |psi(z)|^2, (N, 2^n) float64, from flat h (N, n), J (N or 1, n, n) or None, mask (N, n).

    An absent spin (no field, no coupling) stays in |+>, so a row with k present spins is simulated on
    width w >= k: its present spins first, then w - k absent ones, and p(z) = p_w(z_present, 0...) / 2^(n-w)
    exactly. Rows are grouped by w = max(k, _PADDED_WIDTH): small patterns share one simulation (the Python
    loop over Trotter steps costs more than their amplitudes), large ones get their own width. A causal
    window of n = 8 keys then needs 3.1x fewer amplitude updates than at full width.
    """
    _check_options(anneal_time_ns, trotter_steps, energy_scale)
    N, n = h.shape
    _check_size(n)
    options = (anneal_time_ns, trotter_steps, schedule, a_max_ghz, b_max_ghz, energy_scale)
    with torch.no_grad():
        h = h.detach().double()
        J = J.detach().double() if J is not None else None
        if mask is None or bool(mask.all()) or n <= _PADDED_WIDTH:
            if mask is not None:
                h = h * mask
                J = None if J is None else J * (mask[:, :, None] & mask[:, None, :])
            return _simulate_present(h, J, *options)
        patterns, inverse = torch.unique(mask, dim=0, return_inverse=True)
        widths = patterns.sum(1).clamp(min=_PADDED_WIDTH)
        z = torch.arange(1 << n, device=h.device)
        out = torch.empty(N, 1 << n, dtype=torch.float64, device=h.device)
        for w in widths.unique().tolist():
            group = (widths == w).nonzero().squeeze(1)                 # patterns simulated at width w
            local = torch.full((len(patterns),), -1, dtype=torch.long, device=h.device)
            local[group] = torch.arange(len(group), device=h.device)
            rows = (local[inverse] >= 0).nonzero().squeeze(1)
            which = local[inverse[rows]]                                # (R,) pattern of each row, in group
            # keys[p, i]: the key in slot i of pattern p (present keys first), valid[p, i]: slot is present
            present = patterns[group]
            keys = torch.argsort((~present).to(torch.int8), dim=1, stable=True)[:, :w]
            valid = present.gather(1, keys)
            sel, ok = keys[which], valid[which]
            hw = h[rows].gather(1, sel) * ok
            Jw = None
            if J is not None:
                pair = ok[:, :, None] & ok[:, None, :]
                if J.shape[0] == 1 and len(group) == 1:
                    Jw = J[0][sel[0][:, None], sel[0][None, :]][None] * pair[:1]
                else:
                    Jr = J.expand(N, n, n)[rows]
                    r = torch.arange(len(rows), device=h.device)[:, None, None]
                    Jw = Jr[r, sel[:, :, None], sel[:, None, :]] * pair
            p = _simulate_present(hw, Jw, *options)                     # (R, 2^w)
            # basis index z of the n spins -> index of its present spins' bits in the width-w state
            index = torch.zeros(len(group), 1 << n, dtype=torch.long, device=h.device)
            for i in range(w):
                bit = (z[None, :] >> keys[:, i:i + 1]) & 1
                index |= (bit * valid[:, i:i + 1]) << i
            out[rows] = p.gather(1, index[which]) / float(1 << (n - w))
    return out


def _simulate_present(h: Tensor, J: Tensor | None, anneal_time_ns: float, trotter_steps: int,
                      schedule: str | Schedule, a_max_ghz: float | None, b_max_ghz: float | None,
                      energy_scale: float) -> Tensor:
    """_simulate with every spin present: float64 h (N, n), J (N or 1, n, n) or None -> (N, 2^n)."""
    N, n = h.shape
    if N == 0:  # no system to simulate
        return h.new_zeros(0, 1 << n, dtype=torch.float64)
    dt = float(anneal_time_ns) / trotter_steps
    s_mid = (np.arange(trotter_steps, dtype=np.float64) + 0.5) / trotter_steps
    a_ghz, b_ghz = schedule_values(schedule, s_mid, a_max_ghz, b_max_ghz)
    C = 1 << n
    spins = configurations(n, device=h.device)
    thetas = TWO_PI * dt * a_ghz / 2.0  # mixer angle per step, radians
    sizes = [min(_BLOCK_BITS, n - done) for done in range(0, n, _BLOCK_BITS)]
    rotations = {k: _rotations(thetas, k, h.device) for k in set(sizes)}  # (steps, 2^k, 2^k) each
    out = []
    chunk = max(1, _STATE_ELEMENTS // C)
    for start in range(0, N, chunk):
        Jc = J if J is None or J.shape[0] == 1 else J[start:start + chunk]
        energy = float(energy_scale) * _problem_diagonal(h[start:start + chunk], Jc, spins)
        _check_phases(energy, dt, b_ghz)
        psi = torch.full(energy.shape, 1.0 / math.sqrt(C), dtype=torch.complex128, device=h.device)
        for step, (a, b) in enumerate(zip(a_ghz, b_ghz)):
            angle = energy * (-TWO_PI * dt * b / 2.0)  # problem phase, radians
            psi *= torch.complex(torch.cos(angle), torch.sin(angle))
            if a != 0.0:
                psi = _mix(psi, [rotations[k][step] for k in sizes])
        out.append(psi.abs().square())
    probabilities = torch.cat(out)
    return probabilities / probabilities.sum(-1, keepdim=True)


PHASE_TOLERANCE = 1e-6  # largest accumulated rounding of the problem phases accepted, radians


def _check_phases(energy: Tensor, dt: float, b_ghz) -> None:
    """ValueError when the problem phases, summed over the steps, reach values whose float64 cos and sin are off
    by more than PHASE_TOLERANCE (each phase is rounded to its magnitude times float64's epsilon): the
    simulated state would be noise, not the anneal."""
    if energy.numel() == 0:
        return
    total = float(energy.detach().abs().max()) * TWO_PI * dt * float(np.sum(np.abs(b_ghz))) / 2.0
    if total * torch.finfo(torch.float64).eps > PHASE_TOLERANCE:
        raise ValueError(
            f"DQA's problem phases reach {total:.3g} radians over the anneal, beyond what float64 resolves "
            f"(phase rounding {total * torch.finfo(torch.float64).eps:.2g} rad > {PHASE_TOLERANCE:g}): the "
            "simulated state would be noise. Lower energy_scale (target_beta=1.0 uses the calibrated scale) or "
            "the fields and couplings; an anneal of energies this large keeps only its ground states, which "
            "method 'exact' gives.")


def _flatten(h: Tensor, J: Tensor | None, mask: Tensor | None):
    """Broadcast to the common batch and flatten: h (N, n), J (N or 1, n, n), mask (N, n), batch shape."""
    n = h.shape[-1]
    shapes = [h.shape[:-1]] + ([J.shape[:-2]] if J is not None else []) \
        + ([mask.shape[:-1]] if mask is not None else [])
    batch = torch.broadcast_shapes(*shapes)
    h = h.expand(*batch, n).reshape(-1, n)
    if J is not None:
        J = J.reshape(1, n, n) if math.prod(J.shape[:-2]) == 1 else J.expand(*batch, n, n).reshape(-1, n, n)
    if mask is not None:
        mask = mask.expand(*batch, n).reshape(-1, n)
    return h, J, mask, tuple(batch)


# ------------------------------------------------------------------------------------------ public API

def anneal_distribution(h: Tensor, J: Tensor | None = None, *, mask: Tensor | None = None,
                        anneal_time_ns: float = 5.0, trotter_steps: int = 200, schedule: str | Schedule = "linear",
                        a_max_ghz: float | None = None, b_max_ghz: float | None = None,
                        energy_scale: float | None = None, target_beta: float | None = None) -> Tensor:
    """Final measurement probabilities of simulated DQA over the 2^n basis states, (..., 2^n) float64.

    h: (..., n) or (n,); J: (n, n) or broadcastable (..., n, n); mask: (..., n) bool (absent spins are
    zeroed, see the module docstring). Basis index bit j is spin j, 1 meaning s_j = +1. Times in ns,
    a_max_ghz = A(0) and b_max_ghz = B(1) in GHz (named schedules; default 6.366401 and 14.55571);
    energy_scale multiplies h and J (default 1). target_beta: instead of energy_scale, the scale
    :func:`calibrate_energy_scale` fits for this anneal and target (both given: an error). Not
    differentiable. n <= MAX_SPINS (16).
    """
    check_inputs(h, J, None, mask)
    _check_size(h.shape[-1])
    options = _with_defaults(dict(anneal_time_ns=anneal_time_ns, trotter_steps=trotter_steps, schedule=schedule,
                                  a_max_ghz=a_max_ghz, b_max_ghz=b_max_ghz, energy_scale=energy_scale,
                                  target_beta=target_beta))
    hf, Jf, mf, batch = _flatten(h, J, mask)
    p = _simulate(hf, Jf, mf, **options)
    return p.reshape(*batch, p.shape[-1])


def dqa_draw(h: Tensor, J: Tensor | None, mask: Tensor | None, num_samples: int,
             generator: torch.Generator | None = None, **anneal_options) -> Tensor:
    """Measurement samples of simulated DQA: spins (N, S, n), +-1 in h's dtype.

    h: (N, n); J: (N or 1, n, n) or None; mask: (N, n) bool or None. Absent spins are zeroed, so they
    come back as free +-1 coin flips: the caller masks them. Samples are drawn with torch.multinomial
    (with replacement) from the final probabilities. ``anneal_options`` as in :func:`anneal_distribution`.
    """
    if h.dim() != 2:
        raise ValueError(f"dqa_draw takes flat h (N, n), got shape {tuple(h.shape)}")
    if J is not None and (J.dim() != 3 or J.shape[0] not in (1, h.shape[0])):
        raise ValueError(f"dqa_draw takes J (1 or N = {h.shape[0]}, n, n), got shape {tuple(J.shape)}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
    check_inputs(h, J, None, mask)
    _check_size(h.shape[-1])
    p = _simulate(h, J, mask, **_with_defaults(anneal_options))
    index = torch.multinomial(p, num_samples, replacement=True, generator=generator)  # (N, S)
    spins = configurations(h.shape[-1], dtype=h.dtype, device=h.device)
    return spins[index]


def dqa_marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                  num_samples: int = 1000, gradient: str = "covariance", nudge: float = 0.1,
                  generator: torch.Generator | None = None, seed: int | None = None, **anneal_options) -> Tensor:
    """Sample means of s_j under simulated DQA, shaped like h (..., n); absent spins are 0.

    The statistical error of each entry is at most 1/sqrt(num_samples). ``generator`` or ``seed`` (not
    both) fixes the draws. Gradients in h and J come from the samples by ``gradient`` ('covariance', 'ste'
    or 'nudged', see ``_sampling``); the final DQA state is not a Boltzmann distribution, so 'covariance'
    is the Boltzmann identity applied to it (an approximation, like the paper's straight-through estimator).
    ``target_beta=1.0`` runs the anneal at the calibrated energy scale (:func:`calibrate_energy_scale`),
    where it approximates exp(-E).
    """
    _check_pairwise(K)
    check_inputs(h, J, None, mask)
    _check_size(h.shape[-1])
    draw = partial(dqa_draw, **_with_defaults(anneal_options))
    return sampled_marginals(h, J, mask, draw, num_samples=num_samples, gradient=gradient, nudge=nudge,
                             generator=resolve_generator(h.device, seed, generator))


def dqa_exact_marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None,
                        **anneal_options) -> Tensor:
    """<Z_j> under the final DQA state (no sampling noise), shaped like h (..., n); absent spins are 0."""
    _check_pairwise(K)
    check_inputs(h, J, None, mask)
    hf, Jf, mf, batch = _flatten(h, J, mask)
    _check_size(h.shape[-1])
    p = _simulate(hf, Jf, mf, **_with_defaults(anneal_options))
    m = p @ configurations(h.shape[-1], device=h.device)
    if mf is not None:
        m = m * mf
    return m.to(h.dtype).reshape(*batch, h.shape[-1])


# the anneal's options and their defaults (energy_scale None: 1, or the calibrated scale with target_beta)
ANNEAL_OPTIONS = dict(anneal_time_ns=5.0, trotter_steps=200, schedule="linear", a_max_ghz=None, b_max_ghz=None,
                      energy_scale=None, target_beta=None)


def _anneal_defaults(options: dict) -> dict:
    """The anneal's options with their defaults (target_beta not resolved); ValueError for an unknown name or
    for energy_scale and target_beta both given."""
    unknown = set(options) - set(ANNEAL_OPTIONS)
    if unknown:
        raise ValueError(f"unknown DQA option(s) {sorted(unknown)}; known: {sorted(ANNEAL_OPTIONS)}")
    full = {**ANNEAL_OPTIONS, **options}
    if full["target_beta"] is not None and full["energy_scale"] is not None:
        raise ValueError(f"give energy_scale or target_beta, not both (got energy_scale={full['energy_scale']!r} "
                         f"and target_beta={full['target_beta']!r}): target_beta sets the energy scale by "
                         f"calibration")
    return full


def _with_defaults(options: dict) -> dict:
    """The options with their defaults, target_beta resolved into energy_scale: _simulate's keywords."""
    full = _anneal_defaults(options)
    target = full.pop("target_beta")
    if target is None:
        full["energy_scale"] = 1.0 if full["energy_scale"] is None else full["energy_scale"]
    else:
        full["energy_scale"] = calibrate_energy_scale(target, **{k: v for k, v in full.items()
                                                                  if k != "energy_scale"})
    return full


def _check_target_beta(target_beta) -> None:
    if isinstance(target_beta, bool) or not isinstance(target_beta, (int, float)) \
            or not 0 < target_beta < math.inf:
        raise ValueError(f"target_beta must be a finite number > 0, got {target_beta!r}")


def _check_anneal(full: dict) -> None:
    """ValueError for a bad anneal time, step count, energy scale, schedule or schedule maximum in ``full`` (the
    anneal's options with their defaults, energy_scale None standing for 1)."""
    scale = 1.0 if full.get("energy_scale") is None else full["energy_scale"]
    _check_options(full["anneal_time_ns"], full["trotter_steps"], scale)
    schedule_values(full["schedule"], np.array([0.0, 1.0]), full["a_max_ghz"], full["b_max_ghz"])


def check_dqa_options(options: dict) -> None:
    """ValueError for any option value of method 'dqa' that :func:`dqa_marginals` would refuse at its first call:
    the sampling options (num_samples, gradient, nudge; seed and generator, not both) and the anneal's
    (anneal_time_ns, trotter_steps, schedule and its maxima, energy_scale or target_beta but not both).
    Cheap: the calibration that target_beta implies is not run (its result is what the anneal uses).
    ``ising.validate_options('dqa', options)`` calls it, so a bad config fails before any training.
    """
    own = {p.name: p.default for p in inspect.signature(dqa_marginals).parameters.values()
           if p.kind is p.KEYWORD_ONLY}
    sampling = {**own, **{k: v for k, v in options.items() if k in own}}
    check_options(sampling["num_samples"], sampling["gradient"], sampling["nudge"])
    check_seed(sampling["seed"], sampling["generator"])
    full = _anneal_defaults({k: v for k, v in options.items() if k not in own})
    if full["target_beta"] is not None:
        _check_target_beta(full["target_beta"])
    _check_anneal(full)


def _check_pairwise(K: Tensor | None) -> None:
    if K is not None:
        raise ValueError("method 'dqa' is pairwise only (the annealer's H_P has h and J); got K. "
                         "Use method='exact' or 'reference' for three-body terms.")


# ------------------------------------------------------------------- the Boltzmann regime: beta_eff, calibration

class BetaFit(NamedTuple):
    """beta (...,) and KL(p || p_beta) (...,) at that beta, in nats, float64."""

    beta: Tensor
    kl: Tensor


def fit_beta(probabilities: Tensor, energies: Tensor, *, max_beta: float = 1e3) -> BetaFit:
    """The beta minimising KL(p || p_beta), p_beta(s) = exp(-beta E(s)) / Z(beta), per system.

    probabilities p and energies E: (..., C) over the same C states (computed in float64). KL(p || p_beta)
    = sum p log p + beta <E>_p + log Z(beta) is convex in beta: its derivative is <E>_p - <E>_beta and its
    second derivative Var_beta(E) >= 0. So the minimiser is the root of <E>_beta = <E>_p (moment matching).

    The root is found on the side of beta = 0 that p lies on (beta >= 0 when <E>_p is at most the uniform
    mean; otherwise the mirrored problem with -E), with energies measured from the lowest, dE >= 0, and the
    equation taken in logs: log <dE>_beta = log <dE>_p, whose left side falls with slope Var(dE) / <dE> and
    becomes linear in beta for cold distributions, where <dE>_beta ~ exp(-beta gap). Newton steps on it stay
    inside a bisection bracket [0, max_beta] and converge to 1e-12 relative in a few steps at any gap, with no
    underflow (every mean is a logsumexp). beta is +-max_beta where p is colder or hotter than every beta in
    range (p on the lowest states only: beta -> infinity), and 0 where E is constant over the states (every
    beta fits alike).
    """
    if not isinstance(probabilities, Tensor) or not isinstance(energies, Tensor) \
            or probabilities.shape != energies.shape or probabilities.dim() < 1:
        raise ValueError("probabilities and energies must be tensors of the same shape (..., C), got "
                         f"{tuple(getattr(probabilities, 'shape', ()))} and {tuple(getattr(energies, 'shape', ()))}")
    if isinstance(max_beta, bool) or not isinstance(max_beta, (int, float)) or not 0 < max_beta < math.inf:
        raise ValueError(f"max_beta must be a finite number > 0, got {max_beta!r}")
    p, E = probabilities.detach().double(), energies.detach().double()
    if not (torch.isfinite(p).all() and torch.isfinite(E).all()) or (p < 0).any() \
            or ((p.sum(-1) - 1).abs() > 1e-6).any():
        raise ValueError("probabilities must be finite, >= 0 and sum to 1 over the last dimension; energies finite")
    spread = E.amax(-1) - E.amin(-1)
    constant = spread <= 1e-12 * (1.0 + E.abs().amax(-1))
    sign = torch.where((p * E).sum(-1) > E.mean(-1), -1.0, 1.0)  # hotter than uniform: the mirrored problem
    dE = sign[..., None] * E
    dE = dE - dE.amin(-1, keepdim=True)
    log_dE = dE.log()                                            # -inf on the lowest states
    log_target = (p * dE).sum(-1).log()                          # -inf: p on the lowest states only

    def log_moments(beta: Tensor) -> tuple[Tensor, Tensor]:
        """log <dE>_beta and log <dE^2>_beta."""
        logits = -beta[..., None] * dE
        log_z = torch.logsumexp(logits, -1)
        return torch.logsumexp(logits + log_dE, -1) - log_z, torch.logsumexp(logits + 2 * log_dE, -1) - log_z

    lo, hi = torch.zeros_like(log_target), torch.full_like(log_target, float(max_beta))
    beta = torch.where(torch.isinf(log_target), hi, lo)
    for _ in range(200):  # Newton: a few steps; bisection alone would need about 50
        log_m1, log_m2 = log_moments(beta)
        g = log_m1 - log_target                                  # falls as beta grows; the root is g = 0
        lo = torch.where(g > 0, beta, lo)
        hi = torch.where(g < 0, beta, hi)
        slope = (log_m2 - log_m1).exp() - log_m1.exp()           # -d log<dE>/d beta = Var(dE) / <dE> >= 0
        newton = beta + g / slope.clamp(min=1e-300)
        inside = (slope > 0) & (newton > lo) & (newton < hi)
        new = torch.where(inside, newton, (lo + hi) / 2)
        new = torch.where((g == 0) | torch.isinf(log_target), beta, new)
        done = bool(((new - beta).abs() <= 1e-12 * (1.0 + beta.abs())).all())
        beta = new
        if done:
            break
    beta = torch.where(constant, 0.0, sign * beta)
    return BetaFit(beta, _kl(p, torch.log_softmax(-beta[..., None] * E, -1)))


def _kl(p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) = sum p (log p - log q) over the last dimension, 0 log 0 = 0, float64, >= 0."""
    return torch.where(p > 0, p * (p.clamp(min=1e-300).log() - log_q), 0.0).sum(-1).clamp(min=0.0)


def _energies(hf: Tensor, Jf: Tensor | None, mf: Tensor | None) -> Tensor:
    """E(s) over the 2^n basis states, (N, 2^n) float64, of flat h (N, n), J (N or 1, n, n), mask (N, n)."""
    h, J = hf.detach().double(), None if Jf is None else Jf.detach().double()
    if mf is not None:
        h = h * mf
        J = None if J is None else J * (mf[:, :, None] & mf[:, None, :])
    return -negative_energies(h, J, None, configurations(h.shape[-1], device=h.device))


def effective_beta(h: Tensor, J: Tensor | None = None, *, mask: Tensor | None = None, max_beta: float = 1e3,
                   **anneal_options) -> BetaFit:
    """DQA's effective inverse temperature: per system, the beta minimising KL(p_DQA || p_beta), and that KL.

    h: (..., n); J: broadcastable (..., n, n); mask: (..., n) bool (absent spins are uniform in both
    distributions, so they add nothing to the KL). p_DQA = :func:`anneal_distribution` (``anneal_options``:
    its options, energy_scale and target_beta included); p_beta(s) proportional to exp(-beta E(s)) with E the
    package's energy of h and J *as given* (not times energy_scale), so beta = 1 means DQA samples exp(-E).
    Returns :class:`BetaFit` with beta and kl of the batch shape (float64); see :func:`fit_beta`.
    """
    p = anneal_distribution(h, J, mask=mask, **anneal_options)
    hf, Jf, mf, batch = _flatten(h, J, mask)
    fit = fit_beta(p.reshape(-1, p.shape[-1]), _energies(hf, Jf, mf), max_beta=max_beta)
    return BetaFit(fit.beta.reshape(batch), fit.kl.reshape(batch))


def boltzmann_kl(h: Tensor, J: Tensor | None = None, *, mask: Tensor | None = None, beta: float = 1.0,
                 **anneal_options) -> Tensor:
    """KL(p_DQA || p_beta) in nats at a given beta (default 1: the distance to Boltzmann attention's
    exp(-E)), shaped like h without its last dimension, float64. Arguments as in :func:`effective_beta`."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta):
        raise ValueError(f"beta must be a finite number, got {beta!r}")
    p = anneal_distribution(h, J, mask=mask, **anneal_options)
    hf, Jf, mf, batch = _flatten(h, J, mask)
    log_q = torch.log_softmax(-float(beta) * _energies(hf, Jf, mf), -1)
    return _kl(p.reshape(-1, p.shape[-1]), log_q).reshape(batch)


# The systems calibrate_energy_scale fits on, after what training produced (measured; see its docstring).
CALIBRATION_SYSTEMS = dict(sizes=(4, 6, 8), num_systems=16, field_mean=-1.3, field_std=0.4, coupling_std=0.25,
                           seed=0)


def calibration_systems(n: int, num_systems: int, field_mean: float, field_std: float, coupling_std: float,
                        seed: int) -> tuple[Tensor, Tensor]:
    """Random systems h (num_systems, n), J (num_systems, n, n), float64: h_j ~ N(field_mean, field_std^2),
    J_jk = J_kj ~ N(0, coupling_std^2) for j < k, J_jj = 0; from torch.Generator seeded with 1000 seed + n."""
    g = torch.Generator().manual_seed(1000 * seed + n)
    h = field_mean + field_std * torch.randn(num_systems, n, dtype=torch.float64, generator=g)
    W = (coupling_std * torch.randn(num_systems, n, n, dtype=torch.float64, generator=g)).triu(1)
    return h, W + W.transpose(-1, -2)


def calibration_objective(energy_scale: float, target_beta: float = 1.0, *, systems=None, **anneal_options) -> float:
    """Mean over ``systems`` (a list of (h, J), default those of CALIBRATION_SYSTEMS) of
    KL(p_DQA || p_target), p_target proportional to exp(-target_beta E), DQA run at ``energy_scale``."""
    if systems is None:
        c = CALIBRATION_SYSTEMS
        systems = [calibration_systems(n, c["num_systems"], c["field_mean"], c["field_std"], c["coupling_std"],
                                       c["seed"]) for n in c["sizes"]]
    kl = [boltzmann_kl(h, J, beta=target_beta, energy_scale=energy_scale, **anneal_options) for h, J in systems]
    return float(torch.cat(kl).mean())


_GRID = np.logspace(-4.0, 2.0, 31)  # energy scales searched first (then refined by golden section)


def calibrate_energy_scale(target_beta: float = 1.0, *, sizes: tuple[int, ...] = CALIBRATION_SYSTEMS["sizes"],
                           num_systems: int = CALIBRATION_SYSTEMS["num_systems"],
                           field_mean: float = CALIBRATION_SYSTEMS["field_mean"],
                           field_std: float = CALIBRATION_SYSTEMS["field_std"],
                           coupling_std: float = CALIBRATION_SYSTEMS["coupling_std"],
                           seed: int = CALIBRATION_SYSTEMS["seed"], **anneal_options) -> float:
    """The energy scale c at which DQA's output is closest to Boltzmann at ``target_beta``.

    c minimises the mean over random systems of KL(p_DQA(c) || p_target), p_target(s) proportional to
    exp(-target_beta E(s)) (:func:`calibration_objective`). The systems (:func:`calibration_systems`):
    ``num_systems`` per size in ``sizes``, h_j ~ N(field_mean, field_std^2), J_jk ~ N(0, coupling_std^2),
    seeded. The defaults follow what training produced: the DQA study's context lengths T = 4, 6, 8; h+J models
    trained on Shakespeare (2000 steps, measured once on one batch) fed their marginals fields of mean -1.28,
    -1.31, -1.46 and std 0.41, 0.38, 0.52 at T = 4, 8, 16 (the learned field bias near -log(T) / 2 plus
    the QK scores), and the committed runs' learned J have an rms of 0.12 to 0.29 per entry at T = 4..16
    (0.25 at T = 8 in that run), about constant in T, so J is not scaled by 1 / sqrt(n). How c moves with
    n and the field scale is in report/dqa_calibration/.

    Search: 31 scales from 1e-4 to 1e2 (log grid), then golden section between the best one's neighbours
    (to 1e-4 relative); an optimum at the grid's edge is an error. ``anneal_options``: those of
    :func:`anneal_distribution` except energy_scale and target_beta. It minimises the KL; whether
    beta_eff reaches target_beta there is :func:`effective_beta`'s to say. Deterministic and cached per
    set of options (lru_cache): the default fit runs ~55 anneals of 48 systems, a few seconds on one core.
    """
    for name in ("energy_scale", "target_beta"):
        if name in anneal_options:
            raise ValueError(f"calibrate_energy_scale fits the energy scale: do not pass {name}")
    _check_target_beta(target_beta)
    if not isinstance(sizes, (tuple, list)) or not sizes or any(
            isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SPINS for n in sizes):
        raise ValueError(f"sizes must be a non-empty tuple of integers in 1..{MAX_SPINS}, got {sizes!r}")
    if isinstance(num_systems, bool) or not isinstance(num_systems, int) or num_systems < 1:
        raise ValueError(f"num_systems must be an integer >= 1, got {num_systems!r}")
    for name, value in (("field_mean", field_mean), ("field_std", field_std), ("coupling_std", coupling_std)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (name != "field_mean" and value < 0):
            raise ValueError(f"{name} must be a finite number{' >= 0' if name != 'field_mean' else ''}, "
                             f"got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    options = {k: v for k, v in _with_defaults(anneal_options).items() if k != "energy_scale"}
    _check_anneal(options)
    return _calibrated_scale(float(target_beta), tuple(sizes), num_systems, float(field_mean), float(field_std),
                             float(coupling_std), seed, tuple(sorted(options.items())))


@lru_cache(maxsize=64)
def _calibrated_scale(target_beta, sizes, num_systems, field_mean, field_std, coupling_std, seed, options) -> float:
    systems = [calibration_systems(n, num_systems, field_mean, field_std, coupling_std, seed) for n in sizes]
    options = dict(options)

    def f(log_c: float) -> float:
        return calibration_objective(10.0 ** log_c, target_beta, systems=systems, **options)

    grid = np.log10(_GRID)
    values = [f(x) for x in grid]
    if max(values) - min(values) <= 1e-12 * (1.0 + abs(min(values))):
        raise ValueError(f"calibrate_energy_scale: the KL to exp(-{target_beta:g} E) is the same at every energy "
                         f"scale searched ({_GRID[0]:g} .. {_GRID[-1]:g}): the calibration systems have no energy "
                         f"to scale (field_mean = {field_mean:g}, field_std = {field_std:g}, coupling_std = "
                         f"{coupling_std:g}, sizes {sizes}); give them fields or couplings")
    best = int(np.argmin(values))
    if best in (0, len(grid) - 1):
        raise ValueError(f"calibrate_energy_scale: the KL to exp(-{target_beta:g} E) is smallest at the edge of "
                         f"the searched energy scales ({_GRID[0]:g} .. {_GRID[-1]:g}), at {_GRID[best]:g}; "
                         f"change the anneal (anneal_time_ns, schedule) so that the optimum lies inside")
    a, b = grid[best - 1], grid[best + 1]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
    f1, f2 = f(x1), f(x2)
    while b - a > 4e-5:  # log10 units: c to 1e-4 relative
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - ratio * (b - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + ratio * (b - a)
            f2 = f(x2)
    return float(10.0 ** ((a + b) / 2))


METHOD = Method("dqa", dqa_marginals, None, keyword_options(dqa_marginals) | frozenset(ANNEAL_OPTIONS), "sampled",
                f"n <= {MAX_SPINS} spins (a 2^n statevector); not a Boltzmann distribution unless target_beta=1.0",
                check_dqa_options, max_spins=MAX_SPINS)
