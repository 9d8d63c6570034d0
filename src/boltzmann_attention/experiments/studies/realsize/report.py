"""The realsize study's report."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ... import lr_rule
from ...recipes import NANOGPT, NANOGPT_LOSS, NANOGPT_T
from ...report import ReportContext, every_run_is, header_section, protocol_sections
from ...results import NO_MEASURES, Results
from ...stats import millinats, paired, relative, stat
from ...tables import fmt_interval, fmt_num, fmt_stat, table_with_holm
from .grids import (
    ARMS,
    BY_NAME,
    COUPLED,
    LONG_BATCH,
    LONG_EVAL_WINDOWS,
    LONG_STEPS,
    LONG_T,
    LR_SEEDS,
    MEMORY_PROBE_STEPS,
    NANOGPT_LR,
    NEAR_TIE,
    PREFIX,
    RANGE,
    WINDOW,
    Decisions,
    arm_learning_rates,
    long_arms,
    variant,
)


def owns(res: Results) -> bool:
    """True when every run is of this study's variants."""
    return every_run_is(res, PREFIX)


def report(res: Results, context: ReportContext) -> list[str]:
    """Header, the protocol, stage 1's learning rates, then stages 2 (T = 64) and 3 (T = 256)."""
    d = context.decisions
    lines = header_section(res, context.results_dir)
    lines += [protocol_sections(context.protocol)[""], ""]
    lines += learning_rate_section(res, d)
    lines += comparison_section(res, NANOGPT_T, context.out, d)
    lines += comparison_section(res, LONG_T, context.out, d)
    return lines


def _group(res: Results, arm: str, lr: float, T: int = NANOGPT_T):
    a = BY_NAME[arm]
    return res.get("shakespeare", variant(arm, lr, T), T, a.mode, a.method)


def per_seed(res: Results, arm: str, lr: float, T: int = NANOGPT_T) -> dict[str, dict[int, float]]:
    """Per seed: loss, seconds per step and memory (:meth:`...results.Group.measures`)."""
    g = _group(res, arm, lr, T)
    return dict(NO_MEASURES) if g is None else g.measures()


def decide_learning_rates(res: Results, d: Decisions) -> dict[str, tuple[float | None, float | None]]:
    """Per arm whose stage-1 runs are all there (the lrs in DIVERGED aside): (the rule's lr, the lr to add
    beyond the edge or None)."""
    return lr_rule.decide([a.name for a in ARMS], lambda arm: arm_learning_rates(arm, d),
                          lambda arm, lr: lr_rule.seeds_mean(per_seed(res, arm, lr)["loss"], LR_SEEDS), d.diverged,
                          NEAR_TIE, NANOGPT_LR)


def learning_rate_section(res: Results, d: Decisions) -> list[str]:
    decided = decide_learning_rates(res, d)
    table = lr_rule.table(["arm", "lr", "validation loss", "ms per step"], [a.name for a in ARMS],
                          lambda arm: arm_learning_rates(arm, d),
                          lambda arm, lr: lr_rule.loss_cells(per_seed(res, arm, lr), LR_SEEDS), decided, d.diverged)
    if not table:
        return []
    notes = lr_rule.decision_notes([a.name for a in ARMS], decided, d.best_lr, "studies/realsize/decisions.json")
    return ["## Stage 1: each arm's learning rate", "",
            f"T = {NANOGPT_T}, validation loss (nats per character) of seed(s) {', '.join(map(str, LR_SEEDS))}; "
            f"ms per step: wall time over steps, evaluations included. Rule (fixed before the runs): the lowest "
            f"loss; losses within {NEAR_TIE:g} nats of it are tied, and the lr the fewest half-decade steps from "
            f"nanoGPT's {NANOGPT_LR:g} wins among them (then the smaller); a winner at the edge of the arm's lrs "
            "adds the next lr beyond it. Bold: the rule's choice.", "", table, "", notes, ""]


