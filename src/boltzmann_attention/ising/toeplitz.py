"""Mean field and TAP with Toeplitz (relative) couplings, J applied as the banded operator it is.

A structured J (:class:`Toeplitz`): J_jk = f(|j - k|) for 1 <= |j - k| <= w and 0 beyond, described by
its profile f of shape (..., w), profile[..., d - 1] = f(d); the batch dims broadcast against h's batch
dims (one profile per head: (H, 1, w) against h (B, H, L, n)). The dense (n, n) matrix is never built:

    (J m)_j = sum_{d=1..w} f(d) (m_{j-d} + m_{j+d}),

computed in blocks of P spins: each block is one GEMM of its P + 2w neighbouring m with one (P + 2w, P)
band matrix, the same for every block (Toeplitz) and every query of a group: n (P + 2w) multiply-adds per
query instead of n^2.

Equations and solvers as :mod:`boltzmann_attention.ising.meanfield` (same options, same warnings):

    naive: m = tanh(h + J m),     TAP: m = tanh(h + J m - m (J∘J)(1 - m^2)),

a fixed point (damped or Anderson-accelerated iteration) started at tanh(h), stopped when max |F(m) - m|
< tol for every query; absent spins (mask False) are 0 and in nobody's field. Gradients are implicit
(never by unrolling): with D = 1 - F^2 at the fixed point and A = dF/dm, the backward solves
lambda = g + A^T lambda by the same solver, A^T v = J(D v) for naive and
J(D v) - (J∘J)(1 - m^2) ∘ D v + 2 m ∘ (J∘J)(m ∘ D v) for TAP (J symmetric), then dL/dh = D lambda
and dL/df by autograd through one application of the field at the fixed point. :func:`solve` reports
the iterations and the largest residual, forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ._autograd import first_order_backward
from ._inputs import check_inputs, check_int, group_queries
from .meanfield import _adjoint, _report, forward_iteration
from .meanfield import _Settings as MeanFieldSettings
from .meanfield import _settings as meanfield_settings

__all__ = ["Toeplitz", "ToeplitzInfo", "solve", "marginals"]

_ON_FAIL = ("warn", "raise", "ignore")
BLOCK = 64


@dataclass(frozen=True)
class Toeplitz:
    """J_jk = profile[..., |j - k| - 1] for 1 <= |j - k| <= w = profile.shape[-1], 0 beyond (w = 0: J = 0)."""

    profile: Tensor

    def __post_init__(self):
        p = self.profile
        if not isinstance(p, Tensor) or not p.is_floating_point() or p.dim() < 1:
            raise ValueError("Toeplitz couplings need a floating-point profile of shape (..., w), w >= 0: "
                             "profile[..., d - 1] = J_jk for |j - k| = d (w = 0: no couplings)")
        if not torch.isfinite(p).all():
            raise ValueError("the Toeplitz profile contains NaN or inf")

    @property
    def bandwidth(self) -> int:
        return self.profile.shape[-1]

    def dense(self, n: int) -> Tensor:
        """The (..., n, n) matrix (for tests and the exact methods)."""
        w = self.bandwidth
        table = F.pad(self.profile, (1, 1))  # index: distance, clamped past the band
        position = torch.arange(n, device=self.profile.device)
        distance = (position[:, None] - position[None, :]).abs().clamp(max=w + 1)
        return table[..., distance]


@dataclass
class ToeplitzInfo:
    """iterations / max_residual of the forward iteration and converged per query (batch shape);
    backward_iterations / backward_max_residual once a backward pass has run (else None)."""

    iterations: int
    max_residual: float
    converged: Tensor
    _extra: dict = field(default_factory=dict, repr=False)

    @property
    def backward_iterations(self) -> int | None:
        return self._extra.get("backward_iterations")

    @property
    def backward_max_residual(self) -> float | None:
        return self._extra.get("backward_residual")


@dataclass(frozen=True)
class _Settings(MeanFieldSettings):
    """The dense solver's settings plus the block size of the operator."""

    block: int


def _settings(tap, damping, tol, max_iter, on_fail, block, h=None, solver="damped", anderson_memory=5) -> _Settings:
    """The dense solver's checks (meanfield._settings), plus the block size."""
    base = meanfield_settings(tap, damping, tol, max_iter, on_fail, None, h, solver, anderson_memory)
    return _Settings(**vars(base), block=check_int("block", block, 1))


# ---------------------------------------------------------------------------------------------------
# The operator on grouped tensors: m (G, Q, n), profile (G, w)


