"""The conjunction study's rules applied to its runs, and its report: the calibration, then the stages."""

from __future__ import annotations

from ... import blocks
from ...arms import calibration_note, calibration_stopped
from ...conjunction import ANALYSIS
from ...report import ReportContext, every_run_is
from ...results import Results
from ...staged_report import Staged, from_grids, study_report
from ...tables import fmt_num, md_table
from . import grids
from .grids import (
    ARMS,
    CALIBRATION_ARMS,
    PREFIX,
    REFERENCE_LR,
    SETTINGS,
    SOLVED,
    TASK,
    TUNING_SEED,
    Decisions,
    Setting,
    calibration_outcome,
    variant,
)

WHERE = "studies/conjunction/decisions.json"
CLASS_METRICS = tuple(f"error_{c}" for c in blocks.CLASSES[1:])


def owns(res: Results) -> bool:
    """True when every run is of this study's variants."""
    return every_run_is(res, PREFIX)


def values(res: Results, arm: str, s: Setting, lr: float, metric: str, split: str) -> dict[int, float]:
    return ARMS[arm].values(res, "blocks", variant(arm, s, lr), s.T, metric, split)


def premise(s: Setting) -> float:
    """The share of the setting's validation and test sequences in which no single query letter names the block,
    by brute force over their text."""
    data = blocks.BlockData(s.T, num_blocks=s.num_blocks, **TASK)
    needs = [blocks.needs_conjunction(x) for x, _ in (data.val, data.test)]
    return float(sum(int(n.sum()) for n in needs)) / sum(len(n) for n in needs)


def decide_calibration(res: Results, d: Decisions) -> list[tuple[Setting, dict[str, float | None], str | None]]:
    """Per started setting: (setting, {arm: validation error or None}, the rule's outcome or None)."""
    out = []
    for i, s, _ in d.started(SETTINGS, CALIBRATION_ARMS):
        errors = {arm: values(res, arm, s, REFERENCE_LR, "error", "val").get(TUNING_SEED) for arm in CALIBRATION_ARMS}
        out.append((s, errors, calibration_outcome(list(errors.values()), run=not d.is_over_budget(i))))
    return out


def _pct(v: float | None) -> str:
    return fmt_num(None if v is None else 100 * v, 1)


def calibration_section(res: Results, d: Decisions) -> tuple[list[str], bool]:
    """The calibration's table and the rule's note, and whether the calibration stopped the study."""
    rows, notes, stopped = [], [], False
    decided = decide_calibration(res, d)
    for i, (s, errors, outcome) in enumerate(decided):
        classes = []
        for arm in CALIBRATION_ARMS:
            split = [values(res, arm, s, REFERENCE_LR, m, "val").get(TUNING_SEED) for m in CLASS_METRICS]
            classes.append("/".join(_pct(v) for v in split) if None not in split else "")
        rows.append([str(i + 1), str(s.num_blocks), str(s.T), str(s.d_model), str(s.steps),
                     f"{100 * premise(s):.1f}", *(_pct(errors[a]) for a in CALIBRATION_ARMS), *classes,
                     outcome or "waiting for runs"])
        if i == len(decided) - 1 and d.chosen is None:
            note = calibration_note(i + 1, outcome, len(SETTINGS), WHERE)
            notes += [note] if note else []
            stopped = calibration_stopped(i + 1, outcome, len(SETTINGS))
    header = ["setting", "blocks", "T", "d_model", "steps", "conjunction needed %",
              *(f"{a} error" for a in CALIBRATION_ARMS), *(f"{a}: decoy/other/none" for a in CALIBRATION_ARMS),
              "rule"]
    return ["## Calibration", "",
            f"{', '.join(CALIBRATION_ARMS)} at lr {REFERENCE_LR:g}, seed {TUNING_SEED}; validation error in %, and "
            "its split by what a wrong answer picked (a decoy block holding one query letter, another block, no "
            "marker of the sequence); the share of validation and test sequences that need both letters, by brute "
            f"force; the rule: pass when the best arm's error is at most {100 * SOLVED:g}% (protocol.md).", "",
            md_table(header, rows), ""] + ([" ".join(notes), ""] if notes else []), stopped


def staged(s: Setting) -> Staged:
    """The stages' report at the chosen setting (:mod:`...staged_report`)."""
    classes = tuple(zip(CLASS_METRICS, ("wrong: decoy %", "wrong: other block %", "wrong: not a marker %")))
    return from_grids(grids, "blocks", s, class_metrics=classes, analysis=ANALYSIS.name, where=WHERE)


def report(res: Results, context: ReportContext) -> list[str]:
    return study_report(res, context, calibration_section(res, context.decisions), staged, SETTINGS)
