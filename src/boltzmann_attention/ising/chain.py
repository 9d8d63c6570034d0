"""Method ``chain``: exact marginals and log Z for banded couplings that may differ for every query.

J_jk = 0 for |j - k| > w, and J may carry any batch shape, so each query (each entry of h's batch) can have
couplings of its own: couplings computed from content (``couplings.ContentCouplings``). The chain's state is
its last w spins (2^w states); spins are added one at a time in the log domain, for all queries at once:

    log alpha_p(s_p, r) = logsumexp_o [log alpha_{p-1}(r, o) + s_p (h_p + sum_{d=1..w} J_{p-d,p} s_{p-d})],

with r = (s_{p-1}, ..., s_{p-w+1}) and o = s_{p-w}, and the same recursion backwards for beta. The marginal of
s_p is tanh((L+ - L-) / 2), L+- the log weight of s_p = +-1 from alpha_{p-1}, the step and beta_p. Every step is
a few batched tensor operations, and the gradients are autograd's through the recursion (no custom backward):
O(n 2^(w+1)) work and O(n 2^w) memory per query, in n sequential steps.

Method ``banded`` solves the same systems with GEMMs over blocks of spins and shares its tables between the
queries that share J, so it is the faster of the two for couplings shared by many queries (a static J); for a
J per query its per-group work dominates, and this method is the one to use.

Absent spins (mask False) are free spins with field 0 and no couplings: each adds log 2 to the recursion's
log Z, which is taken off, and has marginal 0. Absent spins before the last present one are allowed.

The chunked scan (option ``chunk_length`` = c) gives the same results in 3c + 2n/c sequential steps instead of
2n (for the marginals; the backward as many), with no host read, for devices where a step's launch, not its
arithmetic, is the cost (a GPU): the chain is cut into chunks of c spins, and each chunk's transfer from its
first state to its last, a 2^w x 2^w matrix per query, is built for all chunks at once (c steps, the recursion
above run from every start state); alpha and beta are then carried across chunk boundaries by those matrices
(n/c steps each way), and filled in within all chunks at once (c steps each way). It costs 2^w times the work
and the memory of the sequential recursion, and runs every query's chain to n (the sequential recursion stops
each at its last present spin, which it reads on the host: once per mask key, see ``band_marginals``), so on a
CPU it is slower: the default is the sequential recursion (``chunk_length=None``).

Options: ``bandwidth`` (w; inferred from J's nonzero entries when None, refused when J is trained),
``max_bandwidth`` (default 12), checked by method banded's rule, which reads a dense J on the host and refuses a
coupling beyond ``bandwidth`` (couplings in band form, :class:`Band`, need no such check), and ``chunk_length``
(None, or the spins per chunk of the chunked scan).
"""

from __future__ import annotations

import math
from functools import cache
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import banded, planner
from ._inputs import check_int
from .record import Method, keyword_options

__all__ = ["Band", "band_marginals", "log_partition", "marginals"]

MAX_BANDWIDTH = 12


class Band(NamedTuple):
    """Couplings in band form: ``values[..., p, d - 1] = J_{p-d, p}`` for d = 1..w (0 where p - d < 0), shape
    (..., n, w). What :class:`~boltzmann_attention.couplings.ContentCouplings` gives a method whose record takes
    it (``Method.band``): the (n, n) matrix is never built."""

    values: Tensor


def band_marginals(h: Tensor, couplings: Band, mask: Tensor | None = None, *, bandwidth: int | None = None,
                   max_bandwidth: int = MAX_BANDWIDTH, chunk_length: int | None = None,
                   mask_key: str | None = None) -> Tensor:
    """:func:`marginals` for couplings in band form: h (..., n), couplings.values (..., n, w), mask (..., n).
    mask_key: the caller's name for a mask that is the same every call (the layer's causal mask): the chains'
    lengths are then read from it on the host once, not at every call (``planner.chain_lengths``)."""
    values = couplings.values
    w = values.shape[-1]
    if bandwidth is not None and check_int("bandwidth", bandwidth, 0) < w:
        raise ValueError(f"the band holds couplings {w} apart, beyond bandwidth {bandwidth}")
    if w > check_int("max_bandwidth", max_bandwidth, 0):
        raise ValueError(f"bandwidth {w} exceeds max_bandwidth={max_bandwidth} (the chain has 2^w states); raise "
                         "max_bandwidth, or use method='meanfield'")
    return _run(h, values, mask, True, _chunk_length(chunk_length), mask_key)


def marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              bandwidth: int | None = None, max_bandwidth: int = MAX_BANDWIDTH,
              chunk_length: int | None = None) -> Tensor:
    """<s_j>, shaped like the broadcast of h with J's batch shape and mask (..., n); 0 for absent spins."""
    return _solve(h, J, K, mask, bandwidth, max_bandwidth, chunk_length, marginals=True)


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                  bandwidth: int | None = None, max_bandwidth: int = MAX_BANDWIDTH,
                  chunk_length: int | None = None) -> Tensor:
    """log Z of the present spins, shaped like the broadcast batch shape."""
    return _solve(h, J, K, mask, bandwidth, max_bandwidth, chunk_length, marginals=False)


def _solve(h, J, K, mask, bandwidth, max_bandwidth, chunk_length, *, marginals: bool):
    chunk_length = _chunk_length(chunk_length)
    w = banded._bandwidth(h, J, K, bandwidth, max_bandwidth, None, "chain")
    dtype = torch.promote_types(h.dtype, torch.float32)
    band = None if w == 0 else _band(J.to(dtype), w)  # (..., n, w): band[..., p, d - 1] = J_{p-d, p}
    return _run(h, band, mask, marginals, chunk_length)


def _chunk_length(value: int | None) -> int | None:
    return None if value is None else check_int("chunk_length", value, 1)


def _run(h: Tensor, band: Tensor | None, mask: Tensor | None, marginals: bool, chunk_length: int | None,
         mask_key: str | None = None) -> Tensor:
    """Marginals or log Z for fields h (..., n) and couplings in band form (..., n, w) or None."""
    n = h.shape[-1]
    w = 0 if band is None else band.shape[-1]
    shape = torch.broadcast_shapes(h.shape[:-1], band.shape[:-2] if band is not None else (),
                                   mask.shape[:-1] if mask is not None else ())
    dtype = torch.promote_types(h.dtype, torch.float32)
    present = None if mask is None else mask.expand(*shape, n)
    field = h.to(dtype).expand(*shape, n)
    if present is not None:
        field = field * present
    if w == 0 or n == 0 or math.prod(shape) == 0:
        m = torch.tanh(field)
        logz = torch.logaddexp(field, -field)
        logz = (logz if present is None else logz * present).sum(-1)
        if band is not None:  # in the graph, as a computed result would be
            m, logz = m + band.sum() * 0, logz + band.sum() * 0
        return (m if present is None else m * present) if marginals else logz
    band = band.to(dtype)
    if present is not None:  # no coupling touches an absent spin
        back = F.pad(present, (w, 0))
        band = band * torch.stack([back[..., w - d:w - d + n] for d in range(1, w + 1)], -1) * present[..., None]
    band = band.expand(*shape, n, w)
    field, band = field.reshape(-1, n), band.reshape(-1, n, w)
    Q = field.shape[0]
    if present is None or chunk_length is not None:  # the chunked scan runs every chain to n
        active, order = [Q] * n + [0], None
        length = torch.full(shape, n, device=field.device)
    else:  # a query's chain stops at its last present spin (a causal mask halves the work); longest first
        length, order, active = planner.chain_lengths(present.reshape(-1, n), mask_key)  # the steps, on the host
        field, band = field[order], band[order]
    if chunk_length is None:
        m, logz = _recursion(field, band, w, marginals, active)
    else:
        m, logz = _chunked(field, band, w, marginals, chunk_length)
    if order is not None:
        inverse = torch.argsort(order)
        m, logz = (None if m is None else m[inverse]), logz[inverse]
    if not marginals:
        logz = logz.reshape(shape) - math.log(2.0) * w  # the w virtual spins the chain starts from
        if present is None:
            return logz
        holes = length.reshape(shape) - present.sum(-1)  # absent spins within a chain's run: free, log 2 each
        return logz - math.log(2.0) * holes.to(logz.dtype)
    m = m.reshape(*shape, n)
    return m if present is None else m * present


