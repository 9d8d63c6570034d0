"""The report of the fair-baselines study (profile ``fair``, see :func:`experiments.fair_grids`).

It asks what the couplings J add over sigmoid attention (mode h) once the field bias is treated fairly:

* field-bias variants x modes h, h+J, J against one softmax baseline, on both tasks;
* two Shakespeare metrics (perplexity over all positions, and at the last position only) and two bracket
  metrics (test accuracy, test cross-entropy);
* convergence (4x longer training) and the sensitivity of J (learning-rate multiplier, initialisation).

Every comparison is paired over seeds (a seed fixes the initialisation and the data order of every mode):
the mean of the per-seed differences with a 95% confidence interval from Student's t. ``*`` marks p < 0.05
(two-sided paired t-test); ``**`` marks differences that stay significant after a Holm correction over all
the comparisons of their table.
"""

from __future__ import annotations

import gzip
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .report import ARCHIVE, Group, Results, _duration, _figure, _finish, header_section, load_runs, md_table
from .sweep import DEFAULT_FIELD_BIAS, FAIR_T, FIELD_BIASES, J_INIT_STD, J_LR_MULTIPLIERS, NOFFN

ALPHA = 0.05
BOLTZMANN_MODES = ("h", "h+J", "J")


# ------------------------------------------------------------------------------------------------ statistics

@dataclass
class Paired:
    """Mean of per-seed differences with a two-sided (1 - ALPHA) confidence interval and t-test p-value."""

    mean: float
    low: float
    high: float
    p: float | None  # None with fewer than 2 paired seeds
    n: int

    def mark(self, holm: bool = False) -> str:
        if self.p is None or self.p >= ALPHA:
            return ""
        return "**" if holm else "*"

    def text(self, digits: int = 2, holm: bool = False) -> str:
        if self.n < 2:
            return f"{self.mean:+.{digits}f} (n={self.n})"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]{self.mark(holm)}"


def paired(a: dict[int, float], b: dict[int, float], fn: Callable[[float, float], float]) -> Paired | None:
    """fn(a_s, b_s) over the seeds s present in both: mean, 95% t interval and paired t-test."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    d = np.array([fn(a[s], b[s]) for s in seeds], dtype=float)
    mean, n = float(d.mean()), d.size
    if n < 2:
        return Paired(mean, math.nan, math.nan, None, n)
    from scipy import stats

    sd = float(d.std(ddof=1))
    if sd == 0.0:  # no spread: the difference is exact
        return Paired(mean, mean, mean, 1.0 if mean == 0 else 0.0, n)
    half = float(stats.t.ppf(1 - ALPHA / 2, n - 1)) * sd / math.sqrt(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    return Paired(mean, mean - half, mean + half, p, n)


def holm(p_values: list[float | None]) -> list[bool]:
    """Which p-values stay below ALPHA after the Holm-Bonferroni correction (None counts as not rejected)."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    rejected = [False] * len(p_values)
    m = len(indexed)
    for rank, (p, i) in enumerate(indexed):
        if p >= ALPHA / (m - rank):
            break
        rejected[i] = True
    return rejected


def relative(reference: float, other: float) -> float:
    """(reference - other) / reference x 100: positive when ``other`` is lower (better for PPL and loss)."""
    return (reference - other) / reference * 100.0


def points(reference: float, other: float) -> float:
    """(other - reference) x 100: accuracy points, positive when ``other`` is better."""
    return (other - reference) * 100.0


def millinats(reference: float, other: float) -> float:
    """(reference - other) x 1000: a loss difference in millinats, positive when ``other`` is lower. (A
    relative difference would explode where the losses are near 0, as on saturated brackets.)"""
    return (reference - other) * 1000.0


@dataclass(frozen=True)
class Metric:
    key: str
    split: str
    title: str
    diff: Callable[[float, float], float]
    unit: str
    scale: float  # for absolute values
    lower_is_better: bool


METRICS = {
    "shakespeare": (Metric("ppl", "val", "perplexity, all positions", relative, "%", 1.0, True),
                    Metric("ppl_last", "val", "perplexity, last position", relative, "%", 1.0, True)),
    "brackets": (Metric("accuracy", "test", "test accuracy", points, "pts", 100.0, False),
                 Metric("loss", "test", "test cross-entropy (millinats)", millinats, "mnat", 1000.0, True)),
}


