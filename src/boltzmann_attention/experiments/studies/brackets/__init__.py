"""Bracket matching with headroom: a bracket task hard enough to rank the mechanisms. Profiles
``brackets-calibration`` (the difficulty, calibrated on softmax over the ladder ``SETTINGS``) and
``brackets-hard`` (the mechanisms on the chosen setting, in three stages: each mode's learning rate, the grid,
and the lr without the FFN), and their report.

The difficulty is a set of options of the task (``TrainConfig`` fields ``train_sequences``,
``min_fill``/``max_fill``, ``open_probability`` and ``deduplicate``; see ``experiments.data.generate_brackets``),
the old generator being their defaults. The rules of each stage and the measurements behind each choice are in
``protocol.md`` (the report quotes it); the decisions made from runs (the chosen setting, the lrs added beyond
a grid's edge, diverged lrs, each mode's best lr) in ``decisions.json``, handed to the grids and the report as
:class:`Decisions`. The grids are in ``grids.py``, the report in ``report.py``.
"""

from __future__ import annotations

from .grids import READS, Decisions, calibration_grids, hard_grids
from .report import owns, report

PROFILES = {"brackets-calibration": calibration_grids, "brackets-hard": hard_grids}
HELP = {"brackets-calibration": "the bracket task's difficulty calibrated on softmax",
        "brackets-hard": "every mode on the chosen bracket setting, each at its own lr"}

__all__ = ["HELP", "PROFILES", "READS", "Decisions", "owns", "report"]
