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

Options: ``bandwidth`` (w; inferred from J's nonzero entries when None, refused when J is trained) and
``max_bandwidth`` (default 12), checked by method banded's rule, which reads a dense J on the host and refuses a
coupling beyond ``bandwidth``. Couplings in band form (:class:`Band`) need no such check.
"""

from __future__ import annotations

import bisect
import math
from functools import cache
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import banded
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
                   max_bandwidth: int = MAX_BANDWIDTH) -> Tensor:
    """:func:`marginals` for couplings in band form: h (..., n), couplings.values (..., n, w), mask (..., n)."""
    values = couplings.values
    w = values.shape[-1]
    if bandwidth is not None and check_int("bandwidth", bandwidth, 0) < w:
        raise ValueError(f"the band holds couplings {w} apart, beyond bandwidth {bandwidth}")
    if w > check_int("max_bandwidth", max_bandwidth, 0):
        raise ValueError(f"bandwidth {w} exceeds max_bandwidth={max_bandwidth} (the chain has 2^w states); raise "
                         "max_bandwidth, or use method='meanfield'")
    return _run(h, values, mask, True)


def marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              bandwidth: int | None = None, max_bandwidth: int = MAX_BANDWIDTH) -> Tensor:
    """<s_j>, shaped like the broadcast of h with J's batch shape and mask (..., n); 0 for absent spins."""
    return _solve(h, J, K, mask, bandwidth, max_bandwidth, marginals=True)


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                  bandwidth: int | None = None, max_bandwidth: int = MAX_BANDWIDTH) -> Tensor:
    """log Z of the present spins, shaped like the broadcast batch shape."""
    return _solve(h, J, K, mask, bandwidth, max_bandwidth, marginals=False)


def _solve(h, J, K, mask, bandwidth, max_bandwidth, *, marginals: bool):
    w = banded._bandwidth(h, J, K, bandwidth, max_bandwidth, None, "chain")
    dtype = torch.promote_types(h.dtype, torch.float32)
    band = None if w == 0 else _band(J.to(dtype), w)  # (..., n, w): band[..., p, d - 1] = J_{p-d, p}
    return _run(h, band, mask, marginals)


def _run(h: Tensor, band: Tensor | None, mask: Tensor | None, marginals: bool) -> Tensor:
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
    if present is None:
        lengths, order = [n] * Q, None
    else:  # a query's chain stops at its last present spin (a causal mask halves the work); longest first
        flat = present.reshape(-1, n)
        length = torch.where(flat.any(-1), n - flat.flip(-1).to(torch.uint8).argmax(-1), 0)
        order = torch.argsort(length, descending=True, stable=True)
        lengths = length[order].tolist()  # read on the host: the steps each query takes
        field, band = field[order], band[order]
    m, logz = _recursion(field, band, w, marginals, lengths)
    if order is not None:
        inverse = torch.argsort(order)
        m, logz = (None if m is None else m[inverse]), logz[inverse]
    if not marginals:
        logz = logz.reshape(shape) - math.log(2.0) * w  # the w virtual spins the chain starts from
        if present is None:
            return logz
        holes = length.reshape(shape) - present.sum(-1)  # absent spins before the last present one: free, log 2
        return logz - math.log(2.0) * holes.to(logz.dtype)
    m = m.reshape(*shape, n)
    return m if present is None else m * present


def _recursion(field: Tensor, band: Tensor, w: int, marginals: bool, lengths: list[int]
               ) -> tuple[Tensor | None, Tensor]:
    """field (Q, n), band (Q, n, w), each query's chain length (non-increasing, at most n) -> (marginals (Q, n) or
    None, 0 beyond each chain; log Z (Q,) of each chain, including its 2^w virtual start states).

    States are numbered by their spins as bits, the newest spin the leading one: x = (s_{p-1}, ..., s_{p-w}) before
    spin p, so the state after it is (s_p, r) with r = x >> 1, and the pairs (r, o) are adjacent entries. At step p
    the queries whose chains reach p are a prefix of the batch: ``active[p]`` of them."""
    Q, n = field.shape
    half = 1 << (w - 1)
    steps_run = lengths[0] if lengths else 0
    active = [bisect.bisect_left([-x for x in lengths], -p) for p in range(steps_run + 1)]  # lengths > p
    local = field[..., None] + band @ _signs(w, field.dtype, field.device).T  # (Q, n, 2^w): the field on s_p
    steps = local.unbind(1)  # one view per spin (indexing local[:, p] would cost a full-size gradient each)
    alpha = [field.new_zeros(Q, 1 << w)]  # the virtual start: weight 1 each
    ended = [field.new_full((Q - active[0],), w * math.log(2.0))]  # log Z of the chains ending at each step
    for p in range(steps_run):
        c = active[p]
        a, l = alpha[-1][:c], steps[p][:c]
        plus, minus = a + l, a - l
        alpha.append(torch.cat([torch.logaddexp(minus[:, 0::2], minus[:, 1::2]),
                                torch.logaddexp(plus[:, 0::2], plus[:, 1::2])], -1))
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
            b, l = beta, steps[p + 1][:beta.shape[0]]
            up = b[:, half:].repeat_interleave(2, -1)  # s_{p+1} = +1 after state x: (+1, x >> 1)
            down = b[:, :half].repeat_interleave(2, -1)
            beta = torch.logaddexp(l + up, down - l)
            if beta.shape[0] < c:
                beta = torch.cat([beta, beta.new_zeros(c - beta.shape[0], 1 << w)])
        posterior = alpha[p + 1] + beta  # (c, 2^w): the state after spin p
        spin = torch.tanh((torch.logsumexp(posterior[:, half:], -1) - torch.logsumexp(posterior[:, :half], -1)) / 2)
        m[p] = F.pad(spin, (0, Q - c))
    m += [field.new_zeros(Q)] * (n - steps_run)
    return torch.stack(m, -1), logz


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


METHOD = Method("chain", marginals, log_partition, keyword_options(marginals), "exact",
                f"J_jk = 0 for |j - k| > w, w <= {MAX_BANDWIDTH}, J may differ per query (options bandwidth, "
                "max_bandwidth)", banded._check_options, max_bandwidth=MAX_BANDWIDTH, band=True)