# ----------------------------------------------------------------------------------------------------- tables

def _values(g: Group | None, m: Metric) -> dict[int, float]:
    return g.values(m.key, m.split) if g is not None else {}


def _absolute(values: dict[int, float], m: Metric) -> str:
    if not values:
        return ""
    v = np.array(list(values.values())) * m.scale
    return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if v.size > 1 else f"{v.mean():.3f}"


def _table_with_holm(header: list[str], cells: list[list[str | Paired | None]]) -> str:
    """A Markdown table whose Paired cells are marked with the Holm correction over the whole table."""
    found = [c for row in cells for c in row if isinstance(c, Paired)]
    survives = dict(zip(map(id, found), holm([c.p for c in found])))
    rows = [[c.text(holm=survives[id(c)]) if isinstance(c, Paired) else (c or "") for c in row] for row in cells]
    return md_table(header, rows)


PREFIXES = ("", NOFFN)  # settings of the study: as is, and (brackets) without the FFN


def _setting(task: str, prefix: str) -> str:
    return f"{task} without the FFN" if prefix == NOFFN else task


class Study:
    """The runs of the fair study, looked up by (task, T, mode, variant); ``prefix`` selects the setting."""

    def __init__(self, res: Results):
        self.res = res

    def group(self, task: str, T: int, mode: str, variant: str) -> Group | None:
        return self.res.get(task, variant, T, mode, "exact")

    def softmax(self, task: str, T: int, long: bool = False, prefix: str = "") -> Group | None:
        return self.group(task, T, "softmax", "long" if long else f"{prefix}fair")

    def biased(self, task: str, T: int, mode: str, bias: str, prefix: str = "") -> Group | None:
        return self.group(task, T, mode, f"{prefix}bias-{bias}")

    def settings(self) -> list[tuple[str, int, str]]:
        """(task, T, prefix) of every bias study present, Shakespeare first."""
        found = {(k[0], k[2], p) for k in self.res.groups for p in PREFIXES
                 if any(k[1] == f"{p}bias-{b}" for b in FIELD_BIASES)}
        return sorted(found, key=lambda s: (s[0] != "shakespeare", s[0], s[2], -s[1]))

    def best_bias(self, task: str, T: int, mode: str, m: Metric, prefix: str = "") -> str | None:
        """The bias variant with the best mean of metric m (selected on the same seeds: optimistic)."""
        means = {}
        for b in FIELD_BIASES:
            v = _values(self.biased(task, T, mode, b, prefix), m)
            if v:
                means[b] = float(np.mean(list(v.values())))
        if not means:
            return None
        pick = min if m.lower_is_better else max
        return pick(means, key=means.get)


def bias_section(study: Study, task: str, T: int, prefix: str = "") -> list[str]:
    lines = [f"### {_setting(task, prefix)}, T = {T}: field-bias variants", ""]

    def values(mode: str, bias: str | None, m: Metric) -> dict[int, float]:
        return _values(study.biased(task, T, mode, bias, prefix), m) if bias else {}

    for m in METRICS[task]:
        base = _values(study.softmax(task, T, prefix=prefix), m)
        absolute = [["softmax (no field)", _absolute(base, m), "", ""]]
        versus, adds, against_default = [], [], []
        default = {mode: values(mode, DEFAULT_FIELD_BIAS, m) for mode in BOLTZMANN_MODES}
        for b in FIELD_BIASES:
            vals = {mode: values(mode, b, m) for mode in BOLTZMANN_MODES}
            absolute.append([b] + [_absolute(vals[mode], m) for mode in BOLTZMANN_MODES])
            versus.append([b] + [paired(base, vals[mode], m.diff) for mode in BOLTZMANN_MODES])
            adds.append([b, paired(vals["h"], vals["h+J"], m.diff)])
            if b != DEFAULT_FIELD_BIAS:
                against_default.append([b] + [paired(default[mode], vals[mode], m.diff) for mode in BOLTZMANN_MODES])
        best = {mode: study.best_bias(task, T, mode, m, prefix) for mode in BOLTZMANN_MODES}
        versus.append(["best variant per mode"] + [paired(base, values(mode, best[mode], m), m.diff)
                                                   for mode in BOLTZMANN_MODES])
        if best["h"] and best["h+J"]:
            adds.append([f"best h+J ({best['h+J']}) vs best h ({best['h']})",
                         paired(values("h", best["h"], m), values("h+J", best["h+J"], m), m.diff)])
        unit = f"{m.unit}, positive = better"
        lines += [f"**{m.title}** (mean ± std over seeds)", "",
                  md_table(["field bias", *BOLTZMANN_MODES], absolute), "",
                  f"Against softmax ({unit}; 95% CI; best variants: "
                  + ", ".join(f"{mode} {best[mode]}" for mode in BOLTZMANN_MODES if best[mode]) + "):", "",
                  _table_with_holm(["field bias", *BOLTZMANN_MODES], versus), "",
                  f"What J adds: h+J against h with the same field bias ({unit}; 95% CI):", "",
                  _table_with_holm(["field bias", "h+J vs h"], adds), "",
                  f"Each variant against the default `{DEFAULT_FIELD_BIAS}`, same mode ({unit}; 95% CI):", "",
                  _table_with_holm(["field bias", *BOLTZMANN_MODES], against_default), ""]
    return lines + learned_bias_table(study, task, T, prefix)


