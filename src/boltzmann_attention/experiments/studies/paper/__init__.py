"""The paper's tables and claims (arXiv:2606.12478): profiles ``quick`` and ``full``, and their report.

The report holds the measured tables next to the paper's numbers, then "Agreement with the paper", claim by
claim with paired t-tests over seeds, and "Extension past the paper" when Shakespeare runs with T > 14 exist.
It is also the report of any results folder that no other study claims (a plain ``sweep``). The paper's
numbers and claims live in ``experiments/claims.py``, where other studies check them on their own runs.
"""

from __future__ import annotations

from ...claims import PAPER, agreement_section, extension_section
from ...recipes import FIRST_RECIPE, with_field_bias
from ...report import (
    ReportContext,
    brackets_section,
    couplings_section,
    header_section,
    sampler_section,
    shakespeare_section,
)
from ...results import Results
from ...sweep import Grid, with_overrides

DEFAULT = True  # the report of any results folder that no other study owns

# ---------------------------------------------------------------------------------------------------- grids

def quick(field_bias: str, decisions: None = None) -> list[Grid]:
    """A smoke test of the pipeline: one seed, 1000 steps (its verdicts mean little)."""
    return with_field_bias([
        Grid(("shakespeare",), (4, 8), seeds=(0,), overrides={"steps": 1000, "eval_interval": 250}),
        Grid(("brackets",), (8,), seeds=(0,), overrides={"steps": 1000, "eval_interval": 250})], field_bias)


def full(field_bias: str, decisions: None = None) -> list[Grid]:
    """The paper's tables: both tasks over its windows, the bracket ablation without the FFN, the three-body
    modes, and Shakespeare past the paper (T = 16, 20, one seed); in the first recipe, as committed."""
    return with_overrides(with_field_bias([
        Grid(("shakespeare",), (4, 6, 8, 10, 12, 14)),
        Grid(("brackets",), (4, 6, 8, 10, 12, 14, 16)),
        Grid(("brackets",), (8, 12, 16), variant="noffn", overrides={"d_ff": 0}),
        Grid(("shakespeare", "brackets"), (8, 12), modes=("h+K", "h+J+K")),
        Grid(("shakespeare",), (16, 20), modes=("softmax", "h+J", "h"), seeds=(0,)),
    ], field_bias), **FIRST_RECIPE)


PROFILES = {"quick": quick, "full": full}
HELP = {"quick": "a smoke test (one seed, short runs; its verdicts mean little)", "full": "the paper's tables"}


# ---------------------------------------------------------------------------------------------------- report

def owns(res: Results) -> bool:
    """The paper's report is the default: it takes any results folder."""
    return True


def report(res: Results, context: ReportContext) -> list[str]:
    """Header, the sampler comparison if sampler-trained runs are present, the task tables with the paper's
    numbers, the learned couplings, and (for variant base) the paper's claims and the extension past it."""
    out = context.out
    lines = header_section(res, context.results_dir)
    lines += sampler_section(res)
    if "shakespeare" in res.tasks():
        lines += shakespeare_section(res, out, PAPER["shakespeare"])
    if "brackets" in res.tasks():
        lines += brackets_section(res, out, PAPER["brackets"])
    lines += couplings_section(res, out)
    if any(r.variant == "base" for r in res.runs):  # the paper's claims are checked on the base variant only
        lines += agreement_section(res)
        lines += extension_section(res)
    return lines
