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

Each energy is a float64 sum of at most m = n + n^2 (+ n^3 with K) exact terms, so rounding moves it by at
most delta = 2 gamma_m S, S = sum |h| + sum |J| / 2 (+ sum |K| / 6) over the full symmetric tensors and
gamma_m = m u / (1 - m u) (u = 2^-53); delta is 0 where every sum is exact: each is a whole multiple of the
inputs' finest power of two, below 2^53 of it (dyadic inputs, say). That moves no probability by more than a
factor e^(2 delta). Where this could move a marginal or a correlation by more than RESOLUTION_TOLERANCE, the
result is kept only if the states that carry the distribution (those within 2 delta + n log 2 + log(4 /
tolerance) of the lowest computed energy) all agree on it, as for frozen spins at any scale; otherwise a
ValueError names the limit. log Z is returned as computed: it is within delta of the truth.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .enumeration import configurations, negative_energies
from .record import Method, no_options

MAX_SPINS = 20
RESOLUTION_TOLERANCE = 1e-6  # largest error in a marginal or correlation accepted from the rounding of the energies


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


def _granularity(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """The largest power of two of which every entry over ``dims`` is a multiple (inf where all are 0)."""
    mantissa, exponent = torch.frexp(x)
    digits = (mantissa.abs() * 2.0 ** 53).long()  # the exact integer significand
    lowest = (digits & -digits).double()  # its lowest set bit
    step = torch.where(x == 0, math.inf, torch.ldexp(lowest, exponent - 53))
    if any(x.shape[d] == 0 for d in dims):  # no entries: no constraint
        return torch.full_like(x.sum(dims), math.inf)
    return step.amin(dims)


def _rounding_bound(h: Tensor, J: Tensor | None, K: Tensor | None) -> Tensor:
    """delta (...,): the most float64 rounding can move any configuration's energy (module docstring). It is 0
    where every sum is exact: without K, when h's sums and J's are whole multiples of their granularities below
    2^53 of them, and so is the energy at the granularity of h and J / 2."""
    n = h.shape[-1]
    terms, size = n, h.abs().sum(-1)
    if J is not None:
        terms, size = terms + n * n, size + J.abs().sum((-2, -1)) / 2
    if K is not None:
        terms, size = terms + n ** 3, size + K.abs().sum((-3, -2, -1)) / 6
    u = 2.0 ** -53
    delta = 2 * terms * u / (1 - terms * u) * size
    if K is None:
        limit = 2.0 ** 53
        step = _granularity(h, (-1,))
        exact = h.abs().sum(-1) <= limit * step
        if J is not None:
            step_J = _granularity(J, (-2, -1))
            exact = exact & (J.abs().sum((-2, -1)) <= limit * step_J) & (step_J >= 2.0 ** -1073)  # halving exact
            step = torch.minimum(step, step_J / 2)
        delta = torch.where(exact & (size <= limit * step), 0.0, delta)
    return delta


def _check_resolved(negative_energy: Tensor, delta: Tensor, values: Tensor, present: Tensor | None, what: str):
    """Raise where rounding could move an average of ``values`` (C, k) (the spins, or their products) by more
    than RESOLUTION_TOLERANCE: rows (...) whose bound is loose and whose carrying states disagree on a present
    entry (``present`` (..., k) bool, or None for all)."""
    loose = torch.expm1(2 * delta) > RESOLUTION_TOLERANCE
    if not bool(loose.any()):
        return
    n = negative_energy.shape[-1].bit_length() - 1  # 2^n states
    window = 2 * delta + n * math.log(2.0) + math.log(4 / RESOLUTION_TOLERANCE)
    carrying = negative_energy >= negative_energy.amax(-1, keepdim=True) - window[..., None]  # (..., C)
    high = torch.where(carrying[..., None], values, -math.inf).amax(-2)  # (..., k)
    low = torch.where(carrying[..., None], values, math.inf).amin(-2)
    unresolved = loose[..., None] & (high != low)
    if present is not None:
        unresolved = unresolved & present
    if bool(unresolved.any()):
        raise ValueError(
            f"method 'reference': the energies cannot be resolved in float64: rounding could move them by up to "
            f"{float(delta.amax()):.3g}, and the states that carry the distribution disagree on a {what}, which "
            f"could then be off by more than {RESOLUTION_TOLERANCE:g}. Rescale the fields and couplings; "
            f"method='exact' bounds the rounding state by state, and solves some of the inputs refused here.")


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
    negative_energy = _free_absent(negative_energies(h, J, K, spins), mask)
    _check_resolved(negative_energy, _rounding_bound(h, J, K), spins, mask, "spin")
    out = torch.softmax(negative_energy, dim=-1) @ spins
    return (out if mask is None else out * mask).to(dtype)


def correlations(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    """<s_j s_k>, shape (..., n, n), for tests of samplers and gradient identities."""
    dtype = h.dtype
    h, J, K, _ = _prepare(h, J, K, mask)
    n = h.shape[-1]
    spins = configurations(n, device=h.device)
    negative_energy = _free_absent(negative_energies(h, J, K, spins), mask)
    pairs = (mask[..., :, None] & mask[..., None, :]).flatten(-2) if mask is not None else None
    _check_resolved(negative_energy, _rounding_bound(h, J, K), (spins[:, :, None] * spins[:, None, :]).flatten(-2),
                    pairs, "pair of spins")
    out = torch.einsum("...c,cj,ck->...jk", torch.softmax(negative_energy, dim=-1), spins, spins)
    if mask is not None:
        out = out * mask[..., :, None] * mask[..., None, :]
    return out.to(dtype)


METHOD = Method("reference", lambda h, J, K, mask: marginals(h, J, K, mask),
                lambda h, J, K, mask: log_partition(h, J, K, mask), frozenset(), "exact",
                f"n <= {MAX_SPINS} spins (brute force in float64, the test oracle)", no_options,
                max_spins=MAX_SPINS, three_body=True)
