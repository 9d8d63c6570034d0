"""Simulated quantum annealing (SQA): path-integral Monte Carlo of a transverse-field Ising model (torch).

Energy convention (the package's only one): E(s) = -h.s - s.J.s / 2, p(s) ∝ exp(-E(s)), s in {-1,+1}^n,
J symmetric with a zero diagonal. Pairwise only (K must be None). Absent spins (mask False) are frozen
at 0 in every slice, so they are in nobody's local field and have marginal 0.

Model: the transverse-field Ising model at inverse temperature ``beta`` (default 1)::

    H(Gamma) = -Gamma sum_j X_j + E_P(Z),    rho = exp(-beta H) / Tr exp(-beta H),

with E_P(Z) the diagonal operator E_P |s> = E(s) |s> (Z_j |s> = s_j |s>). As Gamma -> 0 the diagonal of
rho is exp(-beta E(s)) / Z: with beta = 1 exactly the package's Boltzmann distribution; a larger beta
anneals towards the ground state of E.

Suzuki-Trotter with P = ``trotter_slices`` (even) slices s^0, ..., s^{P-1} in imaginary time (periodic,
s^P = s^0) maps rho to the classical weight::

    w(s^0, ..., s^{P-1}) ∝ exp(-(beta/P) sum_k E(s^k) + J_perp sum_k sum_j s_j^k s_j^{k+1}),
    J_perp = -(1/2) log tanh(beta Gamma / P) > 0,

whose one-slice marginal tends to <s|rho|s> as P -> infinity (Trotter error O((beta / P)^2), with the
commutator of the two terms; small once beta Gamma / P << 1).

Update (heat bath): the local field of spin j in slice k is
F = (beta/P)(h_j + sum_l J_jl s_l^k) + J_perp (s_j^{k-1} + s_j^{k+1}), and p(s_j^k = +1) = sigmoid(2 F).
Spin j is updated in all even slices at once, then in all odd slices (a slice couples only to its two
neighbours, which have the other parity since P is even); one sweep does this for j = 0, ..., n-1. All
systems, chains and slices are batched; one sweep costs 2 n batched products of O(n) per spin.

Schedule: ``sweeps`` sweeps, sweep t at Gamma_t = gamma_start + (gamma_end - gamma_start) t / max(sweeps-1, 1),
from uniform random spins. The result is not an equilibrium sample in general: it is what the anneal
leaves (close to rho(gamma_end) for a slow anneal that still mixes; single-spin moves freeze once
J_perp is large, i.e. beta Gamma / P small). With gamma_start == gamma_end it is plain path-integral
Monte Carlo at that Gamma, with ``sweeps`` sweeps of burn-in.

Samples: every chain gives its P final slices as P samples. They are correlated (nearly equal when
J_perp is large), so the effective sample size lies between the number of chains and num_samples.
ceil(num_samples / P) chains run per system; sample i is slice i % P of chain i // P (the first
num_samples are kept).

Randomness: an explicit ``seed`` (int) or ``generator`` (on the inputs' device); identical seeds give
identical results on the same device. Gradients: ``gradient`` = "covariance" (default), "ste" or
"nudged", see ``_sampling``. The samples are not Boltzmann samples at beta = 1 unless beta = 1 and
Gamma -> 0 (and the chains mixed), so 'covariance' is then an approximation (for beta != 1 the Boltzmann
derivative of exp(-beta E) would be beta Cov); its S / (S - 1) correction assumes independent samples.
log Z is not available.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor

from ._inputs import check_inputs, check_int
from ._sampling import check_options, check_sampling_options, resolve_generator, sampled_marginals
from .record import Method, keyword_options

__all__ = ["sqa_draw", "sqa_marginals"]


def _check_schedule(sweeps, trotter_slices, gamma_start, gamma_end, beta) -> None:
    check_int("sweeps", sweeps, 1)
    check_int("trotter_slices", trotter_slices, 2)
    if trotter_slices % 2:
        raise ValueError(f"trotter_slices must be even (even and odd slices are updated in turn), "
                         f"got {trotter_slices}")
    for name, value in (("gamma_start", gamma_start), ("gamma_end", gamma_end), ("beta", beta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def sqa_draw(h: Tensor, J: Tensor | None, mask: Tensor | None, num_samples: int, generator: torch.Generator,
             *, sweeps: int = 200, trotter_slices: int = 16, gamma_start: float = 3.0, gamma_end: float = 0.05,
             beta: float = 1.0) -> Tensor:
    """SQA samples (N, S, n) as a draw callable (see ``_sampling``); absent spins 0.

    h: (N, n); J: (N or 1, n, n) or None; mask: (N, n) bool or None. Sample i is slice i % P of chain
    i // P. Bind the schedule with partial.
    """
    check_int("num_samples", num_samples, 1)
    _check_schedule(sweeps, trotter_slices, gamma_start, gamma_end, beta)
    N, n = h.shape
    P = trotter_slices
    C = -(-num_samples // P)  # chains per system
    device, dtype = h.device, h.dtype
    present = None if mask is None else mask[:, None, None, :].to(dtype)  # (N, 1, 1, n)
    shared = J is not None and J.shape[0] == 1

    s = 2.0 * torch.randint(0, 2, (N, C, P, n), generator=generator, device=device).to(dtype) - 1.0
    if present is not None:
        s = s * present
    up = torch.ones(1, 1, 1, n, dtype=dtype, device=device) if present is None else present  # +1 (0 if absent)
    field = (beta / P) * h[:, None, None, :]  # (N, 1, 1, n)
    rows = [] if J is None else [(beta / P) * (J[0, j] if shared else J[:, None, None, j, :]) for j in range(n)]

    for t in range(sweeps):
        gamma = gamma_start + (gamma_end - gamma_start) * t / max(sweeps - 1, 1)
        j_perp = -0.5 * math.log(math.tanh(beta * gamma / P))
        # s = +1 iff u < sigmoid(2 F)  <=>  (beta/P) sum_l J_jl s_l + J_perp (neighbours) - threshold > 0
        u = torch.rand(N, C, P, n, generator=generator, device=device, dtype=dtype)
        threshold = 0.5 * (torch.log(u) - torch.log1p(-u)) - field  # logit(u); torch.logit is slow (see mcmc)
        for j in range(n):
            for p in (0, 1):
                other = s[:, :, 1 - p::2, j]  # the slices of the other parity, (N, C, P/2)
                # neighbours of slice 2m are 2m-1, 2m+1 (odd m-1, m); of slice 2m+1: 2m, 2m+2 (even m, m+1)
                local = j_perp * (other + other.roll(1 if p == 0 else -1, -1)) - threshold[:, :, p::2, j]
                if J is not None:
                    mine = s[:, :, p::2]  # (N, C, P/2, n)
                    local = local + (mine @ rows[j] if shared else (mine * rows[j]).sum(-1))
                # copysign gives +-1 (+-0 for an absent spin) and never 0 for a present one, even on a tie
                s[:, :, p::2, j] = torch.copysign(up[..., j], local)
    return s.reshape(N, C * P, n)[:, :num_samples]


def sqa_marginals(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, mask: Tensor | None = None, *,
                  num_samples: int = 1000, sweeps: int = 200, trotter_slices: int = 16, gamma_start: float = 3.0,
                  gamma_end: float = 0.05, beta: float = 1.0, gradient: str = "covariance", nudge: float = 0.1,
                  seed: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """SQA-sampled marginals <s_j>, shaped like the broadcast h (..., n); absent spins 0.

    h: (..., n); J: broadcastable (..., n, n) or None; K must be None; mask: (..., n) bool or None.
    Schedule options as in the module docstring; inputs and options are validated.
    """
    if K is not None:
        raise ValueError("method 'sqa' supports pairwise couplings only (K must be None); "
                         "use method 'exact' or 'reference' for three-body couplings")
    check_inputs(h, J, None, mask)
    check_options(num_samples, gradient, nudge)
    _check_schedule(sweeps, trotter_slices, gamma_start, gamma_end, beta)
    draw = partial(sqa_draw, sweeps=sweeps, trotter_slices=trotter_slices, gamma_start=gamma_start,
                   gamma_end=gamma_end, beta=beta)
    return sampled_marginals(h, J, mask, draw, num_samples=num_samples, gradient=gradient, nudge=nudge,
                             generator=resolve_generator(h.device, seed, generator))


def _check_options(options: dict) -> None:
    o = check_sampling_options(sqa_marginals, options)
    _check_schedule(o["sweeps"], o["trotter_slices"], o["gamma_start"], o["gamma_end"], o["beta"])


METHOD = Method("sqa", sqa_marginals, None, keyword_options(sqa_marginals), "sampled",
                "any n; the anneal's final state, Boltzmann only while it mixes (options sweeps, trotter_slices)",
                _check_options)
