"""The twin study's rules applied to its runs, and its report."""

from __future__ import annotations

import statistics

from ...report import ReportContext, archive_runs, header_section, protocol_sections
from ...report import coattention_section as shared_coattention_section
from ...results import NO_MEASURES, Group, Results
from ...stats import Paired, equivalence_verdict, holm, millinats, paired, stat
from ...tables import fmt_interval, fmt_num, fmt_stat, md_table
from .grids import (
    ARMS,
    DECISIVE,
    LONG_STEPS,
    LONG_T,
    ON_ROPE,
    PREFIX,
    PRIORS_PREFIX,
    ROPE,
    SEEDS,
    TUNED,
    TUNING_SEED,
    WINDOWS,
    Decisions,
    Setting,
    a2_ready,
    choose_multiplier,
    edge_extension,
    long_setting,
    multipliers,
    neighbours,
    stage_a2,
    stage_e,
    with_multiplier,
)

MARGIN = 15.0  # millinats: the equivalence margin of "level" (protocol.md)
WHERE = "studies/twin/decisions.json"


def owns(res: Results) -> bool:
    """True when the runs are this study's: some of its own variants, the rest the priors study's configs."""
    runs = list(res.all_runs)
    return any(r.variant.startswith(PREFIX) for r in runs) and all(
        r.variant.startswith((PREFIX, PRIORS_PREFIX)) for r in runs)


def _group(res: Results, s: Setting) -> Group | None:
    return res.get("shakespeare", s.variant, s.T, ARMS[s.arm].mode, "exact")


def per_seed(res: Results, s: Setting) -> dict:
    """Per seed: validation loss, seconds per step and memory (:meth:`...results.Group.measures`)."""
    g = _group(res, s)
    return dict(NO_MEASURES) if g is None else g.measures()


def _tuning_loss(res: Results, s: Setting) -> float | None:
    return per_seed(res, s)["loss"].get(TUNING_SEED)


def _rule(res: Results, settings: dict[float, Setting]) -> float | None:
    """The multiplier rule over {multiplier: setting} once every seed-0 run is there (None before)."""
    losses = {m: _tuning_loss(res, s) for m, s in settings.items()}
    return choose_multiplier(losses) if all(v is not None for v in losses.values()) else None


def decide_a1(res: Results, d: Decisions) -> dict[str, tuple[float | None, float | None]]:
    """Per tuned arm whose A1 runs are all there: (the rule's multiplier, the one to add beyond the edge or
    None); the multipliers that diverged lose."""
    out = {}
    for arm in TUNED:
        grid = multipliers(arm, d)
        tried = {m: with_multiplier(arm, m, d) for m in grid if m not in d.diverged.get(arm, ())}
        chosen = _rule(res, tried)
        if chosen is not None or (not tried and grid):
            out[arm] = (chosen, edge_extension(chosen, grid) if chosen is not None else None)
    return out


def decide_a2(res: Results, d: Decisions) -> dict[str, float]:
    """Per window with its A1 decided: its slot bias's multiplier, 1 or h-slot16's (the rule without edge
    extension; 1 without runs when h-slot16's is 1)."""
    s = d.multiplier.get("h-slot16")
    if s is None:
        return {}
    if s == 1.0:
        return {w: 1.0 for w in WINDOWS if w in d.multiplier}
    out = {}
    for run in stage_a2(d):
        chosen = _rule(res, {1.0: Setting(run.arm, coupling=run.coupling), s: run})
        if chosen is not None:
            out[run.arm] = chosen
    return out


def a3_settings(arm: str, d: Decisions) -> dict[float, Setting]:
    return {m: with_multiplier(arm, m, d, LONG_T) for m in neighbours(d.multiplier[arm])}


def decide_a3(res: Results, d: Decisions) -> dict[str, float]:
    """Per tuned arm whose A3 runs are all there: the rule's multiplier at T = 256 (no edge extension)."""
    out = {}
    for arm in TUNED:
        if a2_ready(arm, d):
            chosen = _rule(res, a3_settings(arm, d))
            if chosen is not None:
                out[arm] = chosen
    return out


