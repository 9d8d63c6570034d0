"""The exact solvers as opaque operators for ``torch.compile``.

Method ``exact`` and the coupled window decide at run time what to compute from the data: the mask patterns of
a query batch (the planner), which rows need the float64 rescue (Z underflowed, or a lower-precision row's
energy scale is too large), whether values are finite. Traced by dynamo, each of these is a graph break; made
static, the rescue would have to run for every row or not at all. So while ``torch.compile`` traces
(``torch.compiler.is_compiling()``), :func:`boltzmann_attention.ising.marginals` with method 'exact' and the
coupled window's marginals call the operators below instead: to the compiler each is one node with a known
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

from . import exact, window
from ._inputs import batch_shape, check_inputs, empty_result, is_empty


def _none_if_empty(x: Tensor | None, present: bool) -> Tensor | None:
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


def _keep(fn, tensors: list[Tensor | None]) -> tuple[Tensor, Tensor]:
    """(fn's output, the token of its kept graph): the forward of a ``_kept`` operator."""
    leaves, out = _record(fn, tensors)
    key = next(_TOKENS)
    token = torch.full((), key, dtype=torch.int64)
    _KEPT[key] = (leaves, out)
    weakref.finalize(token, _KEPT.pop, key, None)  # a token freed without a backward takes its graph along
    return out.detach().contiguous(), token


def _grads(fn, tensors: list[Tensor | None], grad: Tensor, token: Tensor | None = None) -> list[Tensor]:
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


def _wants_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def _token_like() -> Tensor:
    return torch.empty((), dtype=torch.int64)


# --- method 'exact' ------------------------------------------------------------------------------------

def _exact_eager(h, J, K, mask, max_spins, check):
    """What ``ising.marginals(..., method='exact')`` does in eager: the input checks (unless the caller built
    the inputs and checked them itself, as the attention module does), then the solver."""
    if check:
        check_inputs(h, J, K, mask)
    if is_empty(h, J, K, mask):
        return empty_result(h, J, K, mask, marginals=True)
    return exact.marginals(h, J, K, mask, max_spins=max_spins)


@torch.library.custom_op("boltzmann_attention::exact_marginals", mutates_args=())
def exact_marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, max_spins: int,
                    check: bool) -> Tensor:
    """<s> of method 'exact' (see :mod:`boltzmann_attention.ising.exact`), computed eagerly at run time."""
    return _exact_eager(h, J, K, mask, max_spins, check).contiguous()  # the fake's layout


@exact_marginals.register_fake
def _(h, J, K, mask, max_spins, check):
    return h.new_empty(tuple(batch_shape(h, J, K, mask)) + (h.shape[-1],))


@torch.library.custom_op("boltzmann_attention::exact_marginals_kept", mutates_args=())
def exact_marginals_kept(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None,
                         max_spins: int, check: bool) -> tuple[Tensor, Tensor]:
    """``exact_marginals`` and the token of its kept graph, for the backward (module docstring)."""
    return _keep(lambda h, J, K: _exact_eager(h, J, K, mask, max_spins, check), [h, J, K])


@exact_marginals_kept.register_fake
def _(h, J, K, mask, max_spins, check):
    return h.new_empty(tuple(batch_shape(h, J, K, mask)) + (h.shape[-1],)), _token_like()


