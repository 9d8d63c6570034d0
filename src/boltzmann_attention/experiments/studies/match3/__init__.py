"""Co-attention on a task from the literature: profile ``match3``, Match3 (is there a pair of earlier keys j < k with
x_T + x_j + x_k = 0 mod M), static and content-dependent couplings against the single-score arms, MTA and the
one-step control.

A small 4-layer model on the task of :mod:`...tasks.match3`; the calibration that sets the budget, each arm's lr,
its seeds and the decision rule, and the probe of the coupled arms if the calibration runs out, are in
``protocol.md``, the decisions from runs in ``decisions.json`` (:class:`Decisions`); the grids are in ``grids.py``
and the report in ``report.py``.
"""

from __future__ import annotations

from ...arms import staged_profile
from . import grids
from .grids import Decisions
from .report import owns, report

_staged = staged_profile(grids)


def _profile(field_bias: str, d: Decisions) -> list:
    """The calibration, the stages as they are decided, and the probe (protocol.md)."""
    return _staged(field_bias, d) + grids.probe_grids(d)


PROFILES = {"match3": _profile}
HELP = {"match3": "Match3, a pair of keys needed by definition: content-dependent couplings against static ones, "
                  "the one-step control, MTA and the single-score arms"}

__all__ = ["Decisions", "HELP", "PROFILES", "owns", "report"]