def long_arms(res: Results, d: Decisions) -> dict[str, tuple[Setting, dict]]:
    """Every arm of stages B-C whose setting is decided: (its setting, per_seed), those with runs."""
    out = {}
    for name in dict.fromkeys((*ROPE, *TUNED)):
        s = long_setting(name, d)
        if s is not None:
            found = per_seed(res, s)
            if found["loss"]:
                out[name] = (s, found)
    return out


def decide_best(res: Results, d: Decisions) -> dict[str, str | None]:
    """Stage D's choices: among the arms of stages B-C with every seed, the coupled and the uncoupled arm with
    the lowest mean validation loss (None until every arm of B-C is decided and complete)."""
    arms = long_arms(res, d)
    names = dict.fromkeys((*ROPE, *TUNED))
    complete = {n: f for n, (_, f) in arms.items() if all(s in f["loss"] for s in SEEDS)}
    if set(complete) != set(names):
        return {"best_coupled": None, "best_uncoupled": None}
    mean = {n: statistics.mean(f["loss"][s] for s in SEEDS) for n, f in complete.items()}
    pick = lambda coupled: min((n for n in mean if ARMS[n].coupled == coupled), key=mean.get)  # noqa: E731
    return {"best_coupled": pick(True), "best_uncoupled": pick(False)}


# ---------------------------------------------------------------------------------------------------- report

def _with_priors(res: Results, context: ReportContext) -> Results:
    """This study's runs and the priors study's runs of the same configs (its archive)."""
    own = {(r.variant, r.T, r.seed) for r in res.all_runs}
    found = archive_runs(context.archives.get("priors"), lambda r: (r.variant, r.T, r.seed) not in own)
    return Results(list(res.all_runs) + (list(found.all_runs) if found else []))


def report(res: Results, context: ReportContext) -> list[str]:
    d = context.decisions
    lines = header_section(res, context.results_dir)
    lines += [protocol_sections(context.protocol)[""], ""]
    res = _with_priors(res, context)
    lines += stage_a_section(res, d)
    lines += long_section(res, d)
    lines += questions_section(res, d)
    lines += x16_section(res, d)
    coupled = [(n, LONG_T, _group(res, s)) for n, (s, _) in long_arms(res, d).items() if ARMS[n].coupled]
    lines += shared_coattention_section(coupled)
    return lines


def _label(s: Setting) -> str:
    arm = ARMS[s.arm]
    parts = ([f"J x{s.coupling:g}"] if arm.coupled else []) + ([f"slot x{s.slot_bias:g}"] if arm.has_slot_bias else [])
    return ", ".join(parts) or "-"


def _tuning_rows(res: Results, settings: dict[float, Setting], chosen: float | None, arm: str) -> list[list[str]]:
    rows = []
    for m, s in settings.items():
        f = per_seed(res, s)
        if TUNING_SEED not in f["loss"]:
            continue
        mark = f"**{m:g}**" if m == chosen else f"{m:g}"
        rows.append([arm, mark, _label(s), f"{f['loss'][TUNING_SEED]:.4f}",
                     fmt_num(1000 * f["step_s"][TUNING_SEED], 0)])
    return rows


