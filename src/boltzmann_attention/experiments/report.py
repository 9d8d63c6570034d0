"""The sections every report shares, and what a study's report is handed (:class:`ReportContext`).

A study's report (see ``studies/``) is a list of Markdown lines built from these sections and its own:

* :func:`header_section`: runs, seeds, wall time, machines, training settings, and the runs left out;
* :func:`shakespeare_section` and :func:`brackets_section`: per variant, the metric per T and mode, its
  difference to softmax paired over seeds (and the paper's number next to it where given), a plot; for
  Shakespeare also a fit PPL(T) = a * exp(-b * T) + c per mode;
* :func:`couplings_section`: the learned J (heatmaps, J against distance, its stability across seeds);
* :func:`sampler_section`: models trained through a sampler against the same grid point trained exactly;
* :func:`verdict`: a measured difference held against a claim (used by the paper's and the sampler study);
* :func:`protocol_sections`: a study's ``protocol.md`` split at its headings, for the report to quote.

Everything works on partial grids: a missing mode, T or seed leaves a blank cell or a "not measured".
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import coattention
from .config import TrainConfig
from .plots import plot_couplings, plot_distance, plot_fits, plot_metric
from .results import BASELINE, INFO_KEYS, Group, Results, Run, load_runs, mode_rank, variant_rank
from .stats import (
    ALPHA,
    Paired,
    distance_r2,
    fit_exponential,
    millinats,
    paired,
    point_difference,
    relative_improvement,
    seed_correlation,
    stat,
)
from .tables import (
    counted,
    duration,
    fmt_comparison,
    fmt_interval,
    fmt_num,
    fmt_p,
    fmt_pm,
    fmt_stat,
    label,
    md_table,
    plural,
)

__all__ = ["ReportContext", "Results", "Run", "header_section", "load_runs", "protocol_sections", "verdict"]

LEVEL_TOLERANCE = 0.25  # percent: "level with softmax" when fewer than 3 seeds allow no test
MIN_TESTED = 3          # paired seeds needed before a claim is tested

# The headline metric of each task, its difference to softmax and how it is plotted.
TASK_METRICS = {
    "shakespeare": {"metric": "ppl", "split": "val", "scale": 1.0, "ylabel": "validation perplexity",
                    "diff": relative_improvement, "dlabel": "improvement over softmax (%)", "paper_on": "difference"},
    "brackets": {"metric": "accuracy", "split": "test", "scale": 100.0, "ylabel": "test accuracy (%)",
                 "diff": point_difference, "dlabel": "difference to softmax (points)", "paper_on": "metric"},
}


@dataclass(frozen=True)
class ReportContext:
    """What a study's report is handed besides the runs: where they came from, where the report goes, the
    study's decisions and protocol text, and the archives of the other reports it reads (profile name ->
    path of that report's ``runs.jsonl.gz`` beside ``out``, which need not exist)."""

    results_dir: Path
    out: Path
    decisions: object = None
    protocol: str = ""
    archives: dict[str, Path] = field(default_factory=dict)


