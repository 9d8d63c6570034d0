"""Method ``exact``: marginals and log Z by split enumeration, exact for any finite input.

Each query's system is solved over its present spins only (absent spins are removed from the energy, not
clamped), by split enumeration (:mod:`boltzmann_attention.ising.split`): the spins are cut into two
halves, the couplings between them go into one table T (2^(n/2) x 2^(n/2)) per group of queries that share
J and K, and every query of the group costs two GEMMs with that table, Z = u^T T v (about 2 * 2^n MACs per
query). Gradients are the covariances from the same enumeration.

Masks: queries are grouped by mask pattern (:mod:`boltzmann_attention.ising.planner`). Patterns that
split every group evenly (a causal mask: one pattern per query position) are bucketed by size into a few
calls, each padded with free spins; other masks go pattern by pattern.

Numerics (:mod:`boltzmann_attention.ising.numerics`): rows whose Z underflows, and float32 rows whose
energy scale exceeds 2^13, are recomputed in float64, so the marginals match the float64 reference for
any finite input; energies beyond float64's range raise a ValueError. Typical training values never reach
the fallback. The energy convention is the package's (see :mod:`boltzmann_attention.naive`).

Limit: ``max_spins`` (default 24) present spins per query. The table holds 2^n entries per group
(64 MB in float32 at n = 24) and the work per query is 2 * 2^n MACs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import planner, split
from ._inputs import check_int, group_queries
from .numerics import log_2cosh
from .record import Method, keyword_options

MAX_SPINS = 24


def marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              max_spins: int = MAX_SPINS) -> Tensor:
    """<s_j>, shape of h (..., n). See the module docstring for the algorithm and its limit."""
    return _solve(h, J, K, mask, max_spins)[0]


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                  max_spins: int = MAX_SPINS) -> Tensor:
    """log Z, shape h.shape[:-1]. Raises ValueError where log Z is beyond the dtype's range."""
    logz = _solve(h, J, K, mask, max_spins)[1]
    if not bool(torch.isfinite(logz).all()):
        raise ValueError(f"method 'exact': log Z exceeds the range of {h.dtype} for fields and couplings this "
                         f"large (the marginals are fine); pass float64 inputs")
    return logz


def _solve(h, J, K, mask, max_spins):
    largest = h.shape[-1] if mask is None else int(mask.sum(-1).max()) if mask.numel() else 0
    if largest > max_spins:
        raise ValueError(
            f"method 'exact' enumerates 2^n states and is limited to n <= {max_spins} present spins per "
            f"query (got {largest}). Use method='banded' (couplings of limited range), 'meanfield' or "
            f"'tap' (approximate), or raise max_spins if you accept 2^n time and memory.")
    shapes = [h.shape[:-1]] + [x.shape[:-d] for x, d in ((J, 2), (K, 3), (mask, 1)) if x is not None]
    batch = torch.broadcast_shapes(*shapes)
    if h.shape[-1] == 0 or math.prod(batch) == 0:  # nothing to enumerate: <s> is empty, log Z = log 1 = 0
        zero = h.sum() * 0  # keeps the graph, so that backward works on empty results too
        return h.new_zeros(*batch, h.shape[-1]) + zero, h.new_zeros(batch) + zero
    g = group_queries(h, J, K, mask)
    if g.mask is None:
        m, logz = split.solve(g.h, g.J, g.K)
    else:
        m, logz = _by_mask_pattern(g.h, g.J, g.K, g.mask)
    return g.ungroup(m).clamp(-1.0, 1.0), g.ungroup(logz)


def _by_mask_pattern(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor):
    """Solve masked queries. h, mask: (G, Q, n); J: (G, n, n); K: (G, n, n, n).

    Returns marginals (G, Q, n) and log Z (G, Q). Patterns that split every group evenly (a causal mask:
    one pattern per query position) are bucketed by size; the rest go pattern by pattern.
    """
    if J is None and K is None:  # independent spins: the closed form, absent spins removed
        present = mask.to(h.dtype)
        return torch.tanh(h) * present, (log_2cosh(h) * present).sum(-1)
    patterns, which, order = planner.mask_patterns(mask)
    if order is None:
        return _patterns_one_by_one(h, J, K, patterns, which.reshape(-1))
    if K is None:  # the whole plan in one autograd node
        m, logz, ok = split.Pairwise.apply(h, J, planner.plan(patterns, order, h.dtype, split.ENUMERATED_SPINS))
        return split.rescued(m, logz, ok, h, J, K, mask)
    return _buckets_with_three_body(h, J, K, planner.plan(patterns, order, h.dtype))


