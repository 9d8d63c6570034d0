"""The attention modes, one record each: what a mode uses, and so which options apply to it.

Everything that lists, parses or validates modes reads :data:`RECORDS`: the names (``MODES``: the functional
form's; ``LAYER_MODES``: the module's, with the learned-recency baselines), which are views of the table read
at each use. Which options a mode uses is said by each option's record (:mod:`boltzmann_attention.options`),
from the mode's fields, so that an option a mode does not use is refused rather than silently ignored. Adding a
mode is adding its record to :data:`RECORDS`: a closed form of the field gives its ``weights`` function, and the
layer, the training config, the CLI and ``convert`` take it from there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from . import mta, recency


@dataclass(frozen=True)
class Mode:
    """One attention mode.

    field: the query-key score enters the weights (as the Ising field h, or as softmax's score); couplings:
    pairwise couplings J between keys; three_body: three-body couplings K; field_bias: a learnable field bias
    per head; recency: a learned-recency softmax baseline (:mod:`boltzmann_attention.recency`), offered by the
    module only; convolution: a softmax of scores mixed by a learned key-query convolution
    (:mod:`boltzmann_attention.mta`), module only; forget_gate: the module computes a per-head forget gate from
    its input (kept in a decoding cache as 'log_forget'); attend: for a module-only mode, ``attend(q, k, v, state,
    bias, return_weights)``, its attention with ``state`` {'log_forget': (B, H, S) or None, 'rows': the queries
    its convolution reads, the cached ones first, 'kernel': the convolution's (H, cq, ck) or None} and bias the
    position prior added to the scores; softmax: the weights are SDPA's softmax of the scores; weights:
    for a closed form, ``weights(h, J, mask)``, the weights from the field h (..., L, S), the couplings J
    ((H, S, S), or None for a mode without) and the mask ((..., L, S) bool, True where the key takes part, or
    None), before the mask is applied (mode 'h': sigmoid(2h), the marginal of a free spin). A mode with couplings
    and no closed form has Ising marginals, which a method computes.
    """

    name: str
    summary: str
    field: bool = True
    couplings: bool = False
    three_body: bool = False
    field_bias: bool = False
    recency: bool = False
    convolution: bool = False
    softmax: bool = False
    weights: Callable | None = None
    forget_gate: bool = False
    attend: Callable | None = None

    def __post_init__(self):
        if self.weights is not None and (self.three_body or self.module_only or self.softmax):
            raise ValueError(f"mode {self.name!r}: a closed form is for a mode without three-body couplings, recency, "
                             "convolution or softmax")
        if (self.attend is not None) != self.module_only:
            raise ValueError(f"mode {self.name!r}: a module-only mode (recency, convolution) gives its attend "
                             "function, and no other mode does")

    @property
    def module_only(self) -> bool:
        """Whether only the module offers it (its parameters are the module's: a forget gate, a kernel)."""
        return self.recency or self.convolution

    @property
    def marginals(self) -> bool:
        """Whether its weights are Ising marginals computed by a method (else a closed form or a softmax)."""
        return (self.couplings or self.three_body) and self.weights is None

    @property
    def window(self) -> bool:
        """Whether it can take the coupled window: Ising marginals of pairwise couplings, no three-body terms."""
        return self.marginals and not self.three_body


def _free_spin(field: torch.Tensor, couplings, mask) -> torch.Tensor:
    return torch.sigmoid(2 * field)  # = (tanh(h) + 1) / 2, exact for independent spins


def _one_step(field: torch.Tensor, couplings: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """sigmoid(2 (h_j + sum_k J_jk m0_k)), m0 = tanh(h) on the present keys: one mean-field step from the free
    spins, which mixes neighbouring scores through J and solves no Ising system."""
    m0 = torch.tanh(field) if mask is None else torch.tanh(field) * mask
    if couplings.dim() == 5 and couplings.shape[-3] == 1:  # one J per sequence and head, (B, H, 1, S, S)
        return torch.sigmoid(2 * (field + m0 @ couplings.squeeze(-3)))
    if couplings.dim() == 5:  # a J per query row, (B, H, L, S, S): couplings from content
        return torch.sigmoid(2 * (field + (m0.unsqueeze(-2) @ couplings).squeeze(-2)))
    return torch.sigmoid(2 * (field + m0 @ couplings))  # (..., H, L, S) @ (H, S, S); J symmetric


def _forgetting(q, k, v, state: dict, bias, return_weights: bool):
    return recency.forgetting_attention(q, k, v, state["log_forget"], bias=bias, return_weights=return_weights)


def _stickbreaking(q, k, v, state: dict, bias, return_weights: bool):
    return recency.stickbreaking_attention(q, k, v, bias=bias, return_weights=return_weights)


def _convolved(q, k, v, state: dict, bias, return_weights: bool):
    """The convolution reads the cached queries' rows too; their rows are computed and dropped."""
    rows, L = state["rows"], q.shape[-2]
    if isinstance(bias, torch.Tensor):
        bias = torch.nn.functional.pad(bias, (0, 0, rows.shape[-2] - L, 0))
    result = mta.multi_token_attention(rows, k, v, state["kernel"], bias=bias, return_weights=return_weights)
    return tuple(r[..., -L:, :] for r in result) if return_weights else result[..., -L:, :]


RECORDS: dict[str, Mode] = {m.name: m for m in (
    Mode("softmax", "F.scaled_dot_product_attention itself", softmax=True),
    Mode("h", "sigmoid attention, sigmoid(2h), closed form", field_bias=True, weights=_free_spin),
    Mode("J", "couplings only: the weights do not depend on the input", field=False, couplings=True,
         field_bias=True),
    Mode("h+J", "Boltzmann attention", couplings=True, field_bias=True),
    Mode("h+K", "three-body couplings", three_body=True, field_bias=True),
    Mode("h+J+K", "pairwise and three-body couplings", couplings=True, three_body=True, field_bias=True),
    Mode("h+J-step", "one mean-field step from the free spins, sigmoid(2(h + J tanh h)): the control that mixes "
         "neighbouring scores without Ising inference", couplings=True, field_bias=True, weights=_one_step),
    Mode("fox", "forgetting attention (module only)", recency=True, forget_gate=True, attend=_forgetting),
    Mode("stickbreaking", "stick-breaking attention (module only)", recency=True, attend=_stickbreaking),
    Mode("mta", "multi-token attention: softmax of the scores convolved over neighbouring keys and queries (module "
         "only)", convolution=True, attend=_convolved),
)}

class Names(Sequence):
    """The names of the modes whose record passes ``keep``, in table order, read from :data:`RECORDS` at each
    use (so a mode added to the table is in every list). Compares equal to the tuple of its names."""

    def __init__(self, keep: Callable[[Mode], bool]):
        self._keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(n for n, m in RECORDS.items() if self._keep(m))

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __hash__(self):
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


LAYER_MODES = Names(lambda m: True)
MODES = Names(lambda m: not m.module_only)
RECENCY_MODES = Names(lambda m: m.recency)
WINDOW_MODES = Names(lambda m: m.window)


def get(name, choices: Sequence[str] = LAYER_MODES) -> Mode:
    """The record of mode ``name``; ValueError naming the choices for an unknown one."""
    if not isinstance(name, str) or name not in choices:
        raise ValueError(f"unknown mode {name!r}; choose one of {tuple(choices)}")
    return RECORDS[name]


__all__ = ["LAYER_MODES", "MODES", "RECENCY_MODES", "RECORDS", "WINDOW_MODES", "Mode", "Names", "get"]
