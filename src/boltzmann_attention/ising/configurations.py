"""Method ``configurations``: exact marginals as softmax attention over all 2^n spin configurations.

With S (2^n, n) the configurations and E_J(s) = sum_{a<b} J_ab s_a s_b, the Boltzmann law of one query is a
softmax over configurations, and its magnetisations are that softmax's average of S:

    <s> = softmax(h S^T + E_J(S)) S  =  SDPA(q = h, k = v = S, additive bias E_J, scale 1),

so one fused attention kernel (``F.scaled_dot_product_attention``) computes them, with its gradients: the
memory-efficient or flash kernels never hold the (queries x 2^n) scores. Two forms:

- **Every spin present** (the coupled window's full rows): the bias is shared by the queries of a group (one J),
  so it goes in as one more key dimension, q = [h, 1], k = [S, E_J(S)], v = S: n + 1 dimensions, no mask. (An
  additive float mask would do the same, but a mask that needs a gradient, E_J depends on J, sends SDPA on CPU to
  its math backend, which materialises the scores.)
- **Absent spins** (mask False): an absent spin is removed from every term, as in every method: each query gets
  q = [h * m, J_ab m_a m_b (a < b)] against k = [S, s_a s_b (a < b)], the pair products of each configuration,
  so an absent spin has no field and no coupling: it is free, which changes no other marginal (its own is set to
  0). Only present pairs enter the sum, so nothing is cancelled (shifting the fields to undo an absent spin's
  couplings would lose the O(1) fields next to large couplings). n + n(n-1)/2 dimensions per query.

Head dimensions are padded with zeros to what the kernels take (v as wide as q and k on CPU, whose flash kernel
needs equal widths; multiples of 8 elsewhere). float16 and bfloat16 are solved in float32, as method ``exact``.

Numerics: the softmax is max-shifted, so Z never underflows; rows whose energy scale is beyond what the dtype
resolves go to the split enumeration's float64 rescue (``split.rescued``: on the host where checks read it,
else refused by an asynchronous assert), so the marginals are those of method ``exact``. Gradients: SDPA's
(first derivatives; the CPU flash kernel has no double backward).

Cost per query: 2^n (D + Dv) multiply-adds, D = n + 1 (all present) or n (n + 1) / 2 (absent spins), against
the split enumeration's 2 * 2^n; what it buys is one fused kernel in place of the split's chain of small
operations. :func:`boltzmann_attention.ising.window.choose_path` picks between them for the coupled window from
measurements (docs/design.md, "Coupled window"). Limit: ``max_spins`` (default 16) spins per query.
"""

from __future__ import annotations

import contextlib
import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from . import split
from ._inputs import check_int, group_queries
from .enumeration import configurations
from .record import Method, keyword_options

MAX_SPINS = 16
CHUNK_ELEMENTS = 2**24  # (queries x configurations) per call where SDPA runs its math backend (the scores held)
FUSED_CHUNK_ELEMENTS = 2**28  # per call on a GPU where a fused kernel is expected: 1 GiB of float32 scores should
                              # SDPA choose its math backend after all


def marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              max_spins: int = MAX_SPINS) -> Tensor:
    """<s_j>, shape of the broadcast of h (..., n), J (..., n, n) and mask (..., n). See the module docstring."""
    _check(h, K, max_spins)
    if h.dtype in (torch.float16, torch.bfloat16):  # half precision cannot hold 2^n weights' sums: float32
        return marginals(h.float(), None if J is None else J.float(), None, mask, max_spins=max_spins).to(h.dtype)
    if J is None:
        J = h.new_zeros(h.shape[-1], h.shape[-1])
    g = group_queries(h, J, None, mask)
    return g.ungroup(solve(g.h, g.J, g.mask))


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                  max_spins: int = MAX_SPINS) -> Tensor:
    """log Z, h.shape[:-1] broadcast: logsumexp over the configurations of the same scores (absent spins free,
    log 2 each taken off), in chunks of queries."""
    _check(h, K, max_spins)
    if h.dtype in (torch.float16, torch.bfloat16):
        return log_partition(h.float(), None if J is None else J.float(), None, mask, max_spins=max_spins).to(h.dtype)
    if J is None:
        J = h.new_zeros(h.shape[-1], h.shape[-1])
    g = group_queries(h, J, None, mask)
    q, k = _features(g.h, g.J, g.mask)
    n = h.shape[-1]
    chunk = max(1, CHUNK_ELEMENTS >> n)
    logz = torch.cat([torch.logsumexp(x @ k.transpose(-1, -2), dim=-1) for x in q.split(chunk, dim=1)], dim=1)
    if g.mask is not None:
        logz = logz - (~g.mask).sum(-1).to(logz.dtype) * math.log(2.0)
    return g.ungroup(logz)


def _check(h: Tensor, K: Tensor | None, max_spins: int) -> None:
    if K is not None:
        raise ValueError("method 'configurations' supports pairwise couplings only (K must be None); use method "
                         "'exact' or 'reference' for three-body couplings")
    if h.shape[-1] > max_spins:
        raise ValueError(
            f"method 'configurations' attends over all 2^n spin configurations and is limited to n <= {max_spins} "
            f"spins per query (got {h.shape[-1]}; option max_spins). Use method 'exact' (split enumeration, "
            f"n <= 24), 'banded' (couplings of limited range), or 'meanfield' / 'tap' (approximate).")


