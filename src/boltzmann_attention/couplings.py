"""The learnable coupling parametrisations of :class:`~boltzmann_attention.BoltzmannAttention`.

Each is an ``nn.Module`` whose ``forward(length)`` returns the couplings of one call, and whose parameters
start at ``init_std`` times a normal draw (0 by default, so that mode 'h+J' starts as sigmoid attention)
and get no weight decay: each class sets ``no_weight_decay = True``, which
:func:`~boltzmann_attention.parameter_groups` reads from the module's class (so the rule survives copies and
meta initialisation), and its parameters also carry the ``_no_weight_decay`` mark:

- ``FullCouplings``: a free J_jk per key pair and head, (H, S, S), lengths up to ``max_len``;
- ``RelativeCouplings``: J_jk = f(|j - k|), f = 0 beyond ``max_distance``, any length (J is banded);
- ``WindowCouplings``: the coupled window's slot-indexed J (H, W, W), any length;
- ``ThreeBodyCouplings``: a free K_jkl per key triple and head, symmetrised, (H, S, S, S);
- ``ContentCouplings``: couplings computed from each call's keys (and queries), banded: key-conditioned
  (B, H, 1, S, S), shared by the queries of a sequence, or query-conditioned (B, H, L, S, S). Its
  ``forward(key, query)`` takes the head's keys (and queries) instead of a length.

All return symmetric couplings with a zero diagonal (K: zero where two indices coincide), the package's
convention.
"""

from __future__ import annotations

import itertools
import numbers
from functools import lru_cache

import torch
from torch import Tensor, nn

from .validation import check_int, check_sizes

__all__ = ["ContentCouplings", "FullCouplings", "RelativeCouplings", "ThreeBodyCouplings", "WindowCouplings"]


class FullCouplings(nn.Module):
    """One free coupling J_jk per key pair and head, for lengths up to ``max_len``: (H, S, S)."""

    no_weight_decay = True  # read by parameter_groups

    def __init__(self, num_heads: int, max_len: int, init_std: float = 0.0):
        super().__init__()
        check_sizes(num_heads=num_heads, max_len=max_len, init_std=init_std)
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(num_heads, max_len, max_len) * init_std)
        self.weight._no_weight_decay = True

    def forward(self, length: int) -> Tensor:
        _check_length(length)
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len {self.max_len} of the couplings; "
                             "use coupling='relative' for any length")
        upper = self.weight[:, :length, :length].triu(1)
        return upper + upper.transpose(-1, -2)


class RelativeCouplings(nn.Module):
    """J_jk = f(|j - k|) per head, with f(d) learnable for 1 <= d <= max_distance and 0 beyond.

    Works for any length. J has bandwidth ``max_distance``, so method='banded' applies directly;
    max_distance = 0 means no couplings (J = 0).
    """

    no_weight_decay = True  # read by parameter_groups

    def __init__(self, num_heads: int, max_distance: int, init_std: float = 0.0):
        super().__init__()
        check_sizes(num_heads=num_heads, init_std=init_std)
        check_int("max_distance (coupling_range)", max_distance, 0)
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.randn(num_heads, max_distance) * init_std)  # f(1) .. f(max_distance)
        self.weight._no_weight_decay = True

    def forward(self, length: int) -> Tensor:
        _check_length(length)
        zero = self.weight.new_zeros(self.weight.shape[0], 1)
        table = torch.cat([zero, self.weight, zero], dim=1)  # index: distance, clamped past the range
        position = torch.arange(length, device=self.weight.device)
        distance = (position[:, None] - position[None, :]).abs().clamp(max=self.max_distance + 1)
        return table[:, distance]


class ThreeBodyCouplings(nn.Module):
    """One free K_jkl per key triple j<k<l and head, symmetrised: (H, S, S, S)."""

    no_weight_decay = True  # read by parameter_groups

    def __init__(self, num_heads: int, max_len: int, init_std: float = 0.0):
        super().__init__()
        check_sizes(num_heads=num_heads, max_len=max_len, init_std=init_std)
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(num_heads, max_len, max_len, max_len) * init_std)
        self.weight._no_weight_decay = True

    def forward(self, length: int) -> Tensor:
        _check_length(length)
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len {self.max_len} of the couplings")
        i = torch.arange(length, device=self.weight.device)
        ordered = (i[:, None, None] < i[None, :, None]) & (i[None, :, None] < i[None, None, :])
        upper = self.weight[:, :length, :length, :length] * ordered
        return sum(upper.permute(0, *(1 + p for p in perm)) for perm in itertools.permutations(range(3)))


