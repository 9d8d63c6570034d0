"""Exact marginals and log Z for banded couplings (J_jk = 0 for |j - k| > w): transfer matrix.

Energy E(s) = -sum_j h_j s_j - sum_{j<k} J_jk s_j s_k. The state of the chain is its last w spins
(S = 2^w states). Spins are added k at a time ("blocks"); writing a block step as x = (o, r) -> x' = (r, t),
with o the k oldest spins that leave the state, r the w - k spins that stay and t the k new ones,

    alpha_b(r, t) = phi_b(t) sum_o M_b(r, t, o) alpha_{b-1}(o, r),    phi_b(t) = exp(h_new . t),
    beta_{b-1}(o, r) = sum_t M_b(r, t, o) phi_b(t) beta_b(r, t),

where M_b = exp(coupling energy of the new spins) is shared by all queries with the same J (one batched
GEMM per block) and phi_b carries the query's fields. alpha_b beta_b is the joint law of the w spins of
the state after block b (the marginals of its new spins), and alpha_{b-1} M_b phi_b beta_b that of the
w + k spins of the block's window, which holds <s_l s_p> for every coupling J_lp whose later spin p is new.

Shapes: h (..., n); J (..., n, n) or None; mask (..., n) bool or None. Queries (batch entries of h that
share J, see ``group_queries``) run side by side as the columns of (S, queries) messages, in chunks of
at most CHUNK_ENTRIES / S queries. Queries whose chains have the same lengths but other couplings or
another alignment of their blocks (under a causal mask: every head, and every end position modulo k) run
as lanes of one sweep, (lanes, S, queries) messages, as many as fill CHUNK_ENTRIES: fewer, larger
operations where each lane alone would be small. Cost per query: O(n 2^(w+k) / k) multiply-adds in GEMMs
and O(n 2^w / k) elementwise work. Memory: the forward messages of a chunk are kept for the backward sweep; by default a
chunk holds as many queries (longest first) as keep them within MESSAGE_BUDGET, and only a chunk beyond it
(one query, or a given chunk_size) keeps one in about sqrt(blocks) and recomputes the others. A query's
chain stops at its last present spin, so causal masks cost half.

Numerics. Two recursions, chosen per group of queries sharing J:

* Scaled probabilities (fast path, k = 4 for w >= 4): M_b and phi_b are scaled to a maximum of 1, each
  alpha is divided by the sum of the previous one, and the scales are accumulated in log Z. Entries
  that underflow are lost, but the future can raise a state's weight relative to another by at most
  exp(C), C = 2 * (sum of |J| over couplings that cross the cut), and a block lowers the largest entry
  by at most exp(-Delta), Delta = 2 * (sum of |J| of its new spins); fields only reweight the new spins,
  which beta does not see. So with R = 2 * max over w + k consecutive spins of sum_l |J_lp| >= C + Delta,
  the relative error from underflow is at most n 4^w tiny exp(R); the path is used when this is below
  the dtype's eps, i.e. R <= log(1 / tiny) - log(1 / eps) - log n - 2 w log 2 (about 53 in float32 at
  n = 1024, w = 8; 650 in float64). float32 inputs past float32's bound and within float64's run this
  path in float64 (about 2x faster than the log domain, measured; learned couplings of |J| ~ 0.3 at
  w = 8 reached float32's bound in training), and the log-domain path is used otherwise. Large fields are safe
  from underflow, not from rounding: a block's log-weights are sums of its fields and couplings, rounded
  relative to their size, so lower-precision inputs whose local scale (k max |h| + R) exceeds
  ``numerics.FLOAT32_SCALE_LIMIT`` (float32 rounding of 1e-3) run either recursion in float64, as method
  exact does. Where float64 itself cannot resolve the energies (O(1) fields next to couplings of 1e12
  and beyond between spins that are not frozen), a ValueError says so (``_check_resolution``).
  Subnormal numbers (arithmetic on them is ~40x slower on CPUs) are flushed to zero on the calling
  thread and exp arguments are floored at log(tiny) + 1: both only touch entries below e * tiny
  relative to the largest, inside the same bound. So float32 runs in float32 (before: in float64
  whenever the fields could reach subnormals, which sigmoid-attention fields near -log(n) / 2 do).
* Log domain (fallback, one spin per step): log messages with logaddexp, normalised every step. Also
  used when a mask has holes (absent spins before a query's last present spin), because then the
  couplings differ per query: absent spins get field 0 and couplings 0 (free spins), and log 2 per
  absent spin is taken off log Z.

Gradients (one custom autograd function, _Banded; nothing is stored per step). For log Z: d/dh_j = <s_j> and
d/dJ_lp = <s_l s_p> / 2 for each of the two symmetric entries. For the marginals, the vector-Jacobian
product with g is the Hessian of log Z applied to g (it is symmetric), i.e. the derivative of <s_j> and
of <s_l s_p> along the field direction g: dL/dh_j = sum_i g_i Cov(s_i, s_j), dL/dJ_lp = sum_i g_i
Cov(s_i, s_l s_p) / 2. It is computed by running the same forward-backward with tangent messages (dual
numbers) next to the messages. The J gradient covers the band 1 <= |l - p| <= w only: other entries are
structurally zero (so pass ``bandwidth`` when J is trained from a value, such as zero, that does not
fill the band; with w = 0 J gets no gradient). Second derivatives raise (``_autograd``).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
from torch import Tensor

from ._autograd import first_order_backward
from ._inputs import check_int, empty_result, group_queries, is_empty
from .numerics import FLOAT32_SCALE_LIMIT
from .numerics import no_denormals as _no_denormals
from .record import Method, keyword_options, with_defaults

__all__ = ["marginals", "log_partition"]

LINEAR_BLOCK = 4              # spins per block in the scaled-probability recursion
LARGEST_WINDOW = 16           # cap on w + k, so that a block's coupling table has <= 2^16 entries
CHUNK_ENTRIES = 2**18         # default chunk: this many entries per message (S states x queries)
MESSAGE_BUDGET = 256 * 2**20  # bytes of forward messages kept per chunk; beyond it they are checkpointed
MAX_BANDWIDTH = 16            # default max_bandwidth: the chain has 2^w states


def marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              bandwidth: int | None = None, max_bandwidth: int = MAX_BANDWIDTH,
              chunk_size: int | None = None) -> Tensor:
    """<s_j>, shaped like the broadcast of h with J and mask (..., n); 0 for absent spins.

    bandwidth: w such that J_jk = 0 for |j - k| > w (default: the smallest such w); max_bandwidth: the
    largest w accepted (2^w states); chunk_size: queries run together (default: CHUNK_ENTRIES / 2^w, so
    that a message fits in cache; the memory kept per chunk is bounded by MESSAGE_BUDGET either way).
    """
    w = _bandwidth(h, J, K, bandwidth, max_bandwidth, chunk_size)
    if is_empty(h, J, None, mask):
        return empty_result(h, J, None, mask, marginals=True)
    if w == 0:
        m = torch.tanh(h).expand(_batch_shape(h, J, mask) + h.shape[-1:])
        return m if mask is None else m * mask
    g = group_queries(h, J, None, mask)
    _check_resolution(g.h, g.J, g.mask, w)
    return g.ungroup(_Banded.apply(g.h, g.J, g.mask, w, chunk_size, True))


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                  bandwidth: int | None = None, max_bandwidth: int = MAX_BANDWIDTH,
              chunk_size: int | None = None) -> Tensor:
    """log Z of the present spins, shaped like the broadcast batch shape. Options as in :func:`marginals`."""
    w = _bandwidth(h, J, K, bandwidth, max_bandwidth, chunk_size)
    if is_empty(h, J, None, mask):
        return empty_result(h, J, None, mask, marginals=False)
    if w == 0:
        terms = torch.logaddexp(h, -h)  # log 2 cosh h
        terms = terms if mask is None else terms * mask
        return terms.expand(_batch_shape(h, J, mask) + h.shape[-1:]).sum(-1)
    g = group_queries(h, J, None, mask)
    _check_resolution(g.h, g.J, g.mask, w)
    return g.ungroup(_Banded.apply(g.h, g.J, g.mask, w, chunk_size, False))


def _batch_shape(h: Tensor, J: Tensor | None, mask: Tensor | None) -> torch.Size:
    shapes = [h.shape[:-1], J.shape[:-2] if J is not None else (), mask.shape[:-1] if mask is not None else ()]
    return torch.broadcast_shapes(*shapes)


def _bandwidth(h: Tensor, J: Tensor | None, K: Tensor | None, bandwidth: int | None, max_bandwidth: int,
               chunk_size: int | None, method: str = "banded") -> int:
    """The bandwidth w to run with (at most n - 1), after checking J, the options and the limits (``method``: the
    name the errors give; method 'chain' shares the rule)."""
    if K is not None:
        raise ValueError(f"method {method!r} supports pairwise couplings only (K must be None); "
                         "use method='exact' for three-body couplings")
    n = h.shape[-1]
    if bandwidth is not None:
        check_int("bandwidth", bandwidth, 0)
    check_int("max_bandwidth", max_bandwidth, 0)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, 1)
    if bandwidth is None and J is not None and J.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"method {method!r} needs an explicit `bandwidth` when J is trained: a bandwidth inferred "
                         "from J's current values (w = 0 for J = 0) would give every coupling beyond it no "
                         "gradient. Pass method_options={'bandwidth': w} (BoltzmannAttention with "
                         "coupling='relative' passes its coupling_range).")
    needed = 0
    if J is not None:
        pairs = (J.detach() != 0).reshape(-1, n, n).any(0).nonzero() if J.numel() else J.new_zeros(0, 2)
        needed = int((pairs[:, 1] - pairs[:, 0]).abs().max()) if len(pairs) else 0
    if bandwidth is not None and needed > bandwidth:
        raise ValueError(f"J is not banded with bandwidth {bandwidth}: it couples spins {needed} apart. "
                         f"Pass bandwidth >= {needed}, or use method='exact' (n <= 24) or 'meanfield'.")
    w = max(0, min(needed if bandwidth is None else bandwidth, n - 1))
    if w > max_bandwidth:
        raise ValueError(f"bandwidth {w} exceeds max_bandwidth={max_bandwidth} (the chain has 2^w states); "
                         "raise max_bandwidth, or use method='exact' (n <= 24) or 'meanfield'.")
    return 0 if J is None else w


RESOLUTION_TOLERANCE = 1e-6  # largest error in a marginal accepted from the float64 rounding of the energies
_FROZEN_MARGIN = 40.0        # a spin (or pair) is frozen when its other values are this far down in any context


def _check_resolution(h: Tensor, J: Tensor, mask: Tensor | None, w: int) -> None:
    """ValueError where float64 rounding of the recursions' log-weights can move a marginal by more than
    RESOLUTION_TOLERANCE. h (G, Q, n), J (G, n, n), mask (G, Q, n) or None (grouped).

    A step of either recursion adds the local energy of its new spin, of size L_p = |h_p| + sum_k |J_pk|,
    to message entries, rounding them by about eps L_p. That matters only between entries that both carry
    weight: not where every spin of the step's window is frozen (a single spin whose field beats its
    couplings, or a coupled pair whose best configuration beats the others, by _FROZEN_MARGIN in any
    context; absent spins count as frozen, their values do not move the others'). The bound summed over the
    other steps, 4 eps sum (L_p + 64), is compared with the tolerance; typical inputs are cleared by the
    first, cheaper bound that counts every step. The bound is conservative: rounding that happens to be
    exact (dyadic values) can be refused too, from local energies of about 1e9 next to unfrozen spins.
    """
    G, Q, n = h.shape
    if h.numel() == 0:
        return
    eps = torch.finfo(torch.float64).eps
    hd = h.detach().double().abs()
    band = torch.stack([_band(J[g].detach().double(), w) for g in range(G)])  # (G, n, w): J[p - d, p]
    absolute = band.abs()
    rows = absolute.sum(-1)
    for d in range(1, w + 1):  # the partners p + d
        rows[:, :n - d] += absolute[:, d:, d - 1]
    crude = 4 * eps * (hd + rows[:, None, :] + 64.0).sum(-1)
    if float(crude.amax()) <= RESOLUTION_TOLERANCE / 4:
        return
    present = torch.ones_like(hd) if mask is None else mask.double()
    hs = h.detach().double() * present
    pair = [band[:, None, d:, d - 1] * present[..., d:] * present[..., :n - d] for d in range(1, w + 1)]  # J_{p-d,p}
    local = hs.abs()
    for d, Jd in enumerate(pair, 1):
        local[..., d:] += Jd.abs()
        local[..., :n - d] += Jd.abs()
    frozen = (hs.abs() > local - hs.abs() + _FROZEN_MARGIN) | (present == 0)
    for d, Jd in enumerate(pair, 1):
        hq, hp = hs[..., :n - d], hs[..., d:]  # the pair (q, p) = (p - d, p)
        energies = torch.stack([a * hq + b * hp + a * b * Jd for a in (1, -1) for b in (1, -1)])
        top2 = energies.topk(2, dim=0).values
        rest = (local[..., :n - d] - hq.abs() - Jd.abs()) + (local[..., d:] - hp.abs() - Jd.abs())
        both = top2[0] - top2[1] > 2 * rest + _FROZEN_MARGIN
        frozen[..., :n - d] |= both
        frozen[..., d:] |= both
    counted = torch.empty_like(frozen)
    for g in range(G):  # a step's window: its state (w spins) and its block's other new spins (k - 1)
        scaled = mask is None and _window_max(absolute[g].sum(1), w + _block_size(w)) <= \
            _linear_limit(w, n, torch.float64)  # the scaled recursion (k spins a block) may run, else the log domain
        k = _block_size(w) if scaled else 1
        back, ahead = w + k - 1, k - 1
        loose = torch.nn.functional.pad((~frozen[g]).double()[:, None, :], (back, ahead))  # p - back .. p + ahead
        counted[g] = torch.nn.functional.max_pool1d(loose, back + ahead + 1, stride=1)[:, 0] > 0
    bound = 4 * eps * ((local + 64.0) * counted).sum(-1)
    worst = float(bound.amax())
    if worst > RESOLUTION_TOLERANCE:
        raise ValueError(
            f"method 'banded': the energies cannot be resolved in float64: local energies up to "
            f"{float((local * counted).amax()):.3g} next to spins they do not freeze round the log-weights by up "
            f"to {worst:.2g} (tolerance {RESOLUTION_TOLERANCE:g}). Rescale the fields and couplings (e.g. no "
            f"couplings or fields of 1e12 and beyond next to O(1) ones).")


class _Banded(torch.autograd.Function):
    """Marginals (``want_marginals``) or log Z of grouped inputs, one node. Backward of log Z: the
    marginals and pair sums weighted by the incoming gradient; of the marginals: their tangents along it
    (the Hessian of log Z applied to the gradient)."""

    @staticmethod
    def forward(ctx, h, J, mask, w, chunk_size, want_marginals):
        ctx.save_for_backward(h, J, mask)
        ctx.options, ctx.want_marginals = (w, chunk_size), want_marginals
        out = _solve(h, J, mask, w, chunk_size, marginals=want_marginals)
        return (out.marginals if want_marginals else out.log_z).to(h.dtype)

    @staticmethod
    @first_order_backward("method 'banded'")
    def backward(ctx, grad):
        h, J, mask = ctx.saved_tensors
        pairs = ctx.needs_input_grad[1]
        if ctx.want_marginals:
            out = _solve(h, J, mask, *ctx.options, marginals=True, tangent=grad if mask is None else grad * mask,
                         pairs=pairs)
            dh = out.marginals
        else:
            out = _solve(h, J, mask, *ctx.options, marginals=True, pairs=pairs, pair_weights=grad)
            dh = grad[..., None] * out.marginals
        dh = dh.to(h.dtype) if ctx.needs_input_grad[0] else None
        dJ = _dense(out.pairs, h.shape[-1]).to(J.dtype) if pairs else None
        return dh, dJ, None, None, None, None


def _dense(band: Tensor, n: int) -> Tensor:
    """(G, n, w) band statistics (row p, column d - 1: pair (p - d, p)) -> (G, n, n) J gradient, halved."""
    out = band.new_zeros(band.shape[0], n, n)
    for d in range(1, band.shape[-1] + 1):
        out.diagonal(d, -2, -1).copy_(0.5 * band[:, d:, d - 1])
        out.diagonal(-d, -2, -1).copy_(0.5 * band[:, d:, d - 1])
    return out


@dataclass
class _Solution:
    log_z: Tensor               # (G, Q)
    marginals: Tensor | None    # (G, Q, n): <s_j>, or its tangent
    pairs: Tensor | None        # (G, n, w): sum over queries of weight * <s_{p-d} s_p>, or of its tangent


def _solve(h: Tensor, J: Tensor, mask: Tensor | None, w: int, chunk_size: int | None, *, marginals: bool,
           tangent: Tensor | None = None, pairs: bool = False, pair_weights: Tensor | None = None) -> _Solution:
    """Forward(-backward) for grouped inputs h (G, Q, n), J (G, n, n), mask (G, Q, n) or None.

    Without ``tangent``: log Z, and if ``marginals`` the marginals and (if ``pairs``) the band sums of
    pair_weights * <s_l s_p>. With ``tangent`` (a field direction g, (G, Q, n)): the tangents of the
    marginals and of the band sums of <s_l s_p> along g.

    Each group's queries are split into lanes by the alignment of their last spin (see :class:`_Lane`);
    scaled-recursion lanes with the same chain lengths (e.g. every head's and every class's under a causal
    mask) run as one sweep, their tables side by side in the batched GEMMs.
    """
    G, Q, n = h.shape
    dtype = h.dtype if h.dtype in (torch.float32, torch.float64) else torch.float32
    out = _Solution(h.new_zeros(G, Q, dtype=dtype), h.new_zeros(G, n, Q, dtype=dtype) if marginals else None,
                    h.new_zeros(G, n, w, dtype=dtype) if pairs else None)
    sweeps: dict[tuple, list[_Lane]] = {}
    for gi in range(G):
        for lane in _lanes(gi, h[gi].to(dtype), _band(J[gi].to(dtype), w), mask[gi] if mask is not None else None,
                           tangent[gi].to(dtype) if tangent is not None else None,
                           pair_weights[gi].to(dtype) if pair_weights is not None else None, w):
            key = ("scaled", lane.fields.dtype, tuple(lane.last.tolist())) if lane.linear else ("log", gi, lane.c)
            sweeps.setdefault(key, []).append(lane)
    for lanes in sweeps.values():
        # as many lanes side by side as fill one cache-sized chunk (CHUNK_ENTRIES), in sweeps of equal size
        queries = len(lanes[0].members) if chunk_size is None else min(chunk_size, len(lanes[0].members))
        per_sweep = max(1, (CHUNK_ENTRIES >> w) // queries)
        count = -(-len(lanes) // per_sweep)
        size = -(-len(lanes) // count)
        for start in range(0, len(lanes), size):
            _run(out, lanes[start:start + size], w, chunk_size)
    if pairs:  # couplings to virtual spins (p - d < 0) do not exist
        out.pairs *= torch.arange(n, device=h.device)[:, None] >= torch.arange(1, w + 1, device=h.device)
    if marginals:
        out.marginals = out.marginals.transpose(1, 2)
        if mask is not None:
            out.marginals = out.marginals * mask
    return out


@dataclass
class _Lane:
    """The queries of group ``group`` whose last spin p has p % k == c, longest first: blocks of k spins
    end at p. A lane of the scaled recursion (``linear``) runs with k = _block_size(w), else with k = 1."""
    group: int
    c: int
    k: int
    linear: bool
    members: Tensor           # (m,) query indices in the group, by decreasing last block
    last: Tensor              # (m,) last block of each
    fields: Tensor            # (Q, n) the group's fields (0 at absent spins)
    padded: Tensor            # (w + k - 1 + n, w): row w + k - 1 + p holds the couplings of spin p
    present: Tensor | None    # (Q, n) bool, only when the mask has holes (log domain)
    direction: Tensor | None  # (Q, n) tangent direction g
    weights: Tensor | None    # (Q,) pair weights

    def rows(self, blocks: int) -> Tensor:
        """(blocks, k) padded positions of each block's new spins."""
        arange = partial(torch.arange, device=self.last.device)
        return self.c + self.padded.shape[1] + self.k * arange(blocks)[:, None] + arange(self.k)