def stage_a_section(res: Results, d: Decisions) -> list[str]:
    header = ["arm", "multiplier", "lr multipliers", "validation loss", "ms per step"]
    a1, rows = decide_a1(res, d), []
    for arm in TUNED:
        grid = {m: with_multiplier(arm, m, d) for m in multipliers(arm, d)}
        rows += _tuning_rows(res, grid, a1.get(arm, (None,))[0], arm)
    if not rows:
        return []
    notes = []
    for arm, (chosen, extra) in a1.items():
        if chosen is None:
            notes.append(f"{arm}: every multiplier diverged.")
        elif extra is not None:
            notes.append(f"{arm}: best at {chosen:g}, the grid's edge: the rule adds {extra:g} (EXTRA_MULTIPLIERS).")
        elif d.multiplier.get(arm) != chosen:
            notes.append(f"{arm}: the rule picks {chosen:g} (MULTIPLIER in {WHERE} differs: update it).")
    waiting = [a for a in TUNED if a not in a1]
    if waiting:
        notes.append(f"Not decided yet (runs missing): {', '.join(waiting)}.")
    lines = ["## Stage A1: the multipliers at T = 64", "",
             f"Seed {TUNING_SEED}, lr 3e-3, validation loss in nats per character; the multiplier is the tuned one "
             "(J's for the windows, the slot bias's for the h arms); bold: the rule's choice (protocol.md). ms per "
             "step: wall time over steps, evaluations included, under the machine's load at the time.", "",
             md_table(header, rows), ""] + ([" ".join(notes), ""] if notes else [])
    a2 = decide_a2(res, d)
    rows = []
    for run in stage_a2(d):
        grid = {1.0: Setting(run.arm, coupling=run.coupling), run.slot_bias: run}
        rows += _tuning_rows(res, grid, a2.get(run.arm), run.arm)
    if rows:
        lines += ["## Stage A2: the windows' own slot bias at h-slot16's multiplier", "",
                  "Each window at its A1 multiplier of J, its slot bias at 1 and at h-slot16's A1 multiplier; the rule "
                  "without edge extension; bold: its choice.", "", md_table(header, rows), ""]
    a3, rows = decide_a3(res, d), []
    for arm in TUNED:
        if a2_ready(arm, d):
            rows += _tuning_rows(res, a3_settings(arm, d), a3.get(arm), arm)
    if rows:
        differs = [a for a, m in a3.items() if d.long_multiplier.get(a) != m]
        lines += ["## Stage A3: the multipliers checked at T = 256", "",
                  "Each arm at its decided multiplier and one factor-4 step either side, seed 0; the rule without "
                  "edge extension; bold: its choice (LONG_MULTIPLIER)"
                  + (f"; not yet in {WHERE} for {', '.join(differs)}" if differs else "") + ".", "",
                  md_table(header, rows), ""]
    return lines


def long_section(res: Results, d: Decisions) -> list[str]:
    arms = long_arms(res, d)
    if not arms:
        return []
    rows = []
    for name, (s, f) in arms.items():
        rows.append([name, _label(s), fmt_stat(stat(f["loss"].values()), digits=4),
                     fmt_num(1000 * statistics.mean(f["step_s"].values()), 0),
                     fmt_num(statistics.mean(f["peak_mib"].values()), 0) if f["peak_mib"] else ""])
    return [f"## Stages B and C: every arm at T = {LONG_T}", "",
            f"Batch 12, {LONG_STEPS} steps, 512 validation windows, lr 3e-3 and each arm's decided multipliers. "
            "Validation loss, mean ± std over seeds (n); ms per step as above; peak RSS of the memory probe (MiB).",
            "", md_table(["arm", "lr multipliers", "validation loss", "ms per step", "peak RSS (MiB)"], rows), ""]


def verdict(c: Paired | None, margin: float = MARGIN) -> str:
    """The protocol's verdict on a paired difference (uncoupled minus coupled, millinats)."""
    return equivalence_verdict(c, margin, ahead=("the coupled arm", "the uncoupled arm"))


def _comparison_rows(res: Results, d: Decisions, pairs, twins: dict[str, Setting] | None = None) -> list[list]:
    """(comparison, Paired or None) per (coupled, uncoupled) pair at T = 256 with decided settings; ``twins``
    (arm -> setting) replaces the decided setting of those uncoupled arms, and a comparison with such a twin
    waits for all its seeds: in their place the text "not run yet (n of 5 seeds)"."""
    twins, out = twins or {}, []
    for coupled, uncoupled in pairs:
        a, b = long_setting(coupled, d), twins.get(uncoupled) or long_setting(uncoupled, d)
        name = f"{coupled} vs {uncoupled}"
        if uncoupled in twins:
            n = len(set(SEEDS) & set(per_seed(res, b)["loss"]))
            if n < len(SEEDS):
                out.append([name, f"not run yet ({n} of {len(SEEDS)} seeds)"])
                continue
        out.append([name, paired(per_seed(res, b)["loss"], per_seed(res, a)["loss"], millinats) if a and b else None])
    return out


