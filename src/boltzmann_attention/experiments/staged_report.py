"""The report of a study's three stages once its calibration has chosen a setting (the conjunction and Match3
studies): one implementation, parametrised by :class:`Staged`, of what their protocols report.

* Stage 1, learning rates: the lr rule (:mod:`.lr_rule`) on each arm's validation loss on the tuning seed.
* Stage 2, seeds: every arm at its lr, its test error (mean, 95% t interval, seed spread), the error by class, the
  steps to the first evaluation at or below the bar of validation error, ms per step; and ``BEST_SINGLE`` and
  ``BEST_CONTENT`` as the rule picks them, against those recorded in decisions.json.
* Stage 3, the decision: test error in points, other arm minus ``BEST_CONTENT``, paired over every seed, Holm over
  the three pairs, TOST at the margin, the verdicts and the protocol's three conclusions, or that the comparison
  decides nothing (all solved, or all unsolved) with the steps to the bar as the secondary measure.
* Every coupled arm: its test error with J = 0 at evaluation, and the sign of the coupling between the pair that
  answers, per layer (the runs' analysis, :mod:`.conjunction`).

Everything renders from partial results: an undecided lr or arm reads "not decided yet", a missing run "not run
yet".
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from . import lr_rule
from .arms import Arm, StagedDecisions
from .report import ReportContext, header_section, protocol_sections
from .results import NO_MEASURES, Group, Results
from .stats import Paired, equivalence_verdict, holm, paired, point_difference, stat, t_half_width
from .tables import fmt_interval, fmt_num, md_table, table_with_holm

WAITING = "The stages wait for the calibration: no setting is chosen yet (CHOSEN in decisions.json)."
STOPPED = "The stages do not run: no calibration setting passed (protocol.md)."
CONCLUSIONS = ("Content couplings beat single scores", "Content beats position", "It is Ising inference")


@dataclass(frozen=True)
class Staged:
    """What the stages' report needs of a study at its chosen setting (its grids.py and protocol.md).

    ``group(res, arm, lr)``: the arm's runs at the setting and lr (a Group, or None); ``class_metrics``: the test
    metrics of the error by class, each with its column's title; ``unsolved``: the mean test error above which,
    for all four decisive arms, the comparison decides nothing (as it does when all are at most ``solved``);
    ``reached``: the validation error whose first evaluation at or below it counts the steps; ``analysis``: the
    name of the coupled runs' analysis."""

    arms: dict[str, Arm]
    group: Callable[[Results, str, float], Group | None]
    calibration_arms: tuple[str, ...]
    learning_rates: tuple[float, ...]
    reference_lr: float
    near_tie: float
    tuning_seed: int
    seeds: tuple[int, ...]
    decisive_seeds: tuple[int, ...]
    single_score: tuple[str, ...]
    content: tuple[str, ...]
    control: str
    static: str
    class_metrics: tuple[tuple[str, str], ...]
    margin: float
    unsolved: float
    analysis: str
    where: str
    solved: float = 0.01
    reached: float = 0.05

    @property
    def all_seeds(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.seeds) | set(self.decisive_seeds)))


def from_grids(grids, task: str, setting, *, class_metrics: tuple[tuple[str, str], ...], analysis: str,
               where: str) -> Staged:
    """The :class:`Staged` of a study at its chosen ``setting`` (which has ``T``), from its grids module: its
    ``ARMS`` and ``variant(arm, setting, lr)``, and the constants that name the rest (``CALIBRATION_ARMS``,
    ``LEARNING_RATES``, ``REFERENCE_LR``, ``NEAR_TIE``, ``TUNING_SEED``, ``SEEDS``, ``DECISIVE_SEEDS``,
    ``SINGLE_SCORE``, ``CONTENT``, ``CONTROL``, ``STATIC``, ``MARGIN``, ``UNSOLVED``)."""
    g = grids
    return Staged(g.ARMS, lambda res, arm, lr: g.ARMS[arm].group(res, task, g.variant(arm, setting, lr), setting.T),
                  calibration_arms=g.CALIBRATION_ARMS, learning_rates=g.LEARNING_RATES, reference_lr=g.REFERENCE_LR,
                  near_tie=g.NEAR_TIE, tuning_seed=g.TUNING_SEED, seeds=g.SEEDS, decisive_seeds=g.DECISIVE_SEEDS,
                  single_score=g.SINGLE_SCORE, content=g.CONTENT, control=g.CONTROL, static=g.STATIC,
                  class_metrics=class_metrics, margin=g.MARGIN, unsolved=g.UNSOLVED, analysis=analysis, where=where)