@torch.library.custom_op("boltzmann_attention::exact_marginals_backward", mutates_args=())
def exact_marginals_backward(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, grad: Tensor,
                             token: Tensor | None, max_spins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients in h, J and K (an empty tensor for an absent J or K) of <grad, <s>>: through the graph kept
    under ``token``, or by recomputation."""
    gh, gJ, gK = _grads(lambda h, J, K: _exact_eager(h, J, K, mask, max_spins, False), [h, J, K], grad, token)
    return gh, gJ, gK


@exact_marginals_backward.register_fake
def _(h, J, K, mask, grad, token, max_spins):
    return (h.new_empty(h.shape), h.new_empty(0) if J is None else J.new_empty(J.shape),
            h.new_empty(0) if K is None else K.new_empty(K.shape))


def _exact_setup(ctx, inputs, output):
    h, J, K, mask, max_spins, check = inputs
    token = output[1] if isinstance(output, tuple) else None
    ctx.save_for_backward(h, J, K, mask, token)
    ctx.max_spins, ctx.has = max_spins, (J is not None, K is not None)


def _exact_backward(ctx, grad, *token_grad):
    h, J, K, mask, token = ctx.saved_tensors
    gh, gJ, gK = exact_marginals_backward(h, J, K, mask, grad, token, ctx.max_spins)
    return gh, _none_if_empty(gJ, ctx.has[0]), _none_if_empty(gK, ctx.has[1]), None, None, None


exact_marginals.register_autograd(_exact_backward, setup_context=_exact_setup)
exact_marginals_kept.register_autograd(_exact_backward, setup_context=_exact_setup)


def exact_solve(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, max_spins: int,
                check: bool = True) -> Tensor:
    """What ``torch.compile`` traces for method 'exact': the kept variant where a gradient is wanted."""
    if _wants_grad(h, J, K):
        return exact_marginals_kept(h, J, K, mask, max_spins, check)[0]
    return exact_marginals(h, J, K, mask, max_spins, check)


# --- the coupled window ---------------------------------------------------------------------------------

def _window_eager(h, J, present):
    return window.marginals(h, J, present)


@torch.library.custom_op("boltzmann_attention::window_marginals", mutates_args=())
def window_marginals(h: Tensor, J: Tensor, present: Tensor | None) -> Tensor:
    """<s_a> of the coupled window (:func:`boltzmann_attention.ising.window.marginals`), eagerly at run time."""
    return _window_eager(h, J, present).contiguous()


def _window_fake(h, J, present):
    shapes = [h.shape[:-1], J.shape[:-2]] + ([present.shape[:-1]] if present is not None else [])
    return h.new_empty(tuple(torch.broadcast_shapes(*shapes)) + (h.shape[-1],))


window_marginals.register_fake(_window_fake)


@torch.library.custom_op("boltzmann_attention::window_marginals_kept", mutates_args=())
def window_marginals_kept(h: Tensor, J: Tensor, present: Tensor | None) -> tuple[Tensor, Tensor]:
    """``window_marginals`` and the token of its kept graph, for the backward (module docstring)."""
    return _keep(lambda h, J: _window_eager(h, J, present), [h, J])


@window_marginals_kept.register_fake
def _(h, J, present):
    return _window_fake(h, J, present), _token_like()


@torch.library.custom_op("boltzmann_attention::window_marginals_backward", mutates_args=())
def window_marginals_backward(h: Tensor, J: Tensor, present: Tensor | None, grad: Tensor,
                              token: Tensor | None) -> tuple[Tensor, Tensor]:
    gh, gJ = _grads(lambda h, J: _window_eager(h, J, present), [h, J], grad, token)
    return gh, gJ


@window_marginals_backward.register_fake
def _(h, J, present, grad, token):
    return h.new_empty(h.shape), J.new_empty(J.shape)


def _window_setup(ctx, inputs, output):
    token = output[1] if isinstance(output, tuple) else None
    ctx.save_for_backward(*inputs, token)


def _window_backward(ctx, grad, *token_grad):
    h, J, present, token = ctx.saved_tensors
    gh, gJ = window_marginals_backward(h, J, present, grad, token)
    return gh, gJ, None


window_marginals.register_autograd(_window_backward, setup_context=_window_setup)
window_marginals_kept.register_autograd(_window_backward, setup_context=_window_setup)


def window_solve(h: Tensor, J: Tensor, present: Tensor | None) -> Tensor:
    """What ``torch.compile`` traces for the coupled window's marginals: the kept variant where a gradient is
    wanted."""
    if _wants_grad(h, J):
        return window_marginals_kept(h, J, present)[0]
    return window_marginals(h, J, present)