def _holm(rows: list[list]) -> list[bool]:
    """Which rows of a family survive Holm over all of them: a row not run yet (a text in place of its Paired)
    counts as not rejected (p = 1), so that the others are corrected for the whole family."""
    return holm([1.0 if isinstance(c, str) else c.p if c is not None else None for _, c in rows])


def _family_table(rows: list[list]) -> str:
    cells = []
    for (name, c), holm_ok in zip(rows, _holm(rows)):
        if c is None or isinstance(c, str):
            cells.append([name, c or "runs missing", "", "", "", ""])
            continue
        cells.append([name, fmt_interval(c, holm_survives=holm_ok) if c.n >= 2 else fmt_num(c.mean, 1, signed=True),
                      str(c.n), fmt_num(c.std, 1), fmt_num(c.tost_p(MARGIN), 3) if c.n >= 2 else "", verdict(c)])
    return md_table(["comparison", "Δ mnats [95%]", "seeds", "seed spread (std of Δ)", f"TOST p (±{MARGIN:g})",
                     "verdict"], cells)


def questions_section(res: Results, d: Decisions) -> list[str]:
    b, c = _comparison_rows(res, d, DECISIVE), _comparison_rows(res, d, ON_ROPE)
    if all(x is None for _, x in b + c):
        return []
    lines = ["## The questions", "",
             "Each row: the uncoupled arm's validation loss minus the coupled arm's, in millinats, paired over "
             "seeds at T = 256 (positive: the couplings help); `*` p < 0.05, `**` also after Holm over the "
             f"question's family; the verdict by the protocol's rule (TOST at 0.05 with the ±{MARGIN:g}-millinat "
             "margin for *equivalent*).", "",
             "### 1. Does the coupled window beat a twin that learns its slot field as fast? (family B)", "",
             _family_table(b), "",
             "### 2. Do couplings add to RoPE? (family C)", "", _family_table(c), ""]
    best = {"best_coupled": d.best_coupled, "best_uncoupled": d.best_uncoupled}
    if best["best_coupled"] and best["best_uncoupled"]:
        rows = _comparison_rows(res, d, [(best["best_coupled"], best["best_uncoupled"])])
        if d.equal_compute_steps is not None and d.equal_compute_arm is not None:
            base = long_setting(d.equal_compute_arm, d)
            short = Setting(base.arm, LONG_T, base.coupling, base.slot_bias, d.equal_compute_steps)
            other = best["best_uncoupled" if d.equal_compute_arm == best["best_coupled"] else "best_coupled"]
            long_other = long_setting(other, d)
            other_loss = per_seed(res, long_other)["loss"]

            def delta(short_loss: dict[int, float]) -> Paired | None:  # uncoupled minus coupled
                pair = (other_loss, short_loss) if ARMS[short.arm].coupled else (short_loss, other_loss)
                return paired(*pair, millinats)

            rows.append([f"{best['best_coupled']} vs {best['best_uncoupled']}, equal wall time "
                         f"({d.equal_compute_arm}: {d.equal_compute_steps} steps)",
                         delta(per_seed(res, short)["loss"])])
            recorded = _recorded_wall_time(res, short, long_other, delta)
        else:
            recorded = []
        lines += ["### 3. The best coupled arm against the best uncoupled arm", "", _family_table(rows), ""]
        lines += recorded
    return lines


def _outcomes(rows: list[list]) -> dict[str, tuple[str, bool]]:
    """Per comparison with its pairs: (its verdict, whether it survives Holm over the family)."""
    return {name: (verdict(c), ok) for (name, c), ok in zip(rows, _holm(rows)) if isinstance(c, Paired)}


def _mean_loss(res: Results, s: Setting) -> str:
    loss = per_seed(res, s)["loss"]
    return f"{fmt_stat(stat(loss.values()), digits=4)} at x{s.slot_bias:g}" if loss else f"no runs at x{s.slot_bias:g}"