def _seeds(seeds) -> str:
    return f"{min(seeds)}-{max(seeds)}"


def _pct(v: float | None) -> str:
    return fmt_num(None if v is None else 100 * v, 2)


def arm_group(res: Results, d: StagedDecisions, st: Staged, arm: str) -> Group | None:
    """The arm's runs at its best lr (None before the lr is decided or without runs)."""
    lr = d.best_lr.get(arm)
    return None if lr is None else st.group(res, arm, lr)


def values(res: Results, d: StagedDecisions, st: Staged, arm: str, metric: str, split: str) -> dict[int, float]:
    g = arm_group(res, d, st, arm)
    return {} if g is None else g.values(metric, split)


def steps_to(run, bar: float) -> int | None:
    """The step of the run's first evaluation with a validation error at or below ``bar`` (None: not reached)."""
    return next((int(h["step"]) for h in run.raw.get("history") or () if h.get("error", 1.0) <= bar), None)


def steps_reached(g: Group | None, bar: float) -> dict[int, int | None]:
    return {} if g is None else {s: steps_to(r, bar) for s, r in sorted(g.runs.items())}


# ------------------------------------------------------------------------------------------- stage 1

def lr_section(res: Results, d: StagedDecisions, st: Staged) -> list[str]:
    names = list(st.arms)
    lrs_of = lambda arm: d.learning_rates(arm, st.learning_rates)  # noqa: E731

    def measures(arm: str, lr: float) -> dict:
        g = st.group(res, arm, lr)
        return NO_MEASURES if g is None else g.measures()

    decided = lr_rule.decide(names, lrs_of, lambda arm, lr: measures(arm, lr)["loss"].get(st.tuning_seed),
                             d.diverged, st.near_tie, st.reference_lr)
    table = lr_rule.table(["arm", "lr", "validation loss", "ms per step"], names, lrs_of,
                          lambda arm, lr: lr_rule.loss_cells(measures(arm, lr), (st.tuning_seed,)), decided, d.diverged)
    return ["## Stage 1: learning rates", "",
            f"Seed {st.tuning_seed}; validation loss in nats per answer; the lr rule: losses within {st.near_tie:g} "
            f"nats of the lowest are tied, the tied lr closest to {st.reference_lr:g} wins, a winner at the grid's "
            "edge adds the next lr half a decade beyond; bold: its choice. The calibration's runs at "
            f"{st.reference_lr:g} are stage 1's runs of {', '.join(st.calibration_arms)} at that lr. ms per step: "
            "wall time over steps, evaluations included, under the machine's load at the time.", "",
            table or "No run yet.", "", lr_rule.decision_notes(names, decided, d.best_lr, st.where), ""]


# ------------------------------------------------------------------------------------------- stage 2

def best_arm(res: Results, d: StagedDecisions, st: Staged, names) -> tuple[str | None, list[str]]:
    """The arm of ``names`` with the lowest mean validation error over stage 2's seeds at its lr, then the lower
    mean validation loss; None while one of them lacks a run, with those that do."""
    scores, missing = {}, []
    for arm in names:
        error, loss = (values(res, d, st, arm, m, "val") for m in ("error", "loss"))
        if all(s in error and s in loss for s in st.seeds):
            scores[arm] = (statistics.mean(error[s] for s in st.seeds), statistics.mean(loss[s] for s in st.seeds))
        else:
            missing.append(arm)
    return (None if missing else min(scores, key=scores.get)), missing


