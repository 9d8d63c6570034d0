"""Split enumeration: Z = u^T T v, the marginals and their gradients (the math of method ``exact``).

Split the n spins into a first half A (a = n // 2 spins) and a second half B (b = n - a). Then

    -E(s) = h_A.s_A + h_B.s_B + C(s_A, s_B),

where C holds every coupling term (pairwise and three-body). C does not depend on the query, so for
each group of queries that share J and K the coupling table

    T[x, y] = exp(C(x, y))                     (2^a, 2^b), x and y index the half-configurations,

is built once (``table_factors``: C = left @ right^T; ``CouplingTable``: T, max-shifted per row, block by
block), and for each query only u[x] = exp(h_A.S_A[x]) and v[y] = exp(h_B.S_B[y]). Then

    Z = u^T T v,   <s_A> = ((u * T v) @ S_A) / Z,   <s_B> = ((v * T^T u) @ S_B) / Z.

All queries of a group go through two GEMMs with inner size 2^(n/2): about 2 * 2^n MACs per query
instead of 2 n 2^n for naive enumeration.

Gradients (hand-written: ``Pairwise`` for h and J in one autograd node, ``contract`` when K is present
and autograd differentiates the table factors): for an upstream gradient g on <s> and g_Z on
log Z, the loss is linear in the state averages, so with f(s) = g.s = f_A[x] + f_B[y] and
p(x, y) = u_x T_xy v_y / Z,

    dL/dlog u_x = sum_y p(x, y) (f(x, y) - <f> + g_Z),   dL/dlog v_y likewise,
    dL/dC_xy    = sum_queries p(x, y) (f(x, y) - <f> + g_Z),

i.e. the covariances d<s_j>/dh_k = <s_j s_k> - <s_j><s_k> (and <s_j s_k s_l> terms for C, hence J and
K), computed from the same u, T, v with four more GEMMs. log u, log v and C are linear in h, J, K, so
autograd takes it from there.

Small pairwise systems (n <= ENUMERATED_SPINS, within one table block and one query chunk) skip the split:
the 2^n log-weights h.s + s.J.s / 2 of all states and a softmax, a dozen operations in all (n 2^n work per
query instead of 2^n, cheaper than the split's per-operation overhead at these sizes).

Numerics (:mod:`boltzmann_attention.ising.numerics`): u, v and T are each shifted by their maximum in the
log domain; rows whose Z underflows, and lower-precision rows whose energy scale exceeds
``numerics.FLOAT32_SCALE_LIMIT``, are recomputed in float64 (``rescued``, ``float64_fallback``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from . import checks, numerics
from ._autograd import first_order_backward
from .enumeration import configurations

ENUMERATED_SPINS = 8  # pairwise systems up to this size (and within one block and chunk) skip the split


@lru_cache(maxsize=64)
def half_configurations(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """All 2^n configurations of n spins, (2^n, n), cached per dtype and device."""
    return configurations(n, dtype=dtype, device=device)


def solve(h: Tensor, J: Tensor | None, K: Tensor | None):
    """h (G, Q, n), J (G, n, n), K (G, n, n, n), no mask. Returns (G, Q, n) marginals, (G, Q) log Z."""
    if J is None and K is None:  # independent spins: the closed form is exact
        return torch.tanh(h), numerics.log_2cosh(h).sum(-1)
    n = h.shape[-1]
    a = n // 2
    SA = half_configurations(a, h.dtype, h.device)      # (2^a, a)
    SB = half_configurations(n - a, h.dtype, h.device)  # (2^b, b)
    if K is None:  # pairwise: one autograd node, hand-written backward
        m, logz, ok = Pairwise.apply(h, J, None)
    else:  # with three-body couplings: the table factors go through autograd
        left, right = table_factors(J, K, a, SA, SB)  # C = left @ right^T, (G, 2^a, 2^b)
        log_u = h[..., :a] @ SA.T  # (G, Q, 2^a)
        log_v = h[..., a:] @ SB.T  # (G, Q, 2^b)
        m, logz, ok = contract(log_u, log_v, left, right, SA, SB)
    return rescued(m, logz, ok, h, J, K)


def contract(log_u: Tensor, log_v: Tensor, left: Tensor, right: Tensor, SA: Tensor, SB: Tensor):
    """Marginals (G, Q, a + b), log Z (G, Q) and ok (G, Q) of Z = u^T T v, T = exp(left @ right^T), for
    log u (G, Q, 2^a) and log v (G, Q, 2^b), in chunks of queries; differentiable in all four (first
    derivatives, from the covariances). Rows with ok False underflowed: they hold placeholders, for
    ``float64_fallback`` or the caller's own rescue."""
    chunk = max(1, numerics.CHUNK_ELEMENTS // max(SA.shape[0], SB.shape[0]))
    pieces = [_Contract.apply(lu, lv, left, right, SA, SB)
              for lu, lv in zip(log_u.split(chunk, dim=1), log_v.split(chunk, dim=1))]
    return tuple(torch.cat(x, dim=1) for x in zip(*pieces)) if len(pieces) > 1 else pieces[0]


_REFUSED = ("exact marginals: a query's partition function underflowed or its energy scale is beyond what {} "
            "resolves; under boltzmann_attention.value_checks('host') such queries are solved again in float64 "
            "(on the host), or pass float64 inputs")


def rescued(m, logz, ok, h, J, K, mask=None):
    """Rows that underflowed (ok False), float32 rows whose energy scale exceeds
    numerics.FLOAT32_SCALE_LIMIT, and rows whose float64 energies may be rounded by more than
    RESOLUTION_TOLERANCE allows (``resolved_scale``), recomputed by the float64 fallback, which checks
    the last ones (``check_resolution``)."""
    if not checks.on_host(h.device):  # no host read: the same rows refused by an asynchronous assert
        limit = resolved_scale(h.shape[-1])
        if h.dtype != torch.float64:
            limit = min(limit, numerics.FLOAT32_SCALE_LIMIT)
        torch._assert_async((ok & (numerics.energy_scale(h, J, K) <= limit)).all(), _REFUSED.format(h.dtype))
        return m, logz
    limit = numerics.FLOAT32_SCALE_LIMIT
    bound = numerics.energy_bound(h, J, K) if h.numel() else 0.0
    if h.dtype != torch.float64 and bound > limit:  # rounding of large log-weights:
        ok = ok & (numerics.energy_scale(h, J, K) <= limit)  # solve those rows in float64
    limit = resolved_scale(h.shape[-1])
    if bound > limit:  # rows whose float64 rounding may matter: solved and checked by the fallback
        ok = ok & (numerics.energy_scale(h, J, K) <= limit)
    if not bool(ok.all()):
        m, logz = float64_fallback(m, logz, ok, h, J, K, mask)
    return m, logz


def table_factors(J: Tensor | None, K: Tensor | None, a: int, SA: Tensor, SB: Tensor) -> tuple[Tensor, Tensor]:
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


class CouplingTable:
    """T = exp(C - row max) with C = left @ right^T, (G, 2^a, 2^b), block by block.

    A table of one block is kept; a larger one is rebuilt block by block each time it is read (a GEMM of
    inner size r and an exp per entry, in cache), so no temporary of the table's size is allocated.
    """

    def __init__(self, left: Tensor, right: Tensor):
        self.left, self.right = left, right
        G, rows, cols = left.shape[0], left.shape[1], right.shape[1]
        self.blocks = numerics.row_blocks(G, rows, cols)
        self.floor = numerics.exp_floor(left.dtype)
        self.sanitise = False  # set when the table holds inf/NaN (values beyond the dtype): read as 0
        if len(self.blocks) == 1:
            self.kept = left @ right.transpose(-1, -2)
            self.row_max = self.kept.amax(-1)
            self.kept.sub_(self.row_max[..., None]).clamp_(min=self.floor).exp_()
        else:
            self.kept = None
            g, r = self.blocks[0]  # the largest block
            self.buffer = left.new_empty(len(range(G)[g]), len(range(rows)[r]), cols)
            self.row_max = left.new_empty(G, rows)
            for g, r in self.blocks:
                block = self._product(g, r)
                self.row_max[g, r] = block.amax(-1)

    def _product(self, g, r) -> Tensor:
        left = self.left[g, r]
        return torch.matmul(left, self.right[g].transpose(-1, -2), out=self.buffer[:left.shape[0], :left.shape[1]])

    def __iter__(self):
        """(group slice, row slice, T block (groups, rows, 2^b))."""
        if self.kept is not None:
            yield slice(None), slice(None), (torch.nan_to_num(self.kept, 0.0, 0.0, 0.0) if self.sanitise
                                             else self.kept)
            return
        for g, r in self.blocks:
            block = self._product(g, r).sub_(self.row_max[g, r][..., None]).clamp_(min=self.floor).exp_()
            yield g, r, (block.nan_to_num_(0.0, 0.0, 0.0) if self.sanitise else block)

    def products(self, u: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """T v (G, q, 2^a) and T^T u (G, q, 2^b) for u (G, q, 2^a), v (G, q, 2^b)."""
        if self.kept is not None:
            table = next(iter(self))[2]
            return v @ table.transpose(-1, -2), u @ table
        kv = u.new_empty(u.shape)
        ku = v.new_zeros(v.shape)
        for g, r, block in self:  # in place: fresh large temporaries cost page faults on CPU
            kv[g, :, r] = v[g] @ block.transpose(-1, -2)
            ku[g].baddbmm_(u[g, :, r], block)
        return kv, ku


def _contract_forward(log_u, log_v, left, right, SA, SB):
    """Z = u^T T v for log u (G, q, 2^a), log v (G, q, 2^b) and the table C = left @ right^T.

    T = exp(C - row max) (``CouplingTable``), the row maxima absorbed into log u; u and v max-shifted. Returns
    marginals (G, q, n), log Z (G, q), ok (G, q) and what the backward needs. ok is False where Z
    underflowed or is not finite: those rows hold placeholders (marginals 0) and get no gradient.
    """
    table = CouplingTable(left, right)
    floor = table.floor
    log_u = log_u + table.row_max[:, None, :]
    shift_u, shift_v = log_u.amax(-1, keepdim=True), log_v.amax(-1, keepdim=True)
    u = log_u.sub_(shift_u).clamp_(min=floor).exp_()
    v = (log_v - shift_v).clamp_(min=floor).exp_()
    kv, ku = table.products(u, v)
    pa = u * kv
    z = pa.sum(-1)
    ok = z > torch.finfo(z.dtype).tiny ** 0.5  # False for NaN too
    # keep NaN / inf of bad rows (and tables) out of the results and gradients; without host reads the rows
    # are refused (``rescued``), so there is nothing to keep out
    if checks.on_host(z.device) and not bool(ok.all()):
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
    t_vf, t_uf = table.products(u * f_a, v * f_b)  # T (v f_b) and T^T (u f_a)
    ur_fc = ur * (f_a + c)
    grad_u = pa * (f_a + c) + ur * t_vf
    grad_v = pb * (f_b + c) + vr * t_uf
    grad_left = grad_right = None
    if table_grad:  # dL/dC = T * (xu @ xv) summed over queries, with xu @ xv = (ur (f_a + c))^T v + ur^T (v f_b)
        left, right = table.left, table.right
        xu1, xu2 = ur_fc.transpose(-1, -2), ur.transpose(-1, -2)  # (G, 2^a, q) each: no concatenated copy
        v_fb = v * f_b
        if table.kept is not None:
            block = torch.baddbmm(xu1 @ v, xu2, v_fb).mul_(next(iter(table))[2])
            grad_left = block @ right
            grad_right = block.transpose(-1, -2) @ left if right_grad else None
        else:
            grad_left = torch.zeros_like(left)
            grad_right = torch.zeros_like(right) if right_grad else None
            work = torch.empty_like(table.buffer)
            for g, rr, block in table:
                out = torch.matmul(xu1[g, rr], v[g], out=work[:block.shape[0], :block.shape[1]])
                block = out.baddbmm_(xu2[g, rr], v_fb[g]).mul_(block)
                grad_left[g, rr] = block @ right[g]
                if right_grad:
                    grad_right[g].baddbmm_(block.transpose(-1, -2), left[g, rr])
    return grad_u, grad_v, grad_left, grad_right


class _Contract(torch.autograd.Function):
    """Autograd wrapper of _contract_forward / _contract_backward (first derivatives only): the generic
    path, with the table factors (J and K) differentiated by autograd."""

    @staticmethod
    def forward(ctx, log_u, log_v, left, right, SA, SB):
        with numerics.no_denormals(log_u.device):
            m, logz, ok, ctx.saved = _contract_forward(log_u, log_v, left, right, SA, SB)
        ctx.mark_non_differentiable(ok)
        return m, logz, ok

    @staticmethod
    @first_order_backward("the split enumeration (method 'exact' with K, the coupled window)")
    def backward(ctx, grad_m, grad_logz, _):
        with numerics.no_denormals(grad_m.device):
            grad_u, grad_v, grad_left, grad_right = _contract_backward(
                ctx.saved, grad_m, grad_logz, ctx.needs_input_grad[2] or ctx.needs_input_grad[3])
        return grad_u, grad_v, grad_left, grad_right, None, None


def _pairwise_forward(h: Tensor, J: Tensor):
    """h (G, q, n), J (G, n, n), no autograd. Returns marginals, log Z, ok and what the backward needs.

    The table is C = SA JAB SB^T (left = SA JAB, right = SB); the half-only terms row = diag(SA JAA SA^T) / 2
    and col = diag(SB JBB SB^T) / 2 go into log u and log v."""
    n = h.shape[-1]
    if n <= ENUMERATED_SPINS and h.shape[0] * h.shape[1] << n <= numerics.CHUNK_ELEMENTS \
            and J.shape[0] << n <= numerics.BLOCK_ELEMENTS:
        return _enumerated_forward(h, J)
    a = n // 2
    SA = half_configurations(a, h.dtype, h.device)
    SB = half_configurations(n - a, h.dtype, h.device)
    left, right = SA @ J[:, :a, a:], SB.expand(J.shape[0], -1, -1)
    row = ((SA @ J[:, :a, :a]) * SA).sum(-1).mul_(0.5)  # (G, 2^a)
    col = ((SB @ J[:, a:, a:]) * SB).sum(-1).mul_(0.5)  # (G, 2^b)
    log_u = torch.baddbmm(row[:, None], h[..., :a], SA.T.expand(h.shape[0], -1, -1))
    log_v = torch.baddbmm(col[:, None], h[..., a:], SB.T.expand(h.shape[0], -1, -1))
    chunk = max(1, numerics.CHUNK_ELEMENTS // max(SA.shape[0], SB.shape[0]))
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
    p = logits.sub_(shift).clamp_(min=numerics.exp_floor(h.dtype)).exp_()
    z = p.sum(-1, keepdim=True)
    p = p.div_(z)
    logz = z.log_().add_(shift).squeeze(-1)
    ok = torch.isfinite(logz)
    if checks.on_host(h.device) and not bool(ok.all()):  # beyond the dtype: placeholders (0), no gradient
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


class Pairwise(torch.autograd.Function):
    """Marginals, log Z and ok of pairwise systems, (h (G, Q, n), J (G, n, n)) -> (G, Q, n), (G, Q), (G, Q),
    in one autograd node: the table factors, the split and (with ``plan``) the mask buckets are plain
    tensor code, differentiated by hand (first derivatives only).

    plan: None (no mask) or a ``planner.Plan``: the queries sorted by pattern (one gather), each bucket of
    patterns solved as (G * nb) systems of L spins in which the padded spins are free (gathers of h and of
    the flattened J), and scattered back; the J gradient is summed over the buckets by scatter_add_.
    """

    @staticmethod
    def forward(ctx, h, J, plan):
        with numerics.no_denormals(h.device):
            return Pairwise._forward(ctx, h, J, plan)

    @staticmethod
    @first_order_backward("method 'exact' (split enumeration)")
    def backward(ctx, grad_m, grad_logz, _):
        with numerics.no_denormals(grad_m.device):
            return Pairwise._backward(ctx, grad_m, grad_logz)

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
        for nb, L, free, flat, hidx, qidx, _ in plan.buckets:
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
        for (nb, L, _, flat, hidx, qidx, _), saved in zip(ctx.plan.buckets, ctx.saved):
            gh, gJ = _pairwise_backward(saved, gm_flat.gather(1, hidx).view(G * nb, q, L),
                                        grad_logz.gather(1, qidx).view(G * nb, q), J_grad)
            grad_h.scatter_(1, hidx, gh.reshape(G, -1))
            if J_grad:  # sum over the patterns' sub-J (index_put_ with accumulate sorts: slow)
                grad_J.scatter_add_(1, flat.expand(G, -1), gJ.reshape(G, -1))
        grad_h = grad_h.view(G, Q, n + 1)[..., :n]
        return grad_h, grad_J.view(G, n + 1, n + 1)[:, :n, :n] if J_grad else None, None


def float64_fallback(m, logz, ok, h, J, K, mask=None):
    """Recompute the rows where ok is False in float64 from h (G, Q, n), J, K (and mask (G, Q, n): absent
    spins free, log 2 each taken off log Z): all 2^n log-weights, shifted by their maximum and normalised
    (a softmax, ``numerics.float64_marginals``), so |<s>| <= 1 at any scale. Rows are batched by group and
    mask pattern."""
    G, Q, n = h.shape
    a = n // 2
    SA = half_configurations(a, torch.float64, h.device)
    SB = half_configurations(n - a, torch.float64, h.device)
    bad = (~ok).nonzero()  # (R, 2): group and query index
    keys = bad[:, :1] if mask is None else torch.cat([bad[:, :1], mask[bad[:, 0], bad[:, 1]].long()], dim=1)
    systems, which = torch.unique(keys, dim=0, return_inverse=True)
    index, new_m, new_logz = [], [], []
    for s, key in enumerate(systems):
        g, rows = int(key[0]), bad[which == s]
        present = key[1:].double() if mask is not None else h.new_ones(n, dtype=torch.float64)
        J_g = J[g:g + 1].double() * present[:, None] * present[None, :] if J is not None else None
        K_g = (K[g:g + 1].double() * present[:, None, None] * present[None, :, None] * present[None, None, :]
               if K is not None else None)
        left, right = table_factors(J_g, K_g, a, SA, SB) if J_g is not None or K_g is not None else (None, None)
        table = left @ right.transpose(-1, -2) if left is not None else 0.0  # (1, 2^a, 2^b)
        for chunk in rows[:, 1].split(max(1, numerics.CHUNK_ELEMENTS // (SA.shape[0] * SB.shape[0]))):
            x = h[g, chunk].double() * present
            chunk_m, chunk_logz = numerics.float64_marginals(x[:, :a] @ SA.T, table, x[:, a:] @ SB.T, SA, SB)
            check_resolution(chunk_m, x, J_g, K_g, table, SA, SB, present)
            new_m.append(chunk_m * present)
            new_logz.append(chunk_logz - (n - present.sum()) * math.log(2.0))
            index.append(g * Q + chunk)
    index = torch.cat(index)
    m = m.reshape(G * Q, n).index_put((index,), torch.cat(new_m).to(m.dtype)).reshape(G, Q, n)
    logz = logz.reshape(G * Q).index_put((index,), torch.cat(new_logz).to(logz.dtype)).reshape(G, Q)
    return m, logz


# The energy-range check: float64 log-weights are rounded by at most about (2n + 4) eps |E| (the GEMMs that
# build them from h, J and K). Where that can move a marginal by more than RESOLUTION_TOLERANCE, the states
# that carry the distribution are re-evaluated exactly (math.fsum of their energy differences) and, if the
# computed marginals differ from the exact ones by more than the tolerance, a ValueError names the limit.
RESOLUTION_TOLERANCE = 1e-6  # largest error in a marginal accepted from the rounding of the energies
RESOLUTION_STATES = 4096     # most states per query re-evaluated exactly; beyond, the query is refused
_NEGLIGIBLE_GAP = 60.0       # states this far below the largest log-weight carry < 2^24 e^-60 < 1e-18 in all


def _rounding(n: int) -> float:
    """Bound on the relative rounding of float64 log-weights of n spins (in units of the energy scale)."""
    return (2 * n + 4) * torch.finfo(torch.float64).eps


def resolved_scale(n: int) -> float:
    """The energy scale up to which float64 rounding cannot move a marginal by RESOLUTION_TOLERANCE."""
    return RESOLUTION_TOLERANCE / (8 * _rounding(max(n, 1)))


def check_resolution(m: Tensor, x: Tensor, J: Tensor | None, K: Tensor | None, table, SA: Tensor, SB: Tensor,
                     present: Tensor | None = None) -> None:
    """Raise ValueError for rows of the float64 marginals m (R, n) of x (R, n) (float64, absent spins zeroed,
    J (1, n, n) and K likewise) that are off the exact ones by more than RESOLUTION_TOLERANCE: the rows whose
    rounding bound exceeds it are checked against the exact law of their near states. ``table``: the coupling
    table's logarithm (1, 2^a, 2^b) or 0.0, as passed to ``numerics.float64_marginals``; present (n,): the
    spins whose marginals count (absent spins are free, their marginals are set to 0 by the caller)."""
    n = x.shape[-1]
    scale = x.detach().abs().sum(-1)
    if J is not None:
        scale = scale + J.detach().abs().sum() / 2
    if K is not None:
        scale = scale + K.detach().abs().sum() / 6
    delta = _rounding(n) * scale  # (R,): bound on each log-weight's rounding
    rows = (delta > RESOLUTION_TOLERANCE / 8).nonzero().squeeze(-1).tolist()
    if not rows:
        return
    a, cols = SA.shape[1], SB.shape[0]

    def spins(index: Tensor) -> Tensor:  # state index x * 2^b + y, as in the flattened log-weights
        return torch.cat([SA[index // cols], SB[index % cols]], dim=-1)

    x, table = x.detach(), table.detach() if isinstance(table, Tensor) else table
    pairs = torch.triu_indices(n, n, 1, device=x.device)
    triples = torch.combinations(torch.arange(n, device=x.device), 3) if K is not None and n >= 3 else None
    for r in rows:
        t = ((x[r, :a] @ SA.T)[:, None] + table + (x[r, a:] @ SB.T)[None, :]).reshape(-1)
        top = int(t.argmax())
        near = (t >= t[top] - 2 * float(delta[r]) - _NEGLIGIBLE_GAP).nonzero().squeeze(-1)
        if len(near) > RESOLUTION_STATES:
            _unresolved(n, float(scale[r]), f"{len(near)} states lie within the rounding of the largest weight")
        states, best = spins(near), spins(torch.tensor([top], device=x.device))[0]
        # every energy term of each near state minus the same term of the top state: exact in float64
        terms = [x[r] * (states - best)]
        if J is not None:
            pair = states[:, pairs[0]] * states[:, pairs[1]] - best[pairs[0]] * best[pairs[1]]
            terms.append(J[0, pairs[0], pairs[1]] * pair)
        if triples is not None:
            prod = states[:, triples].prod(-1) - best[triples].prod(-1)
            terms.append(K[0, triples[:, 0], triples[:, 1], triples[:, 2]] * prod)
        exact_gap = torch.tensor([math.fsum(row) for row in torch.cat(terms, dim=-1).tolist()], dtype=torch.float64)
        true = torch.softmax(exact_gap, 0) @ states.cpu()
        error = (m[r].detach().cpu() - true).abs()
        error = float((error if present is None else error * present.cpu()).max())
        if error > RESOLUTION_TOLERANCE:
            _unresolved(n, float(scale[r]), f"the rounded energies move a marginal by {error:.2g}")


def _unresolved(n: int, scale: float, why: str):
    raise ValueError(
        f"the energies of this system cannot be resolved in float64: their scale (sum |h| + sum |J| + sum |K| = "
        f"{scale:.3g}) times float64's rounding ({_rounding(n):.2g} for n = {n}) swamps the energy differences "
        f"that decide the marginals ({why}; tolerance {RESOLUTION_TOLERANCE:g}). Rescale the fields and "
        f"couplings so that the differences that matter are not below about 1e-9 of the largest energies (e.g. "
        f"no couplings of 1e17 next to O(1) fields); method 'reference' rounds the same energies and cannot "
        f"resolve them either.")