def x16_section(res: Results, d: Decisions) -> list[str]:
    """Stage E: questions 1 and 2 with h-slot16 and h-rope-slot16 at x16 in place of their decided multiplier;
    once every run is in, the comparisons whose verdict or Holm result differ from the decided multiplier's."""
    twins = {s.arm: s for s in stage_e(d)}
    if not twins:
        return []
    families = [(_comparison_rows(res, d, pairs), _comparison_rows(res, d, pairs, twins)) for pairs in (DECISIVE,
                                                                                                      ON_ROPE)]
    losses = [f"{arm} {_mean_loss(res, s)}, {_mean_loss(res, long_setting(arm, d))}" for arm, s in twins.items()]
    lines = ["## Questions 1-2 with the twins at x16", "",
             "Stage E (protocol.md), a sensitivity check: the two families again, with h-slot16 and h-rope-slot16 at "
             "slot-bias lr x16 in place of their decided multiplier; the same paired differences, Holm over each "
             "family of four and verdicts. The decisions and the answers above stand whatever it finds. Validation "
             "loss: " + "; ".join(losses) + ".", "",
             "### 1. at x16 (family B)", "", _family_table(families[0][1]), "",
             "### 2. at x16 (family C)", "", _family_table(families[1][1]), ""]
    if any(isinstance(c, str) for _, x16 in families for _, c in x16):
        return lines
    decided = f"x{long_setting('h-slot16', d).slot_bias:g}"
    holm_says = {True: "significant after Holm", False: "not significant after Holm"}
    differ = []
    for at_decided, x16 in families:
        before, after = _outcomes(at_decided), _outcomes(x16)
        differ += [f"- {name}: at {decided} {before[name][0]}, {holm_says[before[name][1]]}; at x16 {after[name][0]}, "
                   f"{holm_says[after[name][1]]}" for name in after if name in before and before[name] != after[name]]
    if not differ:
        return lines + [f"Every verdict and Holm result is the same as at {decided}.", ""]
    return lines + [f"Where x16 changes a verdict or a Holm result (the answers at {decided} stand):", "", *differ, ""]


def _recorded_wall_time(res: Results, short: Setting, dear: Setting, delta) -> list[str]:
    """Question 3 at the runs' own recorded wall times (outside the protocol, whose ratio is timed idle): the
    cheaper arm's evaluations either side of the step where its recorded time equals the dearer arm's, each
    compared by ``delta`` (the cheaper arm's per-seed losses -> the paired difference)."""
    cheap_g, dear_g = _group(res, short), _group(res, dear)
    if cheap_g is None or dear_g is None:
        return []
    dear_s = statistics.mean(r.wall_time_s for r in dear_g.runs.values())
    cheap_step = statistics.mean(cheap_g.measures()["step_s"].values())
    if not (dear_s > 0 and cheap_step > 0):
        return []
    budget = dear_s / cheap_step
    evals = {step: v for step, v in cheap_g.curves().items() if step < short.steps}
    below = max((st for st in evals if st <= budget), default=None)
    above = min((st for st in evals if st > budget), default=None)
    parts = []
    for st in (below, above):
        if st is not None:
            c = delta(evals[st])
            parts.append(f"at step {st} {fmt_interval(c) if c is not None else 'no pairs'}")
    dear_steps = dear.steps or LONG_STEPS
    ratio = dear_s / dear_steps / cheap_step
    return [f"The protocol's ratio was timed with the machine idle. The runs' recorded wall times (under the "
            f"sweep's load, evaluations included) are {dear.arm} {dear_s:.0f} s per {dear_steps}-step run and "
            f"{short.arm} {cheap_step:.3f} s per step: a ratio of {ratio:.2f}, so equal recorded time is "
            f"{budget:.0f} {short.arm} steps. At its evaluations either side (mid-schedule, before its learning "
            f"rate has finished decaying; outside the protocol, unadjusted): {'; '.join(parts) or 'none recorded'}.",
            ""]


__all__ = ["MARGIN", "decide_a1", "decide_a2", "decide_a3", "decide_best", "owns", "report", "verdict"]
