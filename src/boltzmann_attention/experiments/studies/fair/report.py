"""The fair study's report."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...plots import figure, finish
from ...recipes import DEFAULT_FIELD_BIAS, FIELD_BIASES, J_INIT_STD, J_LR_MULTIPLIERS
from ...report import ReportContext, header_section, protocol_sections
from ...results import Group, Results, layer0
from ...stats import ALPHA, Paired, millinats, paired, points, relative, stat
from ...tables import duration, fmt_interval, fmt_stat, md_table, table_with_holm
from .grids import BOLTZMANN_MODES, FAIR_T, NOFFN


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
    """mean ± std over seeds of the metric in its unit (blank when not measured)."""
    return fmt_stat(stat(np.array(list(values.values())) * m.scale), show_n=False)


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
                  table_with_holm(["field bias", *BOLTZMANN_MODES], versus), "",
                  f"What J adds: h+J against h with the same field bias ({unit}; 95% CI):", "",
                  table_with_holm(["field bias", "h+J vs h"], adds), "",
                  f"Each variant against the default `{DEFAULT_FIELD_BIAS}`, same mode ({unit}; 95% CI):", "",
                  table_with_holm(["field bias", *BOLTZMANN_MODES], against_default), ""]
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
            finals = [layer0(r.raw, "field_bias") for r in g.runs.values()] if g else []
            finals = [f[0] for f in finals if f]
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
            group = study.softmax(task, T, long)
            steps = next(iter(group.runs.values())).config["steps"] if soft else "?"
            rows.append([str(steps), _absolute(soft, m), _absolute(h, m), _absolute(hj, m),
                         paired(soft, h, m.diff), paired(soft, hj, m.diff), paired(h, hj, m.diff)])
        lines += [f"**{m.title}**", "", table_with_holm(
            ["steps", "softmax", "h", "h+J", f"h vs softmax ({m.unit})", f"h+J vs softmax ({m.unit})",
             f"h+J vs h ({m.unit})"], rows), ""]
    png = "convergence.png"
    plot_convergence(study, long_variants[0], out / png)
    return lines + [f"![validation perplexity during the long runs]({png})", ""]


def plot_convergence(study: Study, variant: str, path: Path) -> None:
    """Validation perplexity (all positions) against step, mean over seeds, for the 16000-step runs."""
    fig = figure(5.0, 3.2)
    ax = fig.subplots()
    for mode, g, color in (("softmax", study.softmax("shakespeare", FAIR_T, long=True), "black"),
                           ("h", study.group("shakespeare", FAIR_T, "h", variant), "tab:orange"),
                           ("h+J", study.group("shakespeare", FAIR_T, "h+J", variant), "tab:blue")):
        if g is None:
            continue
        curves = g.curves()
        if curves:
            ax.plot(list(curves), [np.mean([math.exp(x) for x in v.values()]) for v in curves.values()], marker="o",
                    ms=3, color=color, label=f"{mode} (n={len(g.runs)})")
    finish(fig, ax, "step", "validation perplexity", f"Shakespeare T={FAIR_T}, 16000 steps", path)


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
                              table_with_holm(["J setting", m.title, f"vs reference ({m.unit})",
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
        return f"{text}: {fmt_interval(c)} {unit}, too few seeds to test"
    significant = c.p < ALPHA
    sign = "better" if c.mean > 0 else "worse"
    if not significant:
        return (f"{text}: no significant difference ({fmt_interval(c)} {unit}, p = {c.p:.2g}); "
                "the claim is not supported")
    verdict = "holds" if sign == expect else "is contradicted"
    return f"{text}: significantly {sign} ({fmt_interval(c)} {unit}, p = {c.p:.2g}); the claim {verdict}"


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
            lines += [f"- Best-tuned: softmax {_absolute(base, m) or 'not measured'}; " + "; ".join(reach)
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


# ---------------------------------------------------------------------------------------------------- write

def owns(res: Results) -> bool:
    """True when the results hold runs of the fair study (variants named ``bias-*`` or ``noffn-bias-*``)."""
    return any(r.variant.startswith(tuple(f"{p}bias-" for p in PREFIXES)) for r in res.all_runs)


def report(res: Results, context: ReportContext) -> list[str]:
    """Header, what the study asks (its protocol), the field-bias study per setting, convergence, sensitivity
    of J, conclusions claim by claim."""
    study, out = Study(res), context.out
    lines = header_section(res, context.results_dir)[:-1]
    lines[0] = "# Fair baselines: what the couplings add over sigmoid attention and its field bias"
    lines += ["- Sum of run wall times per task: " + ", ".join(
        f"{t} {duration(sum(r.wall_time_s for r in res.runs if r.task == t))}" for t in res.tasks()), "",
        protocol_sections(context.protocol)[""], "",
        "Field-bias variants (b = c·log T at initialisation; the weights are sigmoid(2h), so the logit bias is 2b): "
        + "; ".join(f"`{b}`: {'learnable' if lr else 'fixed'}, c = {c:g}" for b, (lr, c) in FIELD_BIASES.items())
        + f". The library's default is `{DEFAULT_FIELD_BIAS}`. With `fixed-0` the J-only mode has no field at all, "
          "so every marginal is 0 by the s -> -s symmetry and every weight is ½ whatever J is.", "",
        "## Field bias", ""]
    for task, T, prefix in study.settings():
        lines += bias_section(study, task, T, prefix)
    lines += convergence_section(study, out)
    lines += sensitivity_section(study)
    return lines + conclusions_section(study)
