"""Multi-token attention's key-query convolution (MTA; Golovneva, Wang, Weston and Sukhbaatar, 2025,
arXiv 2504.00927): softmax attention whose scores are mixed over neighbouring keys and queries by a learned
kernel before the softmax. It is the field's control for what couplings between keys could add by mixing
neighbouring scores alone.

For query i (causal: keys j <= i) and a kernel theta of shape (cq, ck) per head,

    z_ij  = scale * q_i . k_j                  (0 where j > i: the paper's Mask_0, and 0 for queries before the first)
    z'_ij = sum_{a = 0..cq-1} sum_{t = 0..ck-1} theta_{a, t} z_{i-a, j+t-c},   c = (ck - 1) // 2
    A_ij  = softmax_j(z'_ij + bias_ij)  over the keys j <= i

so a query mixes its own and its cq - 1 predecessors' scores (never a later query's), of the keys around j
(offsets -c .. ck - 1 - c, the paper's range), and a masked score enters as 0. ``bias`` (a position prior) is
added after the convolution. At identity (theta_{0, c} = 1, the rest 0) it is softmax attention. The paper's
head-mixing convolution and group normalisation are not part of it. Scores and weights are computed in float32
for half-precision inputs (float64 stays float64) and returned in the input's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .recency import causal_mask


class KeyQueryKernel(nn.Module):
    """The learned kernel theta, (H, cq, ck), at identity: theta[:, 0, (ck - 1) // 2] = 1, the rest 0 (the
    module then computes softmax attention). Exempt from weight decay (:func:`~boltzmann_attention.parameter_groups`),
    which would pull it from the identity towards zero scores."""

    no_weight_decay = True

    def __init__(self, num_heads: int, queries: int, keys: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_heads, queries, keys))
        with torch.no_grad():
            self.weight[:, 0, (keys - 1) // 2] = 1.0

    def extra_repr(self) -> str:
        H, cq, ck = self.weight.shape
        return f"num_heads={H}, queries={cq}, keys={ck}"


def multi_token_attention(query: Tensor, key: Tensor, value: Tensor, kernel: Tensor, *, scale: float | None = None,
                          bias: Tensor | float = 0.0, return_weights: bool = False):
    """Causal softmax attention of convolved scores. query (B, H, L, E): the last L of the S key positions (SDPA's
    bottom-right alignment; scores of queries before the first given one enter as 0, so pass the cq - 1 queries
    before them to get a later block's rows of the whole sequence); key (B, H, S, E); value (B, H, S, Ev);
    kernel (H, cq, ck); bias broadcastable to (B, H, L, S). Returns (B, H, L, Ev) [and the weights]."""
    L, S = query.shape[-2], key.shape[-2]
    H, cq, ck = kernel.shape
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    dtype = torch.promote_types(query.dtype, torch.float32)
    visible = causal_mask(L, S, query.device)
    scores = ((query.to(dtype) @ key.to(dtype).transpose(-1, -2)) * scale).masked_fill(~visible, 0.0)
    # conv2d correlates: flipping theta along queries makes row a of the flipped kernel read query i - a
    c = (ck - 1) // 2
    padded = F.pad(scores, (c, ck - 1 - c, cq - 1, 0))
    batch = scores.shape[:-3]
    mixed = F.conv2d(padded.reshape(-1, H, *padded.shape[-2:]), kernel.to(dtype).flip(1).unsqueeze(1), groups=H)
    mixed = mixed.view(*batch, H, L, S) + (bias.to(dtype) if isinstance(bias, Tensor) else bias)
    weights = torch.softmax(mixed.masked_fill(~visible, float("-inf")), dim=-1)
    out = (weights @ value.to(dtype)).to(value.dtype)
    return (out, weights.to(query.dtype)) if return_weights else out


__all__ = ["KeyQueryKernel", "multi_token_attention"]
