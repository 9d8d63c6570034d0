"""What a trained model's couplings do on a task that needs two keys together: find-the-block with marker answers
(the conjunction study's analysis, ``ANALYSIS``) and Match3 (the match3 study's, ``MATCH3``).

Two measurements of every run with couplings, on the fixed validation and test sets:

* **J = 0 at evaluation**: the error and loss with every coupled layer turned into sigmoid attention on its own
  fields (mode 'h': the couplings removed, the field, its bias and the position priors kept). What the trained
  couplings add to the trained model.
* **The sign between the two query letters**: at the answer query (the last position), the coupling J_jk between
  the keys j, k of the two query letters in the target block, per layer and head: its mean over the sequences,
  and the share of sequences in which it is positive (ferromagnetic: the two matches are attended together, the
  sign that solves the task) or negative. Static couplings give f(|j - k|); couplings from content are computed
  from the layer's own keys and queries on each sequence. Pairs further apart than the couplings' range count
  as zero; ``within_range`` is the share of sequences where they are not. For Match3 the pair is, in each
  positive test sequence, the first pair of keys that completes the query (``tasks.match3.answer_pair``); the
  negative sequences have none.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor, nn

from .. import modes
from ..attention import BoltzmannAttention
from ..couplings import ContentCouplings, RelativeCouplings, WindowCouplings
from . import blocks
from .tasks import match3
from .train import Analysis

__all__ = ["ANALYSIS", "MATCH3", "coupled_layers", "measure", "measure_match3", "query_pair", "without_couplings"]


def coupled_layers(model: nn.Module) -> list[BoltzmannAttention]:
    """The model's attention layers with pairwise couplings, in order."""
    return [m for m in model.modules() if isinstance(m, BoltzmannAttention) and m.couplings is not None]


@contextmanager
def without_couplings(model: nn.Module):
    """Within the block, every coupled layer of ``model`` is sigmoid attention on its own fields; restored on exit."""
    saved = [(layer, layer.mode, layer.couplings, layer.coupling_window) for layer in coupled_layers(model)]
    try:
        for layer, *_ in saved:
            layer.mode, layer.couplings, layer.coupling_window = "h", None, None
        yield model
    finally:
        for layer, mode, couplings, window in saved:
            layer.mode, layer.couplings, layer.coupling_window = mode, couplings, window


def query_pair(inputs: Tensor) -> Tensor:
    """(count, 2) int: the positions in each (left-padded) sequence of the first two query letters inside the
    target block, read from its text (:func:`..blocks.parse`)."""
    out = []
    for row in inputs:
        letters, markers, query = blocks.parse(row)
        start = len(blocks.text(row)) - len(blocks.text(row).lstrip("_"))
        target = next(i for i, b in enumerate(letters) if set(query) <= set(b))
        offset = start + sum(len(b) + 1 for b in letters[:target]) + 1  # each block: its marker, then letters
        out.append([offset + letters[target].index(c) for c in query[:2]])
    return torch.tensor(out, dtype=torch.long)


def _answer_couplings(layer: BoltzmannAttention, x: Tensor, pair: Tensor) -> tuple[Tensor, Tensor]:
    """(count, H): J between the pair's keys at the last query of each sequence of x (the layer's input), and
    (count,) bool: whether the couplings reach the pair at all."""
    B, L, _ = x.shape
    c, j, k = layer.couplings, pair[:, 0], pair[:, 1]
    rows, distance = torch.arange(B), (j - k).abs()
    if isinstance(c, ContentCouplings):
        q, key = layer._heads(layer.query(x)), layer._heads(layer.key(x))  # before the rotary embedding
        J = c(key, q[:, :, -1:])[:, :, 0]                                     # (B, H, S, S) at the last query
        return J[rows, :, j, k], distance <= c.max_distance
    if isinstance(c, WindowCouplings):  # slot a = the key a positions before the query
        a, b = L - 1 - j, L - 1 - k
        inside = (a < c.window) & (b < c.window)
        table = c()
        J = table[:, a.clamp(max=c.window - 1), b.clamp(max=c.window - 1)].T
        return torch.where(inside[:, None], J, 0.0), inside
    if isinstance(c, RelativeCouplings):
        inside = distance <= c.max_distance
        J = c.weight[:, (distance - 1).clamp(0, max(c.max_distance - 1, 0))].T if c.max_distance else \
            c.weight.new_zeros(B, c.weight.shape[0])
        return torch.where(inside[:, None], J, 0.0), inside
    return c(L)[:, j, k].T, torch.ones(B, dtype=torch.bool)  # full couplings: (H, S, S)


def measure(model: nn.Module, task) -> dict | None:
    """The two measurements of the module docstring for a trained model of a marker-answer blocks ``task``, or
    None when it has no coupled layer: {"uncoupled": {"val": metrics, "test": metrics}, "pair": per coupled
    layer {"mean": per head, "positive": per head, "negative": per head, "within_range": share}}."""
    return _measure(model, task, lambda x: (torch.arange(len(x)), query_pair(x)))


def measure_match3(model: nn.Module, task) -> dict | None:
    """:func:`measure` for a trained model of Match3, over its positive test sequences."""
    return _measure(model, task, lambda x: match3.answer_pair(x, task.data.modulus))


@torch.no_grad()
def _measure(model: nn.Module, task, pairs) -> dict | None:
    """``pairs(x)``: the rows of the test inputs x that have a pair, and the pair's positions in each."""
    layers = coupled_layers(model)
    if not layers:
        return None
    was_training = model.training
    model.eval()
    with without_couplings(model):
        uncoupled = {split: task.evaluate(model, split) for split in ("val", "test")}
    x = task.data.test[0]
    rows, pair = pairs(x)
    inputs = {}
    hooks = [layer.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
             for i, layer in enumerate(layers)]
    try:
        model(x)
    finally:
        for hook in hooks:
            hook.remove()
    out = []
    for i, layer in enumerate(layers):
        J, inside = _answer_couplings(layer, inputs[i][rows], pair)  # (count, H), (count,)
        J = J.float()
        out.append({"mean": J.mean(0).tolist(), "positive": (J > 0).float().mean(0).tolist(),
                    "negative": (J < 0).float().mean(0).tolist(), "within_range": float(inside.float().mean())})
    model.train(was_training)
    return {"uncoupled": uncoupled, "pair": out}


def _applies(cfg) -> bool:
    """find-the-block with marker answers, and a mode with pairwise couplings."""
    return cfg.data.task == "blocks" and cfg.data.answer == "marker" and modes.get(cfg.attention.mode).couplings


def _applies_match3(cfg) -> bool:
    """Match3, and a mode with pairwise couplings."""
    return cfg.data.task == "match3" and modes.get(cfg.attention.mode).couplings


# the measurements as runs' analyses: a study that reads one names it in its grids
ANALYSIS = Analysis("conjunction", measure, applies=_applies)
MATCH3 = Analysis("match3", measure_match3, applies=_applies_match3)
