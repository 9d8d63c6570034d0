"""The priors study's report."""

from __future__ import annotations

import statistics
from pathlib import Path

from ... import lr_rule
from ...recipes import NANOGPT, NANOGPT_T
from ...report import (
    ReportContext,
    archive_runs,
    every_run_is,
    fmt_difference,
    header_section,
    protocol_sections,
)
from ...report import coattention_section as shared_coattention_section
from ...results import NO_MEASURES, Results
from ...stats import millinats, paired, stat
from ...tables import fmt_num, fmt_stat, md_table, table_with_holm
from .grids import (
    CHOICE_TIE,
    DECISIVE,
    LONG_BATCH,
    LONG_EVAL_WINDOWS,
    LONG_SEEDS,
    LONG_STEPS,
    LONG_T,
    LR_SEEDS,
    NANOGPT_LR,
    NEAR_TIE,
    PREFIX,
    REALSIZE_LR,
    REUSED,
    SEEDS,
    SOFTMAX_POSITIONS,
    Arm,
    Decisions,
    all_arms,
    arm_learning_rates,
    long_arms,
    long_learning_rates,
    lr_at,
    own_arms,
    variant,
)


def owns(res: Results) -> bool:
    """True when every run is of this study's variants."""
    return every_run_is(res, PREFIX)


def _with_reused(res: Results, context: ReportContext) -> Results:
    """This study's runs and the real-size study's runs of the reused arms."""
    names = {variant(a.name, REALSIZE_LR, T) for a in REUSED for T in (NANOGPT_T, LONG_T)}
    found = archive_runs(context.archives.get("realsize"), lambda r: r.variant in names)
    return Results(list(res.all_runs) + (list(found.all_runs) if found else []))


def _group(res: Results, arm: Arm, lr: float, T: int = NANOGPT_T, steps: int | None = None):
    return res.get("shakespeare", variant(arm.name, lr, T, steps), T, arm.mode, arm.method)


def per_seed(res: Results, arm: Arm, lr: float, T: int = NANOGPT_T, steps: int | None = None) -> dict:
    """Per seed: validation loss, seconds per step and memory (:meth:`...results.Group.measures`)."""
    g = _group(res, arm, lr, T, steps)
    return dict(NO_MEASURES) if g is None else g.measures()


def decide_learning_rates(res: Results, d: Decisions) -> dict[str, tuple[float | None, float | None]]:
    """Per own arm whose stage-1 runs are all there: (the rule's lr, the lr to add beyond the edge or None)."""
    arms = {a.name: a for a in own_arms(d)}
    return lr_rule.decide(list(arms), lambda arm: arm_learning_rates(arm, d),
                          lambda arm, lr: lr_rule.seeds_mean(per_seed(res, arms[arm], lr)["loss"], LR_SEEDS),
                          d.diverged, NEAR_TIE, NANOGPT_LR)


def decide_long_lr(res: Results, d: Decisions) -> dict[str, tuple[float | None, None]]:
    """Stage 3's rule: per decisive arm whose three seed-0 runs at T = 256 are there, (the stage-1 rule's lr
    among them, None: no edge extension)."""
    arms = all_arms(d)
    return lr_rule.decide([n for n in DECISIVE if n in d.best_lr], lambda name: long_learning_rates(name, d),
                          lambda name, lr: per_seed(res, arms[name], lr, LONG_T)["loss"].get(0), {}, NEAR_TIE,
                          NANOGPT_LR, extend=False)


def choose_arm(found: dict[str, dict]) -> str | None:
    """Stage 2's choice among arms ({arm: per_seed}), each with all of SEEDS: the lowest mean validation loss;
    arms within CHOICE_TIE nats of it are tied, and the one with the lowest mean step time wins."""
    complete = {a: f for a, f in found.items() if all(s in f["loss"] for s in SEEDS)}
    if not complete or len(complete) < len(found):
        return None
    mean = {a: statistics.mean(f["loss"].values()) for a, f in complete.items()}
    best = min(mean.values())
    tied = [a for a, m in mean.items() if m <= best + CHOICE_TIE + 1e-12]
    return min(tied, key=lambda a: statistics.mean(complete[a]["step_s"].values()))


def stage2(res: Results, d: Decisions) -> dict[str, dict]:
    """Every arm at its decided lr at T = 64 (the reused ones at the real-size lr), as per_seed."""
    found = {name: per_seed(res, arm, lr_at(name, d)) for name, arm in all_arms(d).items()
             if lr_at(name, d) is not None}
    return {name: f for name, f in found.items() if f["loss"]}


