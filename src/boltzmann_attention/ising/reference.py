"""Brute-force reference: enumerate all 2^n configurations in float64.

This is the oracle every other method is tested against. It is deliberately simple: it builds the
energy of every configuration, then takes a logsumexp and a softmax. Cost O(2^n * n^2) per query,
memory O(2^n) per query, so it is meant for tests (n <= ~16), not for training.

Absent spins (mask False) are handled the simplest possible way: their field and couplings are set to
zero, which leaves them free (<s_j> = 0 exactly), and log 2 per absent spin is taken off log Z. The two
configurations that differ only in an absent spin then have the same energy in exact arithmetic, but a
GEMM may round them differently (its summation order can depend on the column: seen with MKL on an AMD
CPU), and at energies of 1e17 one ulp (16) is a factor e^16 between them. So each such pair's energies are
replaced by their mean (bit for bit the same for both), and the marginals of absent spins are set to 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MAX_SPINS = 20


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


def _free_absent(negative_energy: Tensor, mask: Tensor | None) -> Tensor:
    """Give the two configurations that differ only in an absent spin the same energy, their mean (see the
    module docstring). negative_energy (..., 2^n), mask (..., n) bool or None."""
    if mask is None:
        return negative_energy
    index = torch.arange(negative_energy.shape[-1], device=negative_energy.device)
    for j in range(mask.shape[-1]):
        absent = ~mask[..., j, None]
        if bool(absent.any()):
            partner = negative_energy[..., index ^ (1 << j)]
            negative_energy = torch.where(absent, (negative_energy + partner) / 2, negative_energy)
    return negative_energy


def _prepare(h, J, K, mask):
    if h.shape[-1] > MAX_SPINS:
        raise ValueError(f"method 'reference' enumerates 2^n states and is limited to n <= {MAX_SPINS}; "
                         f"got n = {h.shape[-1]}. Use method='exact' (n <= 24), 'banded' or 'meanfield'.")
    h = h.double()
    J = J.double() if J is not None else None
    K = K.double() if K is not None else None
    absent = 0
    if mask is not None:
        m = mask.double()
        h = h * m
        if J is not None:
            J = J * m[..., :, None] * m[..., None, :]
        if K is not None:
            K = K * m[..., :, None, None] * m[..., None, :, None] * m[..., None, None, :]
        absent = (~mask).sum(-1).double() * math.log(2.0)
    return h, J, K, absent


def log_partition(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    dtype = h.dtype
    h, J, K, absent = _prepare(h, J, K, mask)
    spins = configurations(h.shape[-1], device=h.device)
    return (torch.logsumexp(_free_absent(negative_energies(h, J, K, spins), mask), dim=-1) - absent).to(dtype)


def marginals(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    dtype = h.dtype
    h, J, K, _ = _prepare(h, J, K, mask)
    spins = configurations(h.shape[-1], device=h.device)
    probabilities = torch.softmax(_free_absent(negative_energies(h, J, K, spins), mask), dim=-1)
    out = probabilities @ spins
    return (out if mask is None else out * mask).to(dtype)


def correlations(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    """<s_j s_k>, shape (..., n, n), for tests of samplers and gradient identities."""
    dtype = h.dtype
    h, J, K, _ = _prepare(h, J, K, mask)
    spins = configurations(h.shape[-1], device=h.device)
    probabilities = torch.softmax(_free_absent(negative_energies(h, J, K, spins), mask), dim=-1)
    out = torch.einsum("...c,cj,ck->...jk", probabilities, spins, spins)
    if mask is not None:
        out = out * mask[..., :, None] * mask[..., None, :]
    return out.to(dtype)
