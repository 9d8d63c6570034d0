"""Method chain's compiled CPU kernel (option ``kernel="cpp"``): ``chain_kernel.cpp``, built on first use by
``torch.utils.cpp_extension`` (it needs a C++ compiler and ninja; the build is cached in torch's extensions
folder, ``TORCH_EXTENSIONS_DIR``), and its autograd Function (first derivatives only, see ``_autograd``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ._autograd import first_order_backward

SOURCE = Path(__file__).with_name("chain_kernel.cpp")
_built = None


def module():
    """The built extension (forward, backward); RuntimeError naming the alternative when it cannot be built."""
    global _built
    if _built is None:
        from torch.utils import cpp_extension

        if not cpp_extension.is_ninja_available():
            raise RuntimeError("method 'chain' with kernel='cpp' builds a C++ extension, which needs ninja (pip "
                               "install ninja) and a C++ compiler; or use kernel='torch'")
        try:
            _built = cpp_extension.load("boltzmann_attention_chain", [str(SOURCE)], extra_cflags=["-O3"])
        except (OSError, RuntimeError) as err:
            raise RuntimeError(f"method 'chain' could not build its C++ kernel ({err}); use kernel='torch'") from err
    return _built


class ChainKernel(torch.autograd.Function):
    """(local (Q, n, 2^w), lengths (Q,)) -> (marginals (Q, n), 0 beyond each length; log Z (Q,) including the 2^w
    virtual start states), in local's dtype; the chain's messages are carried in float64."""

    @staticmethod
    def forward(ctx, local: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        local = local.detach()
        top = local.abs().amax(-1, keepdim=True)  # the weights relative to a step's largest: no overflow
        plus, minus = (local - top).exp(), (-local - top).exp()
        m, logz, a, b, za, zb = module().forward(plus, minus, top.squeeze(-1).contiguous(), lengths)
        ctx.save_for_backward(plus, minus, lengths, m, a, b, za, zb)
        ctx.dtype = local.dtype
        return m.to(local.dtype), logz.to(local.dtype)

    @staticmethod
    @first_order_backward("method 'chain' with kernel='cpp'")
    def backward(ctx, grad_m: Tensor | None, grad_logz: Tensor | None):
        plus, minus, lengths, m, a, b, za, zb = ctx.saved_tensors
        grad_m = torch.zeros_like(m) if grad_m is None else grad_m
        grad_logz = m.new_zeros(m.shape[0]) if grad_logz is None else grad_logz
        grad = module().backward(plus, minus, lengths, m, a, b, za, zb, grad_m, grad_logz)
        return grad.to(ctx.dtype), None
