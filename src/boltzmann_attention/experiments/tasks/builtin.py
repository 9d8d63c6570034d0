"""The package's tasks: Tiny Shakespeare, balanced brackets and find-the-block."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import blocks
from .. import data as datasets
from .record import TaskRecord, accuracy_metrics, language_model_metrics


class ShakespeareTask:
    """Tiny Shakespeare, next character: random training windows, fixed evenly spaced validation windows."""

    test = None

    def __init__(self, cfg):
        self.T = cfg.data.T
        self.text = datasets.ShakespeareData()
        self.vocab = self.text.vocab  # characters <-> tokens
        self.vocab_size = self.vocab.size
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
    name="brackets", build=BracketTask, evaluate=accuracy_metrics, headline=("test", "accuracy"), head="position",
    options=("num_fillers", "train_sequences", "min_fill", "max_fill", "open_probability", "deduplicate"),
    check=_check_brackets, extra=lambda data: {f"{split}_in_train": v for split, v in data.in_train.items()},
    plot={"metric": "accuracy", "split": "test", "scale": 100.0, "ylabel": "test accuracy (%)",
          "diff": "points", "dlabel": "difference to softmax (points)", "paper_on": "metric"})

BLOCKS = TaskRecord(
    name="blocks", build=BlockTask, evaluate=_block_metrics, headline=("test", "error"),
    options=("block_size", "query_size", "num_blocks", "conjunction", "answer"), check=_check_blocks)
