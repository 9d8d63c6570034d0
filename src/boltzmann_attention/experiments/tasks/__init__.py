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

from .builtin import BLOCKS, BRACKETS, SHAKESPEARE
from .match3 import MATCH3
from .record import IGNORE, TaskRecord, accuracy_metrics, language_model_metrics

REGISTRY: dict[str, TaskRecord] = {r.name: r for r in (SHAKESPEARE, BRACKETS, BLOCKS, MATCH3)}

__all__ = ["IGNORE", "REGISTRY", "TaskRecord", "accuracy_metrics", "get", "language_model_metrics"]


def get(name: str) -> TaskRecord:
    """The record of task ``name``; ValueError naming the known tasks."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(REGISTRY)}") from None
