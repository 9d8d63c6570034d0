"""Every configuration of n spins, and the energy of each: the brute-force building blocks.

The oracle (:mod:`~boltzmann_attention.ising.reference`), the split enumeration's half tables
(:mod:`~boltzmann_attention.ising.split`) and the annealer's statevector basis
(:mod:`~boltzmann_attention.ising.annealing`) all index states the same way, so they share these two functions.
"""

from __future__ import annotations

import torch
from torch import Tensor


def configurations(n: int, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
    """All 2^n spin configurations, shape (2^n, n); bit j of the row index is spin j (1 means s_j = +1)."""
    index = torch.arange(2**n, device=device)
    bits = (index[:, None] >> torch.arange(n, device=device)) & 1
    return (2 * bits - 1).to(dtype)


def negative_energies(h: Tensor, J: Tensor | None, K: Tensor | None, spins: Tensor) -> Tensor:
    """-E(s) for every configuration: (..., 2^n) from h (..., n), J (..., n, n), K (..., n, n, n).

    -E(s) = sum_j h_j s_j + sum_{j<k} J_jk s_j s_k + sum_{j<k<l} K_jkl s_j s_k s_l, written with the
    full symmetric tensors as h.s + s.J.s / 2 + K(s, s, s) / 6.
    """
    out = h @ spins.T
    if J is not None:
        out = out + 0.5 * torch.einsum("...jk,cj,ck->...c", J, spins, spins)
    if K is not None:
        out = out + torch.einsum("...jkl,cj,ck,cl->...c", K, spins, spins, spins) / 6.0
    return out

