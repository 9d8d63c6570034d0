"""What a trained model's window couplings add beyond a fixed field per slot.

Given the other keys, the log-odds that window key i - a is attended is 2 (h_a - R_a) + 4 sum_b J_ab n_b
(n = (1 + s) / 2, R_a = sum_b J_ab): -R_a is a per-slot field, which a learned relative-position bias also
gives, and only the last term is co-attention (:func:`...coupled_window.slot_field`). Three versions of each
coupled-window layer, on the same inputs:

    exact        the layer as trained
    field only   sigmoid(2 (h - R_a)) on the window: the couplings replaced by their per-slot field
    uncoupled    sigmoid(2 h): the couplings removed

Per layer and head, on validation windows, :func:`decompose` measures how much of the couplings' effect on the
weights the field-only version explains, 1 - sum (a - a_field)^2 / sum (a - a_uncoupled)^2 over the window's
keys (1: the couplings act as a position bias; 0: their effect is all co-attention), and the model's validation
loss with every coupled window in each version.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor, nn

from .. import modes
from ..attention import BoltzmannAttention
from ..coupled_window import band_index, slot_field
from ..couplings import WindowCouplings
from .train import Analysis

__all__ = ["ANALYSIS", "VERSIONS", "coupled_windows", "decompose", "without_couplings"]

VERSIONS = ("field only", "uncoupled")
ANALYSIS_WINDOWS = 64  # validation windows for the weights (the losses use every validation window)


def coupled_windows(model: nn.Module) -> list[BoltzmannAttention]:
    """The model's attention layers with window couplings, in order."""
    return [m for m in model.modules()
            if isinstance(m, BoltzmannAttention) and isinstance(m.couplings, WindowCouplings)]


class _FieldOnly(nn.Module):
    """A slot bias (or none) plus the couplings' per-slot field, in place of a layer's slot bias."""

    def __init__(self, slot_bias: nn.Module | None, couplings: Tensor):
        super().__init__()
        self.slot_bias, self.couplings = slot_bias, couplings

    def forward(self, L: int, S: int) -> Tensor:
        field = slot_field(self.couplings, L, S, S - L)  # the layer is causal: queries are the last L keys
        return field if self.slot_bias is None else self.slot_bias(L, S) + field


@contextmanager
def without_couplings(model: nn.Module, version: str):
    """Within the block, every coupled-window layer of ``model`` is sigmoid attention on its own fields, with the
    couplings' per-slot field added (``"field only"``) or not (``"uncoupled"``); restored on exit."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
    saved = [(layer, layer.mode, layer.couplings, layer.coupling_window, layer.slot_bias)
             for layer in coupled_windows(model)]
    try:
        for layer, _, couplings, _, slot_bias in saved:
            if version == "field only":
                layer.slot_bias = _FieldOnly(slot_bias, couplings().detach())
            layer.mode, layer.couplings, layer.coupling_window = "h", None, None
        yield model
    finally:
        for layer, mode, couplings, window, slot_bias in saved:
            layer.mode, layer.couplings, layer.coupling_window, layer.slot_bias = mode, couplings, window, slot_bias


@torch.no_grad()
def decompose(model: nn.Module, task, windows: int = ANALYSIS_WINDOWS) -> dict | None:
    """The decomposition of the module docstring for a trained model of a Shakespeare ``task``, or None when it
    has no coupled window: {"layers": per layer, per head, "explained" (None for a head whose couplings change
    nothing), the mean |a - a_field| and |a - a_uncoupled| over the window's keys ("field_only_error",
    "coupling_effect") and their mean squares ("field_only_square", "coupling_square": pooled over heads or
    runs, 1 - sum field_only_square / sum coupling_square is the explained share of the pool); "loss":
    validation loss per version, "exact" included; "windows": how many validation windows gave the weights}."""
    layers = coupled_windows(model)
    if not layers:
        return None
    was_training = model.training
    model.eval()
    inputs = {}
    hooks = [layer.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
             for i, layer in enumerate(layers)]
    try:
        model(task.val[0][:windows])
    finally:
        for hook in hooks:
            hook.remove()
    out = []
    for i, layer in enumerate(layers):
        x = inputs[i]
        exact = layer(x, need_weights=True)[1]
        versions = {}
        for version in VERSIONS:
            with without_couplings(layer, version):
                versions[version] = layer(x, need_weights=True)[1]
        L = x.shape[1]
        index, valid = band_index(L, L, layer.coupling_window)
        band = torch.zeros(L, L, dtype=torch.bool).scatter(-1, index, valid)  # the window's keys
        field_error = (exact - versions["field only"])[..., band]   # (B, H, keys)
        effect = (exact - versions["uncoupled"])[..., band]
        explained = 1 - field_error.square().sum((0, 2)) / effect.square().sum((0, 2))  # nan: no effect
        out.append({"explained": [None if e != e else e for e in explained.tolist()],
                    "field_only_error": field_error.abs().mean((0, 2)).tolist(),
                    "coupling_effect": effect.abs().mean((0, 2)).tolist(),
                    "field_only_square": field_error.square().mean((0, 2)).tolist(),
                    "coupling_square": effect.square().mean((0, 2)).tolist()})
    loss = {"exact": task.evaluate(model)["loss"]}
    for version in VERSIONS:
        with without_couplings(model, version):
            loss[version] = task.evaluate(model)["loss"]
    model.train(was_training)
    return {"layers": out, "loss": loss, "windows": min(windows, len(task.val[0]))}


def _applies(cfg) -> bool:
    """A language model with coupled windows."""
    a = cfg.attention
    return cfg.data.task == "shakespeare" and a.coupling_window is not None and modes.get(a.mode).couplings


def _current(recorded) -> bool:
    """Recorded with the mean squares (older results have only the mean absolute differences)."""
    return all("coupling_square" in x for x in recorded["layers"])


# the measurement as a run's analysis: a study that reads it names it in its grids
ANALYSIS = Analysis("coattention", decompose, applies=_applies, current=_current)
