"""Naive mean field and TAP: approximate marginals and log Z, with implicit gradients.

Energy convention (the package's only one)::

    E(s) = -h.s - s.J.s / 2 - K(s, s, s) / 6,   p(s) ∝ exp(-E(s)),   s in {-1, +1}^n,

with J symmetric, zero diagonal, and K fully symmetric, zero where two indices coincide.

Equations, for the magnetisations m_j ≈ <s_j>::

    naive:  m_j = tanh(h_j + sum_k J_jk m_k + 1/2 sum_kl K_jkl m_k m_l)
    TAP:    m_j = tanh(h_j + sum_k J_jk m_k - m_j sum_k J_jk^2 (1 - m_k^2))      (pairwise only)

and the variational estimates of log Z evaluated at the fixed point::

    naive:  Phi(m) = h.m + m.J.m / 2 + K(m, m, m) / 6 + sum_j H(m_j)
    TAP:    Phi(m) + 1/4 sum_jk J_jk^2 (1 - m_j^2) (1 - m_k^2)                   (Onsager term)
    H(m) = -(1+m)/2 log((1+m)/2) - (1-m)/2 log((1-m)/2).

The naive value is a lower bound on log Z for *any* m (Gibbs' variational principle with a product
distribution); the TAP value is a second-order (Plefka) expansion and is not a bound. For couplings of
size eps the marginals' error is O(eps^2) for naive and O(eps^3) for TAP.

Solvers (option ``solver``), both started at m = tanh(h) and stopped when max_j |F(m) - m| < tol for every
query (tol at least the machine epsilon of the inputs' dtype); the value returned is F(m) at the last iterate:

* ``"damped"`` (default): the fixed-point iteration m <- (1 - damping) F(m) + damping m.
* ``"anderson"``: Anderson acceleration (Walker & Ni, SIAM J. Numer. Anal. 49, 2011) with the last
  ``anderson_memory`` steps, per query: with residuals r = F(m) - m and the differences dR, dF of the
  stored steps, gamma = argmin |r - dR gamma| (a regularised m x m solve per query) and
  m <- (F(m) - dF gamma) - damping (r - dR gamma), clipped to [-1, 1]. On a linear map this is GMRES in
  disguise; it converges where the damped iteration oscillates or crawls (strong couplings), in a few
  more vector operations per step. Same fixed points (the equations are the solver's only input).

Cost O(iterations * n^2) per query (two n x n products per iteration for TAP, O(n^3) with K); all
queries sharing J go through one batched GEMM per iteration, J is never copied per query. Anderson adds
about 4 * anderson_memory * n per query and step, and keeps 2 * anderson_memory vectors per query.

Convergence is NOT guaranteed. F is a contraction when the couplings are weak (roughly
max_j sum_k |J_jk| < 1); dense strong or frustrated couplings can make the undamped iteration
oscillate (period 2 is typical for antiferromagnetic bonds) or find one of several fixed points. Damping
helps with oscillations but not with multiple fixed points. When the iteration has not converged after
``max_iter`` steps, ``on_fail`` decides: "warn" (default) issues a :class:`ConvergenceWarning` with the
residual and the iteration count and returns the last iterate, "raise" raises :class:`ConvergenceError`,
"ignore" returns the last iterate silently. ``solve`` reports the per-query outcome in its info.

Gradients (implicit, never by unrolling the loop): the iteration runs without autograd. For the
marginals, with A = dF/dm at the fixed point m*, dm*/dtheta = (I - A)^{-1} dF/dtheta, so a backward
pass with incoming gradient g solves the adjoint system lambda = g + A^T lambda (by the same solver,
on vector-Jacobian products, with the same damping / tol (relative to max|g|) / max_iter / on_fail; its
iteration matrix is the transpose of the forward one, so it converges when the forward iteration
converges linearly), then returns lambda^T dF/dtheta. For log Z, Phi is stationary in m at
the fixed point (dPhi/dm_j = field_j - atanh(m_j) = 0 is exactly the fixed-point equation), so
dPhi(m*(theta), theta)/dtheta = dPhi/dtheta at fixed m: autograd differentiates Phi with m detached
(d/dh = m, d/dJ_jk = m_j m_k / 2 plus the Onsager part). Both are exact at an exact fixed point and off
by O(tol) otherwise. Gradients in J and K are those of the symmetric forms (dJ_jk = dJ_kj), as for the
exact methods. Second derivatives raise (create_graph=True through the backward; see ``_autograd``).

Absent spins (mask False) have m_j = 0, contribute to nobody's field or Onsager term, and add nothing
(not log 2) to log Z, so a masked system equals the smaller system with those spins deleted.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from ._autograd import first_order_backward
from ._inputs import check_inputs, check_int, check_real, group_queries
from .record import Method, keyword_options, with_defaults

__all__ = ["marginals", "log_partition", "solve", "SolveInfo", "ConvergenceWarning", "ConvergenceError"]

_ON_FAIL = ("warn", "raise", "ignore")
SOLVERS = ("damped", "anderson")


class ConvergenceWarning(RuntimeWarning):
    """The mean-field (or adjoint) iteration stopped at max_iter without reaching tol."""


class ConvergenceError(RuntimeError):
    """Raised instead of ConvergenceWarning when on_fail="raise"."""


@dataclass
class SolveInfo:
    """Outcome of the forward iteration.

    iterations: number of applications of F; max_residual: max |F(m) - m| over all queries at the
    last iterate; converged: bool tensor with the broadcast batch shape, True where that query's
    residual is below tol.
    """

    iterations: int
    max_residual: float
    converged: Tensor


@dataclass(frozen=True)
class _Settings:
    tap: bool
    damping: float
    tol: float
    max_iter: int
    on_fail: str
    solver: str
    anderson_memory: int


def _settings(tap, damping, tol, max_iter, on_fail, K, h=None, solver="damped", anderson_memory=5) -> _Settings:
    """The validated options. A tol below the machine epsilon of h's dtype is raised to it (float16: 9.8e-4,
    bfloat16: 7.8e-3): no smaller residual can be resolved in that precision."""
    if not isinstance(tap, bool):
        raise ValueError(f"tap must be True or False, got {tap!r}")
    damping = check_real("damping", damping, minimum=0.0, maximum=1.0, open_maximum=True)
    tol = check_real("tol", tol, minimum=0.0, open_minimum=True)
    max_iter = check_int("max_iter", max_iter, 1)
    if not isinstance(on_fail, str) or on_fail not in _ON_FAIL:
        raise ValueError(f"on_fail must be one of {_ON_FAIL}, got {on_fail!r}")
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    anderson_memory = check_int("anderson_memory", anderson_memory, 1)
    if tap and K is not None:
        raise ValueError("tap supports pairwise couplings only (K must be None); use method 'meanfield' "
                         "for three-body couplings")
    dtype = getattr(h, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        tol = max(tol, torch.finfo(dtype).eps)
    return _Settings(tap, damping, tol, max_iter, on_fail, solver, anderson_memory)


def _report(what: str, residual: float, iterations: int, settings: _Settings, failed: str,
            relative: bool = False) -> None:
    """Warn or raise (``on_fail``) that an iteration stopped at max_iter; ``relative``: its tol was relative
    to each query's largest incoming gradient (the adjoint), so the residual is compared with that."""
    if settings.on_fail == "ignore":
        return
    tol = f"tol {settings.tol:g}" + (" times the query's largest incoming gradient" if relative else "")
    solver = f"damping {settings.damping:g}" + (", anderson" if settings.solver == "anderson" else "")
    message = (f"{what} did not converge: max residual {residual:.3g} >= {tol} after "
               f"{iterations} iterations ({failed}, {solver}); returning the last "
               f"iterate. Increase damping or max_iter, or weaken the couplings.")
    if settings.on_fail == "raise":
        raise ConvergenceError(message)
    warnings.warn(message, ConvergenceWarning, stacklevel=4)