def _lanes(gi: int, fields: Tensor, band: Tensor, present: Tensor | None, direction: Tensor | None,
           weights: Tensor | None, w: int) -> list[_Lane]:
    """Group gi's lanes (queries with at least one present spin), after choosing its recursion."""
    Q, n = fields.shape
    if present is None:
        ends, holes = torch.full((Q,), n - 1, device=fields.device), False
    else:  # last present spin (-1: none); a hole is an absent spin before it
        count = present.sum(-1)
        ends = torch.where(count > 0, n - 1 - present.flip(-1).to(torch.uint8).argmax(-1), -1)
        holes = bool((count != ends + 1).any())
        fields = fields * present
    coupling_range = _window_max(band.abs().sum(1), w + _block_size(w))
    # the scaled recursion in the input's dtype if its underflow bound allows, else in float64 (past float32's
    # bound it is still about 2x faster than the log domain's one spin per step; results are cast back)
    scaled = None if holes else next((d for d in (fields.dtype, torch.float64)
                                      if coupling_range <= _linear_limit(w, n, d)), None)
    linear = scaled is not None
    local_scale = _block_size(w) * float(fields.abs().amax()) + coupling_range if fields.numel() else 0.0
    if fields.dtype != torch.float64 and local_scale > FLOAT32_SCALE_LIMIT:
        scaled = torch.float64  # rounding of large local log-weights in lower precision: run in float64
    if scaled is not None and scaled != fields.dtype:
        fields, band = fields.to(scaled), band.to(scaled)
        direction = direction.to(scaled) if direction is not None else None
        weights = weights.to(scaled) if weights is not None else None
    k = _block_size(w) if linear else 1
    padded = torch.cat([band.new_zeros(w + k - 1, w), band])
    order = torch.argsort(ends, descending=True, stable=True)
    lanes = []
    for c in range(k):
        members = order[(ends[order] >= 0) & (ends[order] % k == c)]
        if len(members):
            lanes.append(_Lane(gi, c, k, linear, members, (ends[members] - c) // k, fields, padded,
                               present if holes else None, direction, weights))
    return lanes


