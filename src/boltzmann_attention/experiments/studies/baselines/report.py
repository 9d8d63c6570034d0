"""The baselines study's report."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path

from ... import lr_rule
from ...claims import PAPER, SHAKESPEARE_CLAIMS, agreement_section, claim_j_structure, claims_beside, extension_section
from ...model import INITS
from ...plots import figure, finish, style
from ...recipes import (
    DEFAULT_FIELD_BIAS,
    NANOGPT_LOSS,
    NANOGPT_T,
)
from ...report import (
    ReportContext,
    archive_runs,
    couplings_section,
    demoted,
    header_section,
    protocol_sections,
    shakespeare_section,
)
from ...results import Group, Results
from ...stats import paired, relative, stat
from ...tables import duration, fmt_stat, md_table, table_with_holm
from .grids import (
    CONVERGENCE_T,
    FAIR_MODES,
    FAIR_T,
    FULL,
    GRID_SEEDS,
    GRID_STEPS,
    GRID_TS,
    INIT_TS,
    LEARNING_RATES,
    LONG_TS,
    LONGEST_T,
    MODES,
    NANOGPT_VARIANT,
    PREFIX,
    SEEDS,
    STEPS,
    Decisions,
    fair_variants,
    variant,
)


def owns(res: Results) -> bool:
    """True when every run is of this study's variants."""
    return bool(res.all_runs) and all(r.variant.startswith(PREFIX) or r.variant == NANOGPT_VARIANT
                                      for r in res.all_runs)


def report(res: Results, context: ReportContext) -> list[str]:
    """Header, the protocol, then each stage's section (a stage without runs has none)."""
    d = context.decisions
    lines = header_section(res, context.results_dir)
    lines += [protocol_sections(context.protocol)[""], ""]
    lines += nanogpt_section(res)
    lines += init_section(res, d)
    lines += learning_rate_section(res, d)
    lines += convergence_section(res, context.out, d)
    lines += grid_section(res, context)
    lines += fair_section(res, d)
    return lines


def _values(g: Group | None, metric: str = "ppl") -> dict[int, float]:
    return g.values(metric) if g is not None else {}


def _get(res: Results, T: int, mode: str, var: str) -> Group | None:
    return res.get("shakespeare", var, T, mode, "exact")


def nanogpt_section(res: Results) -> list[str]:
    g = _get(res, NANOGPT_T, "softmax", NANOGPT_VARIANT)
    if g is None:
        return []
    losses = g.values("loss")
    s = stat(losses.values())
    rows = [[str(seed), f"{loss:.4f}", duration(g.runs[seed].wall_time_s)] for seed, loss in sorted(losses.items())]
    gap = (s.mean - NANOGPT_LOSS) / NANOGPT_LOSS * 100
    return ["## The nanoGPT check", "",
            f"Softmax in nanoGPT's CPU configuration: validation loss (nats per character, all 64 positions of "
            f"2048 fixed validation windows) {fmt_stat(s, digits=4)} against nanoGPT's published ~{NANOGPT_LOSS} "
            f"({gap:+.1f}%). The training recipe is the field's.", "",
            md_table(["seed", "validation loss", "wall time"], rows), ""]


def init_section(res: Results, d: Decisions) -> list[str]:
    """Both inits per mode and T, the paired effect of the init, each mode against softmax under each init,
    and the decision rule applied."""
    if not any(_get(res, T, "softmax", variant(i)) for T in INIT_TS for i in INITS):
        return []
    lines = ["## 1. Initialisation", "",
             "Validation perplexity (all positions, then last position), mean ± std over 5 seeds, 4000 steps, "
             "lr 3e-3. 'gpt2 vs torch' and 'vs softmax' are paired over seeds, Δ% with its 95% interval, "
             "positive = lower perplexity (better); `*` p < 0.05, `**` also after a Holm correction over the "
             "table.", ""]
    for metric, name in (("ppl", "all positions"), ("ppl_last", "last position")):
        cells = []
        for T in sorted(INIT_TS):
            for mode in MODES:
                torch_g, gpt2_g = (_get(res, T, mode, variant(i)) for i in ("torch", "gpt2"))
                a, b = _values(torch_g, metric), _values(gpt2_g, metric)
                if not a and not b:
                    continue
                soft = {i: _values(_get(res, T, "softmax", variant(i)), metric) for i in ("torch", "gpt2")}
                h_gpt2 = _values(_get(res, T, "h", variant("gpt2")), metric)
                cells.append([str(T), mode, fmt_stat(stat(a.values())), fmt_stat(stat(b.values())),
                              paired(a, b, relative) if a and b else None,
                              paired(soft["torch"], a, relative) if mode != "softmax" and a else None,
                              paired(soft["gpt2"], b, relative) if mode != "softmax" and b else None,
                              paired(h_gpt2, b, relative) if mode == "h+J" and b and h_gpt2 else None])
        lines += [f"### {name.capitalize()}", "",
                  table_with_holm(["T", "mode", "torch PPL", "gpt2 PPL", "gpt2 vs torch, Δ%",
                                   "vs softmax (torch), Δ%", "vs softmax (gpt2), Δ%", "what J adds: vs h (gpt2), Δ%"],
                                  cells), ""]
    means = {}
    for init in INITS:
        per_T = [stat(_values(_get(res, T, "softmax", variant(init))).values()) for T in INIT_TS]
        if all(per_T):
            means[init] = statistics.mean(s.mean for s in per_T)
    if len(means) == len(INITS):
        best = min(means, key=means.get)
        lines += ["Rule: the default init is softmax's best, by its mean perplexity over T = 8 and 12: "
                  + ", ".join(f"{i} {means[i]:.3f}" for i in INITS) + f", so **{best}**"
                  + ("" if best == d.chosen_init else f" (the study's later stages still use {d.chosen_init}: "
                                                      "update CHOSEN_INIT in decisions.json)") + ".", ""]
    return lines


