"""The machinery of the exact solvers' opaque operators for ``torch.compile`` (the operators live beside their
solvers: ``exact.exact_marginals``, ``window.window_marginals`` and their ``_kept`` and ``_backward`` variants).

Method ``exact`` and the coupled window decide at run time what to compute from the data: the mask patterns of
a query batch (the planner), which rows need the float64 rescue (Z underflowed, or a lower-precision row's
energy scale is too large), whether values are finite. Traced by dynamo, each of these is a graph break; made
static, the rescue would have to run for every row or not at all. So while ``torch.compile`` traces
(``torch.compiler.is_compiling()``), :func:`boltzmann_attention.ising.marginals` with method 'exact' and the
coupled window's marginals call those operators instead: to the compiler each is one node with a known
output shape (``register_fake``), and at run time it runs the eager solver unchanged, with its input checks,
its planning and its float64 fallback. Compiled and eager results are the same numbers.

Backward. Where a gradient is wanted (grad mode on and an input that requires grad, decided when the graph is
traced), the forward operator is the ``_kept`` variant: it solves with autograd recording, as eager does, and
keeps that graph (the enumeration the analytic backward reads) in ``_KEPT`` under a key that it returns as an
int64 token; the backward operator takes the token and differentiates the kept graph, so a compiled training
step solves each system once, as eager. The entry leaves ``_KEPT`` when the backward takes it or when the token
is freed (the step's graph dropped without a backward), so nothing accumulates. Without a kept graph (a second
backward through a retained graph, a token the compiler copied) the backward recomputes the forward and
differentiates that: the same numbers, one more solve. Eager code never goes through these operators.
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch import Tensor


def none_if_empty(x: Tensor | None, present: bool) -> Tensor | None:
    return x if present else None


def _autograd_back_on():
    """A context in which autograd records again inside an operator's implementation.

    The dispatcher runs a custom operator's implementation with the autograd keys in the thread's excluded set
    (below autograd); the backward operators here recompute the forward and differentiate it, so they take the
    autograd keys out of that set for the duration (torch's own ``_ForceDispatchKeyGuard``; the rest of the
    set, autocast included, stays excluded)."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for name in ("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor"):
        if hasattr(torch._C.DispatchKey, name):
            excluded = excluded.remove(getattr(torch._C.DispatchKey, name))
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded)


def _record(fn, tensors: list[Tensor | None]) -> tuple[list[Tensor | None], Tensor]:
    """fn of detached copies of the tensors with autograd recording: (those leaves, the output)."""
    with _autograd_back_on(), torch.enable_grad():
        leaves = [None if x is None else x.detach().requires_grad_() for x in tensors]
        return leaves, fn(*leaves)


_KEPT: dict[int, tuple[list[Tensor | None], Tensor]] = {}  # token -> (leaves, output) of a kept forward
_TOKENS = itertools.count()


def keep(fn, tensors: list[Tensor | None]) -> tuple[Tensor, Tensor]:
    """(fn's output, the token of its kept graph): the forward of a ``_kept`` operator."""
    leaves, out = _record(fn, tensors)
    key = next(_TOKENS)
    token = torch.full((), key, dtype=torch.int64)
    _KEPT[key] = (leaves, out)
    weakref.finalize(token, _KEPT.pop, key, None)  # a token freed without a backward takes its graph along
    return out.detach().contiguous(), token


def grads(fn, tensors: list[Tensor | None], grad: Tensor, token: Tensor | None = None) -> list[Tensor]:
    """d<grad, fn(*tensors)>/d tensor for each tensor given (an empty tensor for each None): through the graph
    kept under ``token`` when there is one, else by recomputing fn."""
    kept = _KEPT.pop(int(token), None) if token is not None else None
    leaves, out = kept if kept is not None else _record(fn, tensors)
    with _autograd_back_on(), torch.enable_grad():
        wanted = [x for x in leaves if x is not None]
        found = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
    result = []
    for x in tensors:
        if x is None:
            result.append(grad.new_empty(0))
        else:
            g = next(found)
            result.append(torch.zeros(x.shape, dtype=x.dtype, device=x.device) if g is None else g.contiguous())
    return result


def wants_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def token_like() -> Tensor:
    return torch.empty((), dtype=torch.int64)