def _recursion(field: Tensor, band: Tensor, w: int, marginals: bool, active: list[int]
               ) -> tuple[Tensor | None, Tensor]:
    """field (Q, n), band (Q, n, w), the queries ordered longest chain first, and ``active[p]``: how many of their
    chains are longer than p, for p = 0 .. the longest -> (marginals (Q, n) or None, 0 beyond each chain; log Z (Q,)
    of each chain, including its 2^w virtual start states).

    States are numbered by their spins as bits, the newest spin the leading one: x = (s_{p-1}, ..., s_{p-w}) before
    spin p, so the state after it is (s_p, r) with r = x >> 1, and the pairs (r, o) are adjacent entries. At step p
    the queries whose chains reach p are a prefix of the batch: ``active[p]`` of them."""
    Q, n = field.shape
    steps_run = len(active) - 1
    local = field[..., None] + band @ _signs(w, field.dtype, field.device).T  # (Q, n, 2^w): the field on s_p
    steps = local.unbind(1)  # one view per spin (indexing local[:, p] would cost a full-size gradient each)
    alpha = [field.new_zeros(Q, 1 << w)]  # the virtual start: weight 1 each
    ended = [field.new_full((Q - active[0],), w * math.log(2.0))]  # log Z of the chains ending at each step
    for p in range(steps_run):
        c = active[p]
        alpha.append(_forward(alpha[-1][:c], steps[p][:c]))
        ended.append(torch.logsumexp(alpha[-1][active[p + 1]:], -1))
    logz = torch.cat(ended[::-1])
    if not marginals:
        return None, logz
    m = [None] * steps_run
    beta = None
    for p in range(steps_run - 1, -1, -1):
        c = active[p]
        if beta is None:
            beta = field.new_zeros(c, 1 << w)
        else:  # from the state after spin p + 1 back to the state after spin p; chains that end at p start at 0
            beta = _backward(beta, steps[p + 1][:beta.shape[0]])
            if beta.shape[0] < c:
                beta = torch.cat([beta, beta.new_zeros(c - beta.shape[0], 1 << w)])
        m[p] = F.pad(_spin(alpha[p + 1] + beta), (0, Q - c))
    m += [field.new_zeros(Q)] * (n - steps_run)
    return torch.stack(m, -1), logz


def _forward(alpha: Tensor, step: Tensor) -> Tensor:
    """log alpha (..., 2^w) over the state before a spin -> over the state after it; step (..., 2^w): the spin's
    local field in each state before it. The pairs (r, o) that merge are adjacent entries."""
    plus, minus = alpha + step, alpha - step
    return torch.cat([torch.logaddexp(minus[..., 0::2], minus[..., 1::2]),
                      torch.logaddexp(plus[..., 0::2], plus[..., 1::2])], -1)


def _backward(beta: Tensor, step: Tensor) -> Tensor:
    """log beta (..., 2^w) over the state after the next spin -> over the state before it; step: that spin's."""
    half = beta.shape[-1] // 2
    up = beta[..., half:].repeat_interleave(2, -1)  # the next spin +1 after state x: state (+1, x >> 1)
    down = beta[..., :half].repeat_interleave(2, -1)
    return torch.logaddexp(step + up, down - step)


def _spin(posterior: Tensor) -> Tensor:
    """<s> of the newest spin from the log weights (..., 2^w) of the state after it (its spin the leading bit)."""
    half = posterior.shape[-1] // 2
    return torch.tanh((torch.logsumexp(posterior[..., half:], -1) - torch.logsumexp(posterior[..., :half], -1)) / 2)


