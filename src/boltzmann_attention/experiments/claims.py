"""The paper's numbers and claims (Kim & Park, arXiv:2606.12478), each checked against measured runs.

A claim reads the runs of variant ``base`` (and ``noffn`` for the FFN ablation) of a :class:`.results.Results`,
so a study checks the paper's claims on its own runs by relabelling them. :func:`agreement_section` renders
claims as a report section, :func:`extension_section` Shakespeare past the paper's largest window, and
:func:`claims_beside` two sets of verdicts side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .report import Verdict, coupling_table, summarize, verdict
from .results import Results
from .stats import ALPHA, Paired, combine, fit_line, point_difference, relative_improvement, stat
from .tables import fmt_comparison, fmt_direction, fmt_num, fmt_or, fmt_p, md_table

# The paper's numbers.
# Shakespeare: relative improvement of validation perplexity over softmax, percent (positive = better).
PAPER_SHAKESPEARE_RELATIVE = {
    ("h+J", 4): -0.02, ("h+J", 6): 0.43, ("h+J", 8): 0.81, ("h+J", 10): 0.92, ("h+J", 12): 1.08,
    ("h+J", 14): 1.04, ("h", 8): -3.08, ("h", 12): -7.14, ("J", 14): -14.73,
}
# Brackets: accuracy over closing brackets, percent.
PAPER_BRACKETS_ACCURACY = {("h+J", 16): 95.97, ("softmax", 16): 93.08, ("h", 16): 90.06, ("J", 16): 87.42}
PAPER = {"shakespeare": PAPER_SHAKESPEARE_RELATIVE, "brackets": PAPER_BRACKETS_ACCURACY}

PAPER_MAX_T = 14          # the largest Shakespeare window in the paper
STABLE_CORRELATION = 0.5  # seed-to-seed correlation of J above which the structure counts as stable



def paper_shakespeare(mode: str, T: int) -> float | None:
    return PAPER_SHAKESPEARE_RELATIVE.get((mode, T))


def paper_brackets(mode: str, T: int) -> float | None:
    return PAPER_BRACKETS_ACCURACY.get((mode, T))


# -------------------------------------------------------------------------------------------- the paper's claims

@dataclass
class Claim:
    title: str
    paper: str
    summary: str
    lines: list


def _claim_table(rows: list[list[str]], first: str = "T") -> str:
    return md_table([first, "paper", "measured", "verdict"], rows)


def _rel(res: Results, T: int, mode: str, metric: str = "ppl") -> Paired | None:
    g, base = res.pick("shakespeare", "base", T, mode), res.baseline("shakespeare", "base", T)
    if g is None or base is None:
        return None
    return relative_improvement(base.values(metric), g.values(metric))


def _paper_range(res: Results, low: int) -> list[int]:
    """Shakespeare T in the paper's range (T <= 14), at least ``low``, measured or with a paper number."""
    measured = [T for T in res.Ts("shakespeare", "base") if T <= PAPER_MAX_T]
    paper = [T for (_, T) in PAPER_SHAKESPEARE_RELATIVE]
    return sorted({T for T in measured + paper if T >= low})


def claim_hj_ahead(res: Results) -> Claim:
    rows, verdicts = [], []
    for T in _paper_range(res, 4):
        c = _rel(res, T, "h+J")
        v = verdict(c, "level" if T == 4 else "greater")
        verdicts.append(v)
        paper = paper_shakespeare("h+J", T)
        rows.append([str(T), fmt_num(paper, signed=True) + " %" if paper is not None else "",
                     fmt_comparison(c) + " %" if c else "", v.text])
    return Claim("h+J ahead of softmax on Shakespeare (level at T=4, ahead from T=6)",
                 "h+J level with softmax at T=4 (-0.02 %), then ahead: +0.43 % (T=6) … +1.04 % (T=14)",
                 summarize(verdicts), [_claim_table(rows)])