# ---------------------------------------------------------------------------------------------------
# The fixed-point map on grouped tensors: h (G, Q, n), J (G, n, n), K (G, n, n, n), mask (G, Q, n) float


@dataclass
class _Couplings:
    J: Tensor | None  # symmetrised
    J2: Tensor | None  # J * J, for the Onsager terms (TAP only)
    K: Tensor | None  # symmetrised

    @staticmethod
    def build(J: Tensor | None, K: Tensor | None, tap: bool) -> _Couplings:
        if J is not None:
            J = 0.5 * (J + J.transpose(-1, -2))
        if K is not None:
            K = (K + K.permute(0, 1, 3, 2) + K.permute(0, 2, 1, 3) + K.permute(0, 2, 3, 1)
                 + K.permute(0, 3, 1, 2) + K.permute(0, 3, 2, 1)) / 6.0
        return _Couplings(J, J * J if (tap and J is not None) else None, K)


def _fixed_point_map(m: Tensor, h: Tensor, c: _Couplings, mask: Tensor | None) -> Tensor:
    """F(m) = tanh(local field), zero at absent spins.

    m must already be zero at absent spins (every iterate is), so they are in nobody's field; only the
    Onsager weights 1 - m_k^2 need the mask.
    """
    field = h if c.J is None else torch.baddbmm(h, m, c.J)  # (m @ J)_j = sum_k J_jk m_k, J symmetric
    if c.K is not None:
        field = field + 0.5 * torch.einsum("gjkl,gqk,gql->gqj", c.K, m, m)
    if c.J2 is not None:
        u = 1.0 - m * m if mask is None else mask - m * m
        field = field - m * torch.bmm(u, c.J2)
    f = torch.tanh(field)
    return f if mask is None else f * mask


