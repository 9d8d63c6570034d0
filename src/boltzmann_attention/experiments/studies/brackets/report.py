"""The bracket study's report: the calibration, each mode's lr, the grid and the check without the FFN."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from functools import cache
from pathlib import Path

from ... import lr_rule
from ...claims import (
    BRACKET_CLAIMS,
    agreement_section,
    claim_brackets_order,
    claim_j_structure,
    claim_noffn_gap,
    claim_three_body,
    claims_beside,
)
from ...data import CLOSE, BracketData, depths
from ...plots import figure, finish
from ...report import (
    ReportContext,
    archive_runs,
    demoted,
    header_section,
    protocol_sections,
)
from ...results import Group, Results, load_runs
from ...stats import paired, points, stat
from ...tables import fmt_num, md_table, table_with_holm
from .grids import (
    ABLATION,
    BAND,
    BY_VARIANT,
    CALIBRATION,
    CALIBRATION_LR,
    CALIBRATION_SEEDS,
    CALIBRATION_T,
    FFN_SETTINGS,
    FULL,
    HARD_PREFIX,
    LR_SEEDS,
    LR_T,
    MODES,
    NEAR_TIE,
    NOFFN_CHECK_MODES,
    SETTINGS,
    TARGET,
    Decisions,
    Setting,
    chosen_setting,
    hard_variant,
    mode_learning_rates,
    noffn_check_lrs,
)


def _calibration_run(variant: str) -> bool:
    return variant in BY_VARIANT


def _hard_run(variant: str) -> bool:
    return variant.startswith(HARD_PREFIX)


def owns(res: Results) -> bool:
    """True when every run is of this study's variants (the calibration's or the experiments')."""
    return bool(res.all_runs) and all(_calibration_run(r.variant) or _hard_run(r.variant) for r in res.all_runs)


def report(res: Results, context: ReportContext) -> list[str]:
    """The calibration (when its runs are there), then the experiments on the chosen setting (likewise), each
    after its protocol."""
    lines = header_section(res, context.results_dir)
    protocol = protocol_sections(context.protocol)
    if any(_calibration_run(r.variant) for r in res.all_runs):
        lines += [protocol["Calibration"], ""] + calibration_section(res, context.out, context.decisions)
    if any(_hard_run(r.variant) for r in res.all_runs):
        lines += [protocol["Experiments on the chosen setting"], ""] + hard_sections(res, context)
    return lines


@cache
def data_statistics(setting: Setting, T: int = CALIBRATION_T, seed: int = 0) -> dict[str, float]:
    """Filler fraction, mean nesting depth and mean match distance of a setting's training set, and the
    fraction of its validation sequences that occur in the training set before any de-duplication."""
    options = setting.overrides
    sizes = (options.pop("train_sequences", 20000), 2000, 2000)
    data = BracketData(T, seed, sizes=sizes, **options)
    tokens, labels = data.train
    closing = labels >= 0
    distance = (closing.nonzero()[:, 1] - labels[closing]).float().mean()
    return {"filler": float((tokens > CLOSE).float().mean()), "depth": float(depths(tokens).float().mean()),
            "distance": float(distance), "val_in_train": data.in_train["val"]}


def _group(res: Results, setting: Setting) -> Group | None:
    return res.get("brackets", setting.variant, CALIBRATION_T, "softmax", "exact")


def choose(means: dict[str, float]) -> str | None:
    """The rule: the setting whose mean accuracy lies in BAND and is closest to TARGET (ties: the earlier
    setting of the ladder); None when none lies in the band. ``means``: setting name -> mean accuracy."""
    order = [s.name for s in SETTINGS]
    inside = [n for n in order if n in means and BAND[0] <= means[n] <= BAND[1]]
    return min(inside, key=lambda n: (round(abs(means[n] - TARGET), 9), order.index(n))) if inside else None