def protocol_sections(text: str) -> dict[str, str]:
    """A protocol's text by section: ``""`` the text before the first ``## `` heading (a leading ``# `` title
    line left out), then each ``## `` heading's text under its title; every part stripped."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    if first < len(lines) and lines[first].startswith("# "):
        lines = lines[first + 1:]
    sections, title, body = {}, "", []
    for line in lines:
        if line.startswith("## "):
            sections[title] = "\n".join(body).strip()
            title, body = line[3:].strip(), []
        else:
            body.append(line)
    sections[title] = "\n".join(body).strip()
    return sections


# ---------------------------------------------------------------------------------------------------- header

def every_run_is(res: Results, prefix: str) -> bool:
    """A study's ``owns`` when its variants share a prefix: there are runs, and every one's variant starts with it."""
    return bool(res.all_runs) and all(r.variant.startswith(prefix) for r in res.all_runs)


def header_section(res: Results, results_dir: Path) -> list[str]:
    runs = res.runs
    per_task = Counter(r.task for r in runs)
    per_variant = Counter(r.variant for r in runs)
    seeds = sorted({r.seed for r in runs})
    info = {k: Counter(str(r.info.get(k)) for r in runs) for k in INFO_KEYS}
    machines = Counter(f"{r.info.get('machine')} / {r.info.get('processor') or '?'} / {r.info.get('cpus')} CPUs"
                       for r in runs)
    cfg = {k: Counter(json.dumps(r.config.get(k)) for r in runs) for k in ("steps", "batch_size", "lr")}
    resumed = sum(1 for r in runs if r.steps_run is not None and r.steps_run < r.config.get("steps", 0))
    lines = [
        "# Boltzmann attention: results",
        "",
        f"Generated by `boltzmann_attention` from `{results_dir}`; do not edit by hand.",
        "",
        "## Runs",
        "",
        f"- Runs: {len(runs)} ({', '.join(f'{t}: {n}' for t, n in sorted(per_task.items()))}); "
        f"variants: {', '.join(f'{v} ({per_variant[v]})' for v in sorted(per_variant, key=variant_rank))}",
        f"- Seeds: {', '.join(map(str, seeds))}",
        f"- Total training wall time: {duration(sum(r.wall_time_s for r in runs))} (sum over runs)",
        f"- Machines: {counted(machines)}",
        f"- torch: {counted(info['torch'])}; Python: {counted(info['python'])}; commits: {counted(info['commit'])}",
        f"- Training: steps {counted(cfg['steps'])}; batch size {counted(cfg['batch_size'])}; "
        f"learning rate {counted(cfg['lr'])}",
    ]
    lines += [f"- Variant `{v}`: {text}" for v, text in _variant_settings(runs).items()]
    if resumed:
        lines.append(f"- {plural(resumed, 'run')} resumed from a checkpoint; their wall time sums every segment "
                     "(train adds the time saved in the checkpoint), their steps_run counts only the last")
    if res.duplicates:
        lines.append(f"- Ignored duplicates: {', '.join(res.duplicates)}")
    return lines + excluded_lines(res) + [""]


def excluded_lines(res: Results) -> list[str]:
    """One line naming the runs left out for unusable metrics, and why (none when every run is usable)."""
    if not res.excluded:
        return []
    listed = "; ".join(f"`{r.name}` ({', '.join(why)})" for r, why in res.excluded)
    return [f"- Left out, not counted above: {plural(len(res.excluded), 'run')} with unusable metrics: {listed}"]


def _variant_settings(runs: list[Run]) -> dict[str, str]:
    """Per variant, the config fields that differ from TrainConfig's defaults (besides the grid axes)."""
    defaults = TrainConfig().flat()
    axes = {"task", "T", "mode", "method", "seed"}
    by_variant: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in runs:
        for k, v in r.config.items():
            if k not in axes and (k not in defaults or v != defaults[k]):
                by_variant[r.variant][k][json.dumps(v, sort_keys=True)] += 1
    totals = Counter(r.variant for r in runs)
    out = {}
    for v in sorted(totals, key=variant_rank):
        items = by_variant.get(v, {})
        out[v] = ", ".join(f"{k}={counted(c)}" + (f" in {sum(c.values())} of {plural(totals[v], 'run')}"
                                                  if sum(c.values()) < totals[v] else "")
                           for k, c in sorted(items.items())) or "TrainConfig defaults"
    return out


# -------------------------------------------------------------------------------------------- task tables

def shakespeare_table(res: Results, variant: str, metric: str, paper: dict | None = None) -> str:
    """Rows T; per mode: perplexity, relative improvement over softmax (%), the paper's number."""
    return _mode_table(res, "shakespeare", variant, values=lambda g: g.values(metric),
                       fmt_value=lambda v: fmt_stat(stat(v.values())), compare=relative_improvement,
                       paper=paper or {}, labels=("PPL", "Δ%", "Δ%"), paper_signed=True)


def brackets_table(res: Results, variant: str, split: str, paper: dict | None = None) -> str:
    """Rows T; per mode: accuracy (%), difference to softmax (points), the paper's accuracy."""
    return _mode_table(res, "brackets", variant, values=lambda g: g.values("accuracy", split),
                       fmt_value=lambda v: fmt_stat(stat(v.values()), digits=2, scale=100.0),
                       compare=point_difference, paper=paper or {}, labels=("acc %", "Δ pts", "%"),
                       paper_signed=False)


