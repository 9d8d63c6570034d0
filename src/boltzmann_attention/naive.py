"""Boltzmann attention, defined by brute force: read this first.

For query i every present key j is a spin s_j in {-1, +1} with the field h_ij = scale * q_i.k_j + bias.
With couplings J (one symmetric, zero-diagonal matrix per head) and optional three-body couplings K,

    E_i(s) = - sum_j h_ij s_j - sum_{j<k} J_jk s_j s_k - sum_{j<k<l} K_jkl s_j s_k s_l,
    p_i(s) = exp(-E_i(s)) / Z_i,      a_ij = (<s_j>_i + 1) / 2,      o_i = sum_j a_ij v_j.

This is the package's one energy convention. A key that is masked out (``attn_mask`` False, or j > i
when causal) is absent: it is not a spin of query i at all, and a_ij = 0. With J = K = 0 the spins are
independent and a_ij = sigmoid(2 h_ij).

The coupled window (``coupling_window=W``, causal): slot a holds key i - a, J is (H, W, W) indexed by slot,
so keys j and k in query i's window are coupled by J[i - j, i - k]; keys before the window are independent.

Masks and heads follow SDPA. Query row r sits at position i = r (``is_causal=True``, top-left) or
i = S - L + r (``attn_mask=torch.nn.attention.bias.causal_lower_right(L, S)``, queries that end at the last
key), and sees the keys j <= i. A float ``attn_mask`` is additive: -inf removes the key (absent), a finite
entry is added to h_ij. ``enable_gqa``: key and value with Hkv heads, H a multiple of Hkv; query head h reads
key/value head h // (H / Hkv); couplings are per query head.

The function below enumerates all 2^n states of each query's present keys in float64, one query at a time.
It is the definition: every fast path (:func:`boltzmann_attention.boltzmann_attention`, the
:class:`~boltzmann_attention.BoltzmannAttention` module, every method of :mod:`boltzmann_attention.ising`)
is tested against it or against :mod:`boltzmann_attention.ising.reference`, its Ising-level twin. Use it
only for small n (2^n states per query).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias, CausalVariant


def naive_boltzmann_attention(query: Tensor, key: Tensor, value: Tensor, couplings: Tensor | None = None,
                              three_body: Tensor | None = None, *, is_causal: bool = False,
                              attn_mask: Tensor | None = None, scale: float | None = None,
                              bias: float | Tensor = 0.0, coupling_window: int | None = None,
                              enable_gqa: bool = False) -> tuple[Tensor, Tensor]:
    """Output (B, H, L, Ev) and weights (B, H, L, S), in float64, by enumeration of every query's states.

    query (B, H, L, E), key (B, H, S, E), value (B, H, S, Ev); couplings (H or 1, S, S), or (H or 1, W, W)
    with ``coupling_window=W``, or per sequence and query row (B or 1, H or 1, L or 1, S, S) (couplings that
    depend on content); three_body (H or 1, S, S, S); attn_mask bool, broadcastable to (B, H, L, S),
    True where the key takes part, a float tensor (additive, -inf absent) or a CausalBias; bias a float or a
    tensor broadcastable to (B, H, L, S). Mode 'J' (a field of the bias alone) is a zero query.
    """
    B, H, L, E = query.shape
    S = key.shape[-2]
    offset = 0  # query row r sits at position r + offset
    if isinstance(attn_mask, CausalBias):
        offset = S - L if attn_mask.variant == CausalVariant.LOWER_RIGHT else 0
        is_causal, attn_mask = True, None
    if coupling_window is not None and not is_causal:
        raise ValueError("coupling_window needs is_causal=True (slot a is key i - a)")
    if enable_gqa:
        key = key.repeat_interleave(H // key.shape[1], dim=1)
        value = value.repeat_interleave(H // value.shape[1], dim=1)
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    field = query.double() @ key.double().transpose(-1, -2) * scale + torch.as_tensor(bias, dtype=torch.float64)
    present = torch.ones(B, H, L, S, dtype=torch.bool)
    if attn_mask is not None and attn_mask.is_floating_point():
        present = present & (attn_mask != -math.inf)
        field = field + attn_mask.double().masked_fill(attn_mask == -math.inf, 0.0)
    elif attn_mask is not None:
        present = present & attn_mask
    field = field.expand(B, H, L, S)
    if is_causal:
        present = present & torch.ones(L, S, dtype=torch.bool).tril(offset)
    weights = torch.zeros(B, H, L, S, dtype=torch.float64)
    for b, head, r in itertools.product(range(B), range(H), range(L)):
        i = r + offset  # the query's position
        keys = present[b, head, r].nonzero().flatten().tolist()
        J = None if couplings is None else _pick(couplings, b, head, r).double()
        K = None if three_body is None else three_body[head if three_body.shape[0] > 1 else 0].double()
        if coupling_window is not None:  # keys before the window are independent: sigmoid(2h)
            for j in keys:
                if j <= i - coupling_window:
                    weights[b, head, r, j] = torch.sigmoid(2 * field[b, head, r, j])
            keys = [j for j in keys if j > i - coupling_window]
            slots = [i - j for j in keys]
            J = None if J is None else J[slots][:, slots]
        elif J is not None:
            J = J[keys][:, keys]
        if K is not None:
            K = K[keys][:, keys][:, :, keys]
        m = _magnetisations(field[b, head, r, keys], J, K)
        weights[b, head, r, keys] = (m + 1) / 2
    return weights @ value.double(), weights


def _pick(x: Tensor, b: int, head: int, r: int) -> Tensor:
    """The (S, S) couplings of batch item b, head and query row r: x is (H or 1, S, S) or (B or 1, H or 1, L or 1,
    S, S)."""
    index = (head,) if x.dim() == 3 else (b, head, r)
    return x[tuple(i if size > 1 else 0 for i, size in zip(index, x.shape))]


def _magnetisations(h: Tensor, J: Tensor | None, K: Tensor | None) -> Tensor:
    """<s> under p(s) proportional to exp(h.s + s.J.s / 2 + K(s, s, s) / 6), all 2^n states of n spins."""
    n = h.shape[0]
    if n == 0:
        return h
    states = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=n)), dtype=torch.float64)
    minus_energy = states @ h
    if J is not None:  # sum over ordered pairs j != k counts each pair twice (J symmetric, zero diagonal)
        minus_energy = minus_energy + torch.einsum("sj,jk,sk->s", states, J, states) / 2
    if K is not None:  # ordered triples count each unordered one 6 times
        minus_energy = minus_energy + torch.einsum("sj,sk,sl,jkl->s", states, states, states, K) / 6
    p = torch.softmax(minus_energy, dim=0)
    return p @ states