def _max_abs(x: Tensor) -> Tensor:
    """max over the spin dimension, (G, Q, n) -> (G, Q); 0 when n = 0."""
    return x.abs().amax(-1) if x.shape[-1] else x.new_zeros(x.shape[:-1])


def _iterate(h: Tensor, c: _Couplings, mask: Tensor | None, s: _Settings):
    """The forward iteration (no autograd). Returns (F(m) at the last iterate, residual (G, Q), its)."""
    return forward_iteration(lambda m: _fixed_point_map(m, h, c, mask), h, mask, s)


def forward_iteration(step, h: Tensor, mask: Tensor | None, s):
    """The magnetisations' fixed point m = step(m) with ``s.solver``, from tanh(h) (0 at absent spins) to
    tol; shared by the dense and the Toeplitz solvers. Returns (step(m), residual, iterations)."""
    m = torch.tanh(h) if mask is None else torch.tanh(h) * mask
    return fixed_point(step, m, s, lambda r: r < s.tol, magnetisation=True)


def fixed_point(step, x: Tensor, s, done, magnetisation: bool = False) -> tuple[Tensor, Tensor, int]:
    """Iterate towards x = step(x) with ``s.solver`` from ``x`` (..., n) until ``done(residual)`` holds for
    every query, residual = max |step(x) - x| over the last axis, or after ``s.max_iter`` steps. Returns
    (step(x) at the last iterate, residual (...), steps). ``magnetisation``: the iterates are clipped to
    [-1, 1] (Anderson's extrapolation can leave the box; tanh never does)."""
    if s.solver == "anderson":
        return _anderson(step, x, s, done, magnetisation)
    iterations = 0
    while True:
        f = step(x)
        iterations += 1
        residual = _max_abs(f - x)
        if iterations == s.max_iter or bool(done(residual).all()):
            return f, residual, iterations
        x = torch.lerp(f, x, s.damping)  # (1 - damping) f + damping x


def _anderson(step, x: Tensor, s, done, clip: bool) -> tuple[Tensor, Tensor, int]:
    """Anderson acceleration (type II) with ``s.anderson_memory`` stored steps per query; see the module
    docstring. The Gram matrix of the stored residual differences is updated one row per step and solved
    in float64 with a relative Tikhonov term (its largest diagonal times the larger of 1e-10 and the inputs'
    machine epsilon, the precision of the differences it is built from), so a query without history
    (all differences 0) takes the damped step; a failed solve also falls back to it. Safeguard: a query
    whose residual grew in a step forgets its history (restart)."""
    M = s.anderson_memory
    f = step(x)
    r = f - x
    residual, iterations = _max_abs(r), 1
    lead, n = r.shape[:-1], r.shape[-1]
    dR = r.new_zeros(*lead, M, n)  # ring buffers of the last M differences of residuals and of step(x)
    dF = r.new_zeros(*lead, M, n)
    gram = torch.zeros(*lead, M, M, dtype=torch.float64, device=r.device)
    eye = torch.eye(M, dtype=torch.float64, device=r.device)
    ridge = max(1e-10, torch.finfo(r.dtype).eps)
    stored = 0
    while not (iterations == s.max_iter or bool(done(residual).all())):
        if stored:
            m = min(stored, M)
            R, Fd = dR[..., :m, :], dF[..., :m, :]
            rhs = torch.einsum("...mn,...n->...m", R, r).double().unsqueeze(-1)  # (..., m, 1)
            G = gram[..., :m, :m]
            scale = G.diagonal(dim1=-2, dim2=-1).amax(-1, keepdim=True).unsqueeze(-1)
            gamma, info = torch.linalg.solve_ex(G + (ridge * scale + 1e-300) * eye[:m, :m], rhs)
            gamma = torch.where((info == 0)[..., None, None] & gamma.isfinite(), gamma, 0.0).to(r.dtype)[..., 0]
            x = f - torch.einsum("...mn,...m->...n", Fd, gamma)  # F(x) - dF gamma
            if s.damping:
                x = x - s.damping * (r - torch.einsum("...mn,...m->...n", R, gamma))  # - damping (r - dR gamma)
        else:
            x = torch.lerp(f, x, s.damping)
        if clip:
            x = x.clamp_(-1.0, 1.0)
        f_new = step(x)
        r_new = f_new - x
        iterations += 1
        residual_new = _max_abs(r_new)
        grew = residual_new > residual  # the extrapolation did not help: forget this query's history
        if stored and bool(grew.any()):
            for buffer in (dR, dF, gram):
                buffer[grew] = 0.0
        slot = stored % M
        dR[..., slot, :] = r_new - r
        dF[..., slot, :] = f_new - f
        stored += 1
        m = min(stored, M)
        row = torch.einsum("...mn,...n->...m", dR[..., :m, :], dR[..., slot, :]).double()
        gram[..., slot, :m] = row
        gram[..., :m, slot] = row
        f, r, residual = f_new, r_new, residual_new
    return f, residual, iterations