def _mode_table(res: Results, task: str, variant: str, *, values, fmt_value, compare, paper: dict,
                labels: tuple[str, str, str], paper_signed: bool) -> str:
    """Rows T; per (mode, method): the metric, its comparison with softmax, the paper's number if any.

    values(group) -> {seed: value}; compare(baseline values, values) -> Paired; labels name the metric,
    comparison and paper columns. Paper columns appear for the base variant only.
    """
    cols = res.columns(task, variant)

    def has_paper(mode: str) -> bool:
        return variant == "base" and any(k[0] == mode for k in paper)

    value_label, compare_label, paper_label = labels
    header = ["T"]
    for mode, method in cols:
        lab = label(mode, method)
        header.append(f"{lab} {value_label}")
        if mode != BASELINE:
            header.append(f"{lab} {compare_label}")
        if has_paper(mode):
            header.append(f"{lab} paper {paper_label}")
    rows = []
    for T in res.Ts(task, variant):
        row = [str(T)]
        for mode, method in cols:
            g = res.get(task, variant, T, mode, method)
            vals = values(g) if g else {}
            row.append(fmt_value(vals))
            if mode != BASELINE:
                base = res.baseline(task, variant, T, method)
                base_vals = values(base) if base else {}
                row.append(fmt_comparison(compare(base_vals, vals), expected_n=min(len(vals), len(base_vals))))
            if has_paper(mode):
                row.append(fmt_num(paper.get((mode, T)), signed=paper_signed))
        rows.append(row)
    return md_table(header, rows)


def fit_table(res: Results) -> tuple[str, dict]:
    """One fit per (variant, mode, method) of the Shakespeare perplexity; returns (table, fits)."""
    rows, fits = [], {}
    for variant in res.variants("shakespeare"):
        for mode, method in res.columns("shakespeare", variant):
            Ts, ys = [], []
            for T in res.Ts("shakespeare", variant):
                g = res.get("shakespeare", variant, T, mode, method)
                for v in (g.values("ppl") if g else {}).values():
                    Ts.append(T)
                    ys.append(v)
            fit = fit_exponential(Ts, ys)
            fits[(variant, mode, method)] = fit
            if fit.params is None:
                cells = ["", "", "", ""]
            else:
                cells = [fmt_pm(p, e) for p, e in zip(fit.params, fit.errors)] + [f"{fit.rms:.3g}"]
            rows.append([variant, label(mode, method), str(fit.n_T), *cells, fit.message or "ok"])
    header = ["variant", "mode", "T values", "a", "b", "c", "RMS residual", "note"]
    return md_table(header, rows), fits


def shakespeare_section(res: Results, out: Path, paper: dict | None = None) -> list[str]:
    """``paper``: the paper's relative improvements {(mode, T): %}, shown for the base variant."""
    lines = ["## Tiny Shakespeare (character level)", "",
             "PPL: validation perplexity, mean ± std over seeds (n seeds). Δ%: (PPL_softmax - PPL_mode) / "
             "PPL_softmax × 100, positive = better than softmax; per seed where softmax has the same seed, "
             "mean ± std over those seeds († from the means when no seed is shared). Paper Δ%: the paper's "
             "relative improvement (it does not say whether over all positions or the last one).", ""]
    lines += _variant_tables(res, out, "shakespeare", shakespeare_table, "perplexity",
                             (("ppl", "Shakespeare: perplexity, all positions"),
                              ("ppl_last", "Shakespeare: perplexity, last position only")), paper)
    table, fits = fit_table(res)
    lines += ["### Perplexity against T: fit PPL(T) = a·exp(-b·T) + c", "",
              "Least squares over all seeds' perplexities (all positions); ± is sqrt(diag(pcov)).", "", table, ""]
    for variant in res.variants("shakespeare"):
        if any(f.params is not None for (v, *_), f in fits.items() if v == variant):
            png = f"fit_shakespeare_{file_name(variant)}.png"
            plot_fits(res, variant, fits, out / png)
            lines += [f"![shakespeare {variant}: fits]({png})", ""]
    return lines


def brackets_section(res: Results, out: Path, paper: dict | None = None) -> list[str]:
    """``paper``: the paper's accuracies {(mode, T): %}, shown for the base variant."""
    lines = ["## Bracket matching", "",
             "Accuracy of the position head over closing brackets (percent), mean ± std over seeds (n seeds); the test "
             "split is the headline. Δ pts: accuracy minus softmax's, per seed where softmax has the same seed († "
             "from the means). Paper %: the paper's accuracy (full model).", ""]
    return lines + _variant_tables(res, out, "brackets", brackets_table, "accuracy",
                                   (("test", "Brackets: test accuracy"), ("val", "Brackets: validation accuracy")),
                                   paper)