def solve(h: Tensor, J: Tensor, mask: Tensor | None) -> Tensor:
    """h (G, Q, n), J (G, n, n), mask (G, Q, n) bool or None -> marginals (G, Q, n), 0 at absent spins."""
    n = h.shape[-1]
    if n == 0 or h.numel() == 0:
        return h * 0
    with _without_autocast(h.device.type):
        q, k = _features(h, J, mask)
        m = _attend(q, k, n, h.device)
    ok = torch.ones(m.shape[:-1], dtype=torch.bool, device=m.device)  # a softmax's Z never underflows
    m = split.rescued(m, torch.zeros_like(m[..., 0]), ok, h, J, None, mask)[0]  # energy scale: as method exact
    return m if mask is None else m * mask


def _features(h: Tensor, J: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Queries (G, Q, D) and keys (G or 1, 2^n, D) whose products are the log-weights h.s + E_J(s) of each
    configuration (see the module docstring)."""
    n = h.shape[-1]
    S, pairs, a, b = constants(n, h.dtype, h.device)
    pair_J = (J[:, a, b] + J[:, b, a]) * 0.5  # J_ab read from both halves (as s.J.s / 2): gradients to each alike
    if mask is None:
        energy = pair_J @ pairs.T                                                          # (G, 2^n): E_J(s)
        q = torch.cat([h, h.new_ones(1, 1, 1).expand(*h.shape[:-1], 1)], dim=-1)          # [h, 1]
        k = torch.cat([S.expand(J.shape[0], -1, -1), energy[..., None]], dim=-1)         # [S, E_J]
        return q, k
    present = mask.to(h.dtype)
    couplings = pair_J[:, None] * (present[..., a] * present[..., b])                    # (G, Q, n(n-1)/2)
    return torch.cat([h * present, couplings], dim=-1), torch.cat([S, pairs], dim=-1)[None]


def _constants(n: int, dtype: torch.dtype, device: torch.device):
    """The configurations S (2^n, n), their pair products s_a s_b (2^n, n(n-1)/2) and the pairs a < b."""
    S = configurations(n, dtype=dtype, device=device)
    a, b = torch.triu_indices(n, n, 1, device=device)
    return S, S[:, a] * S[:, b], a, b


_cached_constants = lru_cache(maxsize=64)(_constants)


def constants(n: int, dtype: torch.dtype, device: torch.device):
    """:func:`_constants`, built once per size, dtype and device in eager; under ``torch.compile`` traced into the
    graph, which keeps them as constants (a cache is nothing the compiler can trace)."""
    return _constants(n, dtype, device) if torch.compiler.is_compiling() else _cached_constants(n, dtype, device)


def _attend(q: Tensor, k: Tensor, n: int, device: torch.device) -> Tensor:
    """sum_c softmax_c(q.k_c) S_c, i.e. SDPA with v = S, for q (G, Q, D), k (G or 1, 2^n, D): (G, Q, n)."""
    G, Q, D = q.shape
    cpu = device.type == "cpu"
    width = D if cpu else _round_up(D, 8)  # CPU's flash kernel: any width, v as wide as q and k; else multiples of 8
    S = constants(n, q.dtype, device)[0]
    q, k = F.pad(q, (0, width - D)), F.pad(k, (0, width - D))
    if k.shape[0] == 1:  # keys shared by every group: one sequence of G * Q queries
        q = q.reshape(1, G * Q, width)
    q, k = q[None], k[None]  # SDPA's (B, H, L, E): one batch, a head per group
    v = F.pad(S, (0, (width if cpu else _round_up(n, 8)) - n)).expand(1, k.shape[1], -1, -1)
    if cpu:  # the flash kernel takes every input here: one call
        chunk = q.shape[2]
    else:
        budget = FUSED_CHUNK_ELEMENTS if _fused(q) else CHUNK_ELEMENTS
        chunk = max(1, (budget >> n) // q.shape[1])
    out = torch.cat([F.scaled_dot_product_attention(x, k, v, scale=1.0) for x in q.split(chunk, dim=2)], dim=2)
    return out[0, ..., :n].reshape(G, Q, n)


def _fused(q: Tensor) -> bool:
    """Whether SDPA has a kernel off the CPU that never holds the scores for this input: CUDA's memory-efficient
    one (not float64); elsewhere its math backend, in smaller chunks."""
    return q.device.type == "cuda" and q.dtype != torch.float64


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _without_autocast(device: str):
    """A context without autocast on ``device`` (the features and the kernel stay in the inputs' dtype)."""
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


def _check_options(options: dict) -> None:
    if "max_spins" in options:
        check_int("max_spins", options["max_spins"], 1)


METHOD = Method("configurations", marginals, log_partition, keyword_options(marginals), "exact",
                f"n <= {MAX_SPINS} spins per query (option max_spins); 2^n (D + Dv) MACs", _check_options,
                max_spins=MAX_SPINS, window=True, window_path="configurations")

__all__ = ["MAX_SPINS", "METHOD", "log_partition", "marginals", "solve"]
