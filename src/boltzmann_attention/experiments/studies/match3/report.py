"""The Match3 study's rules applied to its runs, and its report: the calibration, then the stages."""

from __future__ import annotations

from ...arms import calibration_note, calibration_stopped
from ...conjunction import MATCH3
from ...report import ReportContext, every_run_is
from ...results import Results
from ...staged_report import Staged, from_grids, study_report
from ...tables import fmt_num, md_table
from ...tasks import match3
from . import grids
from .grids import (
    ARMS,
    CALIBRATION_ARMS,
    PREFIX,
    REFERENCE_LR,
    SETTINGS,
    SOLVED,
    TUNING_SEED,
    Decisions,
    Setting,
    calibration_outcome,
    variant,
)

WHERE = "studies/match3/decisions.json"


def owns(res: Results) -> bool:
    """True when every run is of this study's variants."""
    return every_run_is(res, PREFIX)


def values(res: Results, arm: str, s: Setting, lr: float, metric: str, split: str) -> dict[int, float]:
    return ARMS[arm].values(res, "match3", variant(arm, s, lr), s.T, metric, split)


def premise(s: Setting) -> tuple[float, float]:
    """Test accuracy of the best rule from the query alone, and from the query and one key (chance: 1/2)."""
    return match3.shortcut_accuracy(match3.Match3Data(s.T, s.modulus))


def _pct(v: float | None) -> str:
    return fmt_num(None if v is None else 100 * v, 1)


def calibration_section(res: Results, d: Decisions) -> tuple[list[str], bool]:
    """The calibration's table and the rule's note, and whether the calibration stopped the study."""
    rows, notes, stopped = [], [], False
    started = d.started(SETTINGS, CALIBRATION_ARMS)
    for i, (index, s, _) in enumerate(started):
        errors = {arm: values(res, arm, s, REFERENCE_LR, "error", "val").get(TUNING_SEED) for arm in CALIBRATION_ARMS}
        outcome = calibration_outcome(list(errors.values()), run=not d.is_over_budget(index))
        alone, pairs = premise(s)
        rows.append([str(i + 1), str(s.T), str(s.modulus), str(s.d_model), str(s.steps), _pct(alone), _pct(pairs),
                     *(_pct(errors[a]) for a in CALIBRATION_ARMS), outcome or "waiting for runs"])
        if i == len(started) - 1 and d.chosen is None:
            note = calibration_note(i + 1, outcome, len(SETTINGS), WHERE)
            notes += [note] if note else []
            stopped = calibration_stopped(i + 1, outcome, len(SETTINGS))
    header = ["setting", "T", "modulus", "d_model", "steps", "query alone %", "query + one key %",
              *(f"{a} error" for a in CALIBRATION_ARMS), "rule"]
    return ["## Calibration", "",
            f"{', '.join(CALIBRATION_ARMS)} at lr {REFERENCE_LR:g}, seed {TUNING_SEED}; validation error in % (chance "
            "50); the premise: test accuracy of the best rule from the query's residue alone, and from the query and "
            f"any one key (chance 50); the rule: pass when the best arm's error is at most {100 * SOLVED:g}% "
            "(protocol.md).", "", md_table(header, rows), ""] + ([" ".join(notes), ""] if notes else []), stopped


def staged(s: Setting) -> Staged:
    """The stages' report at the chosen setting (:mod:`...staged_report`)."""
    classes = (("error_yes", "error on YES %"), ("error_no", "error on NO %"))
    return from_grids(grids, "match3", s, class_metrics=classes, analysis=MATCH3.name, where=WHERE)


def report(res: Results, context: ReportContext) -> list[str]:
    return study_report(res, context, calibration_section(res, context.decisions), staged, SETTINGS)
