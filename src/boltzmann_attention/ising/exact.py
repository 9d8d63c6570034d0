"""Exact marginals by split enumeration: Z = u^T K v (docs: SAMPLERS.md §0).

Split the n spins into a first half A (a = n // 2 spins) and a second half B (b = n - a). Then

    -E(s) = h_A.s_A + h_B.s_B + C(s_A, s_B),

where C holds every coupling term (pairwise and three-body). C does not depend on the query, so for
each group of queries that share J and K we build once the table

    K[x, y] = exp(C(x, y))                     (2^a, 2^b), x and y index the half-configurations,

and for each query only u[x] = exp(h_A.S_A[x]) and v[y] = exp(h_B.S_B[y]). Then

    Z = u^T K v,   <s_A> = ((u * K v) @ S_A) / Z,   <s_B> = ((v * K^T u) @ S_B) / Z.

All queries of a group go through two GEMMs with inner size 2^(n/2): about 2 * 2^n MACs per query
instead of 2 n 2^n for naive enumeration.

Gradients (hand-written: ``_Pairwise`` for h and J in one autograd node, ``_Contract`` when K is present
and autograd differentiates the table factors): for an upstream gradient g on <s> and g_Z on
log Z, the loss is linear in the state averages, so with f(s) = g.s = f_A[x] + f_B[y] and
p(x, y) = u_x K_xy v_y / Z,

    dL/dlog u_x = sum_y p(x, y) (f(x, y) - <f> + g_Z),   dL/dlog v_y likewise,
    dL/dC_xy    = sum_queries p(x, y) (f(x, y) - <f> + g_Z),

i.e. the covariances d<s_j>/dh_k = <s_j s_k> - <s_j><s_k> (and <s_j s_k s_l> terms for C, hence J and
K), computed from the same u, K, v with four more GEMMs. log u, log v and C are linear in h, J, K, so
autograd takes it from there.

Numerics: u, v and K are each shifted by their maximum in the log domain. When the terms that matter
are far from those maxima (|h|, |J| of order 10^2 and more, fields fighting couplings), Z underflows;
such rows are detected (Z below sqrt(tiny) of the dtype, or not finite) and recomputed in float64
from h, J and K: the 2^n log-weights, shifted by their maximum and normalised (a softmax), so
|<s>| <= 1 whatever the scale. Rows of lower-precision inputs (float32) whose energy scale
sum |h| + sum |J| / 2 + sum |K| / 6 exceeds 2^13 (where float32 rounding of the log-weights reaches
1e-3) go the same way. Energies beyond float64's range (|E| > 1e308) raise a ValueError. Typical
training values never reach the fallback.

Masks: queries are grouped by their mask pattern and each pattern is solved as the smaller system of
its present spins. Patterns with the same number of queries per group (a causal mask: one pattern per
query position) are bucketed by their number of present spins into a few calls, each padded to its
largest size with free spins (zero field and couplings: <s> = 0 exactly, a factor 2 in Z that is taken
out of log Z); the buckets minimise a cost model of per-call overhead plus 2^size work. Other masks go
pattern by pattern.

Small pairwise systems (n <= _ENUMERATED_SPINS = 8, within one table block and one query chunk) skip the
split: the 2^n log-weights h.s + s.J.s / 2 of all states and a softmax, a dozen operations in all (n 2^n
work per query instead of 2^n, cheaper than the split's per-operation overhead at these sizes).

Limit: ``max_spins`` (default 24) present spins per query. The table holds 2^n entries per group
(64 MB in float32 at n = 24) and the work per query is 2 * 2^n MACs.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._inputs import group_queries
from .reference import configurations

MAX_SPINS = 24
_CHUNK_ELEMENTS = 2**24  # bound on (queries x half-configurations) held at once per GEMM
# Bucketing cost model, in units of (query x state): a call costs _CALL_OVERHEAD, and each pattern padded
# to L spins costs (queries + _TABLE_COST) * 2^L. Scanned on the 2-core CPU (1 thread): 2^21 was best at T = 12, 16.
_CALL_OVERHEAD = 2**21
_TABLE_COST = 8
_BUCKETED = True  # False: every mask pattern is its own call (tests compare the two paths)
_BLOCK_ELEMENTS = 2**18  # table entries per block of the table's passes (1 MB in float32: stays in cache)
_ENUMERATED_SPINS = 8  # pairwise systems up to this size (and within one block and chunk) skip the split
_FLOAT32_SCALE_LIMIT = 2.0**13  # energy scale above which lower-precision rows are solved in float64


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
        m, logz = _split(g.h, g.J, g.K)
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
        return torch.tanh(h) * present, (_log_2cosh(h) * present).sum(-1)
    patterns, which, order = _mask_patterns(mask)
    if _BUCKETED and order is not None:
        if K is None:
            m, logz, ok = _Pairwise.apply(h, J, _plan(patterns, order, h.dtype))
            return _checked(m, logz, ok, h, J, K, mask)
        return _patterns_bucketed(h, J, K, patterns, order)
    return _patterns_one_by_one(h, J, K, patterns, which.reshape(-1))


_MASKS: dict = {}  # recent masks by shape and device: (mask, its _mask_patterns)


def _mask_patterns(mask: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """Distinct rows (P, n) of a (G, Q, n) mask, the pattern of each query (G, Q), and ``order`` (G, Q)
    sorting each group's queries by pattern when every group has Q / P queries of each (else None).
    Cached: a causal mask is the same every call, and one comparison replaces the unique and the sort."""
    G, Q, n = mask.shape
    key = (mask.shape, mask.device)
    if key in _MASKS and torch.equal(_MASKS[key][0], mask):
        return _MASKS[key][1]
    patterns, which = _unique_rows(mask.reshape(-1, n))
    P = len(patterns)
    which = which.view(G, Q)
    order = None
    if Q % P == 0:
        sorted_which, order = torch.sort(which, dim=1, stable=True)
        if not bool((sorted_which == _pattern_ids(P, Q // P, mask.device)).all()):
            order = None
    _MASKS[key] = (mask.clone(), (patterns, which, order))
    while len(_MASKS) > 8:
        del _MASKS[next(iter(_MASKS))]
    return patterns, which, order


def _unique_rows(mask: Tensor) -> tuple[Tensor, Tensor]:
    """torch.unique(mask, dim=0, return_inverse=True) for a bool (rows, n) mask, n <= 62, via bit codes
    (unique over rows is slow: about 3 ms for 1024 rows of 16)."""
    n = mask.shape[-1]
    if n > 62:
        return torch.unique(mask, dim=0, return_inverse=True)
    bits = torch.arange(n, device=mask.device)
    codes, which = torch.unique((mask.long() << bits).sum(-1), return_inverse=True)
    return (codes[:, None] >> bits) & 1 == 1, which


def _buckets(sizes: list[int], queries: int, enumerated: int = 0) -> list[tuple[int, int]]:
    """Split ascending pattern sizes into contiguous buckets [start, end) minimising the cost model.

    A bucket is padded to its largest size L and costs _CALL_OVERHEAD + count * (queries + _TABLE_COST) * 2^L;
    one with L <= ``enumerated`` (solved state by state: fewer operations, n 2^n work per query) costs
    _CALL_OVERHEAD / 2 + count * (queries * L / 4 + _TABLE_COST) * 2^L.
    Dynamic programme over the distinct sizes (at most n + 1 of them).
    """
    distinct = sorted(set(sizes))
    ends = [max(i for i, s in enumerate(sizes) if s == d) + 1 for d in distinct]  # end index of each size
    best = [0.0] + [math.inf] * len(distinct)
    cut = [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        for i in range(j):
            start = ends[i - 1] if i else 0
            L = distinct[j - 1]
            overhead, per_query = (_CALL_OVERHEAD / 2, L / 4) if L <= enumerated else (_CALL_OVERHEAD, 1)
            cost = best[i] + overhead + (ends[j - 1] - start) * (queries * per_query + _TABLE_COST) * 2.0 ** L
            if cost < best[j]:
                best[j], cut[j] = cost, i
    out, j = [], len(distinct)
    while j:
        i = cut[j]
        out.append((ends[i - 1] if i else 0, ends[j - 1]))
        j = i
    return out[::-1]


@lru_cache(maxsize=64)
def _pattern_ids(P: int, q: int, device: torch.device) -> Tensor:
    """0, .., 0, 1, .., P - 1: the pattern of each query once sorted, q queries per pattern."""
    return torch.arange(P, device=device).repeat_interleave(q)


class _Plan:
    """Buckets of mask patterns by size, for ``_Pairwise``; ``order`` (G, Q) sorts each group's queries by
    pattern (q = Q / P per pattern).

    Each bucket: (nb, L, free (nb,) log 2 per padded spin, flat (nb L L,) indices of the sub-J's entries in
    the padded (n + 1)^2 J, hidx (G, nb q L) indices of the sub-h's entries in the padded (G, Q (n + 1)) h,
    qidx (G, nb q) its queries). In a bucket padded to L spins, each pattern's present spins come first
    (ascending), then the padding index n: h, the marginals and their gradients move by one gather or
    scatter each. Patterns without a present spin are in no bucket (marginals 0, log Z 0).
    """

    def __init__(self, patterns: Tensor, order: Tensor, dtype: torch.dtype, key: tuple):
        G, Q = order.shape
        P, n = patterns.shape
        self.order, self.q = order, Q // P
        perm, buckets = _plan_buckets(key, P, n, G * self.q, (_CALL_OVERHEAD, _TABLE_COST, _ENUMERATED_SPINS),
                                      dtype, patterns.device)
        rows = order.view(G, P, self.q)
        if perm is not None:  # by size (a causal mask's patterns already are)
            rows = rows[:, perm]
        self.buckets = []
        for start, end, idx, free, flat in buckets:
            nb, L = idx.shape
            sel = rows[:, start:end]  # (G, nb, q)
            hidx = (sel[..., None] * (n + 1) + idx[None, :, None, :]).reshape(G, nb * self.q * L)
            self.buckets.append((nb, L, free, flat, hidx, sel.reshape(G, nb * self.q)))


_PLANS: dict = {}  # recent plans by patterns, shapes and dtype; reused while the queries' order is the same


def _plan(patterns: Tensor, order: Tensor, dtype: torch.dtype) -> _Plan:
    """The ``_Plan`` of these patterns and query order, cached (a causal mask gives the same one each call)."""
    key = tuple(patterns.flatten().tolist())
    cache_key = (key, patterns.shape, order.shape, dtype, order.device,
                 (_CALL_OVERHEAD, _TABLE_COST, _ENUMERATED_SPINS))
    plan = _PLANS.get(cache_key)
    if plan is None or not (plan.order is order or torch.equal(plan.order, order)):
        plan = _PLANS[cache_key] = _Plan(patterns, order, dtype, key)
        while len(_PLANS) > 8:
            del _PLANS[next(iter(_PLANS))]
    return plan


@lru_cache(maxsize=256)
def _plan_buckets(key: tuple, P: int, n: int, queries: int, constants: tuple, dtype: torch.dtype,
                  device: torch.device):
    """(perm, buckets) of ``_Plan`` for the patterns ``key`` (P x n bools, flattened); perm None when the
    patterns already are by size. constants: the cost model's (part of the cache key)."""
    patterns = torch.tensor(key, dtype=torch.bool).view(P, n)
    sizes = patterns.sum(-1).tolist()
    by_size = sorted(range(P), key=sizes.__getitem__)
    first = sizes.count(0)
    spins = torch.argsort((~patterns).to(torch.int8), dim=1, stable=True)
    spins = torch.where(torch.arange(n) < torch.tensor(sizes)[:, None], spins, n)
    buckets = []
    for start, end in _buckets([sizes[p] for p in by_size[first:]], queries, _ENUMERATED_SPINS):
        start, end = first + start, first + end
        chosen = by_size[start:end]
        L = sizes[chosen[-1]]
        idx = spins[chosen, :L]
        free = torch.tensor([(L - sizes[p]) * math.log(2.0) for p in chosen], dtype=dtype)
        flat = (idx[:, :, None] * (n + 1) + idx[:, None, :]).reshape(-1)
        buckets.append((start, end, idx.to(device), free.to(device), flat.to(device)))
    perm = None if by_size == list(range(P)) else torch.tensor(by_size, device=device)
    return perm, buckets


