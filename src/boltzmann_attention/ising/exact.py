"""Exact marginals by split enumeration: Z = u^T K v (docs: SAMPLERS.md §0).

Split the n spins into a first half A (a = n // 2 spins) and a second half B (b = n - a). Then

    -E(s) = h_A.s_A + h_B.s_B + C(s_A, s_B),

where C holds every coupling term (pairwise and three-body). C does not depend on the query, so for
each group of queries that share J and K we build once the table

    K[x, y] = exp(C(x, y))                     (2^a, 2^b), x and y index the half-configurations,

and for each query only u[x] = exp(h_A.S_A[x]) and v[y] = exp(h_B.S_B[y]). Then

    Z = u^T K v,   <s_A> = ((u * K v) @ S_A) / Z,   <s_B> = ((v * K^T u) @ S_B) / Z.

All queries of a group go through two GEMMs with inner size 2^(n/2): about 2 * 2^n MACs per query
instead of 2 n 2^n for naive enumeration. Everything is plain torch (exp, matmul, sum), so autograd
gives exact gradients in h, J and K.

Numerics: u, v and K are each shifted by their maximum in the log domain. When the terms that matter
are far from those maxima (|h|, |J| of order 10^2 and more, fields fighting couplings), Z underflows;
such rows are detected (Z below sqrt(tiny) of the dtype) and recomputed in float64 log space with a
logsumexp over all 2^n states. They are correct, just slower; typical training values never reach it.

Masks: queries are grouped by their mask pattern and each pattern is solved as the smaller system of
its present spins, so absent keys cost nothing (a causal query i pays for i + 1 spins, not n). For small
systems (patterns x 2^n <= 2^18, e.g. causal T <= 13) per-pattern calls cost more in overhead than in
arithmetic, so all patterns go through one batched call in which absent spins are made free spins (zero
field and couplings: <s> = 0 exactly, a factor 2 in Z that is taken out of log Z).

Limit: ``max_spins`` (default 24) present spins per query. The table holds 2^n entries per group
(64 MB in float32 at n = 24) and the work per query is 2 * 2^n MACs.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor

from ._inputs import group_queries
from .reference import configurations

MAX_SPINS = 24
_CHUNK_ELEMENTS = 2**24  # bound on (queries x half-configurations) held at once per GEMM
_BATCHED_PATTERN_STATES = 2**18  # patterns x 2^n up to which masked patterns are solved in one batched call


def marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              max_spins: int = MAX_SPINS) -> Tensor:
    """<s_j>, shape of h (..., n). See the module docstring for the algorithm and its limit."""
    return _solve(h, J, K, mask, max_spins)[0]


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                  max_spins: int = MAX_SPINS) -> Tensor:
    """log Z, shape h.shape[:-1]."""
    return _solve(h, J, K, mask, max_spins)[1]


def _solve(h, J, K, mask, max_spins):
    largest = h.shape[-1] if mask is None else int(mask.sum(-1).max()) if mask.numel() else 0
    if largest > max_spins:
        raise ValueError(
            f"method 'exact' enumerates 2^n states and is limited to n <= {max_spins} present spins per "
            f"query (got {largest}). Use method='banded' (couplings of limited range), 'meanfield' or "
            f"'tap' (approximate), or raise max_spins if you accept 2^n time and memory.")
    g = group_queries(h, J, K, mask)
    if g.mask is None:
        m, logz = _split(g.h, g.J, g.K)
    else:
        m, logz = _by_mask_pattern(g.h, g.J, g.K, g.mask)
    return g.ungroup(m), g.ungroup(logz)


def _by_mask_pattern(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor):
    """Solve masked queries. h, mask: (G, Q, n); J: (G, n, n); K: (G, n, n, n).

    Returns marginals (G, Q, n) and log Z (G, Q). Small systems whose patterns split every group evenly (a
    causal mask: one pattern per query position) go through one batched call; the rest pattern by pattern.
    """
    patterns, which = _unique_rows(mask.reshape(-1, mask.shape[-1]))
    G, Q, n = h.shape
    P = len(patterns)
    if P * 2**n <= _BATCHED_PATTERN_STATES and Q % P == 0:
        order = torch.argsort(which.view(G, Q), dim=1, stable=True)
        expected = torch.arange(P, device=h.device).repeat_interleave(Q // P)
        if bool((which.view(G, Q).gather(1, order) == expected).all()):
            return _patterns_batched(h, J, K, patterns, order)
    return _patterns_one_by_one(h, J, K, patterns, which)


def _unique_rows(mask: Tensor) -> tuple[Tensor, Tensor]:
    """torch.unique(mask, dim=0, return_inverse=True) for a bool (rows, n) mask, n <= 62, via bit codes
    (unique over rows is slow: about 3 ms for 1024 rows of 16)."""
    n = mask.shape[-1]
    if n > 62:
        return torch.unique(mask, dim=0, return_inverse=True)
    bits = torch.arange(n, device=mask.device)
    codes, which = torch.unique((mask.long() << bits).sum(-1), return_inverse=True)
    return (codes[:, None] >> bits) & 1 == 1, which


def _patterns_batched(h, J, K, patterns, order):
    """All patterns at once as full-size systems in which absent spins are free (zero field, no couplings).

    A free spin has <s> = 0 and multiplies Z by 2, which is removed from log Z. ``order`` (G, Q) sorts
    each group's queries by pattern, Q / P queries per pattern. Costs 2^n per query whatever the mask,
    which is what small n wants: one call instead of P calls.
    """
    G, Q, n = h.shape
    P = len(patterns)
    present = patterns.to(h.dtype)  # (P, n)
    sorted_h = h.gather(1, order[..., None].expand(G, Q, n)).view(G, P, Q // P, n) * present[:, None]
    sub_J = sub_K = None
    if J is not None:
        sub_J = (J[:, None] * present[:, :, None] * present[:, None, :]).reshape(G * P, n, n)
    if K is not None:
        sub_K = (K[:, None] * present[:, :, None, None] * present[:, None, :, None]
                 * present[:, None, None, :]).reshape(G * P, n, n, n)
    m, logz = _split(sorted_h.reshape(G * P, Q // P, n), sub_J, sub_K)
    m = m.view(G, P, Q // P, n) * present[:, None]
    logz = logz.view(G, P, Q // P) - (n - present.sum(-1))[:, None] * math.log(2.0)
    unsort = torch.argsort(order, dim=1)
    m = m.reshape(G, Q, n).gather(1, unsort[..., None].expand(G, Q, n))
    return m, logz.reshape(G, Q).gather(1, unsort)


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
            out_m[r[:, None], spins] = m.reshape(-1, len(spins))
            out_logz[r] = logz.reshape(-1)
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
    log_table = _coupling_log_table(J, K, a, SA, SB)  # (G, 2^a, 2^b)
    log_u = h[..., :a] @ SA.T  # (G, Q, 2^a)
    log_v = h[..., a:] @ SB.T  # (G, Q, 2^b)

    chunk = max(1, _CHUNK_ELEMENTS // max(SA.shape[0], SB.shape[0]))
    pieces = [_contract(lu, log_table, lv, SA, SB)
              for lu, lv in zip(log_u.split(chunk, dim=1), log_v.split(chunk, dim=1))]
    m, logz, ok = (torch.cat(x, dim=1) for x in zip(*pieces))
    if not bool(ok.all()):
        m, logz = _log_domain_fallback(m, logz, ok, log_u, log_table, log_v, SA, SB)
    return m, logz


def _log_2cosh(x: Tensor) -> Tensor:
    return x.abs() + torch.log1p(torch.exp(-2 * x.abs())) + math.log(2.0)


def _coupling_log_table(J: Tensor | None, K: Tensor | None, a: int, SA: Tensor, SB: Tensor) -> Tensor:
    """C(x, y) = s.J.s / 2 + K(s, s, s) / 6 for s = (SA[x], SB[y]); shape (G, 2^a, 2^b)."""
    # Pairwise: the A-A and B-B parts depend on one half only; the A-B part is a bilinear form.
    table = 0.0
    if J is not None:
        JAA, JAB, JBB = J[:, :a, :a], J[:, :a, a:], J[:, a:, a:]
        table = (0.5 * ((SA @ JAA) * SA).sum(-1)[:, :, None]
                 + 0.5 * ((SB @ JBB) * SB).sum(-1)[:, None, :]
                 + SA @ JAB @ SB.T)
    if K is not None:
        # sum_{jkl} K_jkl s_j s_k s_l over ordered triples = AAA + BBB + 3 AAB + 3 ABB (K symmetric).
        b = K.shape[-1] - a
        PA = (SA[:, :, None] * SA[:, None, :]).reshape(SA.shape[0], a * a)  # pair products
        PB = (SB[:, :, None] * SB[:, None, :]).reshape(SB.shape[0], b * b)
        G = K.shape[0]
        KAAA = K[:, :a, :a, :a].reshape(G, a * a, a)
        KBBB = K[:, a:, a:, a:].reshape(G, b * b, b)
        KAAB = K[:, :a, :a, a:].reshape(G, a * a, b)
        KABB = K[:, :a, a:, a:].reshape(G, a, b * b)
        table = table + (((PA @ KAAA) * SA).sum(-1)[:, :, None] / 6
                         + ((PB @ KBBB) * SB).sum(-1)[:, None, :] / 6
                         + (PA @ KAAB @ SB.T) / 2
                         + (SA @ KABB @ PB.T) / 2)
    return table


def _contract(log_u: Tensor, log_table: Tensor, log_v: Tensor, SA: Tensor, SB: Tensor):
    """Z = u^T K v and the marginals for a chunk of queries, each factor max-shifted.

    Returns marginals (G, q, n), log Z (G, q) and ok (G, q): False where Z underflowed, so that the
    row must be recomputed (its values here are finite placeholders).
    """
    shift_u = log_u.detach().amax(-1, keepdim=True)
    shift_v = log_v.detach().amax(-1, keepdim=True)
    shift_k = log_table.detach().amax((-1, -2), keepdim=True)
    u = torch.exp(log_u - shift_u)
    v = torch.exp(log_v - shift_v)
    k = torch.exp(log_table - shift_k)
    weight_a = u * (v @ k.transpose(-1, -2))  # u * (K v), (G, q, 2^a)
    weight_b = v * (u @ k)                    # v * (K^T u), (G, q, 2^b)
    z = weight_a.sum(-1)
    ok = z > torch.finfo(z.dtype).tiny ** 0.5
    z = torch.where(ok, z, torch.ones_like(z))
    m = torch.cat([weight_a @ SA, weight_b @ SB], dim=-1) / z[..., None]
    logz = torch.log(z) + shift_u.squeeze(-1) + shift_v.squeeze(-1) + shift_k.squeeze(-1)
    return m, logz, ok


def _log_domain_fallback(m, logz, ok, log_u, log_table, log_v, SA, SB):
    """Recompute the rows where Z underflowed with a float64 logsumexp over all 2^n states."""
    G, Q, _ = log_u.shape
    bad = (~ok).nonzero()  # (R, 2): group and query index
    states = log_table.shape[-1] * log_table.shape[-2]
    new_m, new_logz = [], []
    for rows in bad.split(max(1, _CHUNK_ELEMENTS // states)):
        g, q = rows[:, 0], rows[:, 1]
        t = (log_u[g, q].double()[:, :, None] + log_table[g].double() + log_v[g, q].double()[:, None, :])
        lz = torch.logsumexp(t, dim=(1, 2))
        p = torch.exp(t - lz[:, None, None])
        new_m.append(torch.cat([p.sum(2) @ SA.double(), p.sum(1) @ SB.double()], dim=-1))
        new_logz.append(lz)
    index = bad[:, 0] * Q + bad[:, 1]
    m = m.reshape(G * Q, -1).index_put((index,), torch.cat(new_m).to(m.dtype)).reshape(m.shape)
    logz = logz.reshape(G * Q).index_put((index,), torch.cat(new_logz).to(logz.dtype)).reshape(G, Q)
    return m, logz
