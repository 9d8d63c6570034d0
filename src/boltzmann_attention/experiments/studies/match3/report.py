"""The Match3 study's rules applied to its runs, and its report: the calibration, then the stages, or the probe
once the calibration has run out."""

from __future__ import annotations

import statistics

from ...arms import calibration_note, calibration_stopped
from ...conjunction import MATCH3
from ...report import ReportContext, every_run_is
from ...results import Results
from ...staged_report import SIGN_HEADER, Staged, from_grids, sign_rows, study_report
from ...stats import holm, point_difference
from ...tables import fmt_interval, fmt_num, md_table
from ...tasks import match3
from . import grids
from .grids import (
    ALL_ARMS,
    CALIBRATION_ARMS,
    LEARNING_RATES,
    OFF_CHANCE,
    PREFIX,
    PROBE_ARMS,
    PROBE_CONFIRM_SEEDS,
    PROBE_CONTROLS,
    PROBE_SETTING,
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
    return ALL_ARMS[arm].values(res, "match3", variant(arm, s, lr), s.T, metric, split)


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


def probe_outcome(res: Results) -> str | None:
    """The probe's first step by its rule: "confirm" when some probe arm's validation error on the tuning seed is
    below OFF_CHANCE, "ends" when none is and all have run, None while a run is missing."""
    s = SETTINGS[PROBE_SETTING - 1]
    errors = [values(res, arm, s, REFERENCE_LR, "error", "val").get(TUNING_SEED) for arm in PROBE_ARMS]
    if any(e is not None and e < OFF_CHANCE for e in errors):
        return "confirm"
    return None if None in errors else "ends"


def _analysis(res: Results, arm: str, s: Setting) -> dict[int, dict]:
    g = ALL_ARMS[arm].group(res, "match3", variant(arm, s, REFERENCE_LR), s.T)
    return {seed: r.raw[MATCH3.name] for seed, r in (g.runs.items() if g else ()) if r.raw.get(MATCH3.name)}


def probe_section(res: Results, d: Decisions) -> list[str]:
    """The probe (protocol.md): every arm at its setting, the rule's note, and with its second step the other
    learning rates and the paired comparisons of the best content arm."""
    if not d.probe:
        return []
    s = SETTINGS[PROBE_SETTING - 1]
    seeds = (TUNING_SEED, *PROBE_CONFIRM_SEEDS) if d.probe_confirm else (TUNING_SEED,)
    rows, signs = [], []
    for arm in CALIBRATION_ARMS + PROBE_ARMS:
        val, test = (values(res, arm, s, REFERENCE_LR, "error", split) for split in ("val", "test"))
        found = _analysis(res, arm, s)
        uncoupled = [x["uncoupled"]["test"]["error"] for x in found.values()]
        rows.append([arm, " / ".join(_pct(val.get(x)) for x in seeds), " / ".join(_pct(test.get(x)) for x in seeds),
                     _pct(statistics.mean(test.values())) if test else "",
                     _pct(statistics.mean(uncoupled)) if uncoupled else ""])
        signs += sign_rows(arm, found)
    outcome = probe_outcome(res)
    note = {"confirm": f"A probe arm is off chance (validation error below {100 * OFF_CHANCE:g}%): set PROBE_CONFIRM "
                       f"to true in {WHERE}.",
            "ends": f"No probe arm is off chance (validation error below {100 * OFF_CHANCE:g}%): the study ends "
                    "here; none of its arms learns Match3 at this setting (protocol.md).",
            None: "Waiting for the probe's runs."}[outcome]
    if d.probe_confirm and outcome == "ends":
        note += " PROBE_CONFIRM is set, but the rule does not ask for it."
    lines = ["## Probe: the coupled arms where the calibration's arms fail", "",
             f"Setting {PROBE_SETTING} (T = {s.T}, M = {s.modulus}, d_model {s.d_model}, {s.steps} steps), lr "
             f"{REFERENCE_LR:g}; error in % per seed ({', '.join(map(str, seeds))}); the test error with every coupled "
             f"layer at J = 0 at evaluation, mean over seeds (protocol.md).", "",
             md_table(["arm", "validation error % per seed", "test error % per seed", "mean test error %",
                       "with J = 0 %"], rows), "", note, ""]
    if signs:
        lines += ["The coupling J between the first answering pair of keys at the answer query, per layer, over the "
                  "positive test sequences, heads and seeds: its mean, and the shares in % where it is positive "
                  "(the pair attended together) and negative, and where the couplings reach the pair. They describe "
                  "the mechanism; they decide nothing.", "", md_table(SIGN_HEADER, signs), ""]
    return lines + (probe_confirm_section(res, seeds) if d.probe_confirm else [])


def probe_confirm_section(res: Results, seeds: tuple[int, ...]) -> list[str]:
    s = SETTINGS[PROBE_SETTING - 1]
    other_lrs = [lr for lr in LEARNING_RATES if lr != REFERENCE_LR]
    rows, learns_elsewhere = [], []
    for arm in CALIBRATION_ARMS + ("h-rope",):
        cells = []
        for lr in other_lrs:
            val = values(res, arm, s, lr, "error", "val").get(TUNING_SEED)
            cells.append(_pct(val))
            if val is not None and val <= SOLVED:
                learns_elsewhere.append(f"{arm} at lr {lr:g}")
        rows.append([arm, *cells])
    lines = [f"Second step: the calibration arms and h-rope at the other learning rates, seed {TUNING_SEED}, "
             "validation error in %.", "", md_table(["arm", *(f"lr {lr:g}" for lr in other_lrs)], rows), ""]

    def mean_val(arm: str) -> float | None:
        v = values(res, arm, s, REFERENCE_LR, "error", "val")
        return statistics.mean(v[x] for x in seeds) if all(x in v for x in seeds) else None

    content = {a: mean_val(a) for a in PROBE_CONTROLS}
    field = {a: mean_val(a) for a in CALIBRATION_ARMS}
    if None in content.values() or None in field.values():
        return lines + ["The comparison waits for the second step's runs.", ""]
    best = min(content, key=content.get)
    others = ("h-rope", "relative", PROBE_CONTROLS[best], min(field, key=field.get))
    errors = {a: values(res, a, s, REFERENCE_LR, "error", "test") for a in (best, *others)}
    if any(not all(x in errors[a] for x in seeds) for a in errors):
        return lines + ["The comparison waits for the second step's runs.", ""]
    diffs = [point_difference({x: errors[best][x] for x in seeds}, {x: errors[a][x] for x in seeds}) for a in others]
    survives = holm([c.p for c in diffs])
    table = [[f"{a} − {best}", fmt_interval(c, holm_survives=ok)] for a, c, ok in zip(others, diffs, survives)]
    mean = statistics.mean(errors[best][x] for x in seeds)
    learns = mean <= SOLVED and all(c.mean > 0 and ok for c, ok in zip(diffs, survives)) and not learns_elsewhere
    why = [*([f"mean test error {_pct(mean)}%, above {100 * SOLVED:g}%"] if mean > SOLVED else []),
           *(f"{a}: not positive after Holm" for a, c, ok in zip(others, diffs, survives) if not (c.mean > 0 and ok)),
           *(f"{x} learns" for x in learns_elsewhere)]
    verdict = (f"**Content couplings learn Match3 where the others do not**: {'yes' if learns else 'no'} ({best}"
               + (f"; {'; '.join(why)})." if why else ")."))
    return lines + [f"The best content arm is {best} (the lower mean validation error over seeds "
                    f"{', '.join(map(str, seeds))}). Test error in points, each arm minus {best}, paired over those "
                    "seeds; 95% t interval, `*` p < 0.05, `**` also after Holm over the four (protocol.md).", "",
                    md_table(["pair", "Δ points [95%]"], table), "", verdict, ""]


def report(res: Results, context: ReportContext) -> list[str]:
    d = context.decisions
    return study_report(res, context, calibration_section(res, d), staged, SETTINGS) + probe_section(res, d)