def _buckets_with_three_body(h: Tensor, J: Tensor | None, K: Tensor, plan: planner.Plan):
    """The plan's buckets solved one by one with three-body couplings (autograd through gathers and
    scatters): in a bucket padded to L spins the padding spins have zero field and couplings, and their
    factor 2 each in Z is taken out of log Z."""
    G, Q, n = h.shape
    q = plan.q
    h_flat = F.pad(h, (0, 1)).view(G, Q * (n + 1))  # padding column n: zero field
    J_flat = F.pad(J, (0, 1, 0, 1)).view(G, (n + 1) ** 2) if J is not None else None
    K_ext = F.pad(K, (0, 1, 0, 1, 0, 1))
    m_out, logz_out = h.new_zeros(G, Q * (n + 1)), h.new_zeros(G, Q)
    for nb, L, free, flat, hidx, qidx, idx in plan.buckets:
        sub_h = h_flat.gather(1, hidx).view(G * nb, q, L)
        sub_J = J_flat.index_select(1, flat).view(G * nb, L, L) if J is not None else None
        sub_K = K_ext[:, idx[:, :, None, None], idx[:, None, :, None], idx[:, None, None, :]].reshape(G * nb, L, L, L)
        m, logz = split.solve(sub_h, sub_J, sub_K)
        m_out = m_out.scatter(1, hidx, m.reshape(G, -1))  # the padding column n is dropped below
        logz_out = logz_out.scatter(1, qidx, (logz.view(G, nb, q) - free[:, None]).view(G, -1))
    return m_out.view(G, Q, n + 1)[..., :n], logz_out


def _patterns_one_by_one(h, J, K, patterns, which):
    """Each pattern as the smaller system of its present spins: absent spins cost nothing."""
    G, Q, n = h.shape
    flat_h = h.reshape(G * Q, n)
    out_m = h.new_zeros(G * Q, n)
    out_logz = h.new_zeros(G * Q)
    for p, pattern in enumerate(patterns):
        spins = pattern.nonzero().squeeze(-1)
        if spins.numel() == 0:
            continue  # no spin present: marginals 0, log Z = log 1 = 0
        rows = (which == p).nonzero().squeeze(-1)  # ascending, so grouped by g
        groups, counts = torch.unique_consecutive(rows // Q, return_counts=True)
        batches = [(groups, rows)] if bool((counts == counts[0]).all()) else \
            [(groups[i:i + 1], r) for i, r in enumerate(rows.split(counts.tolist()))]
        for grp, r in batches:
            sub_h = flat_h[r][:, spins].reshape(len(grp), -1, len(spins))
            sub_J = J[grp][:, spins][:, :, spins] if J is not None else None
            sub_K = K[grp][:, spins][:, :, spins][:, :, :, spins] if K is not None else None
            m, logz = split.solve(sub_h, sub_J, sub_K)
            out_m = out_m.index_put((r[:, None], spins[None, :]), m.reshape(-1, len(spins)))
            out_logz = out_logz.index_put((r,), logz.reshape(-1))
    return out_m.reshape(G, Q, n), out_logz.reshape(G, Q)


def _check_options(options: dict) -> None:
    if "max_spins" in options:
        check_int("max_spins", options["max_spins"], 1)


def _compiled(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              max_spins: int = MAX_SPINS, check: bool = True) -> Tensor:
    """The marginals as one opaque operator, what ``torch.compile`` traces: ``boltzmann_attention::exact_marginals``
    (or its ``_kept`` variant), which :mod:`boltzmann_attention.ising.opaque` registers around this module's
    solver."""
    from . import opaque  # it imports this module

    return opaque.exact_solve(h, J, K, mask, max_spins, check)


METHOD = Method("exact", marginals, log_partition, keyword_options(marginals), "exact",
                f"n <= {MAX_SPINS} present spins per query (option max_spins)", _check_options,
                max_spins=MAX_SPINS, three_body=True, window=True, compiled=_compiled)