def _best_note(label: str, names, found: tuple[str | None, list[str]], recorded: str | None, where: str) -> str:
    arm, missing = found
    if arm is None:
        return f"{label} (among {', '.join(names)}): not decided yet (runs missing: {', '.join(missing)})."
    if recorded == arm:
        return f"{label}: {arm}."
    return f"{label}: {arm} ({label} in {where} is {recorded or 'not set'}: update it)."


def seeds_section(res: Results, d: StagedDecisions, st: Staged) -> list[str]:
    header = ["arm", "lr", "seeds", "test error % [95%]", "seed spread (std)", *(t for _, t in st.class_metrics),
              f"steps to {100 * st.reached:g}% validation error", "ms per step"]
    rows = []
    for arm in st.arms:
        lr, g = d.best_lr.get(arm), arm_group(res, d, st, arm)
        error = values(res, d, st, arm, "error", "test")
        if lr is None or not error:
            rows.append([arm, "not decided yet" if lr is None else f"{lr:g}", "" if lr is None else "not run yet",
                         *[""] * (len(header) - 3)])
            continue
        s = stat(error.values())
        half = 100 * t_half_width(s.std, s.n)
        mean = f"{100 * s.mean:.2f}" + (f" [{100 * s.mean - half:.2f}, {100 * s.mean + half:.2f}]" if s.n > 1 else "")
        classes = [values(res, d, st, arm, m, "test") for m, _ in st.class_metrics]
        steps = steps_reached(g, st.reached)
        rows.append([arm, f"{lr:g}", ", ".join(map(str, sorted(error))), mean, fmt_num(100 * s.std, 2),
                     *(_pct(statistics.mean(c.values())) if c else "" for c in classes),
                     " / ".join("not reached" if v is None else str(v) for v in steps.values()),
                     fmt_num(1000 * statistics.mean(g.measures()["step_s"].values()), 0)])
    notes = [_best_note("BEST_SINGLE", st.single_score, best_arm(res, d, st, st.single_score), d.best_single, st.where),
             _best_note("BEST_CONTENT", st.content, best_arm(res, d, st, st.content), d.best_content, st.where)]
    return ["## Stage 2: every arm at its lr over seeds", "",
            f"Seeds {_seeds(st.seeds)} for every arm, {_seeds(st.decisive_seeds)} also for stage 3's. Test error in % "
            "(mean [95% t interval]), its seed spread (std, points), the test error by class in % (mean over seeds), "
            f"the steps to the first evaluation with a validation error at most {100 * st.reached:g}% per seed, ms "
            f"per step as above. BEST_SINGLE and BEST_CONTENT: the lowest mean validation error over seeds "
            f"{_seeds(st.seeds)}, then the lower validation loss (protocol.md).", "",
            md_table(header, rows), "", " ".join(notes), ""]


# ------------------------------------------------------------------------------------------- stage 3

def comparisons(res: Results, d: StagedDecisions, st: Staged) -> list[tuple[str, str, Paired | str, bool]]:
    """Per decisive pair (vs BEST_SINGLE, vs static, vs control): (conclusion, other arm, the paired difference of
    test error in points, other minus BEST_CONTENT, or "not run yet (k of n seeds)", whether it survives Holm
    over the three; a pair not run yet counts as p = 1)."""
    content = values(res, d, st, d.best_content, "error", "test")
    out = []
    for conclusion, other in zip(CONCLUSIONS, (d.best_single, st.static, st.control)):
        errors = values(res, d, st, other, "error", "test")
        shared = [s for s in st.all_seeds if s in content and s in errors]
        if len(shared) < len(st.all_seeds):
            out.append((conclusion, other, f"not run yet ({len(shared)} of {len(st.all_seeds)} seeds)"))
        else:
            out.append((conclusion, other, point_difference({s: content[s] for s in shared},
                                                            {s: errors[s] for s in shared})))
    survives = holm([c.p if isinstance(c, Paired) else 1.0 for *_, c in out])
    return [(*row, ok) for row, ok in zip(out, survives)]