def claim_hj_grows(res: Results) -> Claim:
    Ts, ys, enough = [], [], True
    for T in _paper_range(res, 4):
        c = _rel(res, T, "h+J")
        if c is None:
            continue
        enough &= c.n >= 3
        vals = c.per_seed if c.per_seed is not None else [c.mean]
        Ts += [T] * len(vals)
        ys += list(vals)
    paper_pts = sorted((T, v) for (m, T), v in PAPER_SHAKESPEARE_RELATIVE.items() if m == "h+J")
    paper_slope = fit_line(*np.array(paper_pts).T).slope
    paper = f"the improvement grows with T (slope of the paper's six numbers: {paper_slope:+.3f} % per unit T)"
    title = "h+J's advantage grows with T (Shakespeare, T ≤ 14)"
    if len(set(Ts)) < 2:
        return Claim(title, paper, "not measured", ["Fewer than two T values with both h+J and softmax."])
    fit = fit_line(Ts, ys)
    over = f"over T = {', '.join(map(str, sorted(set(Ts))))}"
    if fit.stderr is None:  # a line through two points: no degree of freedom left for its error
        measured = f"slope {fit.slope:+.3f} % per unit T {over} (no error: {len(Ts)} points fix the line)"
    else:
        measured = f"slope {fit.slope:+.3f} ± {fit.stderr:.3f} % per unit T {over}"
    word = "agrees" if fit.slope > 0 else "does not agree"
    if not enough:
        text = f"{word} (too few seeds to test: fewer than 3 paired seeds at some T)"
    elif fit.stderr is None:
        text = f"{word} (too few points to test: {len(Ts)})"
    elif abs(fit.slope) < fit.stderr:
        text = f"{word} in sign only (within noise: the slope is smaller than its standard error; {fmt_p(fit.p)})"
    elif fit.p < ALPHA:
        text = f"{word} (significant: {fmt_p(fit.p)}, linear regression over seeds)"
    else:
        text = f"{word} in sign only (not significant: {fmt_p(fit.p)}, linear regression over seeds)"
    return Claim(title, paper, text, [f"Measured: {measured}. Verdict: {text}."])


def claim_h_behind(res: Results) -> Claim:
    rows, verdicts = [], []
    for T in _paper_range(res, 8):
        c = _rel(res, T, "h")
        v = verdict(c, "less")
        verdicts.append(v)
        paper = paper_shakespeare("h", T)
        rows.append([str(T), fmt_num(paper, signed=True) + " %" if paper is not None else "(behind)",
                     fmt_comparison(c) + " %" if c else "", v.text])
    return Claim("h behind softmax on Shakespeare from T=8", "h behind softmax from T=8 (-3.08 % at T=8, -7.14 % at "
                 "T=12)", summarize(verdicts), [_claim_table(rows)])


def claim_j_worst(res: Results) -> Claim:
    rows, verdicts = [], []
    for T in _paper_range(res, 4):
        J = res.pick("shakespeare", "base", T, "J")
        others = [res.pick("shakespeare", "base", T, m) for m in ("softmax", "h+J", "h")]
        others = [g for g in others if g is not None and g.values("ppl")]
        if J is None or not J.values("ppl") or not others:
            if paper_shakespeare("J", T) is not None:
                rows.append([str(T), f"{paper_shakespeare('J', T):+.2f} %", "", "not measured"])
                verdicts.append(Verdict(None, False, "not measured"))
            continue
        worst = max(others, key=lambda g: np.mean(list(g.values("ppl").values())))
        c = combine([worst.values("ppl"), J.values("ppl")], lambda o, j: (j - o) / o * 100.0)
        v = verdict(c, "greater")
        verdicts.append(v)
        paper = paper_shakespeare("J", T)
        rows.append([str(T), f"{paper:+.2f} % vs softmax" if paper is not None else "(worst)",
                     f"J's PPL {fmt_direction(c, '%', 'above', 'below')} the next worst ({worst.mode})", v.text])
    return Claim("J the worst mode on Shakespeare", "J worse still than h (-14.73 % at T=14)", summarize(verdicts),
                 [_claim_table(rows)] if rows else ["No Shakespeare runs of mode J."])


BRACKET_ORDER = ("h+J", "softmax", "h", "J")


def claim_brackets_order(res: Results, T: int = 16) -> Claim:
    title = f"Brackets at T={T}: h+J > softmax > h > J (test accuracy)"
    paper = ", ".join(f"{m} {PAPER_BRACKETS_ACCURACY[(m, T)]:.2f} %" for m in BRACKET_ORDER
                      if (m, T) in PAPER_BRACKETS_ACCURACY)
    groups = {m: res.pick("brackets", "base", T, m) for m in BRACKET_ORDER}
    rows, verdicts = [], []
    for hi, lo in zip(BRACKET_ORDER, BRACKET_ORDER[1:]):
        c = None
        if groups[hi] and groups[lo]:
            c = point_difference(groups[lo].values("accuracy", "test"), groups[hi].values("accuracy", "test"))
        v = verdict(c, "greater", unit="pts")
        verdicts.append(v)
        p_hi, p_lo = paper_brackets(hi, T), paper_brackets(lo, T)
        rows.append([f"{hi} − {lo}", f"{p_hi - p_lo:+.2f} pts" if p_hi is not None and p_lo is not None else "",
                     f"{fmt_comparison(c)} pts" if c else "", v.text])
    lines = [_claim_table(rows, first="pair")]
    order = _measured_order(res, T)
    if order:
        lines.append(f"Measured order at T={T}: {order}.")
    else:
        Ts = res.Ts("brackets", "base")
        if Ts:
            lines.append(f"Not measured at T={T}; for information, the order at T={Ts[-1]} (largest measured) is "
                         f"{_measured_order(res, Ts[-1]) or 'not available'}.")
    return Claim(title, paper, summarize(verdicts), lines)