def _variant_tables(res: Results, out: Path, task: str, table: Callable, noun: str, kinds,
                    paper: dict | None) -> list[str]:
    """Per variant: one table per (key, title) of ``kinds`` and the metric-against-T plot."""
    lines = []
    for variant in res.variants(task):
        for key, title in kinds:
            lines += [f"### {title} (variant `{variant}`)", "", table(res, variant, key, paper), ""]
        png = f"metric_{task}_{file_name(variant)}.png"
        plot_metric(res, task, variant, TASK_METRICS[task], out / png, paper if variant == "base" else None)
        lines += [f"![{task} {variant}: {noun} against T]({png})", ""]
    return lines


# ------------------------------------------------------------------------------ sections inside other reports

def archive_runs(path: Path | None, keep: Callable[[Run], bool]) -> Results | None:
    """The runs of another report's archive (``ReportContext.archives``) that ``keep`` accepts; None when the
    archive is not there."""
    return Results([r for r in load_runs(path) if keep(r)]) if path is not None and path.exists() else None


def demoted(lines: list[str]) -> list[str]:
    """Headings one level down, for a shared section placed inside a study's own section."""
    return ["#" + x if x.startswith("#") else x for x in lines]


def lr_decision_notes(names, decided: dict, best_lr: dict, where: str) -> str:
    """The line under a stage's learning-rate table: the names (modes, arms) not decided yet, those that
    diverged at every lr, those whose best lr is at the grid's edge (the rule adds the next lr), and the
    choices, with a reminder where the BEST_LR recorded in ``where`` differs. ``decided``: name -> (the rule's
    lr or None, the lr to add beyond the edge or None)."""
    missing = [n for n in names if n not in decided]
    notes = [f"Not decided yet (runs missing): {', '.join(missing)}."] if missing else []
    for name, (chosen, extra) in decided.items():
        if chosen is None:
            notes.append(f"{name}: every lr diverged.")
        elif extra is not None:
            notes.append(f"{name}: best at {chosen:g}, the grid's edge, so the rule adds lr {extra:g} "
                         "(EXTRA_LEARNING_RATES; not run yet).")
    best = {n: lr for n, (lr, extra) in decided.items() if lr is not None and extra is None}
    if best:
        differs = [n for n, lr in best.items() if best_lr.get(n) != lr]
        notes.append("Chosen: " + ", ".join(f"{n} {lr:g}" for n, lr in best.items())
                     + (f" (BEST_LR in {where} differs for {', '.join(differs)}: update it)" if differs else "")
                     + ".")
    return " ".join(notes)


# ------------------------------------------------------------------------------------------ learned couplings

def coupling_sets(res: Results, task: str, mode: str = "h+J") -> dict[int, tuple[Group, list[np.ndarray]]]:
    """The ``mode`` runs' J (head 0) per T, from variant base if it has any, preferring exact enumeration."""
    variants = [v for v in res.variants(task)
                if any(k[:2] == (task, v) and k[3] == mode for k in res.groups)]
    if not variants:
        return {}
    variant = variants[0]
    out = {}
    for T in res.Ts(task, variant):
        g = res.pick(task, variant, T, mode)
        Js = list(g.couplings().values()) if g else []
        if Js:
            out[T] = (g, Js)
    return out


def coupling_table(res: Results, task: str, mode: str = "h+J") -> tuple[str, dict]:
    """Per T: seeds, mean |J|, share of variance explained by distance, seed-to-seed correlation."""
    sets = coupling_sets(res, task, mode)
    rows, stats = [], {}
    for T, (g, Js) in sets.items():
        corr = seed_correlation(Js)
        r2 = float(np.nanmean([distance_r2(J) for J in Js])) if Js else math.nan
        stats[T] = (len(Js), corr, r2)
        rows.append([str(T), label(g.mode, g.method), str(len(Js)), f"{np.mean([np.abs(J).mean() for J in Js]):.3f}",
                     fmt_num(r2), fmt_num(corr)])
    header = ["T", "mode", "seeds", "mean abs(J)", "R² of J by distance", "correlation between seeds"]
    return md_table(header, rows), stats