def learned_bias_table(study: Study, task: str, T: int, prefix: str = "") -> list[str]:
    """Where the learnable field biases end up, against the -½ log T = sigmoid attention's logit -log T."""
    rows = []
    for b, (learnable, coefficient) in FIELD_BIASES.items():
        if not learnable:
            continue
        cells = [f"{b} (starts at {coefficient * math.log(T):+.2f})"]
        for mode in BOLTZMANN_MODES:
            g = study.biased(task, T, mode, b, prefix)
            finals = [r.raw["field_bias"][0] for r in g.runs.values() if r.raw.get("field_bias")] if g else []
            cells.append(f"{np.mean(finals):+.2f} ± {np.std(finals, ddof=1):.2f}" if len(finals) > 1 else "")
        rows.append(cells)
    if not rows:
        return []
    return [f"Learned field bias at the end of training (mean ± std over seeds; -½ log T = {-0.5 * math.log(T):+.2f}):",
            "", md_table(["variant", *BOLTZMANN_MODES], rows), ""]


def convergence_section(study: Study, out: Path) -> list[str]:
    task, T = "shakespeare", FAIR_T
    long_variants = sorted({k[1] for k in study.res.groups if k[1].startswith("long-bias-")})
    if not long_variants or study.softmax(task, T, long=True) is None:
        return []
    bias = long_variants[0].removeprefix("long-bias-")
    lines = ["## Convergence: 4x longer training", "",
             f"Shakespeare, T = {T}, field bias {bias}; 4000 steps are the bias-study runs, 16000 steps the "
             "`long` runs (the learning-rate schedule is stretched, not continued).", ""]
    for m in METRICS[task]:
        rows = []
        for long in (False, True):
            soft = _values(study.softmax(task, T, long), m)
            variant = long_variants[0] if long else f"bias-{bias}"
            h, hj = (_values(study.group(task, T, mode, variant), m) for mode in ("h", "h+J"))
            steps = study.softmax(task, T, long).runs[0].config["steps"] if soft else "?"
            rows.append([str(steps), _absolute(soft, m), _absolute(h, m), _absolute(hj, m),
                         paired(soft, h, m.diff), paired(soft, hj, m.diff), paired(h, hj, m.diff)])
        lines += [f"**{m.title}**", "", _table_with_holm(
            ["steps", "softmax", "h", "h+J", f"h vs softmax ({m.unit})", f"h+J vs softmax ({m.unit})",
             f"h+J vs h ({m.unit})"], rows), ""]
    png = "convergence.png"
    plot_convergence(study, long_variants[0], out / png)
    return lines + [f"![validation perplexity during the long runs]({png})", ""]


