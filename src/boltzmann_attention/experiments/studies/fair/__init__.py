"""The fair-baselines study: what the couplings J add over sigmoid attention (mode h) once the field bias
is treated fairly. Profile ``fair`` and its report. The grids are in ``grids.py``, the report in
``report.py``.
"""

from __future__ import annotations

from .grids import fair_grids
from .report import owns, report

PROFILES = {"fair": fair_grids}
HELP = {"fair": "the fair-baselines study"}

__all__ = ["HELP", "PROFILES", "owns", "report"]
