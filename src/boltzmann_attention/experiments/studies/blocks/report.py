"""The find-the-block study's rules applied to its runs, and its report."""

from __future__ import annotations

import statistics

import numpy as np

from ... import lr_rule
from ...report import ReportContext, every_run_is, header_section, protocol_sections
from ...results import Group, Results
from ...stats import paired, points, stat
from ...tables import fmt_interval, fmt_num, fmt_stat, md_table
from .grids import (
    ARMS,
    CALIBRATION_ARMS,
    CONTROL,
    COUPLED,
    DECISIVE_SEEDS,
    NEAR_TIE,
    PREFIX,
    RANGE,
    REFERENCE_LR,
    SEEDS,
    SINGLE_SCORE,
    TUNING_SEED,
    Decisions,
    Setting,
    beats,
    best_single,
    calibration_step,
    decisive,
    learning_rates,
    spread,
    variant,
)

WHERE = "studies/blocks/decisions.json"


def owns(res: Results) -> bool:
    """True when every run is of this study's variants."""
    return every_run_is(res, PREFIX)


def _group(res: Results, arm: str, s: Setting, lr: float) -> Group | None:
    return ARMS[arm].group(res, "blocks", variant(arm, s, lr), s.T)


def values(res: Results, arm: str, s: Setting, lr: float, metric: str, split: str) -> dict[int, float]:
    return ARMS[arm].values(res, "blocks", variant(arm, s, lr), s.T, metric, split)


def step_ms(res: Results, arm: str, s: Setting, lr: float) -> dict[int, float]:
    g = _group(res, arm, s, lr)
    return {} if g is None else {k: 1000 * v for k, v in g.measures()["step_s"].items()}


# ------------------------------------------------------------------------------------------------- the rules

def decide_calibration(res: Results, d: Decisions) -> list[tuple[Setting, float | None, float | None, object]]:
    """Per calibration setting: (setting, softmax-rope's and mta's validation errors, the rule's outcome:
    "pass", "failed", the next Setting, or None while a run is missing)."""
    out, tried = [], []
    for s in d.settings():
        tried.append(s)
        e_s, e_m = (values(res, arm, s, REFERENCE_LR, "error", "val").get(TUNING_SEED) for arm in CALIBRATION_ARMS)
        out.append((s, e_s, e_m, None if e_s is None or e_m is None else calibration_step(e_s, e_m, list(tried))))
    return out


def decide_lrs(res: Results, d: Decisions) -> dict[str, tuple[float | None, float | None]]:
    """Stage 1's lr rule per arm with every seed-0 run there: (its lr, the lr to add beyond the edge or None)."""
    s = d.setting
    if s is None:
        return {}
    return lr_rule.decide(ARMS, lambda arm: learning_rates(arm, d),
                          lambda arm, lr: values(res, arm, s, lr, "loss", "val").get(TUNING_SEED), d.diverged,
                          NEAR_TIE, REFERENCE_LR)


def decide_best_single(res: Results, d: Decisions) -> str | None:
    s, found = d.setting, {}
    for arm in SINGLE_SCORE:
        if s is None or arm not in d.best_lr:
            return None
        err, loss = (values(res, arm, s, d.best_lr[arm], m, "val") for m in ("error", "loss"))
        if not all(x in err for x in SEEDS):
            return None
        found[arm] = (statistics.mean(err[x] for x in SEEDS), statistics.mean(loss[x] for x in SEEDS))
    return best_single(found)


def test_errors(res: Results, d: Decisions) -> dict[str, dict[int, float]]:
    """Per arm at its BEST_LR: {seed: test error}, those with runs."""
    s = d.setting
    out = {}
    for arm in ARMS:
        if s is not None and arm in d.best_lr:
            v = values(res, arm, s, d.best_lr[arm], "error", "test")
            if v:
                out[arm] = v
    return out


