"""Marginals by Markov chain Monte Carlo: batched Gibbs sampling and parallel tempering (torch).

Energy convention (the package's only one): E(s) = -h.s - s.J.s / 2, p(s) ∝ exp(-E(s)), s in {-1,+1}^n,
J symmetric with a zero diagonal. Pairwise only (K must be None). Absent spins (mask False) are frozen
at 0, so they are in nobody's local field and have marginal 0.

Gibbs (``gibbs``): sequential-scan heat bath. One sweep updates j = 0, ..., n-1 in turn from
p(s_j = +1 | rest) = sigmoid(2 beta f_j), f_j = h_j + sum_k J_jk s_k (beta = 1 here). Every system
(all batch, head and query entries) and every chain is updated at once: one sweep costs n batched
matrix-vector products, O(n^2) per chain.

Parallel tempering (``pt``): R replicas per chain at inverse temperatures beta_0 < ... < beta_{R-1},
a geometric ladder beta_r = beta_min^((R-1-r)/(R-1)) by default, or any ladder containing 1.0. After
every sweep (a Gibbs sweep of each replica at its own beta) neighbours (r, r+1) exchange
configurations with probability min(1, exp((beta_r - beta_{r+1}) (E_r - E_{r+1}))); the pairs
alternate between even r and odd r from sweep to sweep (deterministic even-odd scheme). Samples are
recorded from the beta = 1 replica.

Schedule (both): ``num_chains`` independent chains per system, each started from uniform random
spins, ``warmup`` sweeps discarded, then one sample every ``sweeps_per_sample`` sweeps until
``num_samples`` samples per system are collected (ceil(num_samples / num_chains) per chain, the last
ones cut). Samples are ordered time-major: sample i comes from chain i % num_chains.

Randomness: an explicit ``seed`` (int) or ``generator`` (on the inputs' device); identical seeds give
identical results on the same device. Gradients: ``gradient`` = "covariance" (default), "ste" or
"nudged", see ``_sampling``. log Z is not available (sampling does not estimate it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from ._inputs import check_inputs, check_int, check_real, group_queries
from ._sampling import check_options, check_sampling_options, resolve_generator, sample_moments, sampled_marginals
from .record import Method, keyword_options

__all__ = ["gibbs", "pt", "gibbs_marginals", "pt_marginals", "gibbs_draw", "pt_draw", "geometric_betas",
           "log_partition", "MCMCResult"]


@dataclass
class MCMCResult:
    """What ``gibbs_marginals`` / ``pt_marginals`` return when any ``return_*`` flag is set.

    marginals: (..., n), differentiable. correlations: <s_j s_k> (..., n, n), detached, or None.
    samples: (..., S, n) +-1 (absent spins 0), detached, sample i from chain i % num_chains, or None.
    swap_acceptance: (..., R-1) acceptance rate of exchanges between replicas r and r+1 over the
    sampling phase (PT only), or None.
    """

    marginals: Tensor
    correlations: Tensor | None = None
    samples: Tensor | None = None
    swap_acceptance: Tensor | None = None



def _check_schedule(warmup, sweeps_per_sample, num_chains) -> None:
    check_int("warmup", warmup, 0)
    check_int("sweeps_per_sample", sweeps_per_sample, 1)
    check_int("num_chains", num_chains, 1)


def geometric_betas(num_replicas: int = 8, beta_min: float = 0.1) -> list[float]:
    """beta_r = beta_min^((R-1-r)/(R-1)), r = 0..R-1: from beta_min up to exactly 1.0."""
    check_int("num_replicas", num_replicas, 2)
    check_real("beta_min", beta_min, minimum=0.0, maximum=1.0, open_minimum=True, open_maximum=True)
    R = num_replicas
    return [float(beta_min) ** ((R - 1 - r) / (R - 1)) for r in range(R - 1)] + [1.0]


def _ladder(betas, num_replicas, beta_min) -> list[float]:
    if betas is None:
        return geometric_betas(8 if num_replicas is None else num_replicas,
                               0.1 if beta_min is None else beta_min)
    if num_replicas is not None or beta_min is not None:
        raise ValueError("give either betas or num_replicas / beta_min, not both")
    if isinstance(betas, Tensor):  # a tensor of betas: its values (each entry alone is not a Python number)
        betas = betas.detach().reshape(-1).tolist()
    ladder = sorted(check_real("each of betas", b, minimum=0.0, open_minimum=True) for b in betas)
    if not ladder:
        raise ValueError("betas must not be empty (it must contain 1.0)")
    if 1.0 not in ladder:
        raise ValueError(f"the beta ladder must contain 1.0 (samples are taken at beta = 1), got {ladder}")
    if len(set(ladder)) != len(ladder):
        raise ValueError(f"the betas must be distinct, got {ladder}")
    return ladder


# ---------------------------------------------------------------------------------------------------
# The sampler (a draw callable, see _sampling): h (N, n), J (N | 1, n, n) or None, mask (N, n) or None


def _energies(s: Tensor, h: Tensor, J: Tensor | None) -> Tensor:
    """E(s) for s (N, M, n): (N, M)."""
    e = -(s @ h.unsqueeze(-1)).squeeze(-1)
    if J is not None:
        e = e - 0.5 * ((s @ J) * s).sum(-1)
    return e


def _simulate(h: Tensor, J: Tensor | None, mask: Tensor | None, num_samples: int, generator: torch.Generator,
              *, betas: list[float], warmup: int, sweeps_per_sample: int, num_chains: int,
              stats: dict | None = None) -> Tensor:
    """Heat-bath sweeps for every (system, chain, replica), with replica exchange when len(betas) > 1."""
    N, n = h.shape
    R, C = len(betas), num_chains
    M = C * R  # chains x replicas, replica index fastest
    device, dtype = h.device, h.dtype
    beta = torch.tensor(betas, dtype=dtype, device=device)
    beta_m = beta.repeat(C)  # (M,)
    one = betas.index(1.0)
    present = None if mask is None else mask[:, None, :].to(dtype)  # (N, 1, n)
    shared = J is not None and J.shape[0] == 1

    s = 2.0 * torch.randint(0, 2, (N, M, n), generator=generator, device=device).to(dtype) - 1.0
    if present is not None:
        s = s * present

    per_chain = -(-num_samples // C)
    out = torch.empty(N, per_chain, C, n, dtype=dtype, device=device)
    accepted = torch.zeros(N, max(R - 1, 0), dtype=dtype, device=device)
    attempts = torch.zeros(max(R - 1, 0), dtype=dtype, device=device)

    # per-spin views, made once: the value of a +1 spin (0 if absent) and the couplings J_j. (J symmetric)
    up = torch.ones(1, 1, n, dtype=dtype, device=device) if present is None else present
    ups = [up[..., j] for j in range(n)]
    rows = [] if J is None else [J[0, j] if shared else J[:, None, j, :] for j in range(n)]

    def sweep(index: int, record_swaps: bool) -> None:
        # heat bath: s_j = +1 iff u < sigmoid(2 beta f_j)  <=>  sum_k J_jk s_k - logit(u) / (2 beta) + h_j > 0
        u = torch.rand(N, M, n, generator=generator, device=device, dtype=dtype)
        # logit(u), written out: torch.logit took ~20 ms per call on 2 busy cores (threads), this takes microseconds
        threshold = 0.5 * (torch.log(u) - torch.log1p(-u)) / beta_m[:, None] - h[:, None, :]
        if J is None:  # independent spins: one vectorised update
            s.copy_(torch.copysign(up, -threshold))
        for j, row in enumerate(rows):
            coupling = s @ row if shared else (s * row).sum(-1)
            # copysign gives +-1 (+-0 for an absent spin) and never 0 for a present one, even on a tie
            s[..., j] = torch.copysign(ups[j], coupling - threshold[..., j])
        if R > 1:
            exchange(index, record_swaps)

    def exchange(index: int, record: bool) -> None:
        a = torch.arange(index % 2, R - 1, 2, device=device)
        if a.numel() == 0:
            return
        b = a + 1
        E = _energies(s, h, J).view(N, C, R)
        delta = (beta[a] - beta[b]) * (E[..., a] - E[..., b])  # (N, C, P)
        u = torch.rand(delta.shape, generator=generator, device=device, dtype=dtype)
        accept = torch.log(u) < delta
        sv = s.view(N, C, R, n)
        sa, sb = sv[:, :, a], sv[:, :, b]
        acc = accept.unsqueeze(-1)
        sv[:, :, a], sv[:, :, b] = torch.where(acc, sb, sa), torch.where(acc, sa, sb)
        if record:
            accepted[:, a] += accept.to(dtype).sum(1)
            attempts[a] += C

    index = 0
    for _ in range(warmup):
        sweep(index, False)
        index += 1
    for t in range(per_chain):
        for _ in range(sweeps_per_sample):
            sweep(index, True)
            index += 1
        out[:, t] = s.view(N, C, R, n)[:, :, one]
    if stats is not None and R > 1:
        stats["swap_acceptance"] = accepted / attempts  # nan for a pair never attempted
    return out.reshape(N, per_chain * C, n)[:, :num_samples]


def gibbs_draw(h: Tensor, J: Tensor | None, mask: Tensor | None, num_samples: int, generator: torch.Generator,
               *, warmup: int = 100, sweeps_per_sample: int = 1, num_chains: int = 1) -> Tensor:
    """Gibbs samples (N, S, n) as a draw callable (see ``_sampling``); bind the schedule with partial."""
    _check_schedule(warmup, sweeps_per_sample, num_chains)
    return _simulate(h, J, mask, num_samples, generator, betas=[1.0], warmup=warmup,
                     sweeps_per_sample=sweeps_per_sample, num_chains=num_chains)


def pt_draw(h: Tensor, J: Tensor | None, mask: Tensor | None, num_samples: int, generator: torch.Generator,
            *, betas=None, num_replicas: int | None = None, beta_min: float | None = None, warmup: int = 100,
            sweeps_per_sample: int = 1, num_chains: int = 1, stats: dict | None = None) -> Tensor:
    """Parallel-tempering samples (N, S, n) at beta = 1 as a draw callable.

    ``stats``: a dict that receives "swap_acceptance" (N, R-1).
    """
    _check_schedule(warmup, sweeps_per_sample, num_chains)
    return _simulate(h, J, mask, num_samples, generator, betas=_ladder(betas, num_replicas, beta_min),
                     warmup=warmup, sweeps_per_sample=sweeps_per_sample, num_chains=num_chains, stats=stats)


# ---------------------------------------------------------------------------------------------------
# Entry points


def _prepare(h, J, K, mask, num_samples, gradient, nudge, seed, generator, schedule) -> torch.Generator:
    if K is not None:
        raise ValueError("the MCMC methods support pairwise couplings only (K must be None); "
                         "use method 'exact', 'reference' or 'meanfield' for three-body couplings")
    check_inputs(h, J, K, mask)
    check_options(num_samples, gradient, nudge)
    _check_schedule(*schedule)
    return resolve_generator(h.device, seed, generator)


def _finish(out, return_correlations, return_samples, swap):
    m, spins = out
    if not (return_correlations or return_samples or swap is not None):
        return m
    correlations = sample_moments(spins)[1] if return_correlations else None
    return MCMCResult(m, correlations, spins if return_samples else None, swap)


def gibbs_marginals(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, mask: Tensor | None = None, *,
                    num_samples: int = 1000, warmup: int = 100, sweeps_per_sample: int = 1, num_chains: int = 1,
                    gradient: str = "covariance", nudge: float = 0.1, seed: int | None = None,
                    generator: torch.Generator | None = None, return_correlations: bool = False,
                    return_samples: bool = False) -> Tensor | MCMCResult:
    """Gibbs-sampled marginals <s_j>, shaped like the broadcast h (..., n); absent spins 0.

    h: (..., n); J: broadcastable (..., n, n) or None; K must be None; mask: (..., n) bool or None.
    Inputs are validated. Returns the marginals, or an :class:`MCMCResult` if a ``return_*`` flag is set.
    """
    schedule = (warmup, sweeps_per_sample, num_chains)
    generator = _prepare(h, J, K, mask, num_samples, gradient, nudge, seed, generator, schedule)
    draw = partial(gibbs_draw, warmup=warmup, sweeps_per_sample=sweeps_per_sample, num_chains=num_chains)
    out = sampled_marginals(h, J, mask, draw, num_samples=num_samples, gradient=gradient, nudge=nudge,
                            generator=generator, return_samples=True)
    return _finish(out, return_correlations, return_samples, None)


def pt_marginals(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, mask: Tensor | None = None, *,
                 num_samples: int = 1000, warmup: int = 100, sweeps_per_sample: int = 1, num_chains: int = 1,
                 num_replicas: int | None = None, beta_min: float | None = None, betas=None,
                 gradient: str = "covariance", nudge: float = 0.1, seed: int | None = None,
                 generator: torch.Generator | None = None, return_correlations: bool = False,
                 return_samples: bool = False, return_swap_rates: bool = False) -> Tensor | MCMCResult:
    """Parallel-tempering marginals <s_j> (..., n), samples taken at beta = 1.

    Ladder: ``betas`` (any values > 0 containing 1.0), or geometric with ``num_replicas`` (default 8)
    from ``beta_min`` (default 0.1) to 1. Other arguments as in :func:`gibbs_marginals`;
    ``return_swap_rates`` adds the exchange acceptance rates (..., R-1) to the result.
    """
    schedule = (warmup, sweeps_per_sample, num_chains)
    ladder = _ladder(betas, num_replicas, beta_min)
    generator = _prepare(h, J, K, mask, num_samples, gradient, nudge, seed, generator, schedule)
    stats: dict = {}
    draw = partial(pt_draw, betas=ladder, warmup=warmup, sweeps_per_sample=sweeps_per_sample,
                   num_chains=num_chains, stats=stats)
    out = sampled_marginals(h, J, mask, draw, num_samples=num_samples, gradient=gradient, nudge=nudge,
                            generator=generator, return_samples=True)
    swap = None
    if return_swap_rates:
        swap = stats.get("swap_acceptance")
        if swap is None:  # a single-replica ladder: nothing to exchange
            swap = out[0].new_zeros(out[0].shape[:-1] + (0,))
        else:
            swap = _ungroup_like(h, J, mask, swap)
    return _finish(out, return_correlations, return_samples, swap)


def _ungroup_like(h, J, mask, x: Tensor) -> Tensor:
    """(N, r) per flattened system -> (..., r) in the broadcast batch shape, as sampled_marginals does."""
    g = group_queries(h, J, None, mask)
    G, Q, _ = g.h.shape
    return g.ungroup(x.reshape(G, Q, *x.shape[1:]))


def gibbs(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, **options) -> Tensor:
    """Dispatcher entry point: Gibbs marginals (options as in :func:`gibbs_marginals`, no return_*)."""
    _no_extras(options, "gibbs_marginals")
    return gibbs_marginals(h, J, K, mask, **options)


def pt(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, **options) -> Tensor:
    """Dispatcher entry point: parallel-tempering marginals (options as in :func:`pt_marginals`, no return_*)."""
    _no_extras(options, "pt_marginals")
    return pt_marginals(h, J, K, mask, **options)


def _no_extras(options: dict, full: str) -> None:
    extras = sorted(k for k in options if k.startswith("return_"))
    if extras:
        raise ValueError(f"{extras} are not available through ising.marginals, which returns marginals "
                         f"only; call boltzmann_attention.ising.mcmc.{full} instead")


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, **options) -> Tensor:
    """Not available: raises ValueError (sampling at beta = 1 does not give log Z)."""
    raise ValueError("the sampling methods ('gibbs', 'pt', 'dqa', 'sqa', dimod samplers) estimate marginals only; "
                     "sampling does not give log Z. Use method 'exact' (n <= 24) or 'banded' (banded J), "
                     "or 'meanfield' for an approximation.")


SAMPLED_LIMIT = "any n; stochastic (option num_samples), marginals only (no log Z)"


def _check_gibbs(options: dict) -> None:
    _no_extras(options, "gibbs_marginals")
    o = check_sampling_options(gibbs_marginals, options)
    _check_schedule(o["warmup"], o["sweeps_per_sample"], o["num_chains"])


def _check_pt(options: dict) -> None:
    _no_extras(options, "pt_marginals")
    o = check_sampling_options(pt_marginals, options)
    _check_schedule(o["warmup"], o["sweeps_per_sample"], o["num_chains"])
    _ladder(o["betas"], o["num_replicas"], o["beta_min"])


METHODS = (
    Method("gibbs", gibbs, None, keyword_options(gibbs_marginals), "sampled", SAMPLED_LIMIT, _check_gibbs),
    Method("pt", pt, None, keyword_options(pt_marginals), "sampled", SAMPLED_LIMIT, _check_pt),
)