def _adjoint(vjp, g: Tensor, s: _Settings, what: str = "mean-field adjoint (backward) iteration"
             ) -> tuple[Tensor, Tensor, int]:
    """Solve lambda = g + A^T lambda with the forward's solver; vjp(v) = A^T v. Reports a failure.
    Returns (lambda, residual (...), iterations)."""
    bound = s.tol * _max_abs(g)
    lam, residual, its = fixed_point(lambda v: g + vjp(v), g, s, lambda r: r <= bound)
    if not bool((residual <= bound).all()):
        failed = int((residual > bound).sum())
        _report(what, float(residual.max()), its, s, f"{failed} of {residual.numel()} queries", relative=True)
    return lam, residual, its


class _ImplicitFixedPoint(torch.autograd.Function):
    """Identity on the fixed point m* in the forward pass; implicit-function gradient in backward."""

    @staticmethod
    def forward(ctx, m_star, h, J, K, mask, settings):
        ctx.save_for_backward(m_star, h, J, K, mask)
        ctx.settings = settings
        return m_star.clone()

    @staticmethod
    @first_order_backward("method 'meanfield'/'tap' (implicit gradient)")
    def backward(ctx, grad):
        m_star, h, J, K, mask = ctx.saved_tensors
        s = ctx.settings
        wanted = ctx.needs_input_grad[1:4]
        with torch.enable_grad():
            z = m_star.detach().requires_grad_(True)
            params = [None if x is None else x.detach().requires_grad_(w)
                      for x, w in zip((h, J, K), wanted, strict=True)]
            f = _fixed_point_map(z, params[0], _Couplings.build(params[1], params[2], s.tap), mask)

            def vjp(v: Tensor) -> Tensor:
                out = torch.autograd.grad(f, z, v, retain_graph=True, allow_unused=True)[0]
                return torch.zeros_like(v) if out is None else out

            lam = grad if (J is None and K is None) else _adjoint(vjp, grad, s)[0]
            inputs = [p for p, w in zip(params, wanted, strict=True) if w]
            grads = iter(torch.autograd.grad(f, inputs, lam, allow_unused=True)) if inputs else iter(())
        out = [next(grads) if w else None for w in wanted]
        return (None, *out, None, None)


def _run(h, J, K, mask, s: _Settings):
    """Group queries and iterate. Returns (grouped, float mask or None, m* (G, Q, n), residual (G, Q), its)."""
    g = group_queries(h, J, K, mask)
    fmask = None if g.mask is None else g.mask.to(g.h.dtype)
    with torch.no_grad():
        c = _Couplings.build(g.J, g.K, s.tap)
        m, residual, its = _iterate(g.h, c, fmask, s)
    if not bool((residual < s.tol).all()):
        failed = int((residual >= s.tol).sum()) if residual.numel() else 0
        _report(f"{'TAP' if s.tap else 'naive'} mean-field iteration", float(residual.max()), its, s,
                f"{failed} of {residual.numel()} queries")
    return g, fmask, m, residual, its