def learning_rate_section(res: Results, d: Decisions) -> list[str]:
    """Stage 2: per mode and lr the perplexity at each T, and the rule's choice (protocol.md: the lowest mean
    log-perplexity over both windows, without a tie band)."""
    def lrs_of(mode: str) -> tuple[float, ...]:
        return tuple(sorted(LEARNING_RATES + d.extra_learning_rates.get(mode, ())))

    def per_T(mode: str, lr: float) -> list[dict[int, float]]:  # the init study ran 5 seeds: the first 3
        return [{s: v for s, v in _values(_get(res, T, mode, variant(d.chosen_init, lr))).items() if s in SEEDS}
                for T in INIT_TS]

    def score(mode: str, lr: float) -> float | None:
        found = per_T(mode, lr)
        return statistics.mean(statistics.mean(math.log(v) for v in by_seed.values()) for by_seed in found) \
            if all(found) else None

    def cells(mode: str, lr: float) -> list[str] | None:
        found = per_T(mode, lr)
        return [fmt_stat(stat(by_seed.values())) for by_seed in found] if any(found) else None

    decided = lr_rule.decide(MODES, lrs_of, score, {})
    table = lr_rule.table(["mode", "lr"] + [f"T = {T}" for T in INIT_TS], MODES, lrs_of, cells, decided)
    if not table:
        return []
    best = {mode: lr for mode, (lr, _) in decided.items()}
    lines = ["## 2. Each mode at its best learning rate", "",
             f"Validation perplexity (all positions), mean ± std over seeds {', '.join(map(str, SEEDS))}, 4000 "
             f"steps, init {d.chosen_init}. Rule: per mode, the lr with the lowest mean log-perplexity over both "
             "windows (bold).", "", table, ""]
    waiting = [m for m in MODES if m not in best and m in d.extra_learning_rates]
    if waiting:
        lines += [f"{m}: best at the grid's edge, so the study adds lr "
                  f"{', '.join(f'{lr:g}' for lr in d.extra_learning_rates[m])} (not run yet)." for m in waiting] + [""]
    if best:
        lines += ["Best: " + ", ".join(f"{m} {lr:g}" for m, lr in best.items())
                  + ("" if best == d.best_lr else " (the convergence stage uses BEST_LR: update it in decisions.json)")
                  + ".", ""]
    return lines


def convergence_section(res: Results, out: Path, d: Decisions) -> list[str]:
    found = {}
    for mode, lr in d.best_lr.items():
        for steps in STEPS:
            g = _get(res, CONVERGENCE_T, mode, variant(d.chosen_init, lr, steps))
            if g is not None:
                found[(mode, steps)] = g
    if not found:
        return []
    cells = []
    for steps in STEPS:
        soft = _values(found.get(("softmax", steps)))
        row = [str(steps)]
        for mode in d.best_lr:
            v = {s: x for s, x in _values(found.get((mode, steps))).items() if s in SEEDS}
            row.append(fmt_stat(stat(v.values()), show_n=False))
        for mode in d.best_lr:
            if mode != "softmax":
                v = _values(found.get((mode, steps)))
                row.append(paired(soft, v, relative) if soft and v else None)
        cells.append(row)
    others = [m for m in d.best_lr if m != "softmax"]
    _plot_convergence(found, out / "convergence.png", d)
    return ["## 3. Training length", "",
            f"T = {CONVERGENCE_T}, each mode at its best lr, validation perplexity (all positions) after the whole "
            "schedule, mean ± std over seeds; Δ% against softmax paired over seeds (positive = better).", "",
            table_with_holm(["steps"] + [f"{m} PPL" for m in d.best_lr] + [f"{m} vs softmax, Δ%" for m in others],
                            cells), "", "![validation perplexity against steps](convergence.png)", "",
            *settling(found, d), ""]