class WindowCouplings(nn.Module):
    """Slot-indexed couplings of a window of W keys, (H, W, W), for any sequence length.

    Free (default): a symmetric J_ab with zero diagonal, W (W - 1) / 2 parameters per head.
    relative=True: J_ab = f(|a - b|), f(1) .. f(W - 1) learnable, W - 1 parameters per head.
    """

    no_weight_decay = True  # read by parameter_groups

    def __init__(self, num_heads: int, window: int, relative: bool = False, init_std: float = 0.0):
        super().__init__()
        check_sizes(num_heads=num_heads, init_std=init_std)
        check_int("coupling_window", window, 1)
        if not isinstance(relative, bool):
            raise ValueError(f"coupling_window_relative must be True or False, got {relative!r}")
        self.window, self.relative = window, relative
        shape = (num_heads, window - 1) if relative else (num_heads, window, window)
        self.weight = nn.Parameter(torch.randn(*shape) * init_std)
        self.weight._no_weight_decay = True

    def forward(self, length: int | None = None) -> Tensor:
        """The (H, W, W) couplings; ``length`` is accepted for symmetry with the other couplings and unused."""
        compiling = torch.compiler.is_compiling()  # the compiler folds the tables itself: no cache to trace
        if self.relative:
            table = torch.cat([self.weight.new_zeros(self.weight.shape[0], 1), self.weight], dim=1)
            distance = (_slot_distance.__wrapped__ if compiling else _slot_distance)(self.window, self.weight.device)
            return table[:, distance]
        upper_triangle = _upper_triangle.__wrapped__ if compiling else _upper_triangle
        upper = self.weight * upper_triangle(self.window, self.weight.dtype, self.weight.device)
        return upper + upper.transpose(-1, -2)


def _check_length(length) -> None:
    """ValueError unless ``length`` is a count of keys (an int >= 0; torch.compile's symbolic ints included)."""
    if isinstance(length, bool) or not isinstance(length, (numbers.Integral, torch.SymInt)) or length < 0:
        raise ValueError(f"length must be an integer >= 0 (the number of keys), got {length!r}")