def findings(errors: dict[str, dict[int, float]], d: Decisions) -> list[str]:
    """The decision rule's statements, once every arm it reads has its seeds (empty before)."""
    wanted = {arm: SEEDS + (DECISIVE_SEEDS if arm in decisive(d) else ()) for arm in ARMS}
    if d.best_single is None or any(not set(wanted[a]) <= set(errors.get(a, {})) for a in ARMS):
        return []

    def pair(a: str, b: str) -> tuple[dict, dict]:
        seeds = sorted(set(wanted[a]) & set(wanted[b]))
        return {x: errors[a][x] for x in seeds}, {x: errors[b][x] for x in seeds}

    adds = all(beats(*pair(COUPLED, b)) for b in SINGLE_SCORE)
    ising = adds and beats(*pair(COUPLED, CONTROL))
    local = COUPLED, CONTROL, "mta"
    level = all(not beats(*pair(a, b)) and not beats(*pair(b, a)) for i, a in enumerate(local) for b in local[i + 1:])
    out = [f"- Couplings add what scores cannot (relative{RANGE} beats softmax-rope, stickbreaking, fox and h-rope by "
           f"more than the seed spread): **{'yes' if adds else 'no'}**."]
    if adds:
        out.append(f"- Ising inference (it also beats the one-step control {CONTROL}): **{'yes' if ising else 'no'}**.")
    if level:
        out.append(f"- relative{RANGE}, {CONTROL} and mta are pairwise level: the finding is **local score mixing**.")
    if not adds and not level:
        order = sorted(ARMS, key=lambda a: statistics.mean(errors[a].values()))
        out.append("- Neither statement of the rule holds; the arms by mean test error: " + " < ".join(order) + ".")
    return out


# ---------------------------------------------------------------------------------------------------- report

def report(res: Results, context: ReportContext) -> list[str]:
    d = context.decisions
    lines = header_section(res, context.results_dir)
    sections = protocol_sections(context.protocol)
    lines += [sections[""], ""]
    correction = sections.get("Corrections (after the runs)")
    lines += ["## Corrections (after the runs)", "", correction, ""] if correction else []
    lines += calibration_section(res, d)
    lines += lr_section(res, d)
    errors = test_errors(res, d)
    lines += arms_section(res, d, errors)
    lines += differences_section(errors, d)
    lines += couplings_section(res, d)
    return lines


def _pct(v: float | None) -> str:
    return fmt_num(None if v is None else 100 * v, 1)


def calibration_section(res: Results, d: Decisions) -> list[str]:
    rows, notes = [], []
    decided = decide_calibration(res, d)
    for i, (s, e_s, e_m, outcome) in enumerate(decided):
        said = ("waiting for runs" if outcome is None else outcome if isinstance(outcome, str)
                else f"next: {outcome.num_blocks} blocks, {outcome.steps} steps")
        rows.append([str(i + 1), str(s.block_size), str(s.query_size), str(s.num_blocks), str(s.T), str(s.steps),
                     _pct(e_s), _pct(e_m), said])
        last = i == len(decided) - 1
        if outcome == "pass" and last and not d.chosen:
            notes.append(f"The last setting passes: set CHOSEN to true in {WHERE}.")
        if isinstance(outcome, Setting) and last:
            notes.append(f"The rule asks for the next setting: add it to CALIBRATION in {WHERE}.")
        if outcome == "failed":
            notes.append("The calibration has failed: no setting put softmax-rope's error in the band with mta "
                         "clearly lower, and the study stops here (protocol.md).")
    return ["## Calibration", "",
            f"softmax-rope and mta at lr {REFERENCE_LR:g}, seed {TUNING_SEED}; validation exact-match error in %; "
            "the rule's outcome (protocol.md).", "",
            md_table(["setting", "N", "L", "blocks", "T", "steps", "softmax-rope error", "mta error", "rule"], rows),
            ""] + ([" ".join(notes), ""] if notes else [])


def lr_section(res: Results, d: Decisions) -> list[str]:
    s = d.setting
    if s is None:
        return []

    def cells(arm: str, lr: float) -> list[str] | None:
        loss = values(res, arm, s, lr, "loss", "val").get(TUNING_SEED)
        err = values(res, arm, s, lr, "error", "val").get(TUNING_SEED)
        ms = step_ms(res, arm, s, lr).get(TUNING_SEED)
        return None if loss is None else [f"{loss:.4f}", _pct(err), fmt_num(ms, 0)]

    decided = decide_lrs(res, d)
    table = lr_rule.table(["arm", "lr", "validation loss", "validation error", "ms per step"], ARMS,
                          lambda arm: learning_rates(arm, d), cells, decided, d.diverged)
    if not table:
        return []
    notes = [f"{arm}: best at {lr:g}, the edge: the rule adds {extra:g} (EXTRA_LEARNING_RATES)."
             for arm, (lr, extra) in decided.items() if extra is not None]
    notes += [f"{arm}: the rule picks {lr:g} (BEST_LR in {WHERE} differs: update it)."
              for arm, (lr, extra) in decided.items() if extra is None and d.best_lr.get(arm) != lr]
    single = decide_best_single(res, d)
    if single is not None and single != d.best_single:
        notes.append(f"BEST_SINGLE by the rule: {single} (update {WHERE}).")
    return ["## Stage 1: learning rates", "",
            f"Seed {TUNING_SEED}; validation loss (nats per answer letter) and exact-match error (%); bold: the lr "
            "rule's choice. ms per step: wall time over steps, evaluations included, under the machine's load.", "",
            table, ""] + (
        [" ".join(notes), ""] if notes else [])


