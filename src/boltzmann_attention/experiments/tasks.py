"""The tasks a model trains on, one record each: the only place that knows a task by name.

A :class:`TaskRecord` says how to build the task's data from a config, how to evaluate a model on a split, which
metric is its headline, which head the model needs, which data options are the task's own, and how reports
plot it. The training loop, the config's checks, the results' checks and the reports read the record; none of
them tests a task's name. A new task is one module that defines its record and one line in :data:`REGISTRY`
(``tests/test_add_a_task.py`` adds one).

The data a record builds has ``vocab_size``, ``val`` and ``test`` ((tokens, targets) pairs, ``test`` None when
the task has none) and ``batch(batch_size, generator)``, a training batch drawn with the run's generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from . import blocks
from . import data as datasets

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


def _token_losses(model, x: Tensor, y: Tensor, batch_size: int):
    """Per batch: the logits and the cross-entropy of every scored position (0 where unscored)."""
    for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
        out = model(xb)
        yield out, yb, torch.nn.functional.cross_entropy(out.transpose(1, 2), yb, ignore_index=IGNORE,
                                                         reduction="none")


def language_model_metrics(model, x: Tensor, y: Tensor, batch_size: int) -> dict:
    """Loss and perplexity over all positions, and at the last position only."""
    nll_sum = nll_last = count = 0.0
    for _, yb, nll in _token_losses(model, x, y, batch_size):
        labelled = yb != IGNORE
        nll_sum += float(nll[labelled].sum())
        count += int(labelled.sum())
        nll_last += float(nll[:, -1].sum())
    loss, last = nll_sum / count, nll_last / len(x)
    return {"loss": loss, "ppl": _exp(loss), "loss_last": last, "ppl_last": _exp(last)}


def position_metrics(model, x: Tensor, y: Tensor, batch_size: int) -> dict:
    """Loss and accuracy over the scored positions ('accuracy'), and the fraction of sequences with every scored
    position right ('accuracy_sequence')."""
    nll_sum = correct = count = whole = 0.0
    for out, yb, nll in _token_losses(model, x, y, batch_size):
        labelled = yb != IGNORE
        nll_sum += float(nll[labelled].sum())
        count += int(labelled.sum())
        right = out.argmax(-1) == yb
        correct += int((right & labelled).sum())
        whole += int((right | ~labelled).all(dim=1).sum())
    return {"loss": nll_sum / count, "accuracy": correct / count, "accuracy_sequence": whole / len(x)}


class ShakespeareTask:
    """Tiny Shakespeare, next character: random training windows, fixed evenly spaced validation windows."""

    test = None

    def __init__(self, cfg):
        self.T = cfg.data.T
        self.text = datasets.ShakespeareData()
        self.vocab_size = self.text.vocab.size
        self.val = self.text.val_windows(self.T, max_windows=cfg.data.eval_windows)

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.text.train_batch(batch_size, self.T, generator)


class BracketTask(datasets.BracketData):
    """Balanced brackets (:class:`..data.BracketData`), built from a config; batches from the fixed set."""

    def __init__(self, cfg):
        d = cfg.data
        super().__init__(d.T, seed=cfg.seed, num_fillers=d.num_fillers,
                         sizes=(d.train_sequences, *datasets.SIZES[1:]), min_fill=d.min_fill, max_fill=d.max_fill,
                         open_probability=d.open_probability, deduplicate=d.deduplicate)

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.train_batch(batch_size, generator)


class BlockTask(blocks.BlockData):
    """Find-the-block (:class:`..blocks.BlockData`), built from a config; batches drawn afresh."""

    def __init__(self, cfg):
        d = cfg.data
        super().__init__(d.T, d.block_size, d.query_size, d.num_blocks, conjunction=d.conjunction, answer=d.answer)

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.train_batch(batch_size, generator)


def _block_metrics(model, x: Tensor, y: Tensor, batch_size: int) -> dict:
    return blocks.answer_metrics(torch.cat([model(xb) for xb in x.split(batch_size)]), y, x)


def _check_brackets(d) -> None:
    datasets.word_pairs(d.T, d.min_fill, d.max_fill)  # some word length fits at this T


def _check_blocks(d) -> None:
    blocks.check_options(d.T, d.block_size, d.query_size, d.num_blocks, d.conjunction, d.answer)


SHAKESPEARE = TaskRecord(
    name="shakespeare", build=ShakespeareTask, evaluate=language_model_metrics, headline=("val", "ppl"),
    splits=("val",),
    plot={"metric": "ppl", "split": "val", "scale": 1.0, "ylabel": "validation perplexity",
          "diff": "relative", "dlabel": "improvement over softmax (%)", "paper_on": "difference"})

BRACKETS = TaskRecord(
    name="brackets", build=BracketTask, evaluate=position_metrics, headline=("test", "accuracy"), head="position",
    options=("num_fillers", "train_sequences", "min_fill", "max_fill", "open_probability", "deduplicate"),
    check=_check_brackets, extra=lambda data: {f"{split}_in_train": v for split, v in data.in_train.items()},
    plot={"metric": "accuracy", "split": "test", "scale": 100.0, "ylabel": "test accuracy (%)",
          "diff": "points", "dlabel": "difference to softmax (points)", "paper_on": "metric"})

BLOCKS = TaskRecord(
    name="blocks", build=BlockTask, evaluate=_block_metrics, headline=("test", "error"),
    options=("block_size", "query_size", "num_blocks", "conjunction", "answer"), check=_check_blocks)

REGISTRY: dict[str, TaskRecord] = {r.name: r for r in (SHAKESPEARE, BRACKETS, BLOCKS)}


def get(name: str) -> TaskRecord:
    """The record of task ``name``; ValueError naming the known tasks."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(REGISTRY)}") from None