def _blocks(profile: Tensor, P: int) -> tuple[Tensor, Tensor]:
    """The band split by blocks of P >= w spins: C (G, P, P) within a block, C[r, c] = f(|r - c|), and
    U (G, w, w) from the last w spins of a block to the first w of the next, U[r, c] = f(w + c - r) (c <= r)."""
    w = profile.shape[-1]
    table = F.pad(profile, (1, 1))  # index: distance, clamped past the band
    i = torch.arange(P, device=profile.device)
    C = table[:, (i[:, None] - i[None, :]).abs().clamp(max=w + 1)]
    r, c = torch.arange(w, device=profile.device)[:, None], torch.arange(w, device=profile.device)[None, :]
    U = table[:, torch.where(c <= r, w + c - r, w + 1)]
    return C, U


def _apply(C: Tensor, U: Tensor, m: Tensor, add: Tensor | None = None) -> Tensor:
    """add + J m along the last axis, m (G, Q, N) with N a multiple of the block size P = C.shape[-1].

    One GEMM of every block with C, plus the couplings across block boundaries (w spins each side).
    """
    G, Q, N = m.shape
    P, w = C.shape[-1], U.shape[-1]
    blocks = N // P
    flat = m.reshape(G, Q * blocks, P)
    out = torch.bmm(flat, C) if add is None else torch.baddbmm(add.reshape(G, Q * blocks, P), flat, C)
    if blocks > 1:
        m4, o4 = m.view(G, Q, blocks, P), out.view(G, Q, blocks, P)
        o4[:, :, 1:, :w] += (m4[:, :, :-1, P - w:].reshape(G, -1, w) @ U).view(G, Q, blocks - 1, w)
        o4[:, :, :-1, P - w:] += (m4[:, :, 1:, :w].reshape(G, -1, w) @ U.transpose(-1, -2)).view(G, Q, blocks - 1, w)
    return out.view(G, Q, N)


@dataclass
class _Operator:
    C: Tensor          # blocks of f
    U: Tensor
    C2: Tensor | None  # blocks of f^2 (TAP)
    U2: Tensor | None

    @staticmethod
    def build(profile: Tensor, P: int, tap: bool) -> _Operator:
        C, U = _blocks(profile, P)
        C2, U2 = _blocks(profile * profile, P) if tap else (None, None)
        return _Operator(C, U, C2, U2)

    def J(self, m: Tensor, add: Tensor | None = None) -> Tensor:
        return _apply(self.C, self.U, m, add)

    def J2(self, m: Tensor) -> Tensor:
        return _apply(self.C2, self.U2, m)

    def field(self, m: Tensor, h: Tensor | None, mask: Tensor | None) -> Tensor:
        out = self.J(m, h)
        if self.C2 is not None:  # - m (J∘J)(1 - m^2), absent spins excluded
            u = torch.addcmul(torch.ones_like(m) if mask is None else mask, m, m, value=-1.0)
            out = torch.addcmul(out, m, self.J2(u), value=-1.0)
        return out


def _iterate(h: Tensor, op: _Operator, mask: Tensor | None, s: _Settings):
    """The dense solver's iteration (``s.solver``) with the Toeplitz operator's field."""
    def step(m: Tensor) -> Tensor:
        f = op.field(m, h, mask).tanh_()
        return f if mask is None else f.mul_(mask)

    return forward_iteration(step, h, mask, s)


class _ImplicitFixedPoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, profile, mask, s, holder):
        """h, mask: (G, Q, N), N a multiple of the block size and of at least w (padded by the caller)."""
        with torch.no_grad():
            op = _Operator.build(profile, s.block, s.tap)
            m, residual, its = _iterate(h, op, mask, s)
        holder.update(iterations=its, residual=residual)
        ctx.save_for_backward(m, profile, mask)
        ctx.s, ctx.holder = s, holder
        return m

    @staticmethod
    @first_order_backward("the Toeplitz mean field/TAP (implicit gradient)")
    def backward(ctx, g):
        m, profile, mask = ctx.saved_tensors
        s = ctx.s
        op = _Operator.build(profile, s.block, s.tap)
        D = 1.0 - m * m if mask is None else (1.0 - m * m) * mask
        if s.tap:
            onsager = op.J2(1.0 - m * m if mask is None else mask - m * m)

        def vjp(v: Tensor) -> Tensor:  # A^T v (its entries at absent spins are never used: D is 0 there)
            dv = D * v
            out = op.J(dv)
            if s.tap:
                out.addcmul_(onsager, dv, value=-1.0).addcmul_(m, op.J2(m * dv), value=2.0)
            return out

        lam, residual, its = _adjoint(vjp, g, s, "Toeplitz mean-field adjoint (backward) iteration")
        ctx.holder.update(backward_iterations=its,
                          backward_residual=float(residual.max()) if residual.numel() else 0.0)
        dh = D * lam
        dprofile = None
        if ctx.needs_input_grad[1]:
            with torch.enable_grad():
                p = profile.detach().requires_grad_(True)
                fieldJ = _Operator.build(p, s.block, s.tap).field(m, None, mask)
                dprofile = torch.autograd.grad(fieldJ, p, dh)[0]
        return (dh if ctx.needs_input_grad[0] else None), dprofile, None, None, None


