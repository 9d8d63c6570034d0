"""Boltzmann attention with a coupled window, exact at any length.

For query i (causal: keys j <= i), slot a = 0..W-1 holds key i - a, and one slot-indexed J (W, W) per
head couples the keys in the window; every earlier key is an independent spin:

    E_i(s) = - sum_{j <= i} h_ij s_j - sum_{a<b<W} J_ab s_{i-a} s_{i-b},
    a_ij = (<s_j>_i + 1) / 2:   sigmoid(2 h_ij) for j <= i - W,   window marginals for i - W < j <= i.

With W >= the sequence length this is the paper's model with J_pos[j, k] = J[i - j, i - k] for query i;
with J = 0 it is sigmoid attention. The window marginals come from :mod:`boltzmann_attention.ising.window`
(one split-enumeration table per head for all queries). Absent keys (mask False, or before the start of
the sequence for the first W - 1 queries) are removed from every term and get weight 0.

The output is (sigmoid(2h) masked to j <= i - W) @ v plus the band sum_a a_{i,i-a} v_{i-a}; the dense
(B, H, L, S) weights are only assembled when asked for. The definition by enumeration is
``naive.naive_boltzmann_attention(..., coupling_window=W)``, which this is tested against; the design is in
docs/design.md, "Coupled window".
"""

from __future__ import annotations

import contextlib
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .couplings import WindowCouplings
from .ising import window as window_ising
from .ising._inputs import check_int

__all__ = ["WindowCouplings", "band_index", "band_scores", "band_times_value", "slot_field", "window_attention"]


def band_index(L: int, S: int, window: int, device=None, offset: int = 0) -> tuple[Tensor, Tensor]:
    """Key index i - a of slot a for query row r at position i = r + offset, clamped into [0, S) (L, W), and
    whether it is a key (L, W). offset 0: SDPA's top-left causal alignment; S - L: bottom-right."""
    index = torch.arange(L, device=device)[:, None] + offset - torch.arange(window, device=device)[None, :]
    return index.clamp(0, max(S - 1, 0)), (index >= 0) & (index < S)


def slot_field(couplings: Tensor, L: int, S: int, offset: int = 0) -> Tensor:
    """The part of the window couplings that acts as a fixed field per slot: (H, L, S), at window key j = i - a
    of query row r (position i = r + offset) -R_a = -sum_b J_ab over the slots b whose key exists (i - b >= 0),
    0 elsewhere.

    With n = (1 + s) / 2 ("key attended"), the log-odds that window key i - a is attended, given the others,
    is 2 (h_a - R_a) + 4 sum_b J_ab n_b: a per-slot field, which a learned relative-position bias can also
    give, and the co-attention term, which acts only through keys that are attended. Dropping the latter
    leaves the field-only approximation a = sigmoid(2 (h + slot_field)).
    """
    H, W = couplings.shape[0], couplings.shape[-1]
    index, valid = band_index(L, S, W, couplings.device, offset)                 # (L, W): key of slot a, exists
    with _without_autocast(couplings.device.type):  # in the couplings' dtype, which the scatter below writes
        R = torch.einsum("hab,lb->hla", couplings, valid.to(couplings.dtype))   # (H, L, W): R_a over present b
    out = couplings.new_zeros(H, L, S)  # scatter_add: absent slots (clamped onto key 0) add 0
    return out.scatter_add(-1, index.expand(H, L, W), -R * valid)


def _without_autocast(device: str):
    """A context without autocast on ``device`` (a no-op where autocast is off or unavailable)."""
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


def _cached(fn, *args):
    """fn(*args) from its lru_cache in eager; computed afresh while torch.compile traces (constants there)."""
    return fn.__wrapped__(*args) if torch.compiler.is_compiling() else fn(*args)


@lru_cache(maxsize=16)
def _columns(L: int, S: int, window: int, device, offset: int = 0) -> tuple[Tensor, Tensor]:
    """band_index in column order t = W - 1 - a (column t of row r is key r + offset - W + 1 + t), as used
    inside."""
    index, valid = band_index(L, S, window, device, offset)
    return index.flip(-1), valid.flip(-1)