def _patterns_bucketed(h, J, K, patterns, order):
    """Patterns bucketed by size; in a bucket padded to L spins, each pattern's present spins come first
    (in their order) and the rest are free spins (zero field and couplings), whose factor 2 in Z is taken
    out of log Z. ``order`` (G, Q) sorts each group's queries by pattern, q = Q / P queries per pattern.
    """
    G, Q, n = h.shape
    P = len(patterns)
    q = Q // P
    device = h.device
    sizes = patterns.sum(-1)
    size_list = sizes.tolist()
    by_size = sorted(range(P), key=size_list.__getitem__)
    first = size_list.count(0)  # by_size[:first]: patterns without any present spin
    # present spins first (ascending), then the absent ones, replaced by the padding index n
    spins = torch.argsort((~patterns).to(torch.int8), dim=1, stable=True)
    spins = torch.where(torch.arange(n, device=device) < sizes[:, None], spins, n)
    order = order.view(G, P, q)
    h_ext = F.pad(h, (0, 1))
    J_ext = F.pad(J, (0, 1, 0, 1)) if J is not None else None
    K_ext = F.pad(K, (0, 1, 0, 1, 0, 1)) if K is not None else None
    groups = torch.arange(G, device=device)
    ms, logzs, rows = [], [], []
    if first:  # patterns without any present spin: <s> = 0, log Z = 0
        rows.append(order[:, torch.tensor(by_size[:first], device=device)])
        ms.append(h.new_zeros(G, first, q, n))
        logzs.append(h.new_zeros(G, first, q))
    for start, end in _buckets([size_list[p] for p in by_size[first:]], G * q):
        chosen = torch.tensor(by_size[first + start:first + end], device=device)
        nb, L = len(chosen), size_list[by_size[first + end - 1]]
        idx = spins[chosen, :L]  # (nb, L)
        sel = order[:, chosen]   # (G, nb, q)
        sub_h = h_ext[groups[:, None, None, None], sel[..., None], idx[None, :, None, :]]  # (G, nb, q, L)
        sub_J = J_ext[:, idx[:, :, None], idx[:, None, :]].reshape(G * nb, L, L) if J is not None else None
        sub_K = (K_ext[:, idx[:, :, None, None], idx[:, None, :, None], idx[:, None, None, :]]
                 .reshape(G * nb, L, L, L) if K is not None else None)
        m, logz = _split(sub_h.reshape(G * nb, q, L), sub_J, sub_K)
        free = (L - sizes[chosen]).to(h.dtype) * math.log(2.0)
        logzs.append(logz.view(G, nb, q) - free[None, :, None])
        full = h.new_zeros(G, nb, q, n + 1).scatter(3, idx[None, :, None, :].expand(G, nb, q, L), m.view(G, nb, q, L))
        ms.append(full[..., :n])
        rows.append(sel)
    unsort = torch.argsort(torch.cat(rows, 1).reshape(G, Q), dim=1)
    m = torch.cat(ms, 1).reshape(G, Q, n).gather(1, unsort[..., None].expand(G, Q, n))
    return m, torch.cat(logzs, 1).reshape(G, Q).gather(1, unsort)


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
            m, logz = _split(sub_h, sub_J, sub_K)
            out_m = out_m.index_put((r[:, None], spins[None, :]), m.reshape(-1, len(spins)))
            out_logz = out_logz.index_put((r,), logz.reshape(-1))
    return out_m.reshape(G, Q, n), out_logz.reshape(G, Q)