def _ordering(found: dict, steps: int, d: Decisions) -> list[str] | None:
    """The modes from the lowest mean perplexity to the highest at ``steps``; None unless all have 3 seeds."""
    means = {}
    for mode in d.best_lr:
        v = {s: x for s, x in _values(found.get((mode, steps))).items() if s in SEEDS}
        if len(v) < len(SEEDS):
            return None
        means[mode] = statistics.mean(v.values())
    return sorted(means, key=means.get)


def settling(found: dict, d: Decisions) -> list[str]:
    """The rule for the training length, applied: the ordering of the modes by mean perplexity at each length,
    and whether 16000 steps agrees with 64000 (the same ordering, and every mode's Δ% against softmax at 16000
    inside the 95% interval of its Δ% at 64000)."""
    orders = {steps: _ordering(found, steps, d) for steps in STEPS}
    lines = ["Ordering (lowest perplexity first): " + "; ".join(
        f"{steps} steps: {' < '.join(o) if o else 'incomplete'}" for steps, o in orders.items()) + "."]
    short, long = STEPS[-2], STEPS[-1]
    if orders[short] is None or orders[long] is None:
        return lines + [f"Rule (fixed before the runs): {short} steps has settled when its ordering equals "
                        f"{long}'s and every mode's Δ% against softmax lies inside the 95% interval of its Δ% at "
                        f"{long}. Not decided yet: runs missing."]
    inside = []
    for mode in d.best_lr:
        if mode == "softmax":
            continue
        soft = (_values(found[("softmax", short)]), _values(found[("softmax", long)]))
        a = paired(soft[0], _values(found[(mode, short)]), relative)
        b = paired(soft[1], _values(found[(mode, long)]), relative)
        inside.append((mode, a, b, b.low <= a.mean <= b.high))
    same = orders[short] == orders[long]
    settled = same and all(ok for *_, ok in inside)
    detail = "; ".join(f"{m}: {a.mean:+.2f}% at {short} against [{b.low:+.2f}, {b.high:+.2f}] at {long}"
                       for m, a, b, _ in inside)
    return lines + [f"Rule (fixed before the runs): {short} steps has settled when its ordering equals {long}'s and "
                    f"every mode's Δ% against softmax lies inside the 95% interval of its Δ% at {long}. The "
                    f"orderings are {'the same' if same else 'different'}; {detail}. So {short} steps "
                    + ("**has settled**." if settled else "**has not settled**: the grid's conclusions at "
                       f"{short} steps carry that caveat.")]


def _plot_convergence(found: dict, path: Path, d: Decisions) -> None:
    fig = figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for mode in d.best_lr:
        points = [(steps, stat(g.values("ppl").values())) for (m, steps), g in sorted(found.items()) if m == mode]
        points = [(s, st) for s, st in points if st is not None]
        if points:
            ax.errorbar([s for s, _ in points], [st.mean for _, st in points],
                        yerr=[0 if math.isnan(st.std) else st.std for _, st in points], marker="o", capsize=3,
                        label=f"{mode} (lr {d.best_lr[mode]:g})", **style(mode, "exact"))
    ax.set_xscale("log")
    ax.set_xticks(list(STEPS), [str(s) for s in STEPS])
    finish(fig, ax, "training steps (whole schedule)", "validation perplexity",
           f"Shakespeare T = {CONVERGENCE_T}: perplexity against training length", path)


# --------------------------------------------------------------------------------- stage 5: the paper's grid

def grid_view(res: Results, d: Decisions) -> Results:
    """Stage 5's runs relabelled as variant ``base`` (each mode's variant name carries its own lr), so that the
    paper's tables, fits and claims read them."""
    return Results([replace(r, variant="base") for r in res.runs
                    if r.task == "shakespeare" and r.mode in d.best_lr and r.seed in GRID_SEEDS
                    and r.T in (*GRID_TS, *LONG_TS, LONGEST_T)
                    and r.variant == variant(d.chosen_init, d.best_lr[r.mode], GRID_STEPS)])