def stage3(res: Results, d: Decisions) -> dict[str, dict]:
    """Stage 3's arms at T = 256 at their lr (the decisive pair's once LONG_LR is decided), and softmax and h
    (the real-size runs), as per_seed."""
    arms = all_arms(d)
    names = [n for n in ("softmax", "h", *long_arms(d)) if n not in DECISIVE or n in d.long_lr]
    found = {n: per_seed(res, arms[n], lr_at(n, d, LONG_T), LONG_T) for n in dict.fromkeys(names)
             if lr_at(n, d, LONG_T) is not None}
    return {name: f for name, f in found.items() if f["loss"]}


def stage2_choices(found: dict[str, dict], d: Decisions) -> dict[str, str | None]:
    """The three choices of stage 2's rule from its runs (None until their arms are complete)."""
    arms = all_arms(d)
    pick = lambda names: choose_arm({n: found.get(n, NO_MEASURES) for n in names})  # noqa: E731
    softmax = pick(SOFTMAX_POSITIONS)
    return {"softmax_position": SOFTMAX_POSITIONS.get(softmax) if softmax else None,
            "best_uncoupled": pick([n for n, a in arms.items() if not a.coupled]),
            "best_coupled": pick([n for n, a in arms.items() if a.coupled])}


def decide_equal_compute_steps(res: Results, d: Decisions) -> int | None:
    """Stage 4's rule: round(LONG_STEPS x the best coupled arm's mean wall time per run / the best uncoupled
    arm's, both over their stage-3 seeds); None until both have every seed."""
    if d.best_coupled is None or d.best_uncoupled is None:
        return None
    found = stage3(res, d)
    walls = []
    for name in (d.best_coupled, d.best_uncoupled):
        seeds = LONG_SEEDS if name in DECISIVE else SEEDS
        step_s = found.get(name, NO_MEASURES)["step_s"]
        if not all(s in step_s for s in seeds):
            return None
        walls.append(statistics.mean(step_s[s] for s in seeds))  # steps are LONG_STEPS in each
    return round(LONG_STEPS * walls[0] / walls[1])


def report(res: Results, context: ReportContext) -> list[str]:
    """Header, protocol, the stages' tables and choices, what the couplings add, and their decomposition."""
    d = context.decisions
    own = res
    res = _with_reused(res, context)
    lines = header_section(own, context.results_dir)
    lines += [protocol_sections(context.protocol)[""], ""]
    lines += learning_rate_section(res, d)
    lines += comparison_section(res, d, NANOGPT_T, context.out)
    lines += long_lr_section(res, d)
    lines += comparison_section(res, d, LONG_T, context.out)
    lines += what_couplings_add(res, d)
    lines += coattention_section(res, d)
    return lines


def learning_rate_section(res: Results, d: Decisions) -> list[str]:
    decided = decide_learning_rates(res, d)
    arms = {a.name: a for a in own_arms(d)}
    table = lr_rule.table(["arm", "lr", "validation loss", "ms per step"], list(arms),
                          lambda arm: arm_learning_rates(arm, d),
                          lambda arm, lr: lr_rule.loss_cells(per_seed(res, arms[arm], lr), LR_SEEDS), decided,
                          d.diverged)
    if not table:
        return []
    notes = lr_rule.decision_notes(list(arms), decided, d.best_lr, "studies/priors/decisions.json")
    return ["## Stage 1: each arm's learning rate", "",
            f"T = {NANOGPT_T}, validation loss (nats per character) of seed 0; ms per step: wall time over steps, "
            "evaluations included. The rule of protocol.md; bold: its choice.", "", table, "", notes, ""]


TWIN = {"window16-slot16": "h-slot16", "window8-slot8": "h-slot16", "window16": "h"}  # the same slots, no J


