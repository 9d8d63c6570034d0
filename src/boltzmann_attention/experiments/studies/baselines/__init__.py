"""Strong baselines: the field's initialisation, each mode at its own learning rate, training long enough, and
the nanoGPT check of the recipe. Profile ``baselines`` and its report.

Stages (the rules and the measurements behind each choice: ``protocol.md``, quoted by the report): 1. the
initialisation, torch against gpt2; 2. each mode's learning rate; 3. the training length (4000, 16000, 64000
steps); 4. the nanoGPT check; 5. the paper's grid under the strong recipe (``GRID_STEPS``); 6. the fair study
redone under it; 7. T = 24. Later stages use the earlier ones' decisions (:class:`Decisions`, from
``decisions.json``: the chosen init, the lrs added beyond the grid's edge, each mode's best lr). Every run uses
AdamW's per-tensor loop (``fused_optimizer=False``). The grids are in ``grids.py``, the report in
``report.py``.
"""

from __future__ import annotations

from .grids import READS, SETS_INIT, Decisions, baselines_grids
from .report import owns, report

PROFILES = {"baselines": baselines_grids}
HELP = {"baselines": "the strong-baselines study"}

__all__ = ["Decisions", "HELP", "PROFILES", "READS", "SETS_INIT", "owns", "report"]