NEGLIGIBLE = -1e30  # a log weight whose exp is 0 in float32 and float64, finite so that gradients stay finite


def _chunked(field: Tensor, band: Tensor, w: int, marginals: bool, c: int) -> tuple[Tensor | None, Tensor]:
    """:func:`_recursion` by the chunked scan, every chain run to n: field (Q, n), band (Q, n, w), chunks of c
    spins -> (marginals (Q, n) or None, log Z (Q,) including the 2^w virtual start states)."""
    Q, n = field.shape
    S = 1 << w
    K = -(-n // c)
    local = field[..., None] + band @ _signs(w, field.dtype, field.device).T  # (Q, n, S)
    # pad the chain to K c spins with free ones (field 0, no coupling): log 2 each, taken off below
    steps = F.pad(local, (0, 0, 0, K * c - n)).view(Q, K, c, S).unbind(2)  # c views of (Q, K, S)
    eye = torch.eye(S, dtype=torch.bool, device=field.device)
    transfer = torch.where(eye, 0.0, NEGLIGIBLE).to(field.dtype).expand(Q, K, S, S)  # [first state, current state]
    for step in steps:  # every chunk at once, from every first state
        transfer = _forward(transfer, step[:, :, None, :])
    first = [field.new_zeros(Q, S)]  # alpha over each chunk's first state; the virtual start: weight 1 each
    for k in range(K):
        first.append(torch.logsumexp(first[-1][..., None] + transfer[:, k], -2))
    logz = torch.logsumexp(first[-1], -1) - math.log(2.0) * (K * c - n)
    if not marginals:
        return None, logz
    last = [field.new_zeros(Q, S)]  # beta over each chunk's last state, from the last chunk back
    for k in range(K - 1, 0, -1):
        last.append(torch.logsumexp(transfer[:, k] + last[-1][:, None, :], -1))
    alpha, beta = [torch.stack(first[:-1], 1)], torch.stack(last[::-1], 1)  # (Q, K, S) each
    for step in steps:  # alpha after each spin of every chunk
        alpha.append(_forward(alpha[-1], step))
    m = [None] * c
    for t in range(c - 1, -1, -1):  # beta after spin t of every chunk
        if t < c - 1:
            beta = _backward(beta, steps[t + 1])
        m[t] = _spin(alpha[t + 1] + beta)
    return torch.stack(m, -1).reshape(Q, K * c)[:, :n], logz


@cache
def _signs_cpu(w: int, dtype: torch.dtype) -> Tensor:
    x = torch.arange(1 << w)[:, None]
    shift = torch.arange(w - 1, -1, -1)  # d = 1 is the leading bit
    return (((x >> shift) & 1) * 2 - 1).to(dtype)


def _signs(w: int, dtype: torch.dtype, device) -> Tensor:
    """(2^w, w) spins of each state; cached in eager, traced into the graph under ``torch.compile``."""
    signs = _signs_cpu.__wrapped__ if torch.compiler.is_compiling() else _signs_cpu
    return signs(w, dtype).to(device)


def _band(J: Tensor, w: int) -> Tensor:
    """(..., n, w): entry [p, d - 1] = J_{p-d, p}, 0 where p - d < 0."""
    n = J.shape[-1]
    return torch.stack([F.pad(J.diagonal(d, -2, -1), (d, 0)) if d < n else J.new_zeros(*J.shape[:-2], n)
                        for d in range(1, w + 1)], -1)


def _check_options(options: dict) -> None:
    banded._check_options({k: v for k, v in options.items() if k != "chunk_length"})
    _chunk_length(options.get("chunk_length"))


METHOD = Method("chain", marginals, log_partition, keyword_options(marginals), "exact",
                f"J_jk = 0 for |j - k| > w, w <= {MAX_BANDWIDTH}, J may differ per query (options bandwidth, "
                "max_bandwidth, chunk_length)", _check_options, max_bandwidth=MAX_BANDWIDTH, band=True)