def arms_section(res: Results, d: Decisions, errors: dict[str, dict[int, float]]) -> list[str]:
    s = d.setting
    if not errors:
        return []
    rows = []
    for arm, err in errors.items():
        lr = d.best_lr[arm]
        c = paired(dict.fromkeys(err, 0.0), err, points)  # the error in %, with its t interval
        ci = f"{c.mean:.1f} [{c.low:.1f}, {c.high:.1f}]" if c.n > 1 else f"{c.mean:.1f}"
        acc = values(res, arm, s, lr, "accuracy", "test")
        ms = step_ms(res, arm, s, lr)
        rows.append([arm, f"{lr:g}", ci, fmt_num(c.std, 1), str(c.n), fmt_stat(stat(acc.values()), 3, 100, False),
                     fmt_num(statistics.mean(ms.values()), 0)])
    return ["## Every arm at its lr", "",
            f"{s.num_blocks} blocks of {s.block_size} letters, queries of {s.query_size}, T = {s.T}, {s.steps} steps. "
            "Test exact-match error in %: mean [95% t interval] over seeds, the seed spread (standard deviation), "
            "seeds; per-letter test accuracy in %; ms per step as above.", "",
            md_table(["arm", "lr", "test error", "seed spread", "seeds", "letter accuracy", "ms per step"], rows), ""]


def differences_section(errors: dict[str, dict[int, float]], d: Decisions) -> list[str]:
    if COUPLED not in errors:
        return []
    rows = []
    for other in ARMS:
        if other == COUPLED or other not in errors:
            continue
        a, b = errors[COUPLED], errors[other]
        c = paired(a, b, points)  # other minus relative4, in points: positive when the couplings help
        shared = sorted(set(a) & set(b))
        sa, sb = ({x: v[x] for x in shared} for v in (a, b))
        rows.append([f"{other} − {COUPLED}", fmt_interval(c, 1), str(c.n), fmt_num(100 * spread(sa, sb), 1),
                     "yes" if beats(sa, sb) else "no", "yes" if beats(sb, sa) else "no"])
    lines = ["## The differences", "",
             f"Test error of each arm minus {COUPLED}'s, in points, paired over the seeds both have (positive: the "
             f"couplings help); 95% t interval, `*` p < 0.05; the seed spread: the larger standard deviation of the "
             "two arms over those seeds; *beats*: the mean difference exceeds it (protocol.md).", "",
             md_table(["comparison", "Δ points [95%]", "seeds", "seed spread", f"{COUPLED} beats it",
                       f"it beats {COUPLED}"], rows), ""]
    found = findings(errors, d)
    return lines + (["### The decision rule", "", *found, ""] if found else [])


def couplings_section(res: Results, d: Decisions) -> list[str]:
    s = d.setting
    rows = []
    for arm in (COUPLED, CONTROL):
        if s is None or arm not in d.best_lr:
            continue
        g = _group(res, arm, s, d.best_lr[arm])
        per_seed = [[np.asarray(layer["couplings"])[:, 0, 1:RANGE + 1] for layer in r.raw.get("layers", [])]
                    for r in (g.runs.values() if g else ())]
        if not per_seed:
            continue
        f = np.asarray(per_seed)  # (seeds, layers, heads, offsets)
        for layer in range(f.shape[1]):
            for head in range(f.shape[2]):
                by_seed = f[:, layer, head]
                cells = [f"{m:+.3f} ± {sd:.3f}" if len(by_seed) > 1 else f"{m:+.3f}"
                         for m, sd in zip(by_seed.mean(0), by_seed.std(0, ddof=1) if len(by_seed) > 1 else by_seed[0])]
                rows.append([arm, str(layer), str(head), *cells, str(f.shape[0])])
    if not rows:
        return []
    return ["## The learned couplings by offset", "",
            "f(d), the coupling of two keys d apart, per layer and head: mean ± standard deviation over seeds.", "",
            md_table(["arm", "layer", "head", *(f"d = {k}" for k in range(1, RANGE + 1)), "seeds"], rows), ""]
