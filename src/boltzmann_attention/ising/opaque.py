"""The exact solvers as opaque operators for ``torch.compile``.

Method ``exact`` and the coupled window decide at run time what to compute from the data: the mask patterns of
a query batch (the planner), which rows need the float64 rescue (Z underflowed, or a lower-precision row's
energy scale is too large), whether values are finite. Traced by dynamo, each of these is a graph break; made
static, the rescue would have to run for every row or not at all. So while ``torch.compile`` traces
(``torch.compiler.is_compiling()``), :func:`boltzmann_attention.ising.marginals` with method 'exact' and the
coupled window's marginals call the operators below instead: to the compiler each is one node with a known
output shape (``register_fake``), and at run time it runs the eager solver unchanged, with its input checks,
its planning and its float64 fallback. Compiled and eager results are the same numbers.

Backward: one more opaque operator that recomputes the forward with autograd enabled and differentiates it
(first derivatives, as in eager), so a compiled training step solves each system twice where eager solves it
once and keeps the enumeration for the backward. Eager code never goes through these operators.
"""

from __future__ import annotations

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


def _grads(fn, tensors: list[Tensor | None], grad: Tensor) -> list[Tensor]:
    """d<grad, fn(*tensors)>/d tensor for each tensor given (an empty tensor for each None), recomputing fn."""
    with _autograd_back_on(), torch.enable_grad():
        leaves = [None if x is None else x.detach().requires_grad_() for x in tensors]
        out = fn(*leaves)
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


# --- method 'exact' ------------------------------------------------------------------------------------

def _exact_eager(h, J, K, mask, max_spins):
    """What ``ising.marginals(..., method='exact')`` does in eager: the input checks, then the solver."""
    check_inputs(h, J, K, mask)
    if is_empty(h, J, K, mask):
        return empty_result(h, J, K, mask, marginals=True)
    return exact.marginals(h, J, K, mask, max_spins=max_spins)


@torch.library.custom_op("boltzmann_attention::exact_marginals", mutates_args=())
def exact_marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, max_spins: int) -> Tensor:
    """<s> of method 'exact' (see :mod:`boltzmann_attention.ising.exact`), computed eagerly at run time."""
    return _exact_eager(h, J, K, mask, max_spins).contiguous()  # the fake's layout


@exact_marginals.register_fake
def _(h, J, K, mask, max_spins):
    return h.new_empty(tuple(batch_shape(h, J, K, mask)) + (h.shape[-1],))


@torch.library.custom_op("boltzmann_attention::exact_marginals_backward", mutates_args=())
def exact_marginals_backward(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, grad: Tensor,
                             max_spins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients in h, J and K (an empty tensor for an absent J or K) of <grad, <s>>, by recomputation."""
    gh, gJ, gK = _grads(lambda h, J, K: _exact_eager(h, J, K, mask, max_spins), [h, J, K], grad)
    return gh, gJ, gK


@exact_marginals_backward.register_fake
def _(h, J, K, mask, grad, max_spins):
    return (h.new_empty(h.shape), h.new_empty(0) if J is None else J.new_empty(J.shape),
            h.new_empty(0) if K is None else K.new_empty(K.shape))


def _exact_setup(ctx, inputs, output):
    h, J, K, mask, max_spins = inputs
    ctx.save_for_backward(h, J, K, mask)
    ctx.max_spins, ctx.has = max_spins, (J is not None, K is not None)


def _exact_backward(ctx, grad):
    h, J, K, mask = ctx.saved_tensors
    gh, gJ, gK = exact_marginals_backward(h, J, K, mask, grad, ctx.max_spins)
    return gh, _none_if_empty(gJ, ctx.has[0]), _none_if_empty(gK, ctx.has[1]), None, None


exact_marginals.register_autograd(_exact_backward, setup_context=_exact_setup)


# --- the coupled window ---------------------------------------------------------------------------------

def _window_eager(h, J, present):
    return window.marginals(h, J, present)


@torch.library.custom_op("boltzmann_attention::window_marginals", mutates_args=())
def window_marginals(h: Tensor, J: Tensor, present: Tensor | None) -> Tensor:
    """<s_a> of the coupled window (:func:`boltzmann_attention.ising.window.marginals`), eagerly at run time."""
    return _window_eager(h, J, present).contiguous()


@window_marginals.register_fake
def _(h, J, present):
    shapes = [h.shape[:-1], J.shape[:-2]] + ([present.shape[:-1]] if present is not None else [])
    return h.new_empty(tuple(torch.broadcast_shapes(*shapes)) + (h.shape[-1],))


@torch.library.custom_op("boltzmann_attention::window_marginals_backward", mutates_args=())
def window_marginals_backward(h: Tensor, J: Tensor, present: Tensor | None, grad: Tensor) -> tuple[Tensor, Tensor]:
    gh, gJ = _grads(lambda h, J: _window_eager(h, J, present), [h, J], grad)
    return gh, gJ


@window_marginals_backward.register_fake
def _(h, J, present, grad):
    return h.new_empty(h.shape), J.new_empty(J.shape)


def _window_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _window_backward(ctx, grad):
    h, J, present = ctx.saved_tensors
    gh, gJ = window_marginals_backward(h, J, present, grad)
    return gh, gJ, None


window_marginals.register_autograd(_window_backward, setup_context=_window_setup)