def calibration_section(res: Results, out: Path, d: Decisions) -> list[str]:
    rows, means, curve = [], {}, []
    for i, s in enumerate(SETTINGS):
        g = _group(res, s)
        acc = g.values("accuracy", "test") if g else {}
        whole = g.values("accuracy_sequence", "test") if g else {}
        st, sw = stat(acc.values()), stat(whole.values())
        data = data_statistics(s)
        if st is not None and st.n == len(CALIBRATION_SEEDS):
            means[s.name] = st.mean
        if st is not None:
            curve.append((i, s.name, st, sw))
        rows.append([f"{i}. {s.name}", s.about, f"{100 * data['filler']:.0f}%", f"{data['depth']:.2f}",
                     f"{data['distance']:.2f}", f"{100 * data['val_in_train']:.1f}%", _percent(st), _percent(sw),
                     ", ".join(f"{100 * acc[k]:.2f}" for k in sorted(acc)) or "not run"])
    if not curve:
        return []
    _plot_curve(curve, out / "calibration.png")
    lines = ["## Calibration: softmax's accuracy against the difficulty", "",
             f"Softmax with the FFN at T = {CALIBRATION_T}, lr {CALIBRATION_LR:g}, mean ± std over seeds "
             f"{', '.join(map(str, CALIBRATION_SEEDS))}. Test accuracy over closing brackets, and per sequence "
             "(every closing bracket of the sequence right). The data columns are measured on seed 0's sets: "
             "the fraction of filler slots, the mean nesting depth and the mean distance from a closing bracket "
             "to its opening one in the training set, and the fraction of validation sequences that also occur "
             "in the training set before de-duplication (the de-duplicated settings then redraw them).", "",
             md_table(["setting", "what changes", "filler", "depth", "match distance", "val in train",
                       "test accuracy (%)", "per-sequence (%)", "per seed (%)"], rows), "",
             "![softmax's test accuracy against the setting](calibration.png)", ""]
    lines += _rule_lines(means, d)
    return lines


def _percent(s) -> str:
    if s is None:
        return ""
    spread = "" if math.isnan(s.std) else f" ± {100 * s.std:.2f}"
    return f"{100 * s.mean:.2f}{spread} (n={s.n})"


def _rule_lines(means: dict[str, float], d: Decisions) -> list[str]:
    rule = (f"Rule (fixed before the runs): the setting whose softmax mean test accuracy lies in "
            f"[{100 * BAND[0]:.0f}%, {100 * BAND[1]:.0f}%] and is closest to {100 * TARGET:.0f}%.")
    missing = [s.name for s in SETTINGS if s.name not in means]
    if missing:
        return [rule + f" Not applied yet: {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} not "
                       f"finished all {len(CALIBRATION_SEEDS)} seeds.", ""]
    chosen = choose(means)
    if chosen is None:
        below = [n for n, m in means.items() if m < TARGET]
        above = [n for n, m in means.items() if m >= TARGET]
        near = [min(above, key=means.get, default=None), max(below, key=means.get, default=None)]
        near = [f"{n} ({fmt_num(100 * means[n])}%)" for n in near if n is not None]
        return [rule + " **No setting lies in the band**; the nearest to 90% on either side: " + ", ".join(near)
                + ". A setting between them is to be added to the ladder.", ""]
    note = "" if d.chosen == chosen else (" (CHOSEN in studies/brackets/decisions.json is still "
                                          f"{d.chosen!r}: set it to {chosen!r} for the experiments)")
    return [rule + f" **Chosen: {chosen}** ({fmt_num(100 * means[chosen])}%){note}.", ""]