def _measured_order(res: Results, T: int) -> str:
    means = {}
    for m in BRACKET_ORDER:
        g = res.pick("brackets", "base", T, m)
        s = stat((g.values("accuracy", "test") if g else {}).values())
        if s is not None:
            means[m] = s.mean * 100
    return " > ".join(f"{m} {v:.2f} %" for m, v in sorted(means.items(), key=lambda i: -i[1]))


def claim_noffn_gap(res: Results) -> Claim:
    rows, verdicts = [], []
    for T in sorted(set(res.Ts("brackets", "base")) & set(res.Ts("brackets", "noffn"))):
        groups = [res.pick("brackets", v, T, m) for v in ("base", "noffn") for m in ("softmax", "h+J")]
        c = None
        if all(groups):
            c = combine([g.values("accuracy", "test") for g in groups],
                        lambda bs, bj, ns, nj: ((nj - ns) - (bj - bs)) * 100.0)
        v = verdict(c, "greater", unit="pts")
        verdicts.append(v)
        rows.append([str(T), "wider without FFN", f"gap(noffn) − gap(base) = {fmt_comparison(c)} pts" if c else "",
                     v.text])
    return Claim("Without the FFN the h+J − softmax gap on brackets widens",
                 "the ablation without FFN widens the gap (no numbers)", summarize(verdicts),
                 [_claim_table(rows)] if rows else ["No bracket runs of both variants base and noffn at the same T."])


THREE_BODY_PAIRS = (("h+J+K", "h+J"), ("h+K", "h"))


def claim_three_body(res: Results) -> Claim:
    rows, verdicts = [], []
    for task in ("brackets", "shakespeare"):
        for T in res.Ts(task, "base"):
            if task == "brackets" and T < 12:
                continue
            for with_k, without in THREE_BODY_PAIRS:
                a, b = res.pick(task, "base", T, without), res.pick(task, "base", T, with_k)
                if a is None or b is None:
                    continue
                if task == "brackets":
                    c = point_difference(a.values("accuracy", "test"), b.values("accuracy", "test"))
                    v, unit, paper = verdict(c, "greater", unit="pts"), "pts", "helps"
                else:
                    c = relative_improvement(a.values("ppl"), b.values("ppl"))
                    v, unit, paper = verdict(c, "not greater"), "%", "does not help"
                verdicts.append(v)
                rows.append([f"{task} T={T}: {with_k} vs {without}", paper, f"{fmt_comparison(c)} {unit}" if c else "",
                             v.text])
    return Claim("Three-body couplings help on brackets at T ≥ 12, not on Shakespeare",
                 "h+J+K and h+K help on brackets at T ≥ 12 but not on Shakespeare (no numbers; compared here: "
                 "h+J+K vs h+J and h+K vs h)", summarize(verdicts),
                 [_claim_table(rows, first="comparison")] if rows else ["No three-body runs with their two-body "
                                                                         "counterpart."])


def claim_j_structure(res: Results) -> Claim:
    rows, verdicts = [], []
    for task in res.tasks():
        _, stats = coupling_table(res, task)
        for T, (n, corr, r2) in stats.items():
            if n < 2:
                v = Verdict(None, False, "not measured (fewer than 2 seeds)")
            elif not math.isfinite(corr):
                v = Verdict(None, False, "not measured (J has no variance in a seed: the correlation is undefined)")
            else:
                stable = corr >= STABLE_CORRELATION
                v = Verdict(stable, False, f"{'agrees' if stable else 'does not agree'} (correlation "
                            f"{'≥' if stable else '<'} {STABLE_CORRELATION}, a threshold chosen here)")
            verdicts.append(v)
            rows.append([f"{task} T={T}", "stable, distance-dependent",
                         f"correlation between seeds {fmt_or(corr, 'undefined' if n > 1 else 'undefined (1 seed)')}, "
                         f"R² by distance {fmt_or(r2, 'undefined (J has no variance)')}", v.text])
    return Claim("The learned J has a distance-dependent structure stable across seeds",
                 "distance-dependent J, stable across seeds (no numbers)", summarize(verdicts),
                 [_claim_table(rows, first="runs")] if rows else ["No h+J runs with couplings."])