def file_name(text: str) -> str:
    """text as a file name that Markdown links to as it is: runs of anything but letters, digits, '_', '.', '+'
    and '-' (spaces, brackets, commas, '=' of a relabelled variant) become one '-'."""
    return re.sub(r"[^\w.+-]+", "-", text).strip("-")


def couplings_section(res: Results, out: Path, modes: tuple[str, ...] = ("h+J",)) -> list[str]:
    lines = []
    for mode in modes:
        for task in res.tasks():
            sets = coupling_sets(res, task, mode)
            if not sets:
                continue
            g = next(iter(sets.values()))[0]
            table, _ = coupling_table(res, task, mode)
            suffix = task if mode == "h+J" else f"{task}_{mode}"
            heat, dist = f"couplings_{suffix}.png", f"coupling_distance_{suffix}.png"
            plot_couplings(sets, task, out / heat)
            plot_distance(sets, task, out / dist)
            lines += [f"### {task}{'' if modes == ('h+J',) else f', {mode}'} (variant `{g.variant}`)", "", table, "",
                      f"![{task}: learned J]({heat})", "", f"![{task}: J against distance]({dist})", ""]
    if not lines:
        return []
    return [f"## Learned couplings J ({', '.join(modes)}, head 0)", "",
            "R² of J by distance: share of the variance of the off-diagonal J explained by |j - k| alone "
            "(per seed, averaged). Correlation between seeds: mean Pearson correlation of the off-diagonal J "
            "over pairs of seeds.", "", *lines]


# ---------------------------------------------------------------------------------------------- samplers

def _show(values: dict, scale: float) -> str:
    return fmt_stat(stat(values.values()), scale=scale)


def _paired(c: Paired | None, unit: str) -> str:
    return fmt_comparison(c) + unit if c else ""


def sampler_section(res: Results) -> list[str]:
    """Models trained through a sampler (DQA, PT, Gibbs, ...) against the same grid point trained exactly,
    and, where the runs were also evaluated with exact marginals, how the gap splits into training and
    evaluation."""
    rows, split_rows = [], []
    for (task, variant, T, mode, method), g in sorted(res.groups.items(), key=lambda kv: (
            kv[0][0] != "shakespeare", kv[0][0], kv[0][1], kv[0][2], mode_rank(kv[0][3]), kv[0][4])):
        exact = res.get(task, variant, T, mode, "exact")
        if method in ("exact", "reference") or exact is None or task not in TASK_METRICS:
            continue
        spec = TASK_METRICS[task]
        unit = "%" if task == "shakespeare" else " pts"
        scale = spec["scale"]
        vals, ref = g.values(spec["metric"], spec["split"]), exact.values(spec["metric"], spec["split"])
        base = res.baseline(task, variant, T, "exact")
        base_vals = base.values(spec["metric"], spec["split"]) if base else {}
        c = spec["diff"](ref, vals)  # positive: the sampler-trained model is better
        options = json.dumps(next(iter(g.runs.values())).config.get("method_options") or {}, sort_keys=True)
        rows.append([task, str(T), mode, method, f"`{options}`", _show(ref, scale), _show(vals, scale),
                     fmt_comparison(spec["diff"](base_vals, ref)) if base_vals else "",
                     fmt_comparison(spec["diff"](base_vals, vals)) if base_vals else "",
                     _paired(c, unit), verdict(c, "level", unit.strip()).text,
                     duration(statistics.mean(r.wall_time_s for r in g.runs.values()))])
        exact_eval = g.values(spec["metric"], spec["split"] + "_exact")
        if exact_eval:
            trained = spec["diff"](ref, exact_eval)
            split_rows.append([task, str(T), mode, method, _show(vals, scale), _show(exact_eval, scale),
                               _show(ref, scale), _paired(trained, unit), verdict(trained, "level", unit.strip()).text,
                               _paired(spec["diff"](exact_eval, vals), unit)])
    if not rows:
        return []
    lines = ["## Trained through samplers", "",
             "Each sampler-trained model against the same grid point (task, T, mode, seeds) trained with exact "
             "marginals. Metric: validation perplexity (Shakespeare, all positions) or test accuracy (brackets), "
             "mean ± std over seeds; 'vs softmax' is the Δ of the report's tables (% or points, positive = better "
             "than softmax); 'sampler − exact' is paired over seeds (positive = the sampler-trained model is "
             "better). Wall time: mean per run.", "",
             md_table(["task", "T", "mode", "method", "options", "exact", "sampler", "exact vs softmax",
                       "sampler vs softmax", "sampler − exact", "level with exact?", "time per run"], rows), ""]
    if split_rows:
        lines += ["### Training or evaluation?", "",
                  "The sampler-trained weights evaluated twice: through their sampler (as above) and with exact "
                  "marginals. 'training' compares the second with the exact-trained model; 'evaluation' compares "
                  "the two evaluations of the same weights. The weights were fitted to their sampler's "
                  "distribution, which for DQA is not the Boltzmann one, so exact marginals can be the worse "
                  "evaluation: a large 'evaluation' difference means the model relies on what its sampler does, "
                  "not that the sampler is noisy. Paired over seeds, positive = the first named is better.", "",
                  md_table(["task", "T", "mode", "method", "sampler-trained, sampler eval",
                            "sampler-trained, exact eval", "exact-trained", "training: exact eval − exact-trained",
                            "level?", "evaluation: sampler eval − exact eval"], split_rows), ""]
    return lines