def decides_nothing(res: Results, d: StagedDecisions, st: Staged) -> str | None:
    """Why the comparison decides nothing (all four decisive arms at most ``solved`` mean test error, or all above
    ``unsolved``), or None."""
    four = d.decisive(st.control, st.static)
    means = [values(res, d, st, arm, "error", "test") for arm in four]
    means = [statistics.mean(v[s] for s in st.all_seeds) for v in means if all(s in v for s in st.all_seeds)]
    if len(means) < 4:
        return None
    if all(m <= st.solved for m in means):
        return f"all four reach at most {100 * st.solved:g}% mean test error"
    if all(m > st.unsolved for m in means):
        return f"all four stay above {100 * st.unsolved:g}% mean test error"
    return None


def decision_section(res: Results, d: StagedDecisions, st: Staged) -> list[str]:
    lines = ["## Stage 3: the decision", ""]
    if d.best_content is None or d.best_single is None:
        return lines + [f"Waits for BEST_SINGLE and BEST_CONTENT in {st.where}.", ""]
    content, rows = d.best_content, comparisons(res, d, st)
    cells, verdicts = [], []
    for _, other, c, ok in rows:
        if isinstance(c, str):
            cells.append([f"{other} − {content}", c, "", "", "", ""])
            continue
        verdicts.append(equivalence_verdict(c, st.margin, ok, (content, other)))
        cells.append([f"{other} − {content}", fmt_interval(c, holm_survives=ok), str(c.n), fmt_num(c.std, 2),
                      fmt_num(c.tost_p(st.margin), 3), verdicts[-1]])
    lines += [f"Test error in points, each arm minus BEST_CONTENT ({content}), paired over seeds "
              f"{_seeds(st.all_seeds)} (positive: the content couplings help); 95% t interval, `*` p < 0.05, `**` "
              f"also after Holm over the three pairs; TOST at ±{st.margin:g} points; the verdict: better or worse "
              f"when significant after Holm, equivalent when TOST finds the difference within ±{st.margin:g}, else "
              "inconclusive (protocol.md).", "",
              md_table(["pair", "Δ points [95%]", "seeds", "seed spread (std of Δ)", f"TOST p (±{st.margin:g})",
                        "verdict"], cells), ""]
    if any(isinstance(c, str) for _, _, c, _ in rows):
        return lines + ["The decision waits for stage 3's runs.", ""]
    nothing = decides_nothing(res, d, st)
    if nothing is None:
        return lines + [f"- **{conclusion}** ({other} − {content}): {'yes' if ok and c.mean > 0 else 'no'}, {v}."
                        for (conclusion, other, c, ok), v in zip(rows, verdicts)] + [""]
    steps = steps_reached(arm_group(res, d, st, content), st.reached)
    secondary = []
    for _, other, _, _ in rows:
        theirs = steps_reached(arm_group(res, d, st, other), st.reached)
        both = {s for s in st.all_seeds if steps.get(s) is not None and theirs.get(s) is not None}
        c = paired({s: theirs[s] for s in both}, {s: steps[s] for s in both}, lambda a, b: a - b)
        secondary.append([f"{other} − {content}", c or f"no seed where both reach {100 * st.reached:g}%",
                          str(len(both))])
    return lines + [f"**The comparison decides nothing**: {nothing} (protocol.md). As a secondary measure, stated as "
                    f"such: the steps to {100 * st.reached:g}% validation error, each arm minus BEST_CONTENT, paired "
                    "over the seeds where both reach it (positive: BEST_CONTENT reaches it sooner); `**`: after Holm "
                    "over the three.", "",
                    table_with_holm(["pair", "Δ steps [95%]", "seeds where both reach it"], secondary), ""]


# -------------------------------------------------------------------------------------- coupled arms

def _pooled(pairs: list[dict], key: str) -> float:
    """The mean of a per-head measurement over the heads and seeds of one layer's records."""
    return statistics.mean(v for p in pairs for v in p[key])