def _run(out: _Solution, lanes: list[_Lane], w: int, chunk_size: int | None) -> None:
    """Sweep lanes with the same chain lengths together, chunk by chunk of queries, and write log Z,
    marginals and pair sums into ``out``."""
    first = lanes[0]
    k, dtype, device = first.k, first.fields.dtype, first.fields.device
    n = first.fields.shape[1]
    tangent = first.direction is not None
    for start, stop in _chunks(first.last, n, w, k, dtype, tangent, chunk_size, len(lanes)):
        last = first.last[start:stop]
        blocks = int(last[0]) + 1
        idx = [lane.members[start:stop] for lane in lanes]
        rows = [lane.rows(blocks) for lane in lanes]
        fields = torch.stack([_take(lane.fields[i], r, w + k - 1) for lane, i, r in zip(lanes, idx, rows)], 1)
        directions = (torch.stack([_take(lane.direction[i], r, w + k - 1) for lane, i, r in zip(lanes, idx, rows)],
                                  1) if tangent else None)                                   # (B, L, k, a)
        if first.linear:
            couplings = torch.stack([lane.padded[r].flatten(1) for lane, r in zip(lanes, rows)])  # (L, B, k w)
            model = _Scaled(couplings, fields, directions, w, k)
        else:  # one lane
            presence = None
            if first.present is not None:
                pad = torch.cat([first.present.new_zeros(len(idx[0]), w), first.present[idx[0]]], 1)  # (a, w + n)
                back = rows[0] - torch.arange(1, w + 1, device=device)                              # (B, w)
                presence = (pad[:, back] & pad[:, rows[0]]).permute(1, 2, 0).to(dtype)             # (B, w, a)
            model = _LogDomain(first.padded[rows[0][:, 0]], fields[:, 0, 0], directions[:, 0] if tangent else None,
                               w, presence)
        weights = (torch.stack([lane.weights[i] for lane, i in zip(lanes, idx)]) if first.weights is not None
                   else None)
        with _no_denormals(device):
            z, m, joint = _sweep(model, last, out.marginals is not None, out.pairs is not None,
                                 weights if first.linear or weights is None else weights[0],
                                 _stride(last, w, dtype, tangent, len(lanes)))
        if not first.linear:  # the log-domain sweep has no lane dimension
            z, m = z[None], m[:, :, None] if m is not None else None
            joint = joint[:, None] if joint is not None else None
        for l, (lane, i, r) in enumerate(zip(lanes, idx, rows)):
            absent = torch.full_like(z[l], w + k - 1 - lane.c)  # virtual spins: initial state, first block's padding
            if lane.present is not None:  # absent spins before the last (k = 1: the last spin is at its block)
                absent += last + 1 - lane.present[i].sum(-1)
            out.log_z[lane.group, i] = (z[l] - math.log(2.0) * absent).to(out.log_z.dtype)
            spin = (r - (w + k - 1)).flatten()  # position of each block's new spins; < 0: virtual
            real = spin >= 0
            if out.marginals is not None:
                out.marginals[lane.group, spin[real, None], i] = m[:, :, l].flatten(0, 1)[real].to(out.marginals.dtype)
            if out.pairs is not None:
                stats = (joint[:, l] @ model.pair_signs.flatten(1)).view(-1, w)                  # (B * k, w)
                out.pairs[lane.group].index_add_(0, spin[real], stats[real].to(out.pairs.dtype))