# ------------------------------------------------------------------------------------------------- verdicts

@dataclass
class Verdict:
    agrees: bool | None   # None: not measured
    supported: bool       # tested over >= MIN_TESTED seeds and the test backs the claim
    text: str


def _noise(c: Paired, unit: str) -> tuple[str, str]:
    """(kind, text) with kind one of 'untested', 'few', 'noise', 'significant', 'not significant'."""
    if c.n == 0:
        return "untested", "no shared seeds: from the means, untested"
    p = c.p if c.n >= MIN_TESTED else None
    if c.n >= 2 and abs(c.mean) < c.std:
        ptext = f"; {fmt_p(p)}" if p is not None else ""
        return "noise", (f"within noise: the mean difference ({c.mean:+.2f} {unit}) is smaller than its std over "
                         f"{c.n} seeds ({c.std:.2f} {unit}){ptext}")
    if p is None:
        return "few", f"too few seeds to test: {c.n} paired"
    word = "significant" if p < ALPHA else "not significant"
    return word, f"{word}: {fmt_p(p)}, paired t-test over {c.n} seeds"


def verdict(c: Paired | None, expect: str, unit: str = "%") -> Verdict:
    """Compare a measured difference with a claim: expect 'greater' (> 0), 'less' (< 0), 'level' (= 0) or
    'not greater' (<= 0)."""
    if c is None:
        return Verdict(None, False, "not measured")
    kind, text = _noise(c, unit)
    if expect in ("level", "not greater"):
        if kind == "significant":
            agrees = expect == "not greater" and c.mean < 0
            what = "worse" if c.mean < 0 else "better" if expect == "not greater" else "different"
            return Verdict(agrees, agrees, f"{'agrees' if agrees else 'does not agree'} ({what}, {text})")
        if kind in ("noise", "not significant"):
            return Verdict(True, True, f"agrees (no significant difference; {text})")
        if expect == "level":
            agrees = abs(c.mean) <= LEVEL_TOLERANCE
            bound = f"difference {'within' if agrees else 'beyond'} ±{LEVEL_TOLERANCE} {unit}"
        else:
            agrees = c.mean <= LEVEL_TOLERANCE
            bound = f"improvement {'≤' if agrees else '>'} {LEVEL_TOLERANCE} {unit}"
        return Verdict(agrees, False, f"{'agrees' if agrees else 'does not agree'} ({bound}; {text})")
    agrees = c.mean > 0 if expect == "greater" else c.mean < 0
    word = "agrees" if agrees else "does not agree"
    if kind == "significant":
        return Verdict(agrees, agrees, f"{word} ({text})")
    if kind in ("noise", "not significant"):
        return Verdict(agrees, False, f"{word} in sign only ({text})")
    return Verdict(agrees, False, f"{word} ({text})")


