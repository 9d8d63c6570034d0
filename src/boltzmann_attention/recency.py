"""Two learned-recency attentions, the field's baselines for what a coupled window could add by position alone.

- Forgetting attention (FoX; Lin, Nikishin, He and Courville, ICLR 2025): softmax attention whose score of key j
  for query i gets the bias sum_{k=j+1..i} log f_k, with a per-head forget gate f_t = sigmoid(w.x_t + b) of each
  position: a data-dependent ALiBi. No position embedding.
- Stick-breaking attention (Tan, Shen, Yang, Courville and Panda, ICLR 2025): with beta_ij = sigmoid(z_ij) of
  the score z, key j gets beta_ij times prod (1 - beta_ik) over the keys k between j and the query: nearer keys
  claim their share of the stick first. The weights need not sum to one. No position embedding.

Both are causal. Queries are the last L of the S key positions (SDPA's bottom-right alignment), so decoding
with a cache gives the last rows of the full computation. Scores and weights are computed in float32 for
half-precision inputs (float64 inputs stay float64), in log space, and returned in the input's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _as(bias: Tensor | float, dtype: torch.dtype) -> Tensor | float:
    return bias.to(dtype) if isinstance(bias, Tensor) else bias


def causal_mask(L: int, S: int, device=None, include_current: bool = True) -> Tensor:
    """(L, S) bool, True where key j is visible to query row r at position S - L + r (j <= i, or j < i)."""
    return torch.ones(L, S, dtype=torch.bool, device=device).tril(S - L - (0 if include_current else 1))


def forgetting_attention(query: Tensor, key: Tensor, value: Tensor, log_forget: Tensor, *,
                         scale: float | None = None, bias: Tensor | float = 0.0, return_weights: bool = False):
    """Forgetting attention. query (B, H, L, E), key (B, H, S, E), value (B, H, S, Ev); log_forget (B, H, S):
    log f_t <= 0 of every key position (logsigmoid of the gate); bias: added to the scores (broadcastable to
    (B, H, L, S), e.g. a position prior). Returns (B, H, L, Ev) [and the weights]."""
    L, S = query.shape[-2], key.shape[-2]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    dtype = _compute_dtype(query)
    # sum_{k=j+1..i} log f_k per (query, key) as a reverse cumulative sum of same-sign terms along each row, not
    # as the difference c_i - c_j of prefix sums, which loses float32's digits once c grows large (long S)
    visible = causal_mask(L, S, query.device)
    terms = log_forget.to(dtype)[..., None, :].masked_fill(~visible, 0.0)  # (B, H, L, S): log f_k for k <= i
    forget = F.pad(terms.flip(-1).cumsum(-1).flip(-1)[..., 1:], (0, 1)).masked_fill(~visible, float("-inf"))
    scores = (query.to(dtype) @ key.to(dtype).transpose(-1, -2)) * scale + forget + _as(bias, dtype)
    weights = torch.softmax(scores, dim=-1)
    out = (weights @ value.to(dtype)).to(value.dtype)
    return (out, weights.to(query.dtype)) if return_weights else out


def stickbreaking_attention(query: Tensor, key: Tensor, value: Tensor, *, scale: float | None = None,
                            bias: Tensor | float = 0.0, attend_current: bool = False, return_weights: bool = False):
    """Stick-breaking attention. query (B, H, L, E), key (B, H, S, E), value (B, H, S, Ev); bias: added to the
    scores z (broadcastable to (B, H, L, S), e.g. a position prior).

    log A_ij = logsigmoid(z_ij) + sum_{j<k<=i'} logsigmoid(-z_ik) over the visible keys k, with z = scale q.k;
    visible means k < i (the query's own position does not take part, as in the authors' reference), or k <= i
    with attend_current=True. The sum over nearer keys is a reverse cumulative sum along the keys. A query with
    no visible key (the first, by default) gets zero weights and a zero output.
    """
    L, S = query.shape[-2], key.shape[-2]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    dtype = _compute_dtype(query)
    z = (query.to(dtype) @ key.to(dtype).transpose(-1, -2)) * scale + _as(bias, dtype)
    visible = causal_mask(L, S, query.device, include_current=attend_current)
    log_beta = F.logsigmoid(z).masked_fill(~visible, float("-inf"))
    log_keep = F.logsigmoid(-z).masked_fill(~visible, 0.0)
    nearer = log_keep.flip(-1).cumsum(-1).flip(-1)  # sum over k >= j ...
    nearer = F.pad(nearer[..., 1:], (0, 1))         # ... shifted to k > j (no subtraction, no cancellation)
    weights = torch.exp(log_beta + nearer)
    out = (weights @ value.to(dtype)).to(value.dtype)
    return (out, weights.to(query.dtype)) if return_weights else out