def _window_max(x: Tensor, width: int) -> float:
    """Largest sum of ``width`` consecutive entries along the last dimension of x (all of it if shorter)."""
    sums = torch.cat([x.new_zeros(*x.shape[:-1], 1), x.cumsum(-1)], -1)
    width = min(width, x.shape[-1])
    return float((sums[..., width:] - sums[..., :-width]).max())


def _linear_limit(w: int, n: int, dtype: torch.dtype) -> float:
    """Largest window sum of |J| (R / 2 in the module docstring) for which the scaled recursion is exact."""
    info = torch.finfo(dtype)
    return (-math.log(info.tiny) + math.log(info.eps) - math.log(n) - 2 * w * math.log(2.0)) / 2


def _floored_exp(x: Tensor) -> Tensor:
    """exp(x) for x <= 0, with x floored at log(tiny) + 1: exp below log(tiny) takes a slow path on CPUs
    (~100x), and such weights, below e * tiny relative to the largest (1), are lost to underflow anyway."""
    return x.clamp_min(math.log(torch.finfo(x.dtype).tiny) + 1.0).exp_()


def _band(J: Tensor, w: int) -> Tensor:
    """(n, n) -> (n, w): row p, column d - 1 holds J[p - d, p] (0 for p < d)."""
    n = J.shape[-1]
    out = J.new_zeros(n, w)
    for d in range(1, w + 1):
        out[d:, d - 1] = J.diagonal(d)
    return out