def summarize(verdicts: list[Verdict]) -> str:
    measured = [v for v in verdicts if v.agrees is not None]
    if not measured:
        return "not measured"
    n_agree = sum(v.agrees for v in measured)
    n_supported = sum(v.supported for v in measured)
    word = "agrees" if n_agree == len(measured) else "does not agree" if n_agree == 0 else "partly agrees"
    return (f"{word}: {n_agree} of {len(measured)} comparisons agree, {n_supported} of them backed by a "
            f"paired t-test over ≥ {MIN_TESTED} seeds")


# ------------------------------------------------------------------ the coupled window: per-slot field or co-attention

def fmt_difference(reference: dict[int, float], other: dict[int, float]) -> str:
    """reference - other in millinats, paired over seeds: "mean [95% interval] (n = k)" ("" without a pair)."""
    c = paired(reference, other, millinats)
    if c is None:
        return ""
    return f"{fmt_interval(c) if c.n >= 2 else fmt_num(c.mean, 1, signed=True)} (n = {c.n})"


def coattention_section(entries: list[tuple[str, int, Group | None]], note: str = "") -> list[str]:
    """Per coupled arm and T (``entries``: name, T and its runs, or None): the decomposition training recorded
    (:mod:`.coattention`), per layer and head over seeds, and the validation loss with the couplings replaced
    by their per-slot field or removed; ``note`` closes the first paragraph."""
    weights, losses = [], []
    for name, T, g in entries:
        found = {s: r.raw["coattention"] for s, r in (g.runs.items() if g else ()) if r.raw.get("coattention")}
        if not found:
            continue
        for layer in range(len(next(iter(found.values()))["layers"])):
            records = [x["layers"][layer] for x in found.values()]
            per_head = [[r["explained"][h] for r in records] for h in range(len(records[0]["explained"]))]
            weights.append([name, str(T), str(layer), _pooled(records),
                            " ".join(_median_or_dash(v) for v in per_head),
                            fmt_num(statistics.mean(e for r in records for e in r["field_only_error"]), 3),
                            fmt_num(statistics.mean(e for r in records for e in r["coupling_effect"]), 3)])
        exact = {s: x["loss"]["exact"] for s, x in found.items()}
        losses.append([name, str(T), fmt_stat(stat(exact.values()), digits=4),
                       *(fmt_difference({s: x["loss"][v] for s, x in found.items()}, exact)
                         for v in ("field only", "uncoupled"))])
    if not weights:
        return []
    return ["## The couplings: a per-slot field or co-attention?", "",
            "Given the other keys, the log-odds that window key i - a is attended is 2 (h_a - R_a) + "
            "4 sum_b J_ab n_b (R_a = sum_b J_ab): a fixed field per slot, which a position bias can also give, and "
            "co-attention. Each coupled run is measured after training on the same inputs in three versions: exact; "
            "field only (the couplings replaced by their per-slot field -R_a); uncoupled (sigmoid attention on the "
            "same fields). Explained: 1 - sum (a - a_field)^2 / sum (a - a_uncoupled)^2 over the window's keys of "
            f"{coattention.ANALYSIS_WINDOWS} validation windows (1: the couplings act as a position bias; 0 or "
            "below: their effect is co-attention), pooled over the layer's heads and the seeds, and per head as "
            "the median over seeds (a head whose couplings barely change its weights can have any value)."
            + (f" {note}" if note else ""), "",
            md_table(["arm", "T", "layer", "explained, pooled", "explained by head", "mean |a - a_field|",
                      "mean |a - a_uncoupled|"], weights), "",
            "Validation loss of the trained model in each version (the same weights; only the coupled windows "
            "change): the version's loss minus the exact loss, in millinats, paired over seeds; positive = the "
            "version's loss is higher, i.e. what the part of the couplings it drops contributes.", "",
            md_table(["arm", "T", "exact loss", "field only vs exact, Δ mnats", "uncoupled vs exact, Δ mnats"],
                     losses), ""]


def _median_or_dash(values: list) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.2f}" if values else "-"


def _pooled(records: list[dict]) -> str:
    """1 - sum field_only_square / sum coupling_square over the heads and runs of ``records`` ("-" when a record
    lacks the squares)."""
    if not all("coupling_square" in r for r in records):
        return "-"
    effect = sum(c for r in records for c in r["coupling_square"])
    return f"{1 - sum(f for r in records for f in r['field_only_square']) / effect:.3f}" if effect else "-"
