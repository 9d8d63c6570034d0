"""Exact marginals of a coupled window of W spins shared by many queries.

The window model: for query i, slot a (0 <= a < W) holds key i - a, and the W slots are coupled by one
slot-indexed J (W, W) per head, shared by every query of the head. This module solves the window part:

    E_q(s) = - sum_a h_qa s_a - sum_{a<b} J_ab s_a s_b,   s in {-1, +1}^W,   over the present slots,

h (..., W), J (..., W, W) (symmetric, zero diagonal; batch dims broadcast against h's), present (..., W)
bool (False: the slot's key is absent -- before the sequence start or masked -- and is removed from every
term). Returns <s_a> (..., W), 0 at absent slots. The keys outside the window are independent spins,
<s_j> = tanh(h_ij); :mod:`boltzmann_attention.coupled_window` assembles the attention from both parts.

Split enumeration as in method ``exact`` (:mod:`boltzmann_attention.ising.split`): slots A = 0..W/2-1 and
B = W/2..W-1, Z = u^T T v with ONE coupling table T (2^(W/2) x 2^(W/2)) per head, so all queries of a head
(B * L of them) go through two GEMMs of inner size 2^(W/2): about 2 * 2^W MACs per query. Gradients: the
covariances from the same enumeration (``split.contract``), then autograd through the table factors.

Absent slots keep every query in the same two GEMMs (this is what the window adds to the shared code): an
absent slot c is clamped to s_c = +1 (the configurations with s_c = -1 get weight 0, through a -big
exponent) and J_cb is subtracted from the field of every present slot b. Then the terms of c in the table
add J_cb s_b + constants, which the field shift cancels: the law of the present slots is exactly that of
the smaller system with c deleted.

Numerics (:mod:`boltzmann_attention.ising.numerics`): u, v and T are max-shifted in the log domain; a query
whose Z still underflows (|h| or |J| in the tens to hundreds, fields fighting couplings) is recomputed in
float64 over its 2^W states. Limit: W <= ``max_spins`` (default 24; the table has 2^W entries per head).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from . import numerics, split
from ._inputs import group_queries

MAX_SPINS = 24


def check_window(J: Tensor | None, window: int, max_spins: int = MAX_SPINS) -> None:
    """Raise ValueError unless 1 <= W <= max_spins and J (unless None) is (H, W, W), symmetric, zero diagonal."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"coupling_window must be an integer >= 1, got {window!r}")
    if window > max_spins:
        raise ValueError(
            f"coupling_window {window} is too large for exact window marginals: the window is enumerated as "
            f"2^W states (a 2^W table per head, 2 * 2^W MACs per query) and is limited to W <= {max_spins} "
            f"(option max_spins). Use a smaller window, or couplings of limited range along the whole "
            f"context (coupling='relative' with method='banded', or 'meanfield'/'tap', approximate).")
    if J is None:
        return
    if not isinstance(J, Tensor) or not J.is_floating_point():
        raise ValueError("window couplings must be a floating-point tensor of shape (H, W, W)")
    if J.dim() != 3 or J.shape[-2:] != (window, window):
        raise ValueError(f"window couplings must have shape (H, {window}, {window}) for coupling_window "
                         f"{window} (slot a is key i - a), got {tuple(J.shape)}")
    if not torch.isfinite(J).all():
        raise ValueError("window couplings contain NaN or inf")
    if (J.diagonal(dim1=-2, dim2=-1) != 0).any():
        raise ValueError("window couplings must have a zero diagonal (s_a^2 = 1 makes J_aa a constant)")
    scale = float(J.detach().abs().max()) if J.numel() else 0.0
    if not torch.allclose(J, J.transpose(-1, -2), rtol=0, atol=1e-5 * max(1.0, scale)):
        raise ValueError("window couplings must be symmetric: J_ab and J_ba are the same coupling")


def marginals(h: Tensor, J: Tensor, present: Tensor | None = None) -> Tensor:
    """<s_a> of the window system, shape of the broadcast (..., W). See the module docstring."""
    g = group_queries(h, J, None, present)
    return g.ungroup(_split(g.h, g.J, g.mask))


@lru_cache(maxsize=32)
def _exclusion(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(2n, 2^n): [S^T; -big [S = -1]^T], so that [h, absent] @ it is h.S with -big where an absent spin is -1."""
    S = split.half_configurations(n, dtype, device)
    big = torch.finfo(dtype).max / (4 * max(n, 1))  # large enough for exp to give 0, small enough to stay finite
    return torch.cat([S.T, -big * (S < 0).to(dtype).T])


def _split(h: Tensor, J: Tensor, present: Tensor | None) -> Tensor:
    """h (G, Q, W), J (G, W, W), present (G, Q, W) bool or None -> marginals (G, Q, W)."""
    W = h.shape[-1]
    if W == 1:  # one spin, no coupling
        m = torch.tanh(h)
        return m if present is None else m * present
    a = W // 2
    SA = split.half_configurations(a, h.dtype, h.device)      # (2^a, a)
    SB = split.half_configurations(W - a, h.dtype, h.device)  # (2^b, b)
    left, right = split.table_factors(J, None, a, SA, SB)     # log T = left @ right^T, (G, 2^a, 2^b)
    if present is None:
        log_u, log_v = h[..., :a] @ SA.T, h[..., a:] @ SB.T  # (G, Q, 2^a), (G, Q, 2^b)
    else:  # clamp absent slots to +1 (configurations with -1 there get -big), cancel their couplings
        absent = (~present).to(h.dtype)
        h = (h - absent @ J) * present
        x = torch.cat([h[..., :a], absent[..., :a], h[..., a:], absent[..., a:]], dim=-1)
        log_u = x[..., :2 * a] @ _exclusion(a, h.dtype, h.device)
        log_v = x[..., 2 * a:] @ _exclusion(W - a, h.dtype, h.device)
    m, _, ok = split.contract(log_u, log_v, left, right, SA, SB)
    if not bool(ok.all()):  # Z underflowed for some queries: recompute them in float64 log space
        m = _float64_rows(m, ok, log_u, left, right, log_v, SA, SB)
    return m if present is None else m * present


def _float64_rows(m, ok, log_u, left, right, log_v, SA, SB):
    """The rows where ok is False recomputed by ``numerics.float64_marginals`` over all 2^W states."""
    G, Q, W = m.shape
    bad = (~ok).nonzero()  # (R, 2): group and query index
    new = []
    for rows in bad.split(max(1, numerics.CHUNK_ELEMENTS // (SA.shape[0] * SB.shape[0]))):
        g, q = rows[:, 0], rows[:, 1]
        log_table = left[g].double() @ right[g].double().transpose(-1, -2)
        new.append(numerics.float64_marginals(log_u[g, q], log_table, log_v[g, q], SA, SB, "exact window")[0])
    index = bad[:, 0] * Q + bad[:, 1]
    return m.reshape(G * Q, W).index_put((index,), torch.cat(new).to(m.dtype)).reshape(G, Q, W)