def _plot_curve(curve: list, path: Path) -> None:
    fig = figure(7.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    ax.axhspan(100 * BAND[0], 100 * BAND[1], color="tab:green", alpha=0.12, label="the rule's band")
    for which, label, marker in ((2, "over closing brackets", "o"), (3, "per sequence", "s")):
        points = [(i, st) for i, st in ((p[0], p[which]) for p in curve) if st is not None]
        if points:
            ax.errorbar([i for i, _ in points], [100 * st.mean for _, st in points],
                        yerr=[0 if math.isnan(st.std) else 100 * st.std for _, st in points], marker=marker,
                        capsize=3, label=label)
    ax.set_ylim(top=min(ax.get_ylim()[1], 101.0))  # accuracy ends at 100%; the std bars need not go beyond
    ax.set_xticks([p[0] for p in curve], [p[1] for p in curve], rotation=20, fontsize=7)
    finish(fig, ax, "setting (a priori from easy to hard)", "softmax test accuracy (%)",
           f"Brackets T = {CALIBRATION_T}, softmax with the FFN: accuracy against the difficulty", path)


# ---------------------------------------------------------------------- report of the experiments (stage 1)

def _lr_values(res: Results, mode: str, lr: float, metric: str, ffn: bool = True,
               split: str = "val") -> dict[int, float]:
    g = res.get("brackets", hard_variant(lr, ffn), LR_T, mode, "exact")
    return {s: v for s, v in (g.values(metric, split) if g else {}).items() if s in LR_SEEDS}


def decide_learning_rates(res: Results, d: Decisions, modes=MODES, lrs_of=None,
                          ffn: bool = True) -> dict[str, tuple[float | None, float | None]]:
    """Per mode whose runs at every lr of ``lrs_of(mode)`` (stage 1's by default) are complete, those in
    DIVERGED aside: (the rule's lr, the lr to add beyond the edge or None). The rule (protocol.md): the highest
    mean validation accuracy, ties within NEAR_TIE to the highest mean per-sequence accuracy, then the smaller
    lr."""
    def second(mode: str, lr: float) -> float:
        seq = _lr_values(res, mode, lr, "accuracy_sequence", ffn)
        return statistics.mean(seq.values()) if seq else math.nan

    return lr_rule.decide(modes, lrs_of or (lambda mode: mode_learning_rates(mode, d)),
                          lambda mode, lr: lr_rule.seeds_mean(_lr_values(res, mode, lr, "accuracy", ffn), LR_SEEDS),
                          d.diverged if ffn else {}, NEAR_TIE, higher=True, second_of=second)


def _lr_cells(res: Results, mode: str, lr: float, ffn: bool = True) -> list[str] | None:
    """An lr table's cells after the lr: both validation accuracies and the accuracy per seed (None: no run)."""
    acc, seq = _lr_values(res, mode, lr, "accuracy", ffn), _lr_values(res, mode, lr, "accuracy_sequence", ffn)
    return [_percent(stat(acc.values())), _percent(stat(seq.values())),
            ", ".join(f"{100 * acc[k]:.2f}" for k in sorted(acc))] if acc else None


LR_HEADER = ["mode", "lr", "validation accuracy (%)", "validation per-sequence (%)", "per seed (%)"]


def learning_rate_section(res: Results, context: ReportContext) -> list[str]:
    d = context.decisions
    decided = decide_learning_rates(res, d)
    table = lr_rule.table(LR_HEADER, MODES, lambda mode: mode_learning_rates(mode, d),
                          lambda mode, lr: _lr_cells(res, mode, lr), decided, d.diverged)
    if not table:
        return []
    lines = ["## Stage 1: each mode's learning rate", "",
             f"T = {LR_T} with the FFN, validation set, mean ± std over seeds {', '.join(map(str, LR_SEEDS))}: "
             "accuracy over closing brackets and per sequence. Rule (fixed before the runs): the highest mean "
             f"accuracy; lrs within {100 * NEAR_TIE:g} points of it count as tied, and the highest mean "
             "per-sequence accuracy among them wins (then the smaller lr); a best lr at the grid's edge adds "
             "the next lr beyond it. Bold: the rule's choice.", "", table, ""]
    return (lines + [lr_rule.decision_notes(MODES, decided, d.best_lr, "studies/brackets/decisions.json"), ""]
            + _reproduction_lines(res, context))


def _reproduction_lines(res: Results, context: ReportContext) -> list[str]:
    """Whether stage 1's softmax at the calibration's lr reproduces the calibration's runs of CHOSEN (the same
    config), from the calibration's archive beside this report when it is there."""
    path, chosen = context.archives.get(CALIBRATION), context.decisions.chosen
    mine = _lr_values(res, "softmax", CALIBRATION_LR, "accuracy")
    if not mine or path is None or not path.exists():
        return []
    before = {r.seed: r.metrics["val"]["accuracy"] for r in load_runs(path)
              if r.variant == chosen_setting(context.decisions).variant and r.mode == "softmax" and r.seed in mine}
    if not before:
        return []
    gap = max(abs(mine[s] - before[s]) for s in before)
    seeds = ", ".join(map(str, sorted(before)))
    what = "reproduces them exactly" if gap == 0 else f"differs from them by up to {100 * gap:.2f} points"
    return [f"Softmax at lr {CALIBRATION_LR:g} has the calibration's config on {chosen}: its validation accuracy "
            f"(seeds {seeds}) {what} (`report/{CALIBRATION}`).", ""]


# ---------------------------------------------------------------------- report of the experiments (stage 2)

FFN_VARIANT = {True: "base", False: "noffn"}  # the relabelled views' variant names (those claims.py reads)


def grid_view(res: Results, d: Decisions) -> Results:
    """Stage 2's runs (each mode at its BEST_LR) relabelled as variant ``base`` (with the FFN) and ``noffn``
    (without), so that the paper's bracket claims read them."""
    runs = []
    for r in res.runs:
        for ffn in FFN_SETTINGS:
            if r.task == "brackets" and r.mode in d.best_lr and r.variant == hard_variant(d.best_lr[r.mode], ffn):
                runs.append(replace(r, variant=FFN_VARIANT[ffn]))
    return Results(runs)


def _test_values(res: Results, variant: str, T: int, mode: str | None, metric: str) -> dict[int, float]:
    g = res.get("brackets", variant, T, mode, "exact") if mode else None
    return g.values(metric, "test") if g else {}


METRICS = (("accuracy", "test accuracy (%)"), ("accuracy_sequence", "per-sequence (%)"))


def results_section(view: Results, d: Decisions) -> list[str]:
    """Per FFN setting: per T and mode, both test accuracies, and their differences to softmax and to the mode
    without its last coupling, paired over seeds."""
    lines = []
    for ffn in FFN_SETTINGS:
        variant = FFN_VARIANT[ffn]
        cells = []
        for T in view.Ts("brackets", variant):
            soft = {k: _test_values(view, variant, T, "softmax", k) for k, _ in METRICS}
            for mode in MODES:
                mine = {k: _test_values(view, variant, T, mode, k) for k, _ in METRICS}
                if not mine["accuracy"]:
                    continue
                ablation = {k: _test_values(view, variant, T, ABLATION.get(mode), k) for k, _ in METRICS}
                cells.append([str(T), mode, f"{d.best_lr[mode]:g}"]
                             + [_percent(stat(mine[k].values())) for k, _ in METRICS]
                             + [paired(soft[k], mine[k], points) if mode != "softmax" else None for k, _ in METRICS]
                             + [paired(ablation[k], mine[k], points) for k, _ in METRICS])
        if cells:
            lines += [f"### {'With' if ffn else 'Without'} the FFN", "",
                      table_with_holm(["T", "mode", "lr", *(t for _, t in METRICS), "vs softmax, Δ pts",
                                       "per-sequence vs softmax, Δ pts", "vs the mode without its coupling, Δ pts",
                                       "per-sequence vs it, Δ pts"], cells,
                                      {5: "accuracy", 7: "accuracy", 6: "sequence", 8: "sequence"}), ""]
    if not lines:
        return []
    return ["## Stage 2: the mechanisms on the chosen setting", "",
            "Test set, mean ± std over seeds (n seeds): accuracy over closing brackets, and per sequence (every "
            "closing bracket of the sequence right). Differences in points, paired over seeds, mean [95% "
            "interval], positive = the mode is better; the mode without its coupling is h for h+J and h+K (what "
            "J, or K, adds to sigmoid attention) and h+J for h+J+K (what K adds to J). `*` p < 0.05 (paired "
            "t-test), `**` also after a Holm correction over the table's comparisons of the same metric.", "",
            *lines]


def _claims(view: Results) -> list:
    others = [claim_brackets_order(view, T) for T in view.Ts("brackets", "base") if T != LR_T]
    for c in others:  # the paper gives numbers at T = 16 only
        c.paper = f"not reported at this T; the same order as the paper's at T = {LR_T}"
    return ([claim_brackets_order(view, LR_T)] + others
            + [claim_noffn_gap(view), claim_three_body(view), claim_j_structure(view)])


def claims_section(view: Results) -> list[str]:
    if not view.runs:
        return []
    return ["## The paper's bracket claims on the chosen setting", "",
            f"Read by `claims.py`'s claim functions from this study's runs relabelled: variant `base` with the FFN, "
            "`noffn` without it, each mode at its stage-1 lr. The order h+J > softmax > h > J is the paper's at "
            f"T = {LR_T}; at the other T it is checked the same way, beyond what the paper reports.", "",
            *demoted(agreement_section(view, _claims(view)))]


def easy_section(view: Results, context: ReportContext) -> list[str]:
    """The easy setting (report/full: the old generator) beside the chosen one, per FFN setting and T that
    both have, and the paper's claims on each."""
    if not view.runs:
        return []
    chosen = context.decisions.chosen
    easy = archive_runs(context.archives.get(FULL),
                        lambda r: r.task == "brackets" and r.variant in FFN_VARIANT.values())
    if easy is None:
        return ["## The easy setting", "", f"The old generator's runs (`report/{FULL}/runs.jsonl.gz`) are not "
                "beside this report, so its row is left out; see `report/full/README.md` (brackets: 98.9-100% for "
                "every mode but J at T <= 16).", ""]
    cells = []
    for ffn in FFN_SETTINGS:
        variant = FFN_VARIANT[ffn]
        for T in sorted(set(easy.Ts("brackets", variant)) & set(view.Ts("brackets", variant))):
            for name, res in ((f"easy (report/{FULL})", easy), (f"{chosen} (this study)", view)):
                acc = {m: _test_values(res, variant, T, m, "accuracy") for m in MODES}
                cells.append([name, "yes" if ffn else "no", str(T)] + [_percent(stat(acc[m].values())) for m in MODES]
                             + [paired(acc["softmax"], acc["h+J"], points)])
    if not cells:
        return []
    then = [c(easy) for c in BRACKET_CLAIMS] + [claim_j_structure(easy)]
    now = [c(view) for c in BRACKET_CLAIMS] + [claim_j_structure(view)]
    return ["## The easy setting beside the chosen one", "",
            "Easy: the old generator (every bracket option at its default), "
            f"`report/{FULL}`'s runs: init torch, lr 3e-3 for every mode, 3 seeds (no per-sequence "
            "accuracy was recorded then). Chosen: this study's stage 2. Test accuracy over closing brackets (%), "
            "mean ± std (n seeds); h+J − softmax in points, paired over seeds, with Holm marks over the table.", "",
            table_with_holm(["setting", "FFN", "T", *MODES, "h+J − softmax, Δ pts"], cells), "",
            "The paper's bracket claims on each (the T = 16 order, the FFN ablation, three-body couplings, the "
            "learned J):", "", claims_beside(["easy", chosen], then, now), ""]


# ---------------------------------------------------------------------- report of the experiments (stage 3)

def noffn_check_section(res: Results, d: Decisions) -> list[str]:
    """Stage 3: validation accuracy without the FFN at each checked mode's lrs (stage 1's rule applied; a best
    at the edge of the lrs run is named), then test accuracy at the rule's lr against softmax at its rule's
    lr, seeds 0-2."""
    def lrs_of(mode: str) -> tuple[float, ...]:
        return noffn_check_lrs(mode, d)

    modes = [m for m in NOFFN_CHECK_MODES if m in d.best_lr]
    decided = decide_learning_rates(res, d, modes, lrs_of, ffn=False)
    table = lr_rule.table(LR_HEADER, modes, lrs_of, lambda mode, lr: _lr_cells(res, mode, lr, ffn=False), decided,
                          label=lambda mode, lr: f"{lr:g}" + (" (stage 1's)" if lr == d.best_lr[mode] else ""))
    chosen = {mode: lr for mode, (lr, _) in decided.items()}
    edges = [f"{mode} {lr:g}" for mode, (lr, extra) in decided.items() if extra is not None]
    if not table:
        return []
    lines = ["## Stage 3 (post hoc): the learning rate without the FFN", "",
             "Added after stage 2's results without the FFN were seen (see the protocol above). "
             f"T = {LR_T} without the FFN, validation set, seeds {', '.join(map(str, LR_SEEDS))}, each mode at its "
             "stage-1 lr and half a decade either side, and the lrs added beyond an edge (NOFFN_CHECK_EXTRA); "
             "stage 1's rule. Bold: the rule's choice.", "", table, ""]
    if edges:
        lines += [f"Best at the edge of the lrs run, so the best lr is not bracketed: {', '.join(edges)}.", ""]
    if "softmax" not in chosen:
        return lines
    soft = {k: _lr_values(res, "softmax", chosen["softmax"], k, ffn=False, split="test") for k, _ in METRICS}
    cells = []
    for mode, lr in chosen.items():
        mine = {k: _lr_values(res, mode, lr, k, ffn=False, split="test") for k, _ in METRICS}
        cells.append([mode, f"{lr:g}", *(_percent(stat(mine[k].values())) for k, _ in METRICS),
                      *((paired(soft[k], mine[k], points) if mode != "softmax" else None) for k, _ in METRICS)])
    return lines + [f"Test set at the rule's lr without the FFN (seeds {', '.join(map(str, LR_SEEDS))}), paired "
                    "with softmax at its rule's lr; Holm marks as in stage 2. Three seeds chosen on the same seeds' "
                    "validation sets: a check of stage 2's lr, not a result in its place.", "",
                    table_with_holm(["mode", "lr", *(t for _, t in METRICS), "vs softmax, Δ pts",
                                     "per-sequence vs softmax, Δ pts"], cells, {4: "accuracy", 5: "sequence"}), ""]


def hard_sections(res: Results, context: ReportContext) -> list[str]:
    d = context.decisions
    view = grid_view(res, d)
    return (learning_rate_section(res, context) + results_section(view, d) + noffn_check_section(res, d)
            + claims_section(view) + easy_section(view, context))
