"""Co-attention where it is required: profile ``conjunction``, find the block with the conjunction of its query
letters necessary by construction, static and content-dependent couplings against the single-score arms, MTA
and the one-step control.

A small 4-layer model on the task of :mod:`...blocks` (``conjunction``, ``answer="marker"``); the calibration
that sets the budget, each arm's lr, its seeds and the decision rule are in ``protocol.md``, the decisions from
runs in ``decisions.json`` (:class:`Decisions`); the grids are in ``grids.py`` and the report in ``report.py``.
"""

from __future__ import annotations

from ...arms import staged_profile
from . import grids
from .grids import Decisions
from .report import owns, report

PROFILES = {"conjunction": staged_profile(grids)}
HELP = {"conjunction": "find the block by a conjunction (no single letter names it): content-dependent couplings "
                       "against static ones, the one-step control, MTA and the single-score arms"}

__all__ = ["Decisions", "HELP", "PROFILES", "owns", "report"]