# ---------------------------------------------------------------------------------------------------
# Public API


def solve(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, mask: Tensor | None = None, *,
          tap: bool = False, damping: float = 0.5, tol: float = 1e-6, max_iter: int = 500,
          on_fail: str = "warn", solver: str = "damped", anderson_memory: int = 5) -> tuple[Tensor, SolveInfo]:
    """Magnetisations m (broadcast batch shape, n) and a :class:`SolveInfo`. Inputs are validated.

    h: (..., n); J: (..., n, n) or None; K: (..., n, n, n) or None (naive only); mask: (..., n) bool
    or None. Batch dimensions broadcast. m is differentiable in h, J and K (implicit gradients).
    """
    check_inputs(h, J, K, mask)
    s = _settings(tap, damping, tol, max_iter, on_fail, K, h, solver, anderson_memory)
    g, fmask, m, residual, its = _run(h, J, K, mask, s)
    m = _ImplicitFixedPoint.apply(m, g.h, g.J, g.K, fmask, s)
    info = SolveInfo(iterations=its,
                     max_residual=float(residual.max()) if residual.numel() else 0.0,
                     converged=g.ungroup(residual < s.tol))
    return g.ungroup(m), info


def marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *, tap: bool = False,
              damping: float = 0.5, tol: float = 1e-6, max_iter: int = 500, on_fail: str = "warn",
              solver: str = "damped", anderson_memory: int = 5) -> Tensor:
    """Mean-field (or TAP) magnetisations, shape of the broadcast (..., n). See the module docstring."""
    s = _settings(tap, damping, tol, max_iter, on_fail, K, h, solver, anderson_memory)
    g, fmask, m, _, _ = _run(h, J, K, mask, s)
    return g.ungroup(_ImplicitFixedPoint.apply(m, g.h, g.J, g.K, fmask, s))


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *, tap: bool = False,
                  damping: float = 0.5, tol: float = 1e-6, max_iter: int = 500,
                  on_fail: str = "warn", solver: str = "damped", anderson_memory: int = 5) -> Tensor:
    """Variational log Z at the fixed point (naive: a lower bound; TAP: with the Onsager term).

    Shape: the broadcast batch shape. Differentiated with m held fixed, which is exact at a fixed point
    because the estimate is stationary in m there (see the module docstring).
    """
    s = _settings(tap, damping, tol, max_iter, on_fail, K, h, solver, anderson_memory)
    g, fmask, m, _, _ = _run(h, J, K, mask, s)  # m carries no graph
    c = _Couplings.build(g.J, g.K, s.tap)
    p, q = 0.5 * (1.0 + m), 0.5 * (1.0 - m)
    entropy = -(torch.xlogy(p, p) + torch.xlogy(q, q))
    if fmask is not None:
        entropy = entropy * fmask
    value = (g.h * m + entropy).sum(-1)
    if c.J is not None:
        value = value + 0.5 * (torch.bmm(m, c.J) * m).sum(-1)
    if c.K is not None:
        value = value + torch.einsum("gjkl,gqj,gqk,gql->gq", c.K, m, m, m) / 6.0
    if c.J2 is not None:
        u = 1.0 - m * m
        if fmask is not None:
            u = u * fmask
        value = value + 0.25 * (torch.bmm(u, c.J2) * u).sum(-1)
    return g.ungroup(value)


def _check_options(options: dict) -> None:
    o = with_defaults(marginals, options)
    _settings(o["tap"], o["damping"], o["tol"], o["max_iter"], o["on_fail"], None, solver=o["solver"],
              anderson_memory=o["anderson_memory"])


def _with_tap(fn):
    def with_tap(h, J, K, mask, **options):
        return fn(h, J, K, mask, tap=True, **options)
    return with_tap


METHODS = (
    Method("meanfield", marginals, log_partition, keyword_options(marginals), "approximate",
           "any n; may not converge (options max_iter, damping, solver, on_fail)", _check_options, three_body=True,
           toeplitz=True),
    Method("tap", _with_tap(marginals), _with_tap(log_partition), keyword_options(marginals, frozenset({"tap"})),
           "approximate", "any n, pairwise only; may not converge (options max_iter, damping, solver, on_fail)",
           lambda options: _check_options({**options, "tap": True}), toeplitz=True, toeplitz_options=(("tap", True),)),
)
