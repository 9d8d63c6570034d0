"""Does J help in a real-size model? Profile ``realsize`` and its report.

nanoGPT's CPU configuration on Tiny Shakespeare (:data:`..recipes.NANOGPT`) with five attention variants
("arms", ``ARMS``): softmax, h, and three h+J arms (the coupled window ``window16``, and relative couplings of
range 8 solved by mean field, ``meanfield8``, and exactly by the banded transfer matrix, ``banded8``). Three
stages: each arm's learning rate at T = 64 (seed 0), three seeds at each arm's best lr, and T = 256 for
softmax, h and the fastest h+J arm. Every run also records its memory (``TrainConfig.memory_probe_steps``) and
a mean-field run its solver's non-convergence, which the report states.

The rules of each stage and the measurements behind each choice (step times, memory, cost) are in
``protocol.md``, which the report quotes; the decisions made from runs (the lrs added beyond an edge, diverged
lrs, each arm's best lr, the fastest arm) in ``decisions.json``, handed to the grids and the report as
:class:`Decisions`. ``experiments.benchmarks.training.time_steps`` measures step times side by side. The
grids are in ``grids.py``, the report in ``report.py``.
"""

from __future__ import annotations

from .grids import Decisions, realsize_grids
from .report import owns, report

PROFILES = {"realsize": realsize_grids}
HELP = {"realsize": "softmax, h and h+J in nanoGPT's CPU configuration"}

__all__ = ["Decisions", "HELP", "PROFILES", "owns", "report"]