SIGN_HEADER = ["arm", "layer", "mean J", "positive %", "negative %", "within range %"]


def sign_rows(arm: str, found: dict[int, dict]) -> list[list[str]]:
    """Per layer, the coupling between the answering pair pooled over the arm's analysis records ``found`` ({seed:
    record}): the rows of :data:`SIGN_HEADER`."""
    rows = []
    for layer in range(len(next(iter(found.values()))["pair"]) if found else 0):
        pairs = [x["pair"][layer] for x in found.values()]
        rows.append([arm, str(layer), fmt_num(_pooled(pairs, "mean"), 4), _pct(_pooled(pairs, "positive")),
                     _pct(_pooled(pairs, "negative")), _pct(statistics.mean(p["within_range"] for p in pairs))])
    return rows


def coupled_section(res: Results, d: StagedDecisions, st: Staged) -> list[str]:
    errors, signs = [], []
    for arm in (a for a, x in st.arms.items() if x.coupled):
        g = arm_group(res, d, st, arm)
        found = {s: r.raw[st.analysis] for s, r in (g.runs.items() if g else ()) if r.raw.get(st.analysis)}
        if not found:
            errors.append([arm, "not decided yet" if arm not in d.best_lr else "not run yet", "", "", ""])
            continue
        coupled = {s: v for s, v in g.values("error", "test").items() if s in found}
        uncoupled = {s: x["uncoupled"]["test"]["error"] for s, x in found.items()}
        c = point_difference(coupled, uncoupled)
        errors.append([arm, str(len(found)), _pct(statistics.mean(coupled.values())),
                       _pct(statistics.mean(uncoupled.values())), fmt_interval(c)])
        signs += sign_rows(arm, found)
    lines = ["## The coupled arms: J = 0 at evaluation, and the sign between the answering pair", "",
             "At each arm's lr over its seeds: the test error in % of the trained model, and of the same model with "
             "every coupled layer made sigmoid attention on its own fields (J = 0 at evaluation); their difference "
             "in points, J = 0 minus coupled, paired over seeds (positive: the trained couplings help).", "",
             md_table(["arm", "seeds", "test error %", "with J = 0 %", "J = 0 − coupled, points [95%]"], errors), ""]
    if signs:
        lines += ["The coupling J between the pair of keys that answers, at the answer query, per layer: its mean over "
                  "the test sequences, heads and seeds, and the shares in % of sequences where it is positive "
                  "(ferromagnetic: the pair attended together, the sign that would solve the task) and negative, "
                  "and where the couplings reach the pair at all. These describe the mechanism; they decide "
                  "nothing.", "",
                  md_table(SIGN_HEADER, signs), ""]
    return lines


def stages_section(res: Results, d: StagedDecisions, st: Staged) -> list[str]:
    """Every section of the stages, in order."""
    return (lr_section(res, d, st) + seeds_section(res, d, st) + decision_section(res, d, st)
            + coupled_section(res, d, st))


__all__ = ["CONCLUSIONS", "SIGN_HEADER", "STOPPED", "WAITING", "Staged", "best_arm", "comparisons",
           "decides_nothing", "sign_rows", "stages_section", "steps_to"]


def study_report(res: Results, context: ReportContext, calibration: tuple[list[str], bool], staged: Callable,
                 settings: tuple) -> list[str]:
    """A calibrated study's report: the header, the protocol's opening, its ``calibration`` section (its lines, and
    whether the calibration stopped the study), then the stages at the chosen setting (``staged(setting)``: its
    :class:`Staged`), or that they wait for the calibration, or that they do not run."""
    d = context.decisions
    section, stopped = calibration
    lines = header_section(res, context.results_dir) + [protocol_sections(context.protocol)[""], ""] + section
    if d.chosen:
        return lines + stages_section(res, d, staged(settings[d.chosen - 1]))
    return lines + [STOPPED if stopped else WAITING, ""]
