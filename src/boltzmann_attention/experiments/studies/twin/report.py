"""The twin study's report (filled in as its stages run)."""

from __future__ import annotations

from ...report import ReportContext, header_section, protocol_sections
from ...results import Results
from .grids import PREFIX, PRIORS_PREFIX


def owns(res: Results) -> bool:
    """True when the runs are this study's: some of its own variants, the rest the priors study's configs."""
    runs = list(res.all_runs)
    return any(r.variant.startswith(PREFIX) for r in runs) and all(
        r.variant.startswith((PREFIX, PRIORS_PREFIX)) for r in runs)


def report(res: Results, context: ReportContext) -> list[str]:
    lines = header_section(res, context.results_dir)
    return lines + [protocol_sections(context.protocol)[""], ""]
