"""Numerics of the enumerating methods: denormals, exp floors, row blocks, energy bounds, the float64 rescue.

Enumeration multiplies weights exp(log-weight - max) that lie in [tiny, 1]. Three things keep that fast and
exact enough in every dtype:

- denormals are flushed on CPU while the products run (``no_denormals``: denormal arithmetic is ~40x slower
  on x86, and products below tiny are negligible next to Z >= sqrt(tiny));
- exp arguments are floored at log(tiny) + 1 (``exp_floor``: exp is ~100x slower in its underflow path);
- large tables are read in row blocks of ``BLOCK_ELEMENTS`` entries that stay in cache (``row_blocks``).

A query whose Z still underflows, or a lower-precision query whose energy scale exceeds
``FLOAT32_SCALE_LIMIT`` (where float32 rounding of the log-weights reaches 1e-3), is recomputed in float64
over all its states (``float64_marginals``): the log-weights shifted by their maximum and normalised, so
|<s>| <= 1 at any scale. Energies beyond float64's range raise a ValueError.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager

import torch
from torch import Tensor

CHUNK_ELEMENTS = 2**24  # bound on (queries x half-configurations) held at once per GEMM
BLOCK_ELEMENTS = 2**18  # table entries per block of the table's passes (1 MB in float32: stays in cache)
FLOAT32_SCALE_LIMIT = 2.0**13  # energy scale above which lower-precision rows are solved in float64


def exp_floor(dtype: torch.dtype) -> float:
    """exp of arguments below log(tiny) is ~100x slower on CPU (the underflow path): arguments are
    floored here, which changes weights below e * tiny relative to the largest one by at most that."""
    return math.log(torch.finfo(dtype).tiny) + 1.0


_SMALLEST_NORMAL = sys.float_info.min  # half of it is 0 when this thread flushes denormals (Python floats and
                                       # torch's CPU kernels share the thread's floating-point flags)


@contextmanager
def no_denormals(device: torch.device):
    """Flush denormals to zero on this CPU thread for the duration (restored after).

    The weights u, T, v lie in [tiny, 1] and their products, ignored next to Z >= sqrt(tiny), often fall
    below tiny: denormal arithmetic is ~40x slower on x86. Flushing them changes Z by < 2^n tiny.
    """
    if device.type != "cpu" or _SMALLEST_NORMAL * 0.5 == 0.0:  # not CPU, or on already (no tensor read)
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def row_blocks(G: int, rows: int, cols: int) -> list[tuple[slice, slice]]:
    """(group slice, row slice) blocks of about BLOCK_ELEMENTS covering a (G, rows, cols) table: whole groups
    together while one group's table fits a block, else one group's rows in slices; a small table is one block
    (slice(None), slice(None)) for all groups."""
    if G * rows * cols <= BLOCK_ELEMENTS:
        return [(slice(None), slice(None))]
    if rows * cols <= BLOCK_ELEMENTS:
        step = BLOCK_ELEMENTS // (rows * cols)
        return [(slice(g, min(g + step, G)), slice(None)) for g in range(0, G, step)]
    step = max(1, BLOCK_ELEMENTS // cols)
    return [(slice(g, g + 1), slice(r, min(r + step, rows))) for g in range(G) for r in range(0, rows, step)]


def energy_bound(h: Tensor, J: Tensor | None, K: Tensor | None) -> float:
    """A bound on every query's ``energy_scale`` in a few reductions (n max |h| + sum |J| / 2 + sum |K| / 6
    over all groups): the per-query scales are needed only when it exceeds the limit."""
    bound = float(h.detach().abs().amax()) * h.shape[-1] if h.numel() else 0.0
    for x, d in ((J, 2), (K, 6)):
        if x is not None:
            bound += float(x.detach().abs().sum()) / d
    return bound


def energy_scale(h: Tensor, J: Tensor | None, K: Tensor | None) -> Tensor:
    """sum |h| + sum_{j<k} |J| + sum_{j<k<l} |K| per query, (G, Q): a bound on |-E(s)|."""
    scale = h.detach().abs().sum(-1)
    if J is not None:
        scale = scale + J.detach().abs().sum((-1, -2))[:, None] / 2
    if K is not None:
        scale = scale + K.detach().abs().sum((-1, -2, -3))[:, None] / 6
    return scale


def log_2cosh(x: Tensor) -> Tensor:
    """log(2 cosh x), stable for any finite x: log Z of one free spin in a field x."""
    return x.abs() + torch.log1p(torch.exp(-2 * x.abs())) + math.log(2.0)


def float64_marginals(log_u: Tensor, table: Tensor | float, log_v: Tensor, SA: Tensor, SB: Tensor,
                      method: str = "exact") -> tuple[Tensor, Tensor]:
    """Marginals (R, a + b) and log Z (R,) of R split systems in float64, over all 2^(a+b) states.

    log_u (R, 2^a), log_v (R, 2^b) and the coupling table's logarithm (R or 1, 2^a, 2^b) (or 0.0) add up
    to the log-weights, which are shifted by their maximum and normalised (a softmax), so |<s>| <= 1 at any
    scale. Differentiable (plain autograd). ``method`` names the caller in the overflow error.
    """
    t = (log_u.double()[:, :, None] + table + log_v.double()[:, None, :]).flatten(1)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"method {method!r}: the energies overflow float64 (|E| > 1.8e308) for fields and "
                         "couplings this large; rescale h, J and K")
    p = torch.softmax(t, dim=-1).view(len(t), SA.shape[0], SB.shape[0])
    return torch.cat([p.sum(2) @ SA.double(), p.sum(1) @ SB.double()], dim=-1), torch.logsumexp(t, dim=-1)