def comparison_section(res: Results, d: Decisions, T: int, out: Path) -> list[str]:
    """Stage 2 (T = 64) or 3 (T = 256): per arm its validation loss, paired differences to softmax and to its
    uncoupled twin, step time and memory, the plot, and (stage 2) the choices of its rule."""
    found = stage2(res, d) if T == NANOGPT_T else stage3(res, d)
    if not found:
        return []
    soft = found.get("softmax", NO_MEASURES)["loss"]
    soft_step = statistics.mean(found["softmax"]["step_s"].values()) if "softmax" in found else None
    cells = []
    for name, f in found.items():
        step = statistics.mean(f["step_s"].values())
        ref = found.get(TWIN.get(name, ""), NO_MEASURES)["loss"]
        cells.append([name, f"{lr_at(name, d, T):g}", fmt_stat(stat(f["loss"].values()), digits=4),
                      paired(soft, f["loss"], millinats) if name != "softmax" and soft else None,
                      paired(ref, f["loss"], millinats) if name in TWIN and ref else None,
                      fmt_num(1000 * step, 0), fmt_num(step / soft_step, 1) if soft_step else "",
                      fmt_num(statistics.mean(f["peak_mib"].values()), 0) if f["peak_mib"] else ""])
    stage = 2 if T == NANOGPT_T else 3
    where = f"batch {NANOGPT['batch_size']}, {NANOGPT['steps']} steps" if T == NANOGPT_T else \
        f"batch {LONG_BATCH}, {LONG_STEPS} steps, {LONG_EVAL_WINDOWS} validation windows"
    png = f"loss_T{T}.png"
    lines = [f"## Stage {stage}: T = {T}, every arm at its lr", "",
             f"{where}. Validation loss (nats per character), mean ± std over seeds (n); differences in millinats, "
             "paired over seeds, mean [95% interval], positive = lower loss than the reference; `*` p < 0.05, `**` "
             "also after Holm over the column. The twin: the same slots without couplings (window16-slot16 and "
             "window8-slot8 against h-slot16, window16 against h). ms per step: wall time over steps, evaluations "
             "included, under the machine's load at the time (two runs at once); peak RSS: the memory probe before "
             "each run (a fresh process, a few training steps), MiB.", "",
             table_with_holm(["arm", "lr", "validation loss", "vs softmax, Δ mnats", "vs its uncoupled twin, Δ mnats",
                              "ms per step", "x softmax", "peak RSS (MiB)"], cells, {3: "softmax", 4: "twin"}), "",
             f"![validation loss against steps and against wall time, T = {T}]({png})", ""]
    curves = {name: (all_arms(d)[name], lr_at(name, d, T), None) for name in found}
    if T != NANOGPT_T and d.equal_compute_steps is not None and d.best_uncoupled is not None:
        name = d.best_uncoupled
        curves[f"{name}, {d.equal_compute_steps} steps"] = (all_arms(d)[name], lr_at(name, d, T), d.equal_compute_steps)
    _plot(res, T, curves, out / png)
    if T == NANOGPT_T:
        choices = stage2_choices(found, d)
        lines += ["Stage 2's choices by its rule (protocol.md): "
                  + "; ".join(f"{k.replace('_', ' ')}: {v or 'not decided (runs missing)'}" for k, v in choices.items())
                  + ".", ""]
    return lines


def long_lr_section(res: Results, d: Decisions) -> list[str]:
    """Stage 3's lr check of the decisive pair: seed 0 at T = 256 at three lrs, and the rule's choice."""
    arms = all_arms(d)
    decided = decide_long_lr(res, d)

    def cells(name: str, lr: float) -> list[str] | None:
        f = per_seed(res, arms[name], lr, LONG_T)
        return [f"{f['loss'][0]:.4f}", fmt_num(1000 * f["step_s"][0], 0)] if 0 in f["loss"] else None

    table = lr_rule.table(["arm", "lr", "validation loss", "ms per step"], [n for n in DECISIVE if n in d.best_lr],
                          lambda name: long_learning_rates(name, d), cells, decided)
    if not table:
        return []
    notes = [f"{name}: the rule picks {lr:g}" + ("" if d.long_lr.get(name) == lr else
                                                 " (not yet in decisions.json)") for name, (lr, _) in decided.items()]
    return [f"## Stage 3: the decisive pair's lr at T = {LONG_T}", "",
            "Seed 0 at the stage-1 lr and one half-decade step either side; the stage-1 rule without edge "
            "extension; bold: its choice (``LONG_LR``).", "", table, "", "; ".join(notes) + ".", ""]