# Constant index tables of the window, derived from (W, dtype, device) and cached outside the module, so that
# no module state can hold them stale or uninitialised (after meta initialisation and to_empty, say). Cached
# rather than rebuilt per call: tiny triu calls cost a thread wake-up each on a busy CPU.
@lru_cache(maxsize=32)
def _upper_triangle(window: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(W, W): 1 above the diagonal, 0 elsewhere."""
    slot = torch.arange(window, device=device)
    return (slot[:, None] < slot[None, :]).to(dtype)


@lru_cache(maxsize=32)
def _slot_distance(window: int, device: torch.device) -> Tensor:
    """(W, W): |a - b|."""
    slot = torch.arange(window, device=device)
    return (slot[:, None] - slot[None, :]).abs()


class ContentCouplings(nn.Module):
    """Couplings that depend on content, from rank-r projections of each head's keys, zero beyond
    ``max_distance``:

    - key-conditioned (``query_conditioned=False``): J_jk = (a_j . b_k + a_k . b_j) / (2 sqrt r), a = k A,
      b = k B; one J per sequence and head, shared by its queries: (B, H, 1, S, S). Exact by the banded
      transfer matrix, since J varies along the chain but not with the query.
    - query-conditioned: J_jk(i) = sum_r u_ir (a_jr b_kr + a_kr b_jr) / (2 sqrt r), u = q_i U, a trilinear
      score of the query against a pair of keys (the Ising counterpart of 2-simplicial attention): (B, H, L, S, S).

    A, U (H, head_dim, r) start as N(0, 1 / head_dim); B starts at ``init_std`` times a normal draw, zero by
    default, so J = 0 and the layer starts as sigmoid attention. The keys (and queries) are the head's
    projections before any rotary embedding: the couplings read content, the range alone reads position.
    J is dense over the band's (S, S) per query row (query-conditioned: B H L S^2 entries), meant for the
    lengths of a banded method.
    """

    no_weight_decay = True  # read by parameter_groups

    def __init__(self, num_heads: int, head_dim: int, rank: int, max_distance: int, query_conditioned: bool = False,
                 init_std: float = 0.0):
        super().__init__()
        check_sizes(num_heads=num_heads, head_dim=head_dim, rank=rank, init_std=init_std)
        self.max_distance = check_int("max_distance", max_distance, 0)
        self.rank, self.query_conditioned = rank, query_conditioned
        scale = head_dim ** -0.5
        self.left = nn.Parameter(torch.randn(num_heads, head_dim, rank) * scale)
        self.right = nn.Parameter(torch.randn(num_heads, head_dim, rank) * init_std)
        self.query_weight = nn.Parameter(torch.randn(num_heads, head_dim, rank) * scale) if query_conditioned \
            else None
        for p in self.parameters():
            p._no_weight_decay = True

    def forward(self, key: Tensor, query: Tensor | None = None) -> Tensor:
        """key (B, H, S, E), query (B, H, L, E) (query-conditioned only) -> J (B, H, 1 or L, S, S), symmetric,
        zero on the diagonal and beyond ``max_distance``."""
        a = torch.einsum("bhse,her->bhsr", key, self.left.to(key.dtype))
        b = torch.einsum("bhse,her->bhsr", key, self.right.to(key.dtype))
        if self.query_conditioned:
            if query is None:
                raise ValueError("query-conditioned couplings need the queries")
            u = torch.einsum("bhle,her->bhlr", query, self.query_weight.to(key.dtype))
            J = torch.einsum("bhlr,bhjr,bhkr->bhljk", u, a, b)
        else:
            J = (a @ b.transpose(-1, -2)).unsqueeze(2)
        S = key.shape[-2]
        return (J + J.transpose(-1, -2)) * (_band_mask(S, self.max_distance, key).mul(0.5 / self.rank ** 0.5))

    def band(self, key: Tensor, query: Tensor | None = None) -> Tensor:
        """The same couplings in band form, (B, H, 1 or L, S, w) with w = max_distance: entry [..., p, d - 1] is
        J_{p-d, p} (0 where p - d < 0), computed for those pairs only."""
        a = torch.einsum("bhse,her->bhsr", key, self.left.to(key.dtype))
        b = torch.einsum("bhse,her->bhsr", key, self.right.to(key.dtype))
        S, scale = key.shape[-2], 0.5 / self.rank ** 0.5
        pairs = []
        for d in range(1, self.max_distance + 1):
            earlier_a = torch.nn.functional.pad(a, (0, 0, d, 0))[..., :S, :]  # a_{p-d}, 0 before the start
            earlier_b = torch.nn.functional.pad(b, (0, 0, d, 0))[..., :S, :]
            pairs.append(earlier_a * b + a * earlier_b)                        # (B, H, S, r)
        pair = torch.stack(pairs, -2) * scale                                    # (B, H, S, w, r)
        if self.query_conditioned:
            if query is None:
                raise ValueError("query-conditioned couplings need the queries")
            u = torch.einsum("bhle,her->bhlr", query, self.query_weight.to(key.dtype))
            return torch.einsum("bhlr,bhswr->bhlsw", u, pair)
        return pair.sum(-1).unsqueeze(2)

    def extra_repr(self) -> str:
        kind = "query" if self.query_conditioned else "keys"
        return f"{kind}, rank={self.rank}, max_distance={self.max_distance}"


def _band_mask(S: int, width: int, like: Tensor) -> Tensor:
    """(S, S) of like's dtype and device: 1 where 0 < |j - k| <= width, else 0."""
    d = (torch.arange(S, device=like.device)[:, None] - torch.arange(S, device=like.device)).abs()
    return ((d > 0) & (d <= width)).to(like.dtype)
