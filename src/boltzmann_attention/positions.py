"""Position priors for attention: rotary embeddings, ALiBi, and a learned bias per slot of the last W keys.

They shift the score of softmax attention or, equally, the Ising field h of Boltzmann attention (with J = 0 the
weight is sigmoid(2h), so a bias on h is a bias on the logit).

Alignment: queries are the last L of the S key positions (query r sits at position S - L + r), SDPA's
bottom-right alignment. For self-attention (L = S) that is the usual square; with a cache of S keys and one
new query it is the last row of the full matrix, so decoding token by token gives the same biases.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .coupled_window import slot_field
from .couplings import WindowCouplings
from .validation import SLOT_BIAS_PARAMETRIZATIONS


def distances(L: int, S: int, device=None) -> Tensor:
    """(L, S) integer distance i - j from query row r (position i = S - L + r) to key j; negative for future keys."""
    return (torch.arange(S - L, S, device=device)[:, None] - torch.arange(S, device=device)[None, :])


def rotary(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding (Su et al.): x (..., N, E) with E even, positions (N,).

    Channel pair (c, c + E/2) is turned by the angle p * base^(-2c / E), so the product of a rotated query at
    position p and a rotated key at position p' depends on p - p' only. Computed in x's dtype, or float32 for
    half-precision x.
    """
    E = x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    half = E // 2
    frequency = base ** (-2 * torch.arange(half, dtype=dtype, device=x.device) / E)
    angle = positions.to(dtype)[:, None] * frequency  # (N, E/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half].to(dtype), x[..., half:].to(dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi's head slopes (Press et al.), float64 (H,): 2^(-8h/H) for h = 1..H when H is a power of two;
    otherwise those of the nearest lower power of two n, then every other slope of 2n (the paper's code)."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = geometric(n) + geometric(2 * n)[0::2][:num_heads - n]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(slopes: Tensor, L: int, S: int) -> Tensor:
    """(H, L, S) bias -m_h |i - j| for slopes m (H,) (future keys get the mirror image; a causal mask drops them)."""
    return -slopes[:, None, None] * distances(L, S, slopes.device).abs().to(slopes.dtype)


class SlotBias(nn.Module):
    """A learnable bias per head on each of the last W keys of a query, by slot a = i - j in 0..W-1, 0 beyond.

    The uncoupled twin of the coupled window: the same slots, a bias on each and no couplings between them. Any
    length. forward(L, S) gives the (H, L, S) bias in the module's dtype (queries the last L of S positions).

    parametrization 'direct': one free scalar per head and slot, ``weight`` (H, W). 'pairs': ``weight`` plus
    the per-slot field -R_a = -sum_b P_ab of a free symmetric table P (H, W, W) with zero diagonal, summed over
    the slots b whose key exists (i - b >= 0): the coupled window's field term (:func:`...coupled_window.
    slot_field`) with its interaction term removed, parametrised as the window's J is (``pairs``, a
    :class:`...couplings.WindowCouplings`), so that it has as many parameters and learns as fast. A
    key_padding_mask does not enter the sum. Both start at zero.
    """

    def __init__(self, num_heads: int, window: int, parametrization: str = "direct"):
        super().__init__()
        if parametrization not in SLOT_BIAS_PARAMETRIZATIONS:
            raise ValueError(f"unknown slot_bias_parametrization {parametrization!r}; choose one of "
                             f"{SLOT_BIAS_PARAMETRIZATIONS}")
        self.window, self.parametrization = window, parametrization
        self.weight = nn.Parameter(torch.zeros(num_heads, window))
        self.weight._no_weight_decay = True
        self.pairs = WindowCouplings(num_heads, window) if parametrization == "pairs" else None

    def forward(self, L: int, S: int) -> Tensor:
        distance = distances(L, S, self.weight.device)
        slot = torch.where((distance >= 0) & (distance < self.window), distance, self.window)  # W: the zero column
        table = torch.cat([self.weight, self.weight.new_zeros(self.weight.shape[0], 1)], dim=1)
        bias = table[:, slot]
        if self.pairs is not None:
            bias = bias + slot_field(self.pairs(), L, S, offset=S - L)
        return bias

    def full_window(self) -> Tensor:
        """(H, W): the bias of slot a at a query whose W slots all hold keys (i >= W - 1)."""
        if self.pairs is None:
            return self.weight
        return self.weight - self.pairs().sum(-1)
