"""The guard on the package's hand-written backward passes: first derivatives only, never a silent zero.

The custom autograd Functions (split enumeration, the transfer matrix, the implicit mean-field gradients,
the sampled estimators) compute their backward from saved forward quantities, outside autograd. Their
gradient is therefore not differentiable again. ``torch.autograd.function.once_differentiable`` only
raises when the incoming gradient itself requires grad, so a loss on a first derivative that is linear in
the output (a gradient penalty on ``grad(out.sum(), q, create_graph=True)``) would silently get zero from
these nodes. Inside a Function's backward, ``torch.is_grad_enabled()`` is True exactly when the caller
builds a graph of the backward (``create_graph=True``): :func:`first_order_backward` raises then. It also
runs the backward without autocast, in the dtypes its forward saved (a backward called inside a
``torch.autocast`` block would otherwise compute in the autocast dtype and mix it with those).
"""

from __future__ import annotations

import contextlib
import functools

import torch

SECOND_ORDER_ALTERNATIVES = (
    "For second derivatives use method='reference' (plain autograd through all 2^n states, n <= 20) or "
    "mode 'h' (sigmoid attention, closed form), or take the first derivatives without create_graph=True.")


def first_order_backward(method: str):
    """Decorate a custom Function's ``backward``: raise a RuntimeError naming ``method`` and the
    alternatives when a graph of the backward is being built, else run it without building one."""

    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            if torch.is_grad_enabled():
                raise RuntimeError(
                    f"{method} has a hand-written backward that gives first derivatives only, and a graph of "
                    f"the backward is being built (create_graph=True, e.g. a gradient penalty or a "
                    f"Hessian-vector product): its second derivatives would be wrong (zero). "
                    f"{SECOND_ORDER_ALTERNATIVES}")
            with torch.no_grad(), _without_autocast(grads):
                return backward(ctx, *grads)

        return wrapper

    return decorate


def _without_autocast(grads):
    """A context with autocast off on the device of the gradients (a no-op where it is off already)."""
    device = next((g.device.type for g in grads if isinstance(g, torch.Tensor)), "cpu")
    if device in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()