SHAKESPEARE_CLAIMS = (claim_hj_ahead, claim_hj_grows, claim_h_behind, claim_j_worst)
BRACKET_CLAIMS = (claim_brackets_order, claim_noffn_gap, claim_three_body)


def agreement_section(res: Results, claims: list[Claim] | None = None) -> list[str]:
    """The claims (by default all of the paper's) as a summary table, then one subsection each."""
    if claims is None:
        claims = [c(res) for c in SHAKESPEARE_CLAIMS + BRACKET_CLAIMS + (claim_j_structure,)]
    lines = ["## Agreement with the paper", "",
             "Variant `base`, exact enumeration where available. Shakespeare: perplexity over all positions. "
             f"Significance: paired t-test over seeds (scipy.stats.ttest_rel) at p < {ALPHA} when at least 3 seeds "
             "are paired; a difference smaller than its standard deviation over seeds is reported as within noise.",
             "", md_table(["claim", "verdict"], [[c.title, c.summary] for c in claims]), ""]
    for c in claims:
        lines += [f"### {c.title}", "", f"Paper: {c.paper}.", "", *[x + "\n" for x in c.lines],
                  f"Summary: {c.summary}.", ""]
    return lines


# ------------------------------------------------------------------------------------------------- extension

def extension_section(res: Results) -> list[str]:
    beyond = [T for T in res.Ts("shakespeare", "base") if T > PAPER_MAX_T]
    if not beyond:
        return []
    rows, measured = [], {}
    for T in [t for t in (12, 14) if t in res.Ts("shakespeare", "base")] + beyond:
        g = res.pick("shakespeare", "base", T, "h+J")
        c = _rel(res, T, "h+J")
        if c is not None:
            measured[T] = c
        paper = paper_shakespeare("h+J", T)
        rows.append([str(T), g.method if g else "", fmt_comparison(c) + " %" if c else "not measured",
                     str(c.n) if c else "", fmt_num(paper, signed=True)])
    lines = ["## Extension past the paper", "",
             f"Shakespeare windows beyond the paper's largest (T = {PAPER_MAX_T}); variant `base`.", "",
             md_table(["T", "h+J method", "h+J Δ% vs softmax", "paired seeds", "paper Δ%"], rows), ""]
    return lines + [_growth_statement(measured, beyond), ""]


def _growth_statement(measured: dict[int, Paired], beyond: list[int]) -> str:
    new = [T for T in beyond if T in measured]
    refs = {T: measured[T] for T in (12, 14) if T in measured}
    if not new:
        return "h+J's relative improvement was not measured past T = 14 (h+J or softmax runs missing)."
    if not refs:
        return (f"h+J's improvement at T = {new[-1]} is {measured[new[-1]].mean:+.2f} %; without T = 12 or 14 runs "
                "there is nothing to compare it with.")
    last = measured[new[-1]]
    best_T = max(refs, key=lambda T: refs[T].mean)
    ref = refs[best_T]
    ref_text = " and ".join(f"{refs[T].mean:+.2f} % at T = {T}" for T in sorted(refs))
    head = f"At T = {new[-1]}, h+J's improvement over softmax is {last.mean:+.2f} % (vs {ref_text})"
    diff = last.mean - ref.mean
    if last.n < 2 or ref.n < 2:
        noise = "; with a single seed on one side there is no spread to judge the difference against"
        solid = False
    else:
        spread = math.hypot(last.std, ref.std)
        solid = abs(diff) >= spread
        noise = (f"; the difference to T = {best_T} ({diff:+.2f} points) is "
                 f"{'larger' if solid else 'smaller'} than the combined seed spread ({spread:.2f})")
    if last.mean > max(r.mean for r in refs.values()):
        trend = "keeps growing" if solid else "is higher, but that growth is not established"
    elif last.mean < min(r.mean for r in refs.values()):
        trend = "shrinks" if solid else "is lower, but that decline is not established"
    else:
        trend = "levels off (it lies between the T = 12 and T = 14 values)"
    return f"{head}: the advantage {trend}{noise}."


def claims_beside(header: list[str], before: list[Claim], after: list[Claim]) -> str:
    """A table of two sets of the paper's claims, verdict beside verdict."""
    return md_table(["claim", *header], [[b.title, a.summary, b.summary] for a, b in zip(before, after)])
