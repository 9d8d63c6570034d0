"""Where co-attention is needed: profile ``blocks``, MTA's find-the-block task with relative couplings, the
one-step mean-field control, MTA and the single-score baselines.

A small 4-layer model on the task of :mod:`...blocks`; the calibration that sets the task's difficulty, each
arm's lr, its seeds and the decision rule are in ``protocol.md``, the decisions from runs in ``decisions.json``
(:class:`Decisions`); the grids are in ``grids.py`` and the report in ``report.py``.
"""

from __future__ import annotations

from .grids import Decisions, blocks_grids
from .report import owns, report

PROFILES = {"blocks": blocks_grids}
HELP = {"blocks": "find the block (MTA's task): relative couplings against the one-step control, MTA and the "
                  "single-score arms, after a calibration of the task's difficulty"}

__all__ = ["Decisions", "HELP", "PROFILES", "owns", "report"]
