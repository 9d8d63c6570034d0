"""A task's record (:class:`TaskRecord`) and the metrics several tasks share."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

IGNORE = -100  # the target of a position that is not scored


def _nothing(_) -> None:
    return None


def _no_extra(_) -> dict:
    return {}


@dataclass(frozen=True)
class TaskRecord:
    """One task.

    build(cfg): the task's data for a TrainConfig (deterministic in cfg.seed and the data options);
    evaluate(model, tokens, targets, batch_size): the metrics of a model on one split, a dict of floats;
    headline: (split, metric) that a run is judged by; splits: the splits a finished run is evaluated on;
    head: the model's output head ("lm": a token per position; "position": a class per position);
    options: the DataConfig fields that only this task reads (any other task must keep their defaults);
    check(data_config): ValueError for options out of range, run once when the config is checked;
    extra(data): what the result records about the data besides the metrics (under "data"; empty: nothing);
    plot: how reports plot the headline against softmax ({metric, split, scale, ylabel, diff, dlabel,
    paper_on}; diff "relative": percent improvement, "points": the difference; None: not plotted).
    """

    name: str
    build: Callable[[Any], Any]
    evaluate: Callable[[torch.nn.Module, Tensor, Tensor, int], dict]
    headline: tuple[str, str]
    splits: tuple[str, ...] = ("val", "test")
    head: str = "lm"
    options: tuple[str, ...] = ()
    check: Callable[[Any], None] = _nothing
    extra: Callable[[Any], dict] = _no_extra
    plot: dict | None = field(default=None, compare=False)


def _exp(x: float) -> float:
    return math.inf if x > 709.0 else math.exp(x)  # a perplexity beyond float64 is inf, not an OverflowError


def token_losses(model, x: Tensor, y: Tensor, batch_size: int):
    """Per batch: the logits and the cross-entropy of every scored position (0 where unscored)."""
    for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
        out = model(xb)
        yield out, yb, torch.nn.functional.cross_entropy(out.transpose(1, 2), yb, ignore_index=IGNORE,
                                                         reduction="none")


def language_model_metrics(model, x: Tensor, y: Tensor, batch_size: int) -> dict:
    """Loss and perplexity over all positions, and at the last position only."""
    nll_sum = nll_last = count = 0.0
    for _, yb, nll in token_losses(model, x, y, batch_size):
        labelled = yb != IGNORE
        nll_sum += float(nll[labelled].sum())
        count += int(labelled.sum())
        nll_last += float(nll[:, -1].sum())
    loss, last = nll_sum / count, nll_last / len(x)
    return {"loss": loss, "ppl": _exp(loss), "loss_last": last, "ppl_last": _exp(last)}


def accuracy_metrics(model, x: Tensor, y: Tensor, batch_size: int) -> dict:
    """Loss and accuracy over the scored positions ('accuracy'), and the fraction of sequences with every scored
    position right ('accuracy_sequence')."""
    nll_sum = correct = count = whole = 0.0
    for out, yb, nll in token_losses(model, x, y, batch_size):
        labelled = yb != IGNORE
        nll_sum += float(nll[labelled].sum())
        count += int(labelled.sum())
        right = out.argmax(-1) == yb
        correct += int((right & labelled).sum())
        whole += int((right | ~labelled).all(dim=1).sum())
    return {"loss": nll_sum / count, "accuracy": correct / count, "accuracy_sequence": whole / len(x)}