def what_couplings_add(res: Results, d: Decisions) -> list[str]:
    """The comparisons the study is for, paired over seeds: the decisive pair and the best coupled arm against
    the best uncoupled one, at T = 64 and 256 at equal steps, and at equal wall time (stage 4)."""
    arms = all_arms(d)
    pairs = [DECISIVE] + ([(d.best_coupled, d.best_uncoupled)] if d.best_coupled and d.best_uncoupled else [])
    rows = []
    for coupled, uncoupled in dict.fromkeys(pairs):
        for T in (NANOGPT_T, LONG_T):
            lr_c, lr_u = lr_at(coupled, d, T), lr_at(uncoupled, d, T)
            if T == LONG_T and (coupled in DECISIVE and coupled not in d.long_lr
                                or uncoupled in DECISIVE and uncoupled not in d.long_lr):
                continue
            if lr_c is None or lr_u is None:
                continue
            a = per_seed(res, arms[coupled], lr_c, T)["loss"]
            b = per_seed(res, arms[uncoupled], lr_u, T)["loss"]
            rows.append([f"{coupled} vs {uncoupled}", f"T = {T}, {LONG_STEPS if T != NANOGPT_T else NANOGPT['steps']}"
                         " steps each", fmt_difference(b, a)])
        if d.equal_compute_steps is not None and (coupled, uncoupled) == (d.best_coupled, d.best_uncoupled):
            a = per_seed(res, arms[coupled], lr_at(coupled, d, LONG_T), LONG_T)["loss"]
            b = per_seed(res, arms[uncoupled], lr_at(uncoupled, d, LONG_T), LONG_T, d.equal_compute_steps)["loss"]
            rows.append([f"{coupled} vs {uncoupled}", f"T = {LONG_T}, equal wall time ({uncoupled}: "
                         f"{d.equal_compute_steps} steps)", fmt_difference(b, a)])
    rows = [r for r in rows if r[2]]
    if not rows:
        return []
    return ["## What the couplings add", "",
            "The uncoupled arm's validation loss minus the coupled arm's, in millinats, paired over seeds: mean "
            "[95% t interval] (n pairs); positive = the coupled arm's loss is lower.", "",
            md_table(["comparison", "at", "Δ mnats"], rows), ""]


def coattention_section(res: Results, d: Decisions) -> list[str]:
    """Per coupled arm of this study and T: the decomposition recorded by training (:func:`...report.
    coattention_section`); the real-size window16 runs kept no trained model and are not measured."""
    entries = []
    for name, arm in ((a.name, a) for a in own_arms(d) if a.coupled):
        for T in (NANOGPT_T, LONG_T):
            lr = lr_at(name, d, T)
            entries.append((name, T, _group(res, arm, lr, T) if lr is not None else None))
    return shared_coattention_section(entries, "The real-size window16 runs kept no trained model and are not "
                                               "measured.")


ARM_COLORS = {"softmax": "black", "h": "tab:orange", "window16": "tab:blue", "window16-slot16": "tab:cyan",
              "window8-slot8": "tab:purple", "h-slot16": "tab:red", "softmax-rope": "tab:gray",
              "softmax-alibi": "tab:olive", "softmax-slot16": "tab:pink", "fox": "tab:brown",
              "stickbreaking": "tab:green", "h-alibi": "gold", "window16-rope": "navy"}


def _plot(res: Results, T: int, curves: dict[str, tuple[Arm, float, int | None]], path: Path) -> None:
    """Each arm's validation loss (mean over seeds of the evaluations during training) against training steps
    (left) and against wall time (right: the evaluation's step times the run's mean seconds per step)."""
    from ...plots import figure, legend, log_x_axis, save, title

    fig = figure(9.0, 3.6)
    ax, wax = fig.subplots(1, 2)
    for label, (arm, lr, steps) in curves.items():
        g = _group(res, arm, lr, T, steps)
        if g is None:
            continue
        curves = g.curves()
        if not curves:
            continue
        common = list(curves)
        mean = [statistics.mean(v.values()) for v in curves.values()]
        step_s = statistics.mean(g.measures()["step_s"].values())
        color = ARM_COLORS.get(arm.name, "tab:gray")
        style = dict(marker=".", color=color, linestyle="--" if steps else "-")
        ax.plot(common, mean, label=f"{label} (lr {lr:g})", **style)
        wax.plot([s * step_s / 60 for s in common], mean, label=label, **style)
    ax.set_xlabel("training step")
    wax.set_xlabel("wall time (min, one run at the arm's mean rate)")
    log_x_axis(wax)
    for axis, what in ((ax, "steps"), (wax, "wall time")):
        axis.set_ylabel("validation loss (nats per character)")
        axis.tick_params(labelsize=8)
        title(axis, f"T = {T}: validation loss against {what} (mean over seeds)")
        legend(axis, fontsize=6)
    save(fig, path)
