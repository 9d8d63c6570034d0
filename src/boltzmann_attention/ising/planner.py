"""The mask-pattern planner of split enumeration: which queries share a system, and how to batch them.

A query whose mask removes spins is solved as the smaller system of its present spins. Queries are grouped
by mask pattern (``mask_patterns``). When every group holds the same number of queries of each pattern (a
causal mask: one pattern per query position) the patterns are bucketed by their number of present spins
(``plan``): each bucket is one call, padded to its largest size with free spins (zero field and
couplings: <s> = 0 exactly, and a factor 2 in Z that the caller takes out of log Z as ``free``). The
buckets minimise a cost model of per-call overhead plus 2^size work (``buckets``). Other masks go pattern
by pattern (the caller loops over ``mask_patterns``' output).

Both the pairwise solver and the three-body path of :mod:`boltzmann_attention.ising.exact` read the same
plan; a plan is cached, since a causal mask gives the same one at every call.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import torch
from torch import Tensor

from . import checks

# Bucketing cost model, in units of (query x state): a call costs CALL_OVERHEAD, and each pattern padded
# to L spins costs (queries + TABLE_COST) * 2^L. CALL_OVERHEAD is tuned for a CPU thread at n = 12 and 16.
CALL_OVERHEAD = 2**21
TABLE_COST = 8

_MASKS: dict = {}  # recent masks by shape and device (and mask key): (mask, what was derived from it)


def _remembered(mask: Tensor, key: str | None, what: str):
    """What ``what`` derived from this mask before, or None. Without a key the cache holds one mask per shape
    and is compared with it; with a key (the caller's name for the mask's values) the mask's values are read
    only where checks read the host (:mod:`.checks`), to refuse a key given to masks of different values."""
    found = _MASKS.get((what, key, mask.shape, mask.device))
    if found is None:
        return None
    if key is not None and not checks.on_host(mask.device):
        return found[1]
    if torch.equal(found[0], mask):
        return found[1]
    if key is not None:
        raise ValueError(f"mask_key {key!r} was given to masks of different values: a mask key must name one "
                         f"mask (for each shape); pass mask_key=None for masks that change")
    return None


def _remember(mask: Tensor, key: str | None, what: str, value):
    _MASKS[(what, key, mask.shape, mask.device)] = (mask.clone(), value)
    while len(_MASKS) > 16:
        del _MASKS[next(iter(_MASKS))]
    return value


def present_spins(mask: Tensor, key: str | None = None) -> int:
    """The most present spins of any query of a (..., n) mask (remembered by mask key: no read after the first)."""
    found = _remembered(mask, key, "present")
    if found is not None:
        return found
    return _remember(mask, key, "present", int(mask.sum(-1).max()) if mask.numel() else 0)


def chain_lengths(mask: Tensor, key: str | None = None) -> tuple[Tensor, Tensor, list[int]]:
    """For a (Q, n) mask: each query's chain length (its last present spin + 1; 0 for none), the queries longest
    first (a stable order), and, on the host, how many chains are longer than p for p = 0 .. the longest (the
    queries a chain's step p runs: a prefix of that order). Remembered by mask key: no read after the first."""
    found = _remembered(mask, key, "chain lengths")
    if found is not None:
        return found
    n = mask.shape[-1]
    length = torch.where(mask.any(-1), n - mask.flip(-1).to(torch.uint8).argmax(-1), 0)
    order = torch.argsort(length, descending=True, stable=True)
    longest = int(length.max()) if length.numel() else 0
    active = (length[:, None] > torch.arange(longest + 1, device=mask.device)).sum(0).tolist()
    return _remember(mask, key, "chain lengths", (length, order, active))


def mask_patterns(mask: Tensor, key: str | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Distinct rows (P, n) of a (G, Q, n) mask, the pattern of each query (G, Q), and ``order`` (G, Q)
    sorting each group's queries by pattern when every group has Q / P queries of each (else None).
    Cached: a causal mask is the same every call, and one comparison replaces the unique and the sort; with a
    mask key, not even that comparison (see ``_remembered``)."""
    G, Q, n = mask.shape
    found = _remembered(mask, key, "patterns")
    if found is not None:
        return found
    patterns, which = _unique_rows(mask.reshape(-1, n))
    P = len(patterns)
    which = which.view(G, Q)
    order = None
    if Q % P == 0:
        sorted_which, order = torch.sort(which, dim=1, stable=True)
        if not bool((sorted_which == _pattern_ids(P, Q // P, mask.device)).all()):
            order = None
    return _remember(mask, key, "patterns", (patterns, which, order))


def _unique_rows(mask: Tensor) -> tuple[Tensor, Tensor]:
    """torch.unique(mask, dim=0, return_inverse=True) for a bool (rows, n) mask, n <= 62, via bit codes
    (unique over rows is slow: about 3 ms for 1024 rows of 16)."""
    n = mask.shape[-1]
    if n > 62:
        return torch.unique(mask, dim=0, return_inverse=True)
    bits = torch.arange(n, device=mask.device)
    codes, which = torch.unique((mask.long() << bits).sum(-1), return_inverse=True)
    return (codes[:, None] >> bits) & 1 == 1, which


def buckets(sizes: list[int], queries: int, enumerated: int = 0) -> list[tuple[int, int]]:
    """Split ascending pattern sizes into contiguous buckets [start, end) minimising the cost model.

    A bucket is padded to its largest size L and costs CALL_OVERHEAD + count * (queries + TABLE_COST) * 2^L;
    one with L <= ``enumerated`` (solved state by state: fewer operations, n 2^n work per query) costs
    CALL_OVERHEAD / 2 + count * (queries * L / 4 + TABLE_COST) * 2^L.
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
            overhead, per_query = (CALL_OVERHEAD / 2, L / 4) if L <= enumerated else (CALL_OVERHEAD, 1)
            cost = best[i] + overhead + (ends[j - 1] - start) * (queries * per_query + TABLE_COST) * 2.0 ** L
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


class Bucket(NamedTuple):
    """One call of a plan: ``count`` patterns padded to ``size`` spins, each pattern's present spins first
    (ascending), then the padding index n."""

    nb: int         # patterns in the bucket
    L: int          # spins per padded system
    free: Tensor    # (nb,) log 2 per padded spin, taken out of log Z
    flat: Tensor    # (nb L L,) indices of the sub-J's entries in the padded (n + 1)^2 J
    hidx: Tensor    # (G, nb q L) indices of the sub-h's entries in the padded (G, Q (n + 1)) h
    qidx: Tensor    # (G, nb q) its queries
    idx: Tensor     # (nb, L) each pattern's spins


class Plan:
    """:class:`Bucket` s of mask patterns by size; ``order`` (G, Q) sorts each group's queries by pattern (q =
    Q / P per pattern). h, the marginals and their gradients move by one gather or scatter per bucket.
    Patterns without a present spin are in no bucket (marginals 0, log Z 0).
    """

    def __init__(self, patterns: Tensor, order: Tensor, dtype: torch.dtype, key: tuple, enumerated: int):
        G, Q = order.shape
        P, n = patterns.shape
        self.order, self.q = order, Q // P
        perm, parts = _plan_buckets(key, P, n, G * self.q, (CALL_OVERHEAD, TABLE_COST, enumerated),
                                      dtype, patterns.device)
        rows = order.view(G, P, self.q)
        if perm is not None:  # by size (a causal mask's patterns already are)
            rows = rows[:, perm]
        self.buckets: list[Bucket] = []
        for start, end, idx, free, flat in parts:
            nb, L = idx.shape
            sel = rows[:, start:end]  # (G, nb, q)
            hidx = (sel[..., None] * (n + 1) + idx[None, :, None, :]).reshape(G, nb * self.q * L)
            self.buckets.append(Bucket(nb, L, free, flat, hidx, sel.reshape(G, nb * self.q), idx))


_PLANS: dict = {}  # recent plans by patterns, shapes and dtype; reused while the queries' order is the same


def plan(patterns: Tensor, order: Tensor, dtype: torch.dtype, enumerated: int = 0, key: str | None = None) -> Plan:
    """The ``Plan`` of these patterns and query order, cached (a causal mask gives the same one each call).

    enumerated: the solver enumerates systems of up to this many spins state by state (a cheaper call,
    n 2^n work per query), which the cost model takes into account; 0 when it never does. key: the mask key
    the patterns came from (``mask_patterns``): the plan is then found without reading the patterns."""
    constants = (CALL_OVERHEAD, TABLE_COST, enumerated)
    if key is not None:
        found = _PLANS.get((key, patterns.shape, order.shape, dtype, order.device, constants))
        if found is not None and found.order is order:  # the patterns and order that mask_patterns remembered
            return found
    content = tuple(patterns.flatten().tolist())
    cache_key = (content if key is None else key, patterns.shape, order.shape, dtype, order.device, constants)
    found = _PLANS.get(cache_key)
    if found is None or not (found.order is order or torch.equal(found.order, order)):
        found = _PLANS[cache_key] = Plan(patterns, order, dtype, content, enumerated)
        while len(_PLANS) > 8:
            del _PLANS[next(iter(_PLANS))]
    return found


@lru_cache(maxsize=256)
def _plan_buckets(key: tuple, P: int, n: int, queries: int, constants: tuple, dtype: torch.dtype,
                  device: torch.device):
    """(perm, buckets) of ``Plan`` for the patterns ``key`` (P x n bools, flattened); perm None when the
    patterns already are by size. constants: the cost model's and ``enumerated`` (part of the cache key)."""
    patterns = torch.tensor(key, dtype=torch.bool).view(P, n)
    sizes = patterns.sum(-1).tolist()
    by_size = sorted(range(P), key=sizes.__getitem__)
    first = sizes.count(0)
    spins = torch.argsort((~patterns).to(torch.int8), dim=1, stable=True)
    spins = torch.where(torch.arange(n) < torch.tensor(sizes)[:, None], spins, n)
    out = []
    for start, end in buckets([sizes[p] for p in by_size[first:]], queries, constants[2]):
        start, end = first + start, first + end
        chosen = by_size[start:end]
        L = sizes[chosen[-1]]
        idx = spins[chosen, :L]
        free = torch.tensor([(L - sizes[p]) * math.log(2.0) for p in chosen], dtype=dtype)
        flat = (idx[:, :, None] * (n + 1) + idx[:, None, :]).reshape(-1)
        out.append((start, end, idx.to(device), free.to(device), flat.to(device)))
    perm = None if by_size == list(range(P)) else torch.tensor(by_size, device=device)
    return perm, out