@lru_cache(maxsize=64)
def _half_configurations(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return configurations(n, dtype=dtype, device=device)


def _split(h: Tensor, J: Tensor | None, K: Tensor | None):
    """h (G, Q, n), J (G, n, n), K (G, n, n, n), no mask. Returns (G, Q, n) marginals, (G, Q) log Z."""
    if J is None and K is None:  # independent spins: the closed form is exact
        return torch.tanh(h), _log_2cosh(h).sum(-1)
    n = h.shape[-1]
    a = n // 2
    SA = _half_configurations(a, h.dtype, h.device)      # (2^a, a)
    SB = _half_configurations(n - a, h.dtype, h.device)  # (2^b, b)
    if K is None:  # pairwise: one autograd node, hand-written backward
        m, logz, ok = _Pairwise.apply(h, J, None)
    else:  # with three-body couplings: the table factors go through autograd
        left, right = _table_factors(J, K, a, SA, SB)  # C = left @ right^T, (G, 2^a, 2^b)
        log_u = h[..., :a] @ SA.T  # (G, Q, 2^a)
        log_v = h[..., a:] @ SB.T  # (G, Q, 2^b)
        chunk = max(1, _CHUNK_ELEMENTS // max(SA.shape[0], SB.shape[0]))
        pieces = [_Contract.apply(lu, lv, left, right, SA, SB)
                  for lu, lv in zip(log_u.split(chunk, dim=1), log_v.split(chunk, dim=1))]
        m, logz, ok = (torch.cat(x, dim=1) for x in zip(*pieces)) if len(pieces) > 1 else pieces[0]
    return _checked(m, logz, ok, h, J, K)


def _checked(m, logz, ok, h, J, K, mask=None):
    """Rows that underflowed (ok False), and float32 rows whose energy scale exceeds
    _FLOAT32_SCALE_LIMIT, recomputed by the float64 fallback."""
    if h.dtype != torch.float64 and _energy_bound(h, J, K) > _FLOAT32_SCALE_LIMIT:  # rounding of large
        ok = ok & (_energy_scale(h, J, K) <= _FLOAT32_SCALE_LIMIT)  # log-weights: solve those rows in float64
    if not bool(ok.all()):
        m, logz = _log_domain_fallback(m, logz, ok, h, J, K, mask)
    return m, logz


def _energy_bound(h: Tensor, J: Tensor | None, K: Tensor | None) -> float:
    """A bound on every query's ``_energy_scale`` in a few reductions (n max |h| + sum |J| / 2 + sum |K| / 6
    over all groups): the per-query scales are needed only when it exceeds the limit."""
    bound = float(h.detach().abs().amax()) * h.shape[-1] if h.numel() else 0.0
    for x, d in ((J, 2), (K, 6)):
        if x is not None:
            bound += float(x.detach().abs().sum()) / d
    return bound


def _energy_scale(h: Tensor, J: Tensor | None, K: Tensor | None) -> Tensor:
    """sum |h| + sum_{j<k} |J| + sum_{j<k<l} |K| per query, (G, Q): a bound on |-E(s)|."""
    scale = h.detach().abs().sum(-1)
    if J is not None:
        scale = scale + J.detach().abs().sum((-1, -2))[:, None] / 2
    if K is not None:
        scale = scale + K.detach().abs().sum((-1, -2, -3))[:, None] / 6
    return scale


def _log_2cosh(x: Tensor) -> Tensor:
    return x.abs() + torch.log1p(torch.exp(-2 * x.abs())) + math.log(2.0)


def _table_factors(J: Tensor | None, K: Tensor | None, a: int, SA: Tensor, SB: Tensor) -> tuple[Tensor, Tensor]:
    """Factors of the coupling table C(x, y) = s.J.s / 2 + K(s, s, s) / 6 for s = (SA[x], SB[y]):
    C = left @ right^T with left (G, 2^a, r), right (G, 2^b, r).

    The A-A and B-B parts depend on one half only (a column of left against ones in right, and the
    reverse); the A-B parts are bilinear: SA JAB SB^T, and with K also 3 KAAB(sA, sA, sB) and
    3 KABB(sA, sB, sB) (K symmetric: sum over ordered triples = AAA + BBB + 3 AAB + 3 ABB).
    """
    G = (J if J is not None else K).shape[0]
    b = SB.shape[1]
    cross = row = col = 0.0
    lefts, rights = [], []
    if J is not None:
        JAA, JAB, JBB = J[:, :a, :a], J[:, :a, a:], J[:, a:, a:]
        cross = SA @ JAB                                 # (G, 2^a, b), against SB
        row = 0.5 * ((SA @ JAA) * SA).sum(-1)            # (G, 2^a)
        col = 0.5 * ((SB @ JBB) * SB).sum(-1)            # (G, 2^b)
    if K is not None:
        PA = (SA[:, :, None] * SA[:, None, :]).reshape(SA.shape[0], a * a)  # pair products
        PB = (SB[:, :, None] * SB[:, None, :]).reshape(SB.shape[0], b * b)
        cross = cross + PA @ K[:, :a, :a, a:].reshape(G, a * a, b) / 2
        lefts.append(SA @ K[:, :a, a:, a:].reshape(G, a, b * b) / 2)    # against PB
        rights.append(PB.expand(G, -1, -1))
        row = row + ((PA @ K[:, :a, :a, :a].reshape(G, a * a, a)) * SA).sum(-1) / 6
        col = col + ((PB @ K[:, a:, a:, a:].reshape(G, b * b, b)) * SB).sum(-1) / 6
    ones_a = SA.new_ones(1, 1, 1).expand(G, SA.shape[0], 1)
    ones_b = SB.new_ones(1, 1, 1).expand(G, SB.shape[0], 1)
    left = torch.cat([cross.expand(G, SA.shape[0], b), *lefts, row[..., None], ones_a], dim=-1)
    right = torch.cat([SB.expand(G, -1, -1), *rights, ones_b, col[..., None]], dim=-1)
    return left, right


def _row_blocks(G: int, rows: int, cols: int) -> list[tuple]:
    """(group, row slice) blocks of about _BLOCK_ELEMENTS covering a (G, rows, cols) table; a small table
    is one block (slice(None), slice(None)) for all groups."""
    if G * rows * cols <= _BLOCK_ELEMENTS:
        return [(slice(None), slice(None))]
    step = max(1, _BLOCK_ELEMENTS // cols)
    return [(g, slice(r, min(r + step, rows))) for g in range(G) for r in range(0, rows, step)]


def _exp_floor(dtype: torch.dtype) -> float:
    """exp of arguments below log(tiny) is ~100x slower on CPU (the underflow path): arguments are
    floored here, which changes weights below e * tiny relative to the largest one by at most that."""
    return math.log(torch.finfo(dtype).tiny) + 1.0


_DENORMAL_PROBE = (torch.tensor(1e-30), torch.tensor(1e-10))  # their product is 0 when denormals are flushed


@contextmanager
def _no_denormals(device: torch.device):
    """Flush denormals to zero on this CPU thread for the duration (restored after).

    The weights u, K, v lie in [tiny, 1] and their products, ignored next to Z >= sqrt(tiny), often fall
    below tiny: denormal arithmetic is ~40x slower on x86. Flushing them changes Z by < 2^n tiny.
    """
    if device.type != "cpu" or bool(_DENORMAL_PROBE[0] * _DENORMAL_PROBE[1] == 0):  # not CPU, or on already
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


class _Table:
    """K = exp(C - row max) with C = left @ right^T, (G, 2^a, 2^b), block by block.

    A table of one block is kept; a larger one is rebuilt block by block each time it is read (a GEMM of
    inner size r and an exp per entry, in cache), so no temporary of the table's size is allocated.
    """

    def __init__(self, left: Tensor, right: Tensor):
        self.left, self.right = left, right
        G, rows, cols = left.shape[0], left.shape[1], right.shape[1]
        self.blocks = _row_blocks(G, rows, cols)
        self.floor = _exp_floor(left.dtype)
        self.sanitise = False  # set when the table holds inf/NaN (values beyond the dtype): read as 0
        if len(self.blocks) == 1:
            self.kept = left @ right.transpose(-1, -2)
            self.row_max = self.kept.amax(-1)
            self.kept.sub_(self.row_max[..., None]).clamp_(min=self.floor).exp_()
        else:
            self.kept = None
            self.buffer = left.new_empty(self.blocks[0][1].stop - self.blocks[0][1].start, cols)
            self.row_max = left.new_empty(G, rows)
            for g, r in self.blocks:
                block = self._product(g, r)
                self.row_max[g, r] = block.amax(-1)

    def _product(self, g, r) -> Tensor:
        out = self.buffer[:r.stop - r.start]
        return torch.matmul(self.left[g, r], self.right[g].transpose(-1, -2), out=out)

    def __iter__(self):
        """(group, row slice, K block (rows, 2^b) or (G, 2^a, 2^b))."""
        if self.kept is not None:
            yield slice(None), slice(None), (torch.nan_to_num(self.kept, 0.0, 0.0, 0.0) if self.sanitise
                                             else self.kept)
            return
        for g, r in self.blocks:
            block = self._product(g, r).sub_(self.row_max[g, r][:, None]).clamp_(min=self.floor).exp_()
            yield g, r, (block.nan_to_num_(0.0, 0.0, 0.0) if self.sanitise else block)

    def products(self, u: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """K v (G, q, 2^a) and K^T u (G, q, 2^b) for u (G, q, 2^a), v (G, q, 2^b)."""
        if self.kept is not None:
            k = next(iter(self))[2]
            return v @ k.transpose(-1, -2), u @ k
        kv = u.new_empty(u.shape)
        ku = v.new_zeros(v.shape)
        for g, r, block in self:  # in place: fresh large temporaries cost page faults on CPU
            kv[g, :, r] = v[g] @ block.T
            ku[g].addmm_(u[g, :, r], block)
        return kv, ku


def _contract_forward(log_u, log_v, left, right, SA, SB):
    """Z = u^T K v for log u (G, q, 2^a), log v (G, q, 2^b) and the table C = left @ right^T.

    K = exp(C - row max) (``_Table``), the row maxima absorbed into log u; u and v max-shifted. Returns
    marginals (G, q, n), log Z (G, q), ok (G, q) and what the backward needs. ok is False where Z
    underflowed or is not finite: those rows hold placeholders (marginals 0) and get no gradient.
    """
    table = _Table(left, right)
    floor = table.floor
    log_u = log_u + table.row_max[:, None, :]
    shift_u, shift_v = log_u.amax(-1, keepdim=True), log_v.amax(-1, keepdim=True)
    u = log_u.sub_(shift_u).clamp_(min=floor).exp_()
    v = (log_v - shift_v).clamp_(min=floor).exp_()
    kv, ku = table.products(u, v)
    pa = u * kv
    z = pa.sum(-1)
    ok = z > torch.finfo(z.dtype).tiny ** 0.5  # False for NaN too
    if not bool(ok.all()):  # keep NaN / inf of bad rows (and tables) out of the results and gradients
        table.sanitise = True
        u = torch.where(ok[..., None], u, 0.0).nan_to_num_(0.0, 0.0, 0.0)
        v = torch.where(ok[..., None], v, 0.0).nan_to_num_(0.0, 0.0, 0.0)
        kv, ku = table.products(u, v)
        pa = u * kv
        z = torch.where(ok, z, 1.0)
    r = 1.0 / z
    pa = pa.mul_(r[..., None])  # marginal distribution of half A, (G, q, 2^a)
    pb = (v * ku).mul_(r[..., None])  # of half B, (G, q, 2^b)
    m = torch.cat([pa @ SA, pb @ SB], dim=-1)
    logz = torch.where(ok, torch.log(z) + shift_u.squeeze(-1) + shift_v.squeeze(-1), 0.0)
    return m, logz, ok, (table, u, v, r, pa, pb, m, SA, SB)


def _contract_backward(saved, grad_m, grad_logz, table_grad: bool, right_grad: bool = True):
    """Gradients in log u, log v, left and right (None unless table_grad; right None unless right_grad too)
    from the covariance formula."""
    table, u, v, r, pa, pb, m, SA, SB = saved
    a = SA.shape[1]
    f_a = grad_m[..., :a] @ SA.T  # f(s) = g.s = f_a[x] + f_b[y]
    f_b = grad_m[..., a:] @ SB.T
    c = (grad_logz - (grad_m * m).sum(-1))[..., None]  # g_Z - <f>
    ur, vr = u * r[..., None], v * r[..., None]
    k_vf, k_uf = table.products(u * f_a, v * f_b)  # K (v f_b) and K^T (u f_a)
    grad_u = pa * (f_a + c) + ur * k_vf
    grad_v = pb * (f_b + c) + vr * k_uf
    grad_left = grad_right = None
    if table_grad:  # dL/dC = K * (xu @ xv) summed over queries, a rank-2q product read block by block
        left, right = table.left, table.right
        xu = torch.cat([ur * (f_a + c), ur], dim=1).transpose(-1, -2)   # (G, 2^a, 2q)
        xv = torch.cat([v, v * f_b], dim=1)                             # (G, 2q, 2^b)
        if table.kept is not None:
            block = (xu @ xv).mul_(next(iter(table))[2])
            grad_left = block @ right
            grad_right = block.transpose(-1, -2) @ left if right_grad else None
        else:
            grad_left = torch.zeros_like(left)
            grad_right = torch.zeros_like(right) if right_grad else None
            work = torch.empty_like(table.buffer)
            for g, rr, block in table:
                block = torch.matmul(xu[g, rr], xv[g], out=work[:rr.stop - rr.start]).mul_(block)
                grad_left[g, rr] = block @ right[g]
                if right_grad:
                    grad_right[g].addmm_(block.T, left[g, rr])
    return grad_u, grad_v, grad_left, grad_right


class _Contract(torch.autograd.Function):
    """Autograd wrapper of _contract_forward / _contract_backward (first derivatives only): the generic
    path, with the table factors (J and K) differentiated by autograd."""

    @staticmethod
    def forward(ctx, log_u, log_v, left, right, SA, SB):
        with _no_denormals(log_u.device):
            m, logz, ok, ctx.saved = _contract_forward(log_u, log_v, left, right, SA, SB)
        ctx.mark_non_differentiable(ok)
        return m, logz, ok

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_m, grad_logz, _):
        with _no_denormals(grad_m.device):
            grad_u, grad_v, grad_left, grad_right = _contract_backward(
                ctx.saved, grad_m, grad_logz, ctx.needs_input_grad[2] or ctx.needs_input_grad[3])
        return grad_u, grad_v, grad_left, grad_right, None, None


def _pairwise_forward(h: Tensor, J: Tensor):
    """h (G, q, n), J (G, n, n), no autograd. Returns marginals, log Z, ok and what the backward needs.

    The table is C = SA JAB SB^T (left = SA JAB, right = SB); the half-only terms row = diag(SA JAA SA^T) / 2
    and col = diag(SB JBB SB^T) / 2 go into log u and log v."""
    n = h.shape[-1]
    if n <= _ENUMERATED_SPINS and h.shape[0] * h.shape[1] << n <= _CHUNK_ELEMENTS \
            and J.shape[0] << n <= _BLOCK_ELEMENTS:
        return _enumerated_forward(h, J)
    a = n // 2
    SA = _half_configurations(a, h.dtype, h.device)
    SB = _half_configurations(n - a, h.dtype, h.device)
    left, right = SA @ J[:, :a, a:], SB.expand(J.shape[0], -1, -1)
    row = ((SA @ J[:, :a, :a]) * SA).sum(-1).mul_(0.5)  # (G, 2^a)
    col = ((SB @ J[:, a:, a:]) * SB).sum(-1).mul_(0.5)  # (G, 2^b)
    log_u = torch.baddbmm(row[:, None], h[..., :a], SA.T.expand(h.shape[0], -1, -1))
    log_v = torch.baddbmm(col[:, None], h[..., a:], SB.T.expand(h.shape[0], -1, -1))
    chunk = max(1, _CHUNK_ELEMENTS // max(SA.shape[0], SB.shape[0]))
    if h.shape[1] <= chunk:
        m, logz, ok, saved = _contract_forward(log_u, log_v, left, right, SA, SB)
        return m, logz, ok, [saved]
    pieces = [_contract_forward(lu, lv, left, right, SA, SB)
              for lu, lv in zip(log_u.split(chunk, dim=1), log_v.split(chunk, dim=1))]
    m, logz, ok = (torch.cat([p[i] for p in pieces], dim=1) for i in range(3))
    return m, logz, ok, [p[3] for p in pieces]


def _pairwise_backward(saved: list, grad_m: Tensor, grad_logz: Tensor, J_grad: bool):
    """Gradients in h (G, q, n) and J (G, n, n) (None unless J_grad), see ``_pairwise_forward``:
    dJAB = SA^T dleft, dJAA = SA^T diag(drow) SA / 2 with drow = dlog u summed over queries, dJBB likewise."""
    if isinstance(saved, tuple):
        return _enumerated_backward(saved, grad_m, grad_logz, J_grad)
    SA, SB = saved[0][-2], saved[0][-1]
    a = SA.shape[1]
    grads_h, grad_left, grad_row, grad_col, start = [], 0, 0, 0, 0
    for piece in saved:
        q = piece[1].shape[1]
        gu, gv, gl, _ = _contract_backward(piece, grad_m[:, start:start + q], grad_logz[:, start:start + q],
                                           J_grad, right_grad=False)
        grads_h.append(torch.cat([gu @ SA, gv @ SB], dim=-1))
        if J_grad:
            grad_left, grad_row, grad_col = grad_left + gl, grad_row + gu.sum(1), grad_col + gv.sum(1)
        start += q
    grad_h = grads_h[0] if len(grads_h) == 1 else torch.cat(grads_h, dim=1)
    grad_J = None
    if J_grad:
        grad_J = grad_h.new_zeros(grad_h.shape[0], *grad_h.shape[-1:] * 2)
        grad_J[:, :a, a:] = SA.T @ grad_left
        grad_J[:, :a, :a] = ((SA.T * grad_row[:, None, :]) @ SA).mul_(0.5)
        grad_J[:, a:, a:] = ((SB.T * grad_col[:, None, :]) @ SB).mul_(0.5)
    return grad_h, grad_J


@lru_cache(maxsize=64)
def _states(n: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """All 2^n states S (2^n, n) and their pair products s_j s_k / 2, (2^n, n n)."""
    S = configurations(n, dtype=dtype, device=device)
    return S, (S[:, :, None] * S[:, None, :]).reshape(-1, n * n) * 0.5


def _enumerated_forward(h: Tensor, J: Tensor):
    """``_pairwise_forward`` for small systems, state by state: log-weights h.s + s.J.s / 2 for all 2^n
    states (G, q, 2^n) and a softmax. More arithmetic than the split (n 2^n per query instead of 2^n), but a
    dozen operations in all, which is what small n wants. Saves a tuple (the split saves a list)."""
    G, q, n = h.shape
    S, pairs = _states(n, h.dtype, h.device)
    coupling = J.reshape(G, n * n) @ pairs.T  # (G, 2^n)
    logits = torch.baddbmm(coupling[:, None, :], h, S.T.expand(G, n, S.shape[0]))
    shift = logits.amax(-1, keepdim=True)
    p = logits.sub_(shift).clamp_(min=_exp_floor(h.dtype)).exp_()
    z = p.sum(-1, keepdim=True)
    p = p.div_(z)
    logz = z.log_().add_(shift).squeeze(-1)
    ok = torch.isfinite(logz)
    if not bool(ok.all()):  # values beyond the dtype: placeholders (marginals 0), no gradient
        p = torch.where(ok[..., None], p, 0.0)
        logz = torch.where(ok, logz, 0.0)
    m = p @ S
    return m, logz, ok, (p, m, S, pairs)


def _enumerated_backward(saved: tuple, grad_m: Tensor, grad_logz: Tensor, J_grad: bool):
    """Gradients of ``_enumerated_forward``: dL/dlogit = p (g.s - <g.s> + g_Z), then through the features."""
    p, m, S, pairs = saved
    c = grad_logz - (grad_m * m).sum(-1)
    grad_logits = (grad_m @ S.T).add_(c[..., None]).mul_(p)  # (G, q, 2^n)
    grad_h = grad_logits @ S
    grad_J = (grad_logits.sum(1) @ pairs).view(-1, *S.shape[-1:] * 2) if J_grad else None
    return grad_h, grad_J


class _Pairwise(torch.autograd.Function):
    """Marginals, log Z and ok of pairwise systems, (h (G, Q, n), J (G, n, n)) -> (G, Q, n), (G, Q), (G, Q),
    in one autograd node: the table factors, the split and (with ``plan``) the mask buckets are plain
    tensor code, differentiated by hand (first derivatives only).

    plan: None (no mask) or a ``_Plan``: the queries sorted by pattern (one gather), each bucket of
    patterns solved as (G * nb) systems of L spins in which the padded spins are free (gathers of h and of
    the flattened J), and scattered back; the J gradient is summed over the buckets by scatter_add_.
    """

    @staticmethod
    def forward(ctx, h, J, plan):
        with _no_denormals(h.device):
            return _Pairwise._forward(ctx, h, J, plan)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_m, grad_logz, _):
        with _no_denormals(grad_m.device):
            return _Pairwise._backward(ctx, grad_m, grad_logz)

    @staticmethod
    def _forward(ctx, h, J, plan):
        ctx.plan = plan
        if plan is None:
            m, logz, ok, ctx.saved = _pairwise_forward(h, J)
            ctx.mark_non_differentiable(ok)
            return m, logz, ok
        G, Q, n = h.shape
        q = plan.q
        h_flat = F.pad(h, (0, 1)).view(G, Q * (n + 1))  # padding column n: zero field
        J_flat = F.pad(J, (0, 1, 0, 1)).view(G, (n + 1) ** 2)
        m_out, logz_out = h.new_zeros(G, Q * (n + 1)), h.new_zeros(G, Q)
        ok_out = torch.ones(G, Q, dtype=torch.bool, device=h.device)
        ctx.saved = []
        for nb, L, free, flat, hidx, qidx in plan.buckets:
            m, logz, ok, saved = _pairwise_forward(h_flat.gather(1, hidx).view(G * nb, q, L),
                                                   J_flat.index_select(1, flat).view(G * nb, L, L))
            m_out.scatter_(1, hidx, m.reshape(G, -1))  # the padding column n is dropped below
            logz_out.scatter_(1, qidx, (logz.view(G, nb, q) - free[:, None]).view(G, -1))
            ok_out.scatter_(1, qidx, ok.reshape(G, -1))
            ctx.saved.append(saved)
        ctx.mark_non_differentiable(ok_out)
        return m_out.view(G, Q, n + 1)[..., :n], logz_out, ok_out

    @staticmethod
    def _backward(ctx, grad_m, grad_logz):
        J_grad = ctx.needs_input_grad[1]
        if ctx.plan is None:
            grad_h, grad_J = _pairwise_backward(ctx.saved, grad_m, grad_logz, J_grad)
            return grad_h, grad_J, None
        G, Q, n = grad_m.shape
        q = ctx.plan.q
        gm_flat = F.pad(grad_m, (0, 1)).view(G, Q * (n + 1))
        grad_h = grad_m.new_zeros(G, Q * (n + 1))
        grad_J = grad_m.new_zeros(G, (n + 1) ** 2) if J_grad else None
        for (nb, L, _, flat, hidx, qidx), saved in zip(ctx.plan.buckets, ctx.saved):
            gh, gJ = _pairwise_backward(saved, gm_flat.gather(1, hidx).view(G * nb, q, L),
                                        grad_logz.gather(1, qidx).view(G * nb, q), J_grad)
            grad_h.scatter_(1, hidx, gh.reshape(G, -1))
            if J_grad:  # sum over the patterns' sub-J (index_put_ with accumulate sorts: slow)
                grad_J.scatter_add_(1, flat.expand(G, -1), gJ.reshape(G, -1))
        grad_h = grad_h.view(G, Q, n + 1)[..., :n]
        return grad_h, grad_J.view(G, n + 1, n + 1)[:, :n, :n] if J_grad else None, None


def _log_domain_fallback(m, logz, ok, h, J, K, mask=None):
    """Recompute the rows where ok is False in float64 from h (G, Q, n), J, K (and mask (G, Q, n): absent
    spins free, log 2 each taken off log Z): all 2^n log-weights, shifted by their maximum and normalised
    (a softmax), so |<s>| <= 1 at any scale. Rows are batched by group and mask pattern."""
    G, Q, n = h.shape
    a = n // 2
    SA = _half_configurations(a, torch.float64, h.device)
    SB = _half_configurations(n - a, torch.float64, h.device)
    bad = (~ok).nonzero()  # (R, 2): group and query index
    keys = bad[:, :1] if mask is None else torch.cat([bad[:, :1], mask[bad[:, 0], bad[:, 1]].long()], dim=1)
    systems, which = torch.unique(keys, dim=0, return_inverse=True)
    index, new_m, new_logz = [], [], []
    for k, key in enumerate(systems):
        g, rows = int(key[0]), bad[which == k]
        present = key[1:].double() if mask is not None else h.new_ones(n, dtype=torch.float64)
        J_g = J[g:g + 1].double() * present[:, None] * present[None, :] if J is not None else None
        K_g = (K[g:g + 1].double() * present[:, None, None] * present[None, :, None] * present[None, None, :]
               if K is not None else None)
        left, right = _table_factors(J_g, K_g, a, SA, SB) if J_g is not None or K_g is not None else (None, None)
        table = left @ right.transpose(-1, -2) if left is not None else 0.0  # (1, 2^a, 2^b)
        for chunk in rows[:, 1].split(max(1, _CHUNK_ELEMENTS // (SA.shape[0] * SB.shape[0]))):
            x = h[g, chunk].double() * present
            t = ((x[:, :a] @ SA.T)[:, :, None] + table + (x[:, a:] @ SB.T)[:, None, :]).reshape(len(chunk), -1)
            if not bool(torch.isfinite(t).all()):
                raise ValueError("method 'exact': the energies overflow float64 (|E| > 1.8e308) for fields and "
                                 "couplings this large; rescale h, J and K")
            p = torch.softmax(t, dim=-1).view(len(chunk), SA.shape[0], SB.shape[0])
            new_m.append(torch.cat([p.sum(2) @ SA, p.sum(1) @ SB], dim=-1) * present)
            new_logz.append(torch.logsumexp(t, dim=-1) - (n - present.sum()) * math.log(2.0))
            index.append(g * Q + chunk)
    index = torch.cat(index)
    m = m.reshape(G * Q, n).index_put((index,), torch.cat(new_m).to(m.dtype)).reshape(G, Q, n)
    logz = logz.reshape(G * Q).index_put((index,), torch.cat(new_logz).to(logz.dtype)).reshape(G, Q)
    return m, logz