def plot_convergence(study: Study, variant: str, path: Path) -> None:
    """Validation perplexity (all positions) against step, mean over seeds, for the 16000-step runs."""
    fig = _figure(5.0, 3.2)
    ax = fig.subplots()
    for mode, g, color in (("softmax", study.softmax("shakespeare", FAIR_T, long=True), "black"),
                           ("h", study.group("shakespeare", FAIR_T, "h", variant), "tab:orange"),
                           ("h+J", study.group("shakespeare", FAIR_T, "h+J", variant), "tab:blue")):
        if g is None:
            continue
        curves = [{e["step"]: math.exp(e["loss"]) for e in r.raw.get("history", [])} for r in g.runs.values()]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if steps:
            ax.plot(steps, [np.mean([c[s] for c in curves]) for s in steps], marker="o", ms=3, color=color,
                    label=f"{mode} (n={len(curves)})")
    _finish(fig, ax, "step", "validation perplexity", f"Shakespeare T={FAIR_T}, 16000 steps", path)


def sensitivity_section(study: Study) -> list[str]:
    T = FAIR_T
    lines = []
    for task, prefix in (("shakespeare", ""), ("brackets", NOFFN), ("brackets", "")):
        variants = sorted({k[1] for k in study.res.groups
                           if k[0] == task and k[1].startswith((f"{prefix}jlr", f"{prefix}jinit"))})
        if not variants:
            continue
        bias = variants[0].split("-bias-", 1)[1]
        settings = [("lr 1x, J = 0 at init", f"{prefix}bias-{bias}")]
        settings += [(f"lr {m:g}x", f"{prefix}jlr{m:g}-bias-{bias}") for m in J_LR_MULTIPLIERS]
        settings.append((f"J ~ N(0, {J_INIT_STD:g}²) at init", f"{prefix}jinit{J_INIT_STD:g}-bias-{bias}"))
        for mode in ("h+J", "J"):
            for m in METRICS[task]:
                soft = _values(study.softmax(task, T, prefix=prefix), m)
                reference = _values(study.group(task, T, mode, settings[0][1]), m)
                rows = []
                for label, variant in settings:
                    v = _values(study.group(task, T, mode, variant), m)
                    if v:
                        rows.append([label, _absolute(v, m), paired(reference, v, m.diff), paired(soft, v, m.diff)])
                if len(rows) > 1:
                    lines += [f"**{_setting(task, prefix)}, {mode}, field bias {bias}: {m.title}**", "",
                              _table_with_holm(["J setting", m.title, f"vs reference ({m.unit})",
                                                f"vs softmax ({m.unit})"], rows), ""]
    if not lines:
        return []
    return ["## Sensitivity of J", "",
            f"T = {T}. The learning rate of J is lr x multiplier; the reference row is the bias study's run "
            "(multiplier 1, J = 0 at initialisation). Brackets are run without the FFN, where the modes do not "
            "all reach 100%.", ""] + lines


# ------------------------------------------------------------------------------------------------ conclusions

def _claim(text: str, c: Paired | None, expect: str, unit: str) -> str:
    """One measured difference against a claim; expect 'better' or 'worse' (positive = better)."""
    if c is None:
        return f"{text}: not measured"
    if c.p is None:
        return f"{text}: {c.text()} {unit}, too few seeds to test"
    significant = c.p < ALPHA
    sign = "better" if c.mean > 0 else "worse"
    if not significant:
        return f"{text}: no significant difference ({c.text()} {unit}, p = {c.p:.2g}); the claim is not supported"
    verdict = "holds" if sign == expect else "is contradicted"
    return f"{text}: significantly {sign} ({c.text()} {unit}, p = {c.p:.2g}); the claim {verdict}"