def _claims(res: Results) -> list:
    return [c(res) for c in SHAKESPEARE_CLAIMS] + [claim_j_structure(res)]


def grid_section(res: Results, context: ReportContext) -> list[str]:
    """Stage 5: the paper's Shakespeare tables, fits, learned J and claims under the strong recipe, and the
    claims' verdicts beside those of the earlier recipe (``report/full``) when its archive is there."""
    out, d = context.out, context.decisions
    view = grid_view(res, d)
    if not view.runs:
        return []
    lines = ["## 5. The paper's grid under the strong recipe", "",
             f"Init {d.chosen_init}, each mode at its best lr "
             f"({', '.join(f'{m} {lr:g}' for m, lr in d.best_lr.items())}), "
             f"{GRID_STEPS} steps, unfused AdamW; the tables below name the runs as variant `base`.", ""]
    lines += demoted(shakespeare_section(view, out, PAPER["shakespeare"]))
    lines += demoted(couplings_section(view, out, modes=("h+J", "J")))
    claims = _claims(view)
    lines += demoted(agreement_section(view, claims))
    lines += demoted(extension_section(view))
    earlier = archive_runs(context.archives.get(FULL), lambda r: r.variant == "base")
    if earlier is not None:
        lines += ["### The claims then and now", "",
                  f"Then: `report/{FULL}` (init torch, lr 3e-3 for every mode, 4000 steps). Now: "
                  "this section's runs. A claim's verdict can change with the recipe, with the number of seeds or "
                  "with the T values measured.", "", claims_beside(["then", "now"], _claims(earlier), claims), ""]
    return lines


# ---------------------------------------------------------------------------- stage 6: the fair study redone

def fair_section(res: Results, d: Decisions) -> list[str]:
    """Per setting of stage 6 and per metric (all positions, last position): each mode's perplexity, against
    softmax and (h+J) against h, and against the same mode at stage 5's default setting, paired over seeds;
    nothing until a stage-6 run exists."""
    def values(mode: str, suffix: str, metric: str = "ppl") -> dict[int, float]:
        return _values(_get(res, FAIR_T, mode, variant(d.chosen_init, d.best_lr[mode], GRID_STEPS) + suffix), metric)

    settings = fair_variants()
    if not any(values(m, suffix) for suffix, (_, _, modes) in settings.items() if suffix for m in modes):
        return []
    lines = ["## 6. The fair study under the strong recipe", "",
             f"T = {FAIR_T}, {GRID_STEPS} steps, each mode at its best lr; validation perplexity, mean ± std over "
             "seeds; Δ% paired over seeds, positive = better: against stage 5's softmax, what J adds (h+J against "
             "h of the same setting; for the J settings, against stage 5's h), and each setting against the same "
             "mode at stage 5's default setting (field bias "
             f"`{DEFAULT_FIELD_BIAS}`, J's lr multiplier 1, J = 0 at init); `*` p < 0.05, `**` also after a Holm "
             "correction over the table.", ""]
    for metric, name in (("ppl", "all positions"), ("ppl_last", "last position")):
        soft, default = values("softmax", "", metric), {m: values(m, "", metric) for m in FAIR_MODES}
        against_softmax, against_default = [], []
        for suffix, (_, _, modes) in settings.items():
            found = {m: values(m, suffix, metric) if m in modes else {} for m in FAIR_MODES}
            h = found["h"] if "h" in modes else default["h"]
            label = suffix.lstrip("-") or f"bias-{DEFAULT_FIELD_BIAS} (stage 5)"
            row = [label] + [fmt_stat(stat(found[m].values())) if found[m] else "" for m in FAIR_MODES]
            row += [paired(soft, found[m], relative) if found[m] and soft else None for m in FAIR_MODES]
            against_softmax.append(row + [paired(h, found["h+J"], relative) if h and found["h+J"] else None])
            if suffix:
                against_default.append([label] + [paired(default[m], found[m], relative)
                                                  if found[m] and default[m] else None for m in FAIR_MODES])
        lines += [f"### {name.capitalize()}", "",
                  table_with_holm(["setting"] + [f"{m} PPL" for m in FAIR_MODES]
                                  + [f"{m} vs softmax, Δ%" for m in FAIR_MODES] + ["h+J vs h, Δ%"],
                                  against_softmax), "",
                  f"Each setting against stage 5's default setting, same mode ({name}):", "",
                  table_with_holm(["setting"] + [f"{m}, Δ%" for m in FAIR_MODES], against_default), ""]
    return lines