def window_attention(field: Tensor, value: Tensor, couplings: Tensor, window: int, mask: Tensor | None, *,
                     scores: tuple | None = None, return_weights: bool = False,
                     max_spins: int = window_ising.MAX_SPINS, offset: int = 0, check_couplings: bool = True,
                     window_path: str = "auto"):
    """Causal coupled-window attention.

    field: (B', H', L, S) fields, B' and H' broadcasting against value's; value: (B, H, S, Ev); couplings:
    (H or 1, W, W) slot-indexed, symmetric, zero diagonal; mask: bool broadcastable to (B, H, L, S), True
    where the key takes part, or None (the causal mask is structural: slot a of query row r is key
    r + offset - a, and the independent part is j <= r + offset - W). offset: 0 for SDPA's top-left causal
    alignment, S - L for the bottom-right one (queries that end at the last key: decoding with a cache).
    scores: (query, key, scale, bias) with field = scale q.k + bias, to compute the band of the field from q
    and k (cheaper in the backward); else it is gathered from ``field``. Returns out (B, H, L, Ev) and the
    weights (B, H, L, S) if asked (else None). Empty batches, queries or keys give empty (or zero) results.
    check_couplings=False skips the checks of the couplings' values (finite, symmetric, zero diagonal), for
    callers that made them (the module) or checked them (the functional form); shapes are checked always.
    window_path: the window marginals' path, 'split' or 'configurations' (:mod:`boltzmann_attention.ising.window`),
    or 'auto': ``window_ising.choose_path(W, device)``, the documented rule.
    """
    window = check_int("coupling_window", window, 1)  # any integral type (numpy, ...), as every size
    compiling = couplings.device.type == "meta" or torch.compiler.is_compiling()
    window_ising.check_window(couplings if check_couplings and not compiling else None, window, max_spins)
    if couplings.dim() != 3 or couplings.shape[-2:] != (window, window):
        raise ValueError(f"window couplings must have shape (H, {window}, {window}), got {tuple(couplings.shape)}")
    if couplings.dtype != field.dtype:
        raise ValueError(f"window couplings must have the field's dtype {field.dtype}, got {couplings.dtype}")
    L, S = field.shape[-2:]
    H = torch.broadcast_shapes(field.shape[:-2], value.shape[:-2])[-1]
    if couplings.shape[0] not in (1, H):
        raise ValueError(f"window couplings must have shape (H, {window}, {window}) with H = 1 or {H} heads, got "
                         f"{tuple(couplings.shape)}")
    if L == 0 or S == 0 or field.numel() == 0 or value.numel() == 0:  # nothing to solve: zeros, still in the graph
        a_out = torch.sigmoid(2 * field) * 0 + couplings.sum() * 0
        out = a_out @ value
        return out, (a_out.expand(*out.shape[:-1], S) if return_weights else None)
    # the band in column order t = W - 1 - a, so that no (L, W) tensor needs flipping; J is flipped instead
    index, present = _cached(_columns, L, S, window, field.device, offset)
    if scores is None:
        h_band = field.gather(-1, index.expand(*field.shape[:-2], L, window))
    else:
        query, key, scale, bias = scores
        h_band = _band_scores(query, key, window, offset=offset) * scale
        if isinstance(bias, Tensor) and bias.dim() >= 1 and bias.shape[-1] != 1:  # a bias per key: its band
            bias = bias.reshape((1,) * (2 - min(bias.dim(), 2)) + tuple(bias.shape))
            bias = bias.expand(*bias.shape[:-2], L, S).gather(-1, index.expand(*bias.shape[:-2], L, window))
        h_band = h_band + bias
    if mask is not None:
        present = present & mask.expand(*mask.shape[:-2], L, S).gather(-1, index.expand(*mask.shape[:-2], L, window))
    J = couplings.flip(-1, -2)[:, None]
    path = window_ising.check_path(window_path)
    path = window_ising.choose_path(window, field.device) if path == "auto" else path
    compiled = window_ising.window_solve if torch.compiler.is_compiling() else window_ising.marginals  # opaque.py

    def solve(h, J, present, key=None):
        return compiled(h, J, present, key, path)

    partial = min(L, max(0, window - 1 - offset))  # the first rows have slots before key 0: absent
    if mask is None and partial < L and L + offset <= S:  # the other rows' windows are full: unmasked
        full = solve(h_band[..., partial:, :], J, None)
        key = f"window slots present: L={L} S={S} W={window} offset={offset} rows={partial}"  # from shapes alone
        m_band = full if partial == 0 else torch.cat([solve(h_band[..., :partial, :], J, present[:partial], key),
                                                      full], dim=-2)
    else:
        m_band = solve(h_band, J, present)  # (B*, H*, L, W), 0 where absent
    a_band = (m_band + present) * 0.5

    # before the window: independent spins, sigmoid(2h), on keys j <= i - W
    if mask is None:
        not_before = _cached(_not_before_window, L, S, window, field.device, offset)
    else:
        not_before = ~(mask & _cached(_before_window, L, S, window, field.device, offset))
    a_out = torch.sigmoid(2 * field).masked_fill(not_before, 0.0)
    out = a_out @ value + _band_times_value(a_band, value, offset=offset)
    if not return_weights:
        return out, None
    # scatter the band into a (..., L, L + W - 1) tensor: column r + t of row r is key r + offset - W + 1 + t
    B, H = out.shape[:2]
    column = (torch.arange(L, device=field.device)[:, None] + torch.arange(window, device=field.device))
    padded = a_band.new_zeros(B, H, L, L + window - 1).scatter(-1, column.expand(B, H, L, window),
                                                                 a_band.expand(B, H, L, window))
    weights = a_out.expand(B, H, L, S) + F.pad(padded, (offset - window + 1, S - L - offset))  # key j: column
    return out, weights                                                                       # j - offset + W - 1