def _block_size(w: int) -> int:
    """Spins per block k of the scaled recursion (k <= w, and w + k <= LARGEST_WINDOW when possible)."""
    return max(1, min(LINEAR_BLOCK, w, LARGEST_WINDOW - w))


def _take(x: Tensor, rows: Tensor, front: int) -> Tensor:
    """x (a, n) per query -> (B, k, a): the values at padded positions ``rows`` (zero in front padding)."""
    return torch.cat([x.new_zeros(x.shape[0], front), x], 1)[:, rows].permute(1, 2, 0)


def _chunks(last: Tensor, n: int, w: int, k: int, dtype: torch.dtype, tangent: bool,
            chunk_size: int | None, lanes: int = 1) -> list[tuple[int, int]]:
    """(start, stop) of each chunk of queries (sorted by decreasing last block ``last``), the same in each
    of ``lanes`` lanes swept together.

    Given ``chunk_size``: chunks of that many. By default: at most CHUNK_ENTRIES / (2^w lanes) queries (a
    message cache-sized), block fields phi within a quarter of MESSAGE_BUDGET, and as many queries as keep
    the chunk's forward messages within MESSAGE_BUDGET (at least one), so that the backward sweep does not
    recompute them: long queries go in narrower chunks than short ones."""
    if chunk_size is not None:
        return [(s, min(s + chunk_size, len(last))) for s in range(0, len(last), chunk_size)]
    size = torch.finfo(dtype).bits // 8 * (1 + tangent) * lanes
    width = max(1, min((CHUNK_ENTRIES >> w) // lanes, MESSAGE_BUDGET // 4 // ((n // k + 1) * 2**k * size)))
    kept = torch.cat([last.new_zeros(1), ((last + 1) * 2**w * size).cumsum(0)]).tolist()
    chunks, start = [], 0
    while start < len(last):
        stop = min(start + width, bisect.bisect_right(kept, kept[start] + MESSAGE_BUDGET) - 1)
        chunks.append((start, max(stop, start + 1)))
        start = chunks[-1][1]
    return chunks


def _stride(last: Tensor, w: int, dtype: torch.dtype, tangent: bool, lanes: int = 1) -> int:
    """Blocks per checkpoint: 1 (keep every message) if that fits the budget, else about sqrt(blocks)."""
    kept = int((last + 1).sum()) * 2**w * (1 + tangent) * lanes * torch.finfo(dtype).bits // 8
    return 1 if kept <= MESSAGE_BUDGET else math.isqrt(int(last[0])) + 1


@dataclass
class _Message:
    value: Tensor            # (L, S, a) scaled probabilities alpha, or (S, a) log alpha
    tangent: Tensor | None   # shaped like value
    norm: Tensor             # (L, a): sum of value (scaled), or (a,) the log-normaliser taken off (log domain)
    scale: Tensor | None = None  # (L, 1, T, a): phi_b / norm_{b-1}, the factor applied to the new spins (scaled)


def _sweep(model, last: Tensor, marginals: bool, pairs: bool, weights: Tensor | None, stride: int):
    """Run a chunk: forward sweep (log Z), then if ``marginals`` the backward sweep.

    last: (a,) last block of each query, decreasing; block b involves the first A_b queries. Forward
    messages are kept every ``stride`` blocks and recomputed in between during the backward sweep.
    Messages are (..., S, a): any leading dimensions (the scaled recursion's lanes) ride along.
    Returns log Z (..., a) (virtual spins included), marginals (B, k, ..., a) and window joints
    (B, ..., 2^(w+k)).
    """
    blocks = int(last[0]) + 1
    counts = (last[None, :] >= torch.arange(blocks, device=last.device)[:, None]).sum(1)
    active = counts.tolist() + [0]
    message = model.start(active[0])
    kept, norms = {-1: message}, []
    for b in range(blocks):
        message = model.forward(b, message, active[b])
        norms.append(message.norm)
        if marginals and ((b + 1) % stride == 0 or b == blocks - 1):
            kept[b] = message
    column = torch.arange(int(counts.sum()), device=last.device)
    column -= (counts.cumsum(0) - counts).repeat_interleave(counts)  # query of each entry of cat(norms)
    lead = message.value.shape[:-2]
    log_norms = message.norm.new_zeros(*lead, active[0]).index_add_(-1, column, model.log(torch.cat(norms, -1)))
    log_z = model.log_z(log_norms, last)
    if not marginals:
        return log_z, None, None
    shape = message.value.shape[:-1] + (active[0],)
    beta = message.value.new_empty(shape)
    dbeta = message.value.new_empty(shape) if model.tangent is not None else None
    span = max(1, model.w // model.k)  # a state holds the new spins of this many blocks
    marg = beta.new_zeros(blocks, model.k, *lead, active[0])
    joint = beta.new_zeros(blocks, *lead, 2 ** (model.w + model.k)) if pairs else None
    for start in reversed(range(0, blocks, stride)):
        end = min(start + stride, blocks)
        segment = {start - 1: kept[start - 1]}
        for b in range(start, end - 1):
            segment[b] = model.forward(b, segment[b - 1], active[b])
        segment[end - 1] = kept.pop(end - 1)
        for b in reversed(range(start, end)):
            a, done = active[b], active[b + 1]
            if done < a:  # queries whose chain ends at block b
                model.end(segment[b], beta[..., done:a], dbeta[..., done:a] if dbeta is not None else None, done)
            # marginals of the last `span` blocks' spins, from the joint law of the state after block b
            first = 0 if b % span == span - 1 else done
            if first < a:
                state = model.marginals(segment[b], first, beta[..., first:a],
                                        dbeta[..., first:a] if dbeta is not None else None)  # (w, ..., a)
                low = max(b - span + 1, 0)
                state = state[state.shape[0] - (b + 1 - low) * model.k:]
                marg[low:b + 1, ..., first:a] = state.unflatten(0, (-1, model.k))
            j = model.backward(b, segment[b - 1], segment[b], beta[..., :a],
                               dbeta[..., :a] if dbeta is not None else None, pairs, weights)
            if pairs:
                joint[b] = j
    return log_z, marg, joint


@lru_cache(maxsize=64)  # constant tables, read only: built once per size, dtype and device
def _spins(bits: int, dtype: torch.dtype, device) -> Tensor:
    """(2^bits, bits) +-1 table; column i is bit bits - 1 - i of the row index (column 0 = oldest spin)."""
    index = torch.arange(2**bits, device=device)
    return (2 * ((index[:, None] >> torch.arange(bits - 1, -1, -1, device=device)) & 1) - 1).to(dtype)


@lru_cache(maxsize=64)  # constant tables, read only: built once per size, dtype and device
def _state_signs(w: int, dtype: torch.dtype, device) -> Tensor:
    """(w + 1, 2^w): the w spins of each state (oldest first), then a row of ones (the normaliser)."""
    return torch.cat([_spins(w, dtype, device).T, torch.ones(1, 2**w, dtype=dtype, device=device)])


@lru_cache(maxsize=64)  # constant tables, read only: built once per size, dtype and device
def _pair_signs(w: int, k: int, dtype: torch.dtype, device) -> Tensor:
    """(2^(w+k), k, w): s_{w+j} s_{w+j-d} over a block window (column d - 1), for new spin j."""
    window = _spins(w + k, dtype, device)
    new = torch.arange(w, w + k, device=device)
    back = new[:, None] - torch.arange(1, w + 1, device=device)
    return window[:, new, None] * window[:, back]


class _Scaled:
    """Scaled-probability recursion, k new spins per block, for L lanes of queries swept side by side
    (each lane's coupling tables shared by its queries): messages are (L, S, a).

    alpha_b = (M_b alpha_{b-1}) * phi_b / sum(alpha_{b-1}); beta starts at 1 / sum(alpha) at the end of each
    query's chain, so that alpha_b . beta_b = 1 at every block (and stays so along tangents)."""

    def __init__(self, couplings: Tensor, fields: Tensor, tangent: Tensor | None, w: int, k: int):
        """couplings (L, B, k * w): J between each block's new spins and their w predecessors; fields,
        tangent (B, L, k, a): h and the tangent direction g at each block's new spins."""
        self.w, self.k, self.tangent = w, k, tangent
        lanes, blocks = couplings.shape[:2]
        dtype, device = couplings.dtype, couplings.device
        self.pair_signs = _pair_signs(w, k, dtype, device)
        self.T, self.R = 2**k, 2 ** (w - k)
        energy = couplings @ self.pair_signs.flatten(1).T          # (L, B, 2^(w+k)), window index (o, r, t)
        top = energy.amax(-1)
        M = _floored_exp(energy - top[..., None]).view(lanes, blocks, self.T, self.R, self.T)
        M = M.permute(1, 0, 3, 4, 2).reshape(blocks, lanes * self.R, self.T, self.T)  # (B, L R, T, O)
        spins = _spins(k, dtype, device)                            # (T, k)
        self.state_signs = _state_signs(w, dtype, device)
        size = fields.abs().sum(-2)                                 # (B, L, a)
        self.phi = _floored_exp(spins @ fields - size[..., None, :])  # (B, L, T, a), largest entry 1
        self.gamma = spins @ tangent if tangent is not None else None
        self.log_scale = top.T[..., None] + size                    # (B, L, a)
        # per-block views, taken once (indexing in the loop costs more dispatches than the block's arithmetic)
        self.blocks_M, self.blocks_back = M.unbind(0), M.transpose(2, 3).unbind(0)  # (L R, T, O), (L R, O, T)
        self.blocks_phi = self.phi.unbind(0)
        self.blocks_gamma = self.gamma.unbind(0) if tangent is not None else None

    def start(self, a: int) -> _Message:
        lanes, S = self.phi.shape[1], self.R * self.T
        value = self.phi.new_ones(lanes, S, a)
        return _Message(value, torch.zeros_like(value) if self.tangent is not None else None,
                        value.new_full((lanes, a), float(S)))

    def _split(self, x: Tensor, a: int) -> Tensor:
        """(L, S, >= a) state-major messages -> (L, R, O, a) view: old state (o, r) with r as the batch."""
        return x.as_strided((x.shape[0], self.R, self.T, a), (x.stride(0), x.stride(1), self.R * x.stride(1),
                                                               x.stride(2)))

    def _apply(self, tables: Tensor, x: Tensor, a: int, out: Tensor | None = None) -> Tensor:
        """(L R, T, O) tables times the (L, R, O, a) split of messages x, into ``out`` (L, R, T, a) (a new
        tensor by default). With R = 1 every lane's split is one batch; otherwise one GEMM batch per lane: the
        split of several lanes cannot be viewed as one batch, and copying it costs more than the dispatches
        (measured)."""
        split, R = self._split(x, a), self.R
        out = x.new_empty(x.shape[0], R, self.T, a) if out is None else out
        if R == 1:  # (w = k) one state index: every lane's split is one batch
            torch.bmm(tables, split[:, 0], out=out[:, 0])
            return out
        for lane in range(x.shape[0]):
            torch.bmm(tables[lane * R:(lane + 1) * R], split[lane], out=out[lane])
        return out

    def forward(self, b: int, prev: _Message, a: int) -> _Message:
        scale = (self.blocks_phi[b][..., :a] / prev.norm[:, None, :a])[:, None]  # (L, 1, T, a)
        value = self._apply(self.blocks_M[b], prev.value, a).mul_(scale)          # (L, R, T, a)
        tangent = None
        if self.tangent is not None:
            tangent = self._apply(self.blocks_M[b], prev.tangent, a).mul_(scale)
            tangent = tangent.addcmul_(value, self.blocks_gamma[b][:, None, :, :a]).flatten(1, 2)
        value = value.flatten(1, 2)
        return _Message(value, tangent, value.sum(1), scale)

    def log(self, norms: Tensor) -> Tensor:
        return norms.log()

    def log_z(self, log_norms: Tensor, last: Tensor) -> Tensor:
        """log Z (L, a) from the summed log norms (blocks 0 .. last) and the tables' scales."""
        offsets = self.log_scale.cumsum(0)[last, :, torch.arange(len(last), device=last.device)].T
        return log_norms + offsets + math.log(self.R * self.T)

    def end(self, cur: _Message, beta: Tensor, dbeta: Tensor | None, first: int) -> None:
        """beta = 1 / Z (and its tangent) for the queries first, first + 1, ... whose chain ends here."""
        norm = cur.norm[:, None, first:first + beta.shape[-1]]
        beta.copy_((1 / norm).expand_as(beta))
        if dbeta is not None:
            dbeta.copy_((-cur.tangent[..., first:first + beta.shape[-1]].sum(1, keepdim=True) / norm**2)
                        .expand_as(dbeta))

    def marginals(self, cur: _Message, first: int, beta: Tensor, dbeta: Tensor | None) -> Tensor:
        """(w, L, a) marginals (or tangents) of the state's spins for queries first, first + 1, ..."""
        alpha = cur.value[..., first:first + beta.shape[-1]]
        moments = self.state_signs @ (alpha * beta)                 # (L, w + 1, a); last row: normaliser (= 1)
        if self.tangent is None:
            return (moments[:, :-1] / moments[:, -1:]).transpose(0, 1)
        dalpha = cur.tangent[..., first:first + beta.shape[-1]]
        dmoments = self.state_signs @ torch.addcmul(dalpha * beta, alpha, dbeta)
        return ((dmoments[:, :-1] - moments[:, :-1] * (dmoments[:, -1:] / moments[:, -1:])) / moments[:, -1:]
                ).transpose(0, 1)

    def backward(self, b, prev, cur, beta, dbeta, pairs, weights):
        """Window joint of block b summed over each lane's queries ((L, 2^(w+k)), or its tangent; None
        without ``pairs``), and beta (dbeta) overwritten with beta_{b-1}."""
        L, R, T, a = beta.shape[0], self.R, self.T, beta.shape[-1]
        v = beta.view(L, R, T, a) * cur.scale                       # phi_b beta_b / sum(alpha_{b-1})
        if self.tangent is not None:
            dv = torch.addcmul(dbeta.view(L, R, T, a) * cur.scale, v, self.blocks_gamma[b][:, None, :, :a])
        joint = None
        if pairs:
            old = self._split(prev.value, a).flatten(0, 1)                           # (L R, O, a)
            if self.tangent is None:
                joint = torch.bmm(old, (v * weights[:, None, None, :a]).flatten(0, 1).transpose(1, 2))
            else:
                joint = torch.bmm(old, dv.flatten(0, 1).transpose(1, 2)).add_(
                    torch.bmm(self._split(prev.tangent, a).flatten(0, 1), v.flatten(0, 1).transpose(1, 2)))
            joint = (joint * self.blocks_back[b]).view(L, R, T, T).transpose(1, 2).flatten(1)  # (o, r, t)
        if b > 0:
            back = self.blocks_back[b]                               # (L R, O, T)
            into = self._split(beta, a)
            dinto = self._split(dbeta, a) if self.tangent is not None else None
            if R == 1:
                torch.bmm(back, v[:, 0], out=into[:, 0])
                if dinto is not None:
                    torch.bmm(back, dv[:, 0], out=dinto[:, 0])
                return joint
            for lane in range(L):
                torch.bmm(back[lane * R:(lane + 1) * R], v[lane], out=into[lane])
                if dinto is not None:
                    torch.bmm(back[lane * R:(lane + 1) * R], dv[lane], out=dinto[lane])
        return joint


class _LogDomain:
    """Log-domain recursion, one spin per step; couplings may be masked per query."""

    k = 1

    def __init__(self, couplings: Tensor, fields: Tensor, tangent: Tensor | None, w: int,
                 presence: Tensor | None):
        """couplings (B, w): J between step b's spin and its w predecessors; fields (B, a); tangent
        (B, 1, a) or None; presence (B, w, a) or None: 1 where both spins of the coupling are present."""
        self.w, self.couplings, self.fields, self.presence = w, couplings, fields, presence
        self.tangent = tangent[:, 0] if tangent is not None else None
        self.R = 2 ** (w - 1)
        self.previous = _spins(w, fields.dtype, fields.device).flip(1)   # (S, w): column d - 1 is s_{p-d}
        self.pair_signs = _pair_signs(w, 1, fields.dtype, fields.device)
        self.state_signs = _state_signs(w, fields.dtype, fields.device)

    def start(self, a: int) -> _Message:
        value = self.fields.new_zeros(2 * self.R, a)
        return _Message(value, torch.zeros_like(value) if self.tangent is not None else None, value.new_zeros(a))

    def log(self, shifts: Tensor) -> Tensor:
        return shifts

    def log_z(self, log_norms: Tensor, last: Tensor) -> Tensor:
        return log_norms

    def end(self, cur: _Message, beta: Tensor, dbeta: Tensor | None, first: int) -> None:
        """log beta = 0 for the queries whose chain ends here (every result is normalised afterwards)."""
        beta.zero_()
        if dbeta is not None:
            dbeta.zero_()

    def _field(self, b: int, a: int) -> Tensor:
        """(S, a): the field on step b's spin in each previous state, h + sum_d J_d s_{p-d}."""
        if self.presence is None:
            return (self.previous @ self.couplings[b])[:, None] + self.fields[b, :a]
        return self.previous @ (self.couplings[b, :, None] * self.presence[b, :, :a]) + self.fields[b, :a]

    def forward(self, b: int, prev: _Message, a: int) -> _Message:
        R = self.R
        field = self._field(b, a)
        x = prev.value[:, :a]
        up0, up1 = x[:R] + field[:R], x[R:] + field[R:]        # new spin +1; oldest spin -1 / +1
        dn0, dn1 = x[:R] - field[:R], x[R:] - field[R:]        # new spin -1
        value = torch.stack([torch.logaddexp(dn0, dn1), torch.logaddexp(up0, up1)], 1).view(-1, a)
        shift = torch.logsumexp(value, 0)
        value = value - shift
        tangent = None
        if self.tangent is not None:
            dx, g = prev.tangent[:, :a], self.tangent[b, :a]
            d0, d1 = dx[:R], dx[R:]
            gap = d0 - d1
            tangent = torch.stack([d1 + torch.sigmoid(dn0 - dn1) * gap - g,
                                   d1 + torch.sigmoid(up0 - up1) * gap + g], 1).view(-1, a)
        return _Message(value, tangent, shift)

    def marginals(self, cur: _Message, first: int, beta: Tensor, dbeta: Tensor | None) -> Tensor:
        """As :meth:`_Scaled.marginals`, with log messages."""
        cols = slice(first, first + beta.shape[1])
        p = torch.softmax(cur.value[:, cols] + beta, 0)
        moments = self.state_signs[:-1] @ p
        if self.tangent is None:
            return moments
        dmoments = self.state_signs @ (p * (cur.tangent[:, cols] + dbeta))
        return dmoments[:-1] - moments * dmoments[-1]

    def backward(self, b, prev, cur, beta, dbeta, pairs, weights):
        """As :meth:`_Scaled.backward`, with log messages."""
        R, a = self.R, beta.shape[1]
        field = self._field(b, a).view(2, R, 1, a)
        sign = field.new_tensor([-1.0, 1.0]).view(1, 1, 2, 1)
        lb = beta.view(1, R, 2, a)
        joint = None
        if pairs:
            log_p = prev.value[:, :a].view(2, R, 1, a) + sign * field + lb   # window (o, r, t)
            prob = torch.softmax(log_p.view(-1, a), 0).view(2, R, 2, a)
            if self.tangent is None:
                joint = (prob * weights[:a]).sum(-1).flatten()
            else:
                g = self.tangent[b, :a]
                change = prev.tangent[:, :a].view(2, R, 1, a) + sign * g + dbeta.view(1, R, 2, a)
                change = change - (prob * change).sum((0, 1, 2))
                joint = (prob * change).sum(-1).flatten()
        if b > 0:
            up, dn = field[:, :, 0] + lb[:, :, 1], lb[:, :, 0] - field[:, :, 0]   # (2, R, a): new spin +1 / -1
            value = torch.logaddexp(up, dn).view(-1, a)
            if self.tangent is not None:
                g = self.tangent[b, :a]
                db = dbeta.view(R, 2, a)
                dbeta.copy_((db[:, 0] - g + torch.sigmoid(up - dn) * (db[:, 1] - db[:, 0] + 2 * g)).view(-1, a))
            beta.copy_(value - torch.logsumexp(value, 0))
        return joint


def _check_options(options: dict) -> None:
    o = with_defaults(marginals, options)
    if o["bandwidth"] is not None:
        check_int("bandwidth", o["bandwidth"], 0)
    check_int("max_bandwidth", o["max_bandwidth"], 0)
    if o["chunk_size"] is not None:
        check_int("chunk_size", o["chunk_size"], 1)


METHOD = Method("banded", marginals, log_partition, keyword_options(marginals), "exact",
                f"J_jk = 0 for |j - k| > w, w <= {MAX_BANDWIDTH} (options bandwidth, max_bandwidth)", _check_options,
                max_bandwidth=MAX_BANDWIDTH)
