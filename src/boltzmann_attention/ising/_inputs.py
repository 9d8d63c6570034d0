"""Input checks and batch grouping shared by every marginal method.

Shapes: ``h`` (..., n); ``J`` (..., n, n); ``K`` (..., n, n, n); ``mask`` (..., n) bool. The batch
dimensions of J, K and mask broadcast against those of h.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor


def _check_finite(name: str, x: Tensor) -> None:
    """ValueError if x holds NaN or inf. A finite sum proves every entry finite (a NaN or inf entry makes
    the sum NaN or inf), and a sum is ~10x cheaper than isfinite on CPU; only a sum that overflowed, or a
    real NaN/inf, takes the entry-wise check."""
    if bool(torch.isfinite(x.detach().sum())):
        return
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")


def _symmetry_tolerance(x: Tensor) -> float:
    scale = float(x.detach().abs().max()) if x.numel() else 0.0
    return 1e-5 * max(1.0, scale)


def check_inputs(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None) -> None:
    """Raise ValueError for any input that would make the energy ill-defined."""
    if not isinstance(h, Tensor) or not h.is_floating_point():
        raise ValueError(f"h must be a floating-point tensor, got {type(h).__name__} "
                         f"{getattr(h, 'dtype', '')}")
    if h.dim() < 1:
        raise ValueError("h must have at least one dimension (..., n)")
    on_meta = [name for name, x in (("h", h), ("J", J), ("K", K), ("mask", mask))
               if isinstance(x, Tensor) and x.device.type == "meta"]
    if on_meta:
        raise ValueError(f"{' and '.join(on_meta)} {'is a meta tensor' if len(on_meta) == 1 else 'are meta tensors'} "
                         "(shapes without values), and marginals and log Z are computed from values: pass tensors "
                         "on a real device (BoltzmannAttention and boltzmann_attention take meta tensors: shapes "
                         "only, nothing solved)")
    n = h.shape[-1]
    _check_finite("h", h)
    batch = h.shape[:-1]
    if J is not None:
        if type(J).__name__ == "Toeplitz":  # the banded operator of relative couplings: its own entry points
            raise ValueError("J is a Toeplitz operator: solve it with ising.toeplitz.solve (mean field, tap=True "
                             "for TAP), or pass it to boltzmann_attention with method 'meanfield' or 'tap'; "
                             "the other methods take the dense J, Toeplitz.dense(n)")
        if not isinstance(J, Tensor) or J.dtype != h.dtype:
            raise ValueError(f"J must be a tensor of h's dtype {h.dtype}")
        if J.dim() < 2 or J.shape[-2:] != (n, n):
            raise ValueError(f"J must have shape (..., {n}, {n}) to match h (..., {n}), got {tuple(J.shape)}")
        _broadcast_or_raise("J", J.shape[:-2], batch)
        check_pairwise("J", J)
    if K is not None:
        if not isinstance(K, Tensor) or K.dtype != h.dtype:
            raise ValueError(f"K must be a tensor of h's dtype {h.dtype}")
        if K.dim() < 3 or K.shape[-3:] != (n, n, n):
            raise ValueError(f"K must have shape (..., {n}, {n}, {n}) to match h, got {tuple(K.shape)}")
        _broadcast_or_raise("K", K.shape[:-3], batch)
        _check_finite("K", K)
        tol = _symmetry_tolerance(K)
        for perm in ((-2, -3), (-1, -2)):
            if not torch.allclose(K, K.transpose(*perm), rtol=0, atol=tol):
                raise ValueError("K must be symmetric under every permutation of its three indices")
        idx = torch.arange(n, device=K.device)
        repeated = (idx[:, None, None] == idx[None, :, None]) | (idx[None, :, None] == idx[None, None, :])
        if (K.masked_select(repeated) != 0).any():
            raise ValueError("K must be zero where two indices coincide (only j<k<l terms exist)")
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise ValueError("mask must be a bool tensor (True means the spin exists)")
        if mask.dim() < 1 or mask.shape[-1] != n:
            raise ValueError(f"mask must have shape (..., {n}), got {tuple(mask.shape)}")
        _broadcast_or_raise("mask", mask.shape[:-1], batch)


def check_pairwise(name: str, J: Tensor) -> None:
    """ValueError naming ``name`` unless the couplings J (..., n, n) are finite, symmetric and have a zero
    diagonal (host reads: for couplings given by the caller)."""
    _check_finite(name, J)
    if (J.diagonal(dim1=-2, dim2=-1) != 0).any():
        raise ValueError(f"{name} must have a zero diagonal (s_j^2 = 1 makes J_jj a constant)")
    if not torch.allclose(J, J.transpose(-1, -2), rtol=0, atol=_symmetry_tolerance(J)):
        raise ValueError(f"{name} must be symmetric: J_jk and J_kj are the same coupling")


def check_int(name: str, value, minimum: int = 0) -> int:
    """``value`` as an int >= minimum; ValueError naming ``name`` otherwise (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_real(name: str, value, *, minimum: float | None = None, maximum: float | None = None,
               open_minimum: bool = False, open_maximum: bool = False) -> float:
    """``value`` as a finite float in the given range; ValueError naming ``name`` otherwise."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if open_minimum else value >= minimum
    if ok and maximum is not None:
        ok = value < maximum if open_maximum else value <= maximum
    if not ok:
        low = "" if minimum is None else f"{'>' if open_minimum else '>='} {minimum:g}"
        high = "" if maximum is None else f"{'<' if open_maximum else '<='} {maximum:g}"
        limits = " and ".join(x for x in (low, high) if x)
        raise ValueError(f"{name} must be a finite number{' ' + limits if limits else ''}, got {value!r}")
    return float(value)


def batch_shape(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None) -> torch.Size:
    """The broadcast batch shape of checked inputs."""
    shapes = [h.shape[:-1]] + ([J.shape[:-2]] if J is not None else []) \
        + ([K.shape[:-3]] if K is not None else []) + ([mask.shape[:-1]] if mask is not None else [])
    return torch.broadcast_shapes(*shapes)


def is_empty(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None) -> bool:
    """True when there is nothing to compute: no spins (n = 0) or an empty batch."""
    return h.shape[-1] == 0 or math.prod(batch_shape(h, J, K, mask)) == 0


def empty_result(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                 marginals: bool) -> Tensor:
    """Marginals (..., n) or log Z (...) of an empty problem: zeros (log 1 = 0 for n = 0).

    The zeros stay connected to h, J and K in autograd (with zero gradients), like a computed result.
    """
    shape = tuple(batch_shape(h, J, K, mask)) + ((h.shape[-1],) if marginals else ())
    link = sum((x * 0).sum() for x in (h, J, K) if x is not None)  # 0 even for huge finite x
    return h.new_zeros(shape) + link


def _broadcast_or_raise(name: str, shape: torch.Size, batch: torch.Size) -> None:
    try:
        torch.broadcast_shapes(shape, batch)
    except RuntimeError:
        raise ValueError(f"the batch shape {tuple(shape)} of {name} does not broadcast "
                         f"with h's batch shape {tuple(batch)}") from None


@dataclass
class Grouped:
    """Queries regrouped so that all queries of a group share J and K.

    h: (G, Q, n); J: (G, n, n) or None; K: (G, n, n, n) or None; mask: (G, Q, n) or None.
    ``ungroup`` maps a (G, Q, *rest) result back to the broadcast batch shape.
    """

    h: Tensor
    J: Tensor | None
    K: Tensor | None
    mask: Tensor | None
    batch_shape: tuple[int, ...]
    permutation: tuple[int, ...]

    def ungroup(self, x: Tensor) -> Tensor:
        rest = x.shape[2:]
        permuted = [self.batch_shape[d] for d in self.permutation]
        x = x.reshape(tuple(permuted) + tuple(rest))
        inverse = [self.permutation.index(d) for d in range(len(self.batch_shape))]
        return x.permute(tuple(inverse) + tuple(range(len(inverse), x.dim())))


def group_queries(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None) -> Grouped:
    """Put batch dims along which J or K vary first (groups), the shared ones last (queries).

    The split-enumeration and transfer-matrix methods build one table per group and reuse it for every
    query of the group, so this turns per-query work into GEMMs. No data is copied for shared couplings.
    """
    coupling_shapes = [J.shape[:-2]] if J is not None else []
    coupling_shapes += [K.shape[:-3]] if K is not None else []
    batch = torch.broadcast_shapes(h.shape[:-1], *coupling_shapes,
                                   *([mask.shape[:-1]] if mask is not None else []))
    nb = len(batch)
    coupling_batch = torch.broadcast_shapes(*coupling_shapes) if coupling_shapes else ()
    coupling_batch = (1,) * (nb - len(coupling_batch)) + tuple(coupling_batch)
    group_dims = [d for d in range(nb) if coupling_batch[d] != 1]  # incl. an empty (0) coupling batch
    query_dims = [d for d in range(nb) if coupling_batch[d] == 1]
    perm = tuple(group_dims + query_dims)
    G = math.prod([batch[d] for d in group_dims])
    Q = math.prod([batch[d] for d in query_dims])  # explicit: a -1 is ambiguous when n or the batch is 0

    def regroup(x: Tensor, event: int) -> Tensor:
        event_shape = tuple(x.shape[x.dim() - event:])
        x = x.reshape((1,) * (nb + event - x.dim()) + tuple(x.shape)).expand(*batch, *event_shape)
        x = x.permute(*perm, *range(nb, nb + event))
        return x.reshape(G, Q, *event_shape)

    def coupling(x: Tensor | None, event: int) -> Tensor | None:
        if x is None:
            return None
        event_shape = tuple(x.shape[x.dim() - event:])
        x = x.reshape((1,) * (nb + event - x.dim()) + tuple(x.shape))
        x = x.expand(*[batch[d] if d in group_dims else 1 for d in range(nb)], *event_shape)
        x = x.permute(*perm, *range(nb, nb + event))
        return x.reshape(G, *event_shape)

    return Grouped(
        h=regroup(h, 1),
        J=coupling(J, 2),
        K=coupling(K, 3),
        mask=regroup(mask, 1) if mask is not None else None,
        batch_shape=tuple(batch),
        permutation=perm,
    )
