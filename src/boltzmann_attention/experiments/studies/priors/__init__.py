"""Co-attention or a recency prior? Profile ``priors`` and its report.

The real-size model (:data:`...recipes.NANOGPT`: 4 layers, 4 heads, d_model 128, nanoGPT's CPU recipe) with
the field's position priors and learned-recency attentions beside the coupled window, so that what the
couplings add beyond a position prior is measured: each arm is a mode and a position scheme (``ARMS``), and
the decisive pair is the coupled window with a learned per-slot bias against sigmoid attention with the same
slot bias and no couplings. The stages, their rules and costs are in ``protocol.md``; the decisions made from
runs in ``decisions.json`` (:class:`Decisions`). The real-size study's softmax, h and window16 runs count as
this study's arms of the same names (its archive, ``READS``). The grids are in ``grids.py``, the report in
``report.py``.
"""

from __future__ import annotations

from .grids import READS, Decisions, priors_grids
from .report import owns, report

PROFILES = {"priors": priors_grids}
HELP = {"priors": "the coupled window against position priors (RoPE, ALiBi, slot bias) and learned recency "
                  "(FoX, stick-breaking), at equal steps and equal compute"}

__all__ = ["Decisions", "HELP", "PROFILES", "READS", "owns", "report"]
