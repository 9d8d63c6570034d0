"""Co-attention or learning speed? Profile ``twin``: the coupled window against twins whose slot field learns
as fast, and the couplings on top of RoPE.

The priors study's real-size model at its recipe and lr 3e-3; what changes between arms is the attention, the
position scheme and the lr multiplier of the part that stands in for another (``coupling_lr_multiplier`` for
J, ``slot_bias_lr_multiplier`` for a slot bias and its pair table). The stages and rules are in
``protocol.md``, the decisions from runs in ``decisions.json`` (:class:`Decisions`); the grids are in
``grids.py`` and the report in ``report.py``. Runs of the priors study with the same config count as this
study's (its archive, ``READS``).
"""

from __future__ import annotations

from .grids import Decisions, twin_grids
from .report import owns, report

READS = ("priors",)
PROFILES = {"twin": twin_grids}
HELP = {"twin": "the coupled window against twins whose slot field learns as fast (tuned slot-bias lr, a pair-table "
                "slot field), and couplings on top of RoPE, at T = 256"}

__all__ = ["Decisions", "HELP", "PROFILES", "READS", "owns", "report"]