# ---------------------------------------------------------------------------------------------------
# Public API


def solve(h: Tensor, couplings: Toeplitz, mask: Tensor | None = None, *, tap: bool = False,
          damping: float = 0.5, tol: float = 1e-6, max_iter: int = 500, on_fail: str = "warn",
          solver: str = "damped", anderson_memory: int = 5, block: int = BLOCK) -> tuple[Tensor, ToeplitzInfo]:
    """Magnetisations m (broadcast batch shape, n) and a :class:`ToeplitzInfo`.

    h: (..., n); couplings: :class:`Toeplitz` with profile (..., w) (batch dims broadcast with h's);
    mask: (..., n) bool or None. Differentiable in h and the profile (implicit gradients).
    """
    if not isinstance(couplings, Toeplitz):
        raise ValueError(f"couplings must be a Toeplitz description, got {type(couplings).__name__}")
    check_inputs(h, None, None, mask)
    profile = couplings.profile
    if profile.dtype != h.dtype:
        raise ValueError(f"the Toeplitz profile must have h's dtype {h.dtype}, got {profile.dtype}")
    try:
        torch.broadcast_shapes(profile.shape[:-1], h.shape[:-1])
    except RuntimeError:
        raise ValueError(f"the batch shape {tuple(profile.shape[:-1])} of the Toeplitz profile does not "
                         f"broadcast with h's batch shape {tuple(h.shape[:-1])}") from None
    n = h.shape[-1]
    if profile.shape[-1] == 0:  # no couplings: one zero distance, so that the operator has a band
        profile = F.pad(profile, (0, 1))
    profile = profile[..., :max(n - 1, 1)]  # distances >= n do not occur
    w = profile.shape[-1]
    P = max(min(block, n), w)  # blocks of P spins, P >= w so that a block only couples to its neighbours
    s = _settings(tap, damping, tol, max_iter, on_fail, P, h, solver, anderson_memory)
    g = group_queries(h, profile[..., None], None, mask)  # the profile as a (..., w, 1) "J": grouped like J
    N = -(-n // P) * P  # padded with absent spins
    gh = F.pad(g.h, (0, N - n))
    fmask = None if g.mask is None and N == n else F.pad(
        g.mask.to(g.h.dtype) if g.mask is not None else torch.ones_like(g.h), (0, N - n))
    holder: dict = {}
    m = _ImplicitFixedPoint.apply(gh, g.J[..., 0], fmask, s, holder)[..., :n]
    residual = holder["residual"]
    if not bool((residual < s.tol).all()):
        failed = int((residual >= s.tol).sum()) if residual.numel() else 0
        _report(f"Toeplitz {'TAP' if tap else 'naive'} mean-field iteration", float(residual.max()),
                holder["iterations"], s, f"{failed} of {residual.numel()} queries")
    info = ToeplitzInfo(iterations=holder["iterations"],
                        max_residual=float(residual.max()) if residual.numel() else 0.0,
                        converged=g.ungroup(residual < s.tol), _extra=holder)
    return g.ungroup(m), info


def marginals(h: Tensor, couplings: Toeplitz, mask: Tensor | None = None, **options) -> Tensor:
    """Mean-field (or TAP, ``tap=True``) magnetisations; see :func:`solve`."""
    return solve(h, couplings, mask, **options)[0]


def causal_marginals(h: Tensor, couplings: Toeplitz, mask: Tensor | None = None, *, chunks: int = 4,
                     **options) -> tuple[Tensor, list[ToeplitzInfo]]:
    """:func:`solve` for attention rows under a causal mask: h (..., L, S), query i sees keys j <= i.

    The rows are cut into ``chunks`` consecutive groups; the group ending at row r only needs keys j <= r
    (the later ones are absent for all its queries, and absent spins are in nobody's field), so it is
    solved on h[..., rows, :r + 1]: about (chunks + 1) / (2 chunks) of the work. mask (broadcastable to h)
    must already exclude j > i. Returns m (..., L, S) (0 beyond each group's keys) and one info per group.
    """
    check_int("chunks", chunks, 1)
    L, S = h.shape[-2:]
    bounds = sorted({0, *(min(L, round(L * c / chunks)) for c in range(1, chunks + 1))})
    pieces, infos = [], []
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        cols = min(S, r1)
        sub_mask = None if mask is None else mask[..., r0:r1, :cols] if mask.shape[-2] != 1 else mask[..., :cols]
        m, info = solve(h[..., r0:r1, :cols], couplings, sub_mask, **options)
        pieces.append(F.pad(m, (0, S - cols)))
        infos.append(info)
    return torch.cat(pieces, dim=-2), infos