@lru_cache(maxsize=16)
def _before_window(L: int, S: int, window: int, device, offset: int = 0) -> Tensor:
    """(L, S) bool, True for the keys j <= i - W of query row r at position i = r + offset (before its window)."""
    return torch.ones(L, S, dtype=torch.bool, device=device).tril(offset - window)


@lru_cache(maxsize=16)
def _not_before_window(L: int, S: int, window: int, device, offset: int = 0) -> Tensor:
    return ~_before_window.__wrapped__(L, S, window, device, offset)


def _keys_from(x: Tensor, window: int, offset: int, rows: int) -> Tensor:
    """x (..., S, E) re-indexed so that row t is key t + offset - W + 1 (zero rows outside 0..S-1), ``rows`` rows."""
    front = window - 1 - offset
    x = F.pad(x, (0, 0, front, 0)) if front >= 0 else x[..., -front:, :]
    return F.pad(x, (0, 0, 0, max(0, rows - x.shape[-2])))[..., :rows, :]


def _overlapping_blocks(x: Tensor, step: int, size: int, blocks: int) -> Tensor:
    """Rows b * step .. b * step + size - 1 of x (..., N, E) for each block b < blocks: (..., blocks, size, E).

    Stacked slices rather than ``Tensor.unfold``: torch.compile's CPU code for unfold's backward can write out of
    bounds on AVX2 machines, while a slice's backward is a plain pad."""
    return torch.stack([x[..., b * step:b * step + size, :] for b in range(blocks)], dim=-3)


def band_times_value(a_band: Tensor, value: Tensor, block: int = 64) -> Tensor:
    """sum_a a_band[..., i, a] value[..., i - a, :] (keys before 0 or past S count as 0): (..., L, Ev).

    a_band: (..., L, W) in slot order; value: (..., S, Ev). By blocks of P queries: the band of a block is
    skewed into a dense (P, P + W - 1) matrix (D[r, r + t] = a_band[r, W - 1 - t], by padding and
    re-viewing) times the P + W - 1 value rows it touches: one batched GEMM, not a gather of (L, W, Ev).
    """
    return _band_times_value(a_band.flip(-1), value, block)


def _band_times_value(a_band: Tensor, value: Tensor, block: int = 64, offset: int = 0) -> Tensor:
    """band_times_value with the band in column order t = W - 1 - a, for query row r at position r + offset."""
    L, W = a_band.shape[-2:]
    P = min(block, L)
    blocks = -(-L // P)
    A = F.pad(a_band, (0, 0, 0, blocks * P - L)).unflatten(-2, (blocks, P))               # (..., n, P, W)
    D = F.pad(A, (0, P)).flatten(-2)[..., :P * (P + W - 1)].unflatten(-1, (P, P + W - 1))  # skew
    v = _keys_from(value, W, offset, blocks * P + W - 1)     # row t: key t + offset - W + 1
    v = _overlapping_blocks(v, P, P + W - 1, blocks)         # (..., n, P + W - 1, Ev)
    return (D @ v).flatten(-3, -2)[..., :L, :]


def band_scores(query: Tensor, key: Tensor, window: int, block: int = 64) -> Tensor:
    """q_i.k_{i-a} for slot a of query i (0 where i - a is not a key): (..., L, W) from (..., L, E), (..., S, E).

    By blocks of P queries: one (P, E) x (E, P + W - 1) GEMM with the keys the block touches, then the
    band is read off the skewed product (A[r, t] = D[r, r + t], by padding and re-viewing).
    """
    return _band_scores(query, key, window, block).flip(-1)


def _band_scores(query: Tensor, key: Tensor, window: int, block: int = 64, offset: int = 0) -> Tensor:
    """band_scores in column order t = W - 1 - a, for query row r at position r + offset."""
    L, W = query.shape[-2], window
    P = min(block, L)
    blocks = -(-L // P)
    q = F.pad(query, (0, 0, 0, blocks * P - L)).unflatten(-2, (blocks, P))             # (..., n, P, E)
    k = _keys_from(key, W, offset, blocks * P + W - 1)                                   # row t: key t + offset - W + 1
    k = _overlapping_blocks(k, P, P + W - 1, blocks).transpose(-1, -2)                  # (..., n, E, P + W - 1)
    D = q @ k                                                                           # (..., n, P, P + W - 1)
    A = F.pad(D.flatten(-2), (0, P)).unflatten(-1, (P, P + W))[..., :W]                 # un-skew: A[r, t]
    return A.flatten(-3, -2)[..., :L, :]