def comparison_section(res: Results, T: int, out: Path, d: Decisions) -> list[str]:
    """Stage 2 (T = 64) or 3 (T = 256): per arm at its BEST_LR, the validation loss, its paired differences
    to softmax and (h+J arms) to h, step time and memory; then what J adds, in words."""
    arms = [a.name for a in ARMS if a.name in d.best_lr and (T == NANOGPT_T or a.name in long_arms(d))]
    found = {arm: per_seed(res, arm, d.best_lr[arm], T) for arm in arms}
    found = {arm: f for arm, f in found.items() if f["loss"]}
    if not found:
        return []
    empty = {"loss": {}}
    soft, h = found.get("softmax", empty)["loss"], found.get("h", empty)["loss"]
    soft_step = statistics.mean(found["softmax"]["step_s"].values()) if "softmax" in found else None
    cells = []
    for arm, f in found.items():
        step = statistics.mean(f["step_s"].values())
        cells.append([arm, f"{d.best_lr[arm]:g}", fmt_stat(stat(f["loss"].values()), digits=4),
                      paired(soft, f["loss"], millinats) if arm != "softmax" and soft else None,
                      paired(h, f["loss"], millinats) if arm in COUPLED and h else None,
                      fmt_num(1000 * step, 0), fmt_num(step / soft_step, 1) if soft_step else "",
                      fmt_num(statistics.mean(f["peak_mib"].values()), 0) if f["peak_mib"] else "",
                      fmt_num(statistics.mean(f["steps_mib"].values()), 0) if f["steps_mib"] else ""])
    where = (f"T = {T}, batch {NANOGPT['batch_size']}, {NANOGPT['steps']} steps" if T == NANOGPT_T else
             f"T = {T}, batch {LONG_BATCH}, {LONG_STEPS} steps, {LONG_EVAL_WINDOWS} validation windows")
    lines = [f"## Stage {2 if T == NANOGPT_T else 3}: {where}", "",
             "Validation loss (nats per character, all positions), mean ± std over seeds (n seeds); differences in "
             "millinats (10^-3 nats), paired over seeds, mean [95% interval], positive = lower loss than the "
             "reference; `*` p < 0.05, `**` also after a Holm correction over the column. ms per step: the run's "
             "wall time over its steps (evaluations included; the machine's load at the time included), mean over "
             "seeds, and its ratio to softmax's. Memory: the probe before each run (a fresh process, "
             f"{MEMORY_PROBE_STEPS} training steps): its peak RSS, and what the steps added to it, MiB, mean over "
             "seeds.", "",
             table_with_holm(["arm", "lr", "validation loss", "vs softmax, Δ mnats", "what J adds: vs h, Δ mnats",
                              "ms per step", "x softmax", "peak RSS (MiB)", "steps' memory (MiB)"], cells,
                             {3: "softmax", 4: "h"}), ""]
    png = f"loss_T{T}.png"
    _plot(res, T, found, out / png, d)
    lines += [f"![validation loss against steps and against step time, T = {T}]({png})", ""]
    if T == NANOGPT_T and soft:
        s = stat(soft.values())
        lines += [f"Softmax: {s.mean:.4f} against nanoGPT's published ~{NANOGPT_LOSS} for this configuration "
                  f"({(s.mean - NANOGPT_LOSS) / NANOGPT_LOSS * 100:+.1f}%).", ""]
    return lines + convergence_lines(res, T, list(found), d) + j_verdicts(found, h)


def convergence_lines(res: Results, T: int, arms: list[str], d: Decisions) -> list[str]:
    """Per arm whose runs recorded solver non-convergence (mean field): in how many training steps and
    evaluations, summed over its seeds; a line saying so for the mean-field arm when none was recorded."""
    lines = []
    for arm in arms:
        runs = _group(res, arm, d.best_lr[arm], T).runs.values()
        found = [r.raw["convergence"] for r in runs if r.raw.get("convergence")]
        if found:
            total = {k: sum(c[k] for c in found) for k in ("unconverged_steps", "unconverged_evaluations")}
            lines.append(f"- {arm}: the marginals did not converge in {total['unconverged_steps']} training steps "
                         f"and {total['unconverged_evaluations']} evaluations, summed over {len(found)} of its "
                         f"{len(runs)} runs (their validation loss is then the last iterate's, not a fixed point's).")
        elif BY_NAME[arm].method in ("meanfield", "tap"):
            lines.append(f"- {arm}: the mean field converged in every step and evaluation of its {len(runs)} runs.")
    return ["Convergence of the iterative solver:", "", *lines, ""] if lines else []


def j_verdicts(found: dict, h: dict[int, float]) -> list[str]:
    """One line per h+J arm: whether J helps, hurts or makes no measurable difference against h, and how much
    (millinats and percent of h's loss, 95% intervals)."""
    lines = []
    for arm in COUPLED:
        if arm not in found or not h:
            continue
        d, pct = paired(h, found[arm]["loss"], millinats), paired(h, found[arm]["loss"], relative)
        if d is None or d.n < 2:
            lines.append(f"- {arm}: fewer than 2 seeds paired with h; not tested.")
            continue
        word = ("**J helps**" if d.low > 0 else "**J hurts**" if d.high < 0 else
                "**no measurable difference** (the interval contains 0)")
        lines.append(f"- {arm} against h: {word}: {fmt_interval(d)} millinats, {fmt_interval(pct)}% of h's loss "
                     f"({d.n} paired seeds).")
    return ["What the couplings add (each h+J arm against h, the same model without J):", "", *lines, ""] if lines \
        else []


ARM_COLORS = {"softmax": "black", "h": "tab:orange", f"window{WINDOW}": "tab:blue", f"meanfield{RANGE}": "tab:green",
              f"banded{RANGE}": "tab:purple"}


def _plot(res: Results, T: int, found: dict, path: Path, d: Decisions) -> None:
    """Left: each arm's validation loss against training steps (mean over seeds of the evaluations during
    training); right: its final validation loss (mean ± std) against its ms per step."""
    from ...plots import figure, legend, log_x_axis, save, title

    fig = figure(9.0, 3.4)
    ax, sax = fig.subplots(1, 2)
    for arm, f in found.items():
        curves = _group(res, arm, d.best_lr[arm], T).curves()
        color = ARM_COLORS.get(arm, "tab:gray")
        if curves:
            ax.plot(list(curves), [statistics.mean(v.values()) for v in curves.values()], marker=".", color=color,
                    label=f"{arm} (lr {d.best_lr[arm]:g})")
        loss = stat(f["loss"].values())
        sax.errorbar([1000 * statistics.mean(f["step_s"].values())], [loss.mean],
                     yerr=[0 if math.isnan(loss.std) else loss.std], marker="o", capsize=3, color=color, label=arm)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation loss (nats per character)")
    title(ax, f"T = {T}: validation loss during training (mean over seeds)")
    log_x_axis(sax)
    sax.set_xlabel("ms per training step (log scale)")
    sax.set_ylabel("final validation loss")
    title(sax, f"T = {T}: loss against cost")
    for axis in (ax, sax):
        axis.tick_params(labelsize=8)
        legend(axis)
    save(fig, path)