def conclusions_section(study: Study) -> list[str]:
    lines = ["## Conclusions, claim by claim", "",
             "Each line is one paired comparison over seeds, with its 95% CI; 'significant' is "
             f"p < {ALPHA} without a multiple-comparison correction (the tables above add the Holm marks).", ""]
    for task, T, prefix in study.settings():
        m = METRICS[task][0]
        base = _values(study.softmax(task, T, prefix=prefix), m)
        lines += [f"**{_setting(task, prefix)}, T = {T}, {m.title}**", ""]
        for b in FIELD_BIASES:
            vals = {mode: _values(study.biased(task, T, mode, b, prefix), m) for mode in BOLTZMANN_MODES}
            if not any(vals.values()):
                continue
            claims = [
                ("h (sigmoid) is worse than softmax", paired(base, vals["h"], m.diff), "worse"),
                ("h+J is better than softmax", paired(base, vals["h+J"], m.diff), "better"),
                ("the couplings add to sigmoid attention (h+J better than h)",
                 paired(vals["h"], vals["h+J"], m.diff), "better"),
                ("J alone is worse than softmax", paired(base, vals["J"], m.diff), "worse"),
            ]
            lines.append(f"- field bias `{b}`:")
            lines += [f"  - {_claim(text, c, expect, m.unit)}" for text, c, expect in claims]
        reach = []
        for mode in BOLTZMANN_MODES:
            best = study.best_bias(task, T, mode, m, prefix)
            if best:
                reach.append(f"{mode} {_absolute(_values(study.biased(task, T, mode, best, prefix), m), m)} ({best})")
        if reach:
            lines += [f"- Best-tuned: softmax {_absolute(base, m)}; " + "; ".join(reach)
                      + " (best of the bias variants on the same seeds, so slightly optimistic).", ""]
    return lines + _convergence_claims(study)


def _convergence_claims(study: Study) -> list[str]:
    """The same claims after 4x the training steps (Shakespeare, T = FAIR_T, all positions)."""
    task, T, m = "shakespeare", FAIR_T, METRICS["shakespeare"][0]
    long_variants = sorted({k[1] for k in study.res.groups if k[1].startswith("long-bias-")})
    soft = _values(study.softmax(task, T, long=True), m)
    if not long_variants or not soft:
        return []
    h, hj = (_values(study.group(task, T, mode, long_variants[0]), m) for mode in ("h", "h+J"))
    claims = [("h (sigmoid) is worse than softmax", paired(soft, h, m.diff), "worse"),
              ("h+J is better than softmax", paired(soft, hj, m.diff), "better"),
              ("the couplings add to sigmoid attention (h+J better than h)", paired(h, hj, m.diff), "better")]
    return [f"**{task}, T = {T}, {m.title}, 4x longer training (16000 steps, `{long_variants[0]}`)**", ""] + [
        f"- {_claim(text, c, expect, m.unit)}" for text, c, expect in claims] + [""]


# ------------------------------------------------------------------------------------------------------ write

def write_fair_report(results_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir/README.md``, its plot and ``runs.jsonl.gz`` for the fair study; returns the README."""
    results_dir, out = Path(results_dir), Path(out_dir)
    runs = load_runs(results_dir)
    res = Results(runs)
    study = Study(res)
    out.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(out / ARCHIVE, "wb", mtime=0) as f:
        f.write("".join(json.dumps(r.raw, separators=(",", ":")) + "\n" for r in runs).encode())
    lines = header_section(res, results_dir)[:-1]
    lines[0] = "# Fair baselines: what the couplings add over sigmoid attention and its field bias"
    lines += ["- Sum of run wall times per task: " + ", ".join(
        f"{t} {_duration(sum(r.wall_time_s for r in runs if r.task == t))}" for t in res.tasks()), "",
        __doc__.split("\n\n", 1)[1].strip(), "",
        "Field-bias variants (b = c·log T at initialisation; the weights are sigmoid(2h), so the logit bias is 2b): "
        + "; ".join(f"`{b}`: {'learnable' if lr else 'fixed'}, c = {c:g}" for b, (lr, c) in FIELD_BIASES.items())
        + f". The library's default is `{DEFAULT_FIELD_BIAS}`. With `fixed-0` the J-only mode has no field at all, "
          "so every marginal is 0 by the s -> -s symmetry and every weight is ½ whatever J is.", "",
        "## Field bias", ""]
    for task, T, prefix in study.settings():
        lines += bias_section(study, task, T, prefix)
    lines += convergence_section(study, out)
    lines += sensitivity_section(study)
    lines += conclusions_section(study)
    path = out / "README.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


def is_fair_study(results_dir: str | Path) -> bool:
    """True when a results folder or archive holds runs of the fair study (variants named bias-*)."""
    return any(r.variant.startswith(tuple(f"{p}bias-" for p in PREFIXES)) for r in load_runs(results_dir))
