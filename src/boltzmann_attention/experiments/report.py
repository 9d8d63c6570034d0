"""The report of a sweep: Markdown tables, small plots and a comparison with the paper.

:func:`write_report` reads every ``<results_dir>/runs/*.json`` written by the sweep (one per run, see
:func:`boltzmann_attention.train.write_result`), groups the runs by (task, variant, T, mode, method) over
seeds and writes ``README.md`` plus PNGs into the output folder:

* a header (runs, seeds, wall time, machines, training settings);
* Shakespeare tables (perplexity over all positions and at the last position; relative improvement over
  softmax, paired over seeds; the paper's number next to it) and bracket tables (accuracy, difference to
  softmax in points, the paper's number);
* plots of the metric against T, of the learned couplings J and of J against the distance |j - k|;
* a fit PPL(T) = a * exp(-b * T) + c per mode;
* "Agreement with the paper", claim by claim, with paired t-tests over seeds, and "Extension past the paper"
  when Shakespeare runs with T > 14 exist.

Everything works on partial grids: a missing mode, T or seed leaves a blank cell or a "not measured".
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import numpy as np

from .sweep import PAPER_BRACKETS_ACCURACY, PAPER_SHAKESPEARE_RELATIVE
from .train import TrainConfig

__all__ = ["Comparison", "Fit", "Group", "Results", "Run", "Stat", "fit_exponential", "load_runs",
           "write_report"]

MODE_ORDER = ("softmax", "h+J", "h", "J", "h+K", "h+J+K")
BASELINE = "softmax"
ALPHA = 0.05            # significance level of the paired t-tests
LEVEL_TOLERANCE = 0.25  # percent: "level with softmax" when fewer than 3 seeds allow no test
STABLE_CORRELATION = 0.5  # seed-to-seed correlation of J above which the structure counts as stable
PAPER_MAX_T = 14        # the largest Shakespeare window in the paper
DPI = 100
MODE_COLORS = {"softmax": "black", "h+J": "tab:blue", "h": "tab:orange", "J": "tab:green", "h+K": "tab:red",
               "h+J+K": "tab:purple"}
INFO_KEYS = ("machine", "processor", "cpus", "torch", "python", "commit")


# ----------------------------------------------------------------------------------------------------- loading

@dataclass
class Run:
    """One result JSON."""

    path: Path
    name: str
    task: str
    variant: str
    T: int
    mode: str
    method: str
    seed: int
    config: dict
    metrics: dict
    wall_time_s: float
    steps_run: int | None
    couplings: np.ndarray | None  # (H, T, T) learned J of layer 0
    info: dict
    raw: dict  # the whole result, as loaded

    @property
    def key(self) -> tuple:
        return (self.task, self.variant, self.T, self.mode, self.method)


ARCHIVE = "runs.jsonl.gz"  # every run's result, one JSON per line, written next to each report


def load_runs(results: str | Path) -> list[Run]:
    """Every ``runs/*.json`` below a results folder (``*.tmp`` files of unfinished writes are ignored), or
    every line of a ``runs.jsonl.gz`` archive written by :func:`write_report`."""
    results = Path(results)
    if results.is_file():
        with gzip.open(results, "rt") as f:
            return [_load_run(Path(f"{results}:{i + 1}"), line) for i, line in enumerate(f) if line.strip()]
    runs_dir = results / "runs"
    paths = sorted(runs_dir.glob("*.json"))
    if not paths:
        raise ValueError(f"no run results (*.json) in {runs_dir}")
    return [_load_run(p, p.read_text()) for p in paths]


def _load_run(path: Path, text: str) -> Run:
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed result file {path}: {e}") from None
    try:
        cfg = d["config"]
        T = int(cfg["T"])
        metrics = d["metrics"]
        if not isinstance(metrics.get("val"), dict):
            raise KeyError("metrics.val")
        run = Run(path=path, name=str(d.get("run", path.stem)), task=str(cfg["task"]),
                  variant=str(d.get("variant", "base")), T=T, mode=str(cfg["mode"]), method=str(cfg["method"]),
                  seed=int(d.get("seed", cfg["seed"])), config=cfg, metrics=metrics,
                  wall_time_s=float(d.get("wall_time_s") or 0.0), steps_run=d.get("steps_run"),
                  couplings=None, info={k: d.get(k) for k in INFO_KEYS}, raw=d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"result file {path} lacks a field or has a bad one: {e!r}") from None
    if d.get("couplings") is not None:
        J = np.asarray(d["couplings"], dtype=float)
        J = J[None] if J.ndim == 2 else J
        if J.ndim != 3 or J.shape[1:] != (T, T):
            raise ValueError(f"result file {path}: couplings have shape {J.shape}, expected (H, {T}, {T})")
        run.couplings = J
    return run


# ------------------------------------------------------------------------------------------------- grouping

@dataclass
class Group:
    """The runs of one grid point over seeds."""

    task: str
    variant: str
    T: int
    mode: str
    method: str
    runs: dict  # seed -> Run

    def values(self, metric: str, split: str = "val") -> dict[int, float]:
        """seed -> metric, leaving out runs without a finite value."""
        out = {}
        for seed, run in self.runs.items():
            v = run.metrics.get(split, {}).get(metric)
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[seed] = float(v)
        return out

    def couplings(self) -> dict[int, np.ndarray]:
        """seed -> J of head 0, (T, T)."""
        return {s: r.couplings[0] for s, r in self.runs.items() if r.couplings is not None}


def _mode_rank(mode: str) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


def _variant_rank(variant: str) -> tuple:
    return (variant != "base", variant)


class Results:
    """All runs, grouped by (task, variant, T, mode, method)."""

    def __init__(self, runs: list[Run]):
        self.runs = runs
        self.groups: dict[tuple, Group] = {}
        self.duplicates: list[str] = []
        for run in sorted(runs, key=lambda r: str(r.path)):
            g = self.groups.setdefault(run.key, Group(*run.key, runs={}))
            if run.seed in g.runs:
                self.duplicates.append(f"{run.path.name} (same grid point and seed as {g.runs[run.seed].path.name})")
                continue
            g.runs[run.seed] = run

    def tasks(self) -> list[str]:
        return sorted({k[0] for k in self.groups}, key=lambda t: (t != "shakespeare", t))

    def variants(self, task: str) -> list[str]:
        return sorted({k[1] for k in self.groups if k[0] == task}, key=_variant_rank)

    def Ts(self, task: str, variant: str) -> list[int]:
        return sorted({k[2] for k in self.groups if k[:2] == (task, variant)})

    def columns(self, task: str, variant: str) -> list[tuple[str, str]]:
        """The (mode, method) pairs present, in the paper's order of modes, exact enumeration first."""
        cols = {(k[3], k[4]) for k in self.groups if k[:2] == (task, variant)}
        return sorted(cols, key=lambda c: (_mode_rank(c[0]), c[0], c[1] != "exact", c[1]))

    def get(self, task: str, variant: str, T: int, mode: str, method: str) -> Group | None:
        return self.groups.get((task, variant, T, mode, method))

    def pick(self, task: str, variant: str, T: int, mode: str, method: str | None = None) -> Group | None:
        """The group of a mode at T: the given method if present, else exact, else any."""
        found = [g for k, g in self.groups.items() if k[:4] == (task, variant, T, mode)]
        for preferred in (method, "exact"):
            for g in found:
                if g.method == preferred:
                    return g
        return min(found, key=lambda g: g.method) if found else None

    def baseline(self, task: str, variant: str, T: int, method: str | None = None) -> Group | None:
        return self.pick(task, variant, T, BASELINE, method)


# ------------------------------------------------------------------------------------------------ statistics

@dataclass
class Stat:
    mean: float
    std: float  # sample standard deviation over seeds; nan for one seed
    n: int


def stat(values: Iterable[float]) -> Stat | None:
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        return None
    return Stat(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan, int(v.size))


@dataclass
class Comparison:
    """A quantity derived from several groups: per seed where all share the seed, else from the means."""

    mean: float
    std: float               # over paired seeds; nan when n < 2
    n: int                   # paired seeds; 0 when computed from the means
    per_seed: np.ndarray | None
    samples: tuple | None    # (a, b) raw paired values of a two-group comparison, for ttest_rel

    def p_value(self) -> float | None:
        """Two-sided paired t-test over seeds (None with fewer than 3 paired seeds)."""
        if self.n < 3:
            return None
        from scipy.stats import ttest_1samp, ttest_rel

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if self.samples is not None:
                p = float(ttest_rel(*self.samples).pvalue)
            else:
                p = float(ttest_1samp(self.per_seed, 0.0).pvalue)
        if not math.isfinite(p):  # no spread at all: the difference is exact
            p = 1.0 if self.mean == 0 else 0.0
        return p


def combine(values: list[dict[int, float]], fn: Callable[..., float]) -> Comparison | None:
    """``fn`` of the groups' values, per seed present in all of them, else of their means."""
    if any(not v for v in values):
        return None
    common = sorted(set.intersection(*(set(v) for v in values)))
    if not common:
        return Comparison(float(fn(*(np.mean(list(v.values())) for v in values))), math.nan, 0, None, None)
    cols = [np.array([v[s] for s in common]) for v in values]
    d = np.array([fn(*row) for row in zip(*cols)], dtype=float)
    samples = tuple(cols) if len(cols) == 2 else None
    return Comparison(float(d.mean()), float(d.std(ddof=1)) if d.size > 1 else math.nan, d.size, d, samples)


def relative_improvement(softmax: dict[int, float], mode: dict[int, float]) -> Comparison | None:
    """(PPL_softmax - PPL_mode) / PPL_softmax * 100: positive when the mode is better."""
    return combine([softmax, mode], lambda s, m: (s - m) / s * 100.0)


def point_difference(reference: dict[int, float], other: dict[int, float]) -> Comparison | None:
    """(accuracy_other - accuracy_reference) in percentage points (accuracies in [0, 1])."""
    return combine([reference, other], lambda r, o: (o - r) * 100.0)


@dataclass
class Verdict:
    agrees: bool | None   # None: not measured
    supported: bool       # tested over >= 3 seeds and the test backs the claim
    text: str


def _noise(c: Comparison, unit: str) -> tuple[str, str]:
    """(kind, text) with kind one of 'untested', 'few', 'noise', 'significant', 'not significant'."""
    if c.n == 0:
        return "untested", "no shared seeds: from the means, untested"
    p = c.p_value()
    if c.n >= 2 and abs(c.mean) < c.std:
        ptext = f"; {_fmt_p(p)}" if p is not None else ""
        return "noise", (f"within noise: the mean difference ({c.mean:+.2f} {unit}) is smaller than its std over "
                         f"{c.n} seeds ({c.std:.2f} {unit}){ptext}")
    if p is None:
        return "few", f"too few seeds to test: {c.n} paired"
    word = "significant" if p < ALPHA else "not significant"
    return word, f"{word}: {_fmt_p(p)}, paired t-test over {c.n} seeds"


def _fmt_p(p: float) -> str:
    return "p < 0.0001" if p < 1e-4 else f"p = {p:.2g}"


def verdict(c: Comparison | None, expect: str, unit: str = "%") -> Verdict:
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
            f"paired t-test over ≥ 3 seeds")


# ------------------------------------------------------------------------------------------------ curve fit

@dataclass
class Fit:
    """PPL(T) = a * exp(-b * T) + c; params/errors None when not fitted (see message)."""

    params: tuple | None   # (a, b, c)
    errors: tuple | None   # sqrt(diag(pcov)) of (a, b, c); inf when undetermined
    rms: float | None      # root mean square residual
    n_T: int
    message: str = ""


def fit_exponential(T: Iterable[float], y: Iterable[float]) -> Fit:
    """Least-squares fit of y = a * exp(-b * T) + c over all points (several seeds per T allowed).

    Fitted as A * exp(-b * (T - T0)) + c with T0 the smallest T (better conditioned), then a = A * exp(b * T0)
    with its error propagated. Needs at least 4 distinct T; never raises on a failed fit.
    """
    from scipy.optimize import curve_fit

    T = np.asarray(list(T), dtype=float)
    y = np.asarray(list(y), dtype=float)
    distinct = np.unique(T)
    if distinct.size < 4:
        return Fit(None, None, None, int(distinct.size), f"not fitted: {distinct.size} T values, at least 4 needed")
    T0, span = distinct[0], distinct[-1] - distinct[0]
    first, last = y[T == distinct[0]].mean(), y[T == distinct[-1]].mean()
    drop = first - last
    c0 = max(last - 0.1 * drop, 0.0)
    A0 = first - c0
    b0 = math.log(11.0) / span if drop != 0 else 1.0 / span
    bounds = ([-np.inf, 1e-6, 0.0], [np.inf, 10.0, np.inf])
    p0 = [A0, float(np.clip(b0, 1e-5, 9.0)), c0]

    def model(t, A, b, c):
        return A * np.exp(-b * (t - T0)) + c

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            (A, b, c), pcov = curve_fit(model, T, y, p0=p0, bounds=bounds, maxfev=20000)
    except (RuntimeError, ValueError) as e:
        return Fit(None, None, None, int(distinct.size), f"fit failed: {e}")
    e0 = math.exp(b * T0)
    jac = np.array([[e0, A * T0 * e0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    with np.errstate(all="ignore"):
        cov = jac @ pcov @ jac.T if np.all(np.isfinite(pcov)) else np.full((3, 3), np.inf)
    errors = tuple(float(math.sqrt(v)) if math.isfinite(v) and v >= 0 else math.inf for v in np.diag(cov))
    rms = float(np.sqrt(np.mean((model(T, A, b, c) - y) ** 2)))
    message = "" if all(math.isfinite(e) for e in errors) else "uncertainty undetermined"
    return Fit((float(A * e0), float(b), float(c)), errors, rms, int(distinct.size), message)


# ------------------------------------------------------------------------------------------- coupling stats

def distance_profile(J: np.ndarray) -> np.ndarray:
    """Mean J_jk over the pairs with |j - k| = d, for d = 1 .. T-1."""
    T = J.shape[0]
    d = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    return np.array([J[d == k].mean() for k in range(1, T)])


def distance_r2(J: np.ndarray) -> float:
    """Share of the variance of the off-diagonal J explained by the distance |j - k| alone."""
    T = J.shape[0]
    d = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    off = d > 0
    total = float(((J[off] - J[off].mean()) ** 2).sum())
    if total <= 1e-30:
        return math.nan
    fitted = distance_profile(J)[d[off] - 1]
    return 1.0 - float(((J[off] - fitted) ** 2).sum()) / total


def seed_correlation(Js: list[np.ndarray]) -> float:
    """Mean Pearson correlation of the off-diagonal J between every pair of seeds (nan for < 2 seeds)."""
    if len(Js) < 2:
        return math.nan
    off = ~np.eye(Js[0].shape[0], dtype=bool)
    flat = [J[off] for J in Js]
    corrs = [np.corrcoef(a, b)[0, 1] for i, a in enumerate(flat) for b in flat[i + 1:]
             if a.std() > 0 and b.std() > 0]
    return float(np.mean(corrs)) if corrs else math.nan


# ------------------------------------------------------------------------------------------------ formatting

def _label(mode: str, method: str) -> str:
    return mode if method == "exact" else f"{mode} [{method}]"


def fmt_stat(s: Stat | None, digits: int = 3, scale: float = 1.0, show_n: bool = True) -> str:
    if s is None:
        return ""
    text = f"{s.mean * scale:.{digits}f}"
    if s.n > 1:
        text += f" ± {s.std * scale:.{digits}f}"
    return text + (f" (n={s.n})" if show_n else "")


def fmt_comparison(c: Comparison | None, digits: int = 2, expected_n: int | None = None) -> str:
    if c is None:
        return ""
    text = f"{c.mean:+.{digits}f}"
    if c.n > 1:
        text += f" ± {c.std:.{digits}f}"
    if c.n == 0:
        text += " †"
    elif expected_n is not None and c.n < expected_n:
        text += f" ({c.n} paired)"
    return text


def _fmt_num(v: float | None, digits: int = 2, signed: bool = False) -> str:
    if v is None or not math.isfinite(v):
        return ""
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def _fmt_pm(v: float, e: float) -> str:
    err = f"{e:.3g}" if math.isfinite(e) else "?"
    return f"{v:.4g} ± {err}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)])


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{int(minutes)} min {int(seconds % 60):02d} s"
    return f"{int(minutes // 60)} h {int(minutes % 60):02d} min"


def _counted(counter: Counter) -> str:
    if len(counter) == 1:
        return str(next(iter(counter)))
    return ", ".join(f"{v} ({n} runs)" for v, n in counter.most_common())


# --------------------------------------------------------------------------------------------------- header

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
        f"variants: {', '.join(f'{v} ({per_variant[v]})' for v in sorted(per_variant, key=_variant_rank))}",
        f"- Seeds: {', '.join(map(str, seeds))}",
        f"- Total training wall time: {_duration(sum(r.wall_time_s for r in runs))} (sum over runs)",
        f"- Machines: {_counted(machines)}",
        f"- torch: {_counted(info['torch'])}; Python: {_counted(info['python'])}; commits: {_counted(info['commit'])}",
        f"- Training: steps {_counted(cfg['steps'])}; batch size {_counted(cfg['batch_size'])}; "
        f"learning rate {_counted(cfg['lr'])}",
    ]
    lines += [f"- Variant `{v}`: {text}" for v, text in _variant_settings(runs).items()]
    if resumed:
        lines.append(f"- {resumed} runs resumed from a checkpoint; their wall time counts only the part after resuming")
    if res.duplicates:
        lines.append(f"- Ignored duplicates: {', '.join(res.duplicates)}")
    return lines + [""]


def _variant_settings(runs: list[Run]) -> dict[str, str]:
    """Per variant, the config fields that differ from TrainConfig's defaults (besides the grid axes)."""
    defaults = {f.name: (f.default if f.default is not MISSING else f.default_factory()) for f in fields(TrainConfig)}
    axes = {"task", "T", "mode", "method", "seed"}
    by_variant: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in runs:
        for k, v in r.config.items():
            if k not in axes and (k not in defaults or v != defaults[k]):
                by_variant[r.variant][k][json.dumps(v, sort_keys=True)] += 1
    totals = Counter(r.variant for r in runs)
    out = {}
    for v in sorted(totals, key=_variant_rank):
        items = by_variant.get(v, {})
        out[v] = ", ".join(f"{k}={_counted(c)}" + (f" in {sum(c.values())} of {totals[v]} runs"
                                                   if sum(c.values()) < totals[v] else "")
                           for k, c in sorted(items.items())) or "TrainConfig defaults"
    return out


# ---------------------------------------------------------------------------------------------------- tables

def _paper_shakespeare(mode: str, T: int) -> float | None:
    return PAPER_SHAKESPEARE_RELATIVE.get((mode, T))


def _paper_brackets(mode: str, T: int) -> float | None:
    return PAPER_BRACKETS_ACCURACY.get((mode, T))


def shakespeare_table(res: Results, variant: str, metric: str) -> str:
    """Rows T; per mode: perplexity, relative improvement over softmax (%), the paper's number."""
    return _mode_table(res, "shakespeare", variant, values=lambda g: g.values(metric),
                       fmt_value=lambda v: fmt_stat(stat(v.values())), compare=relative_improvement,
                       paper=PAPER_SHAKESPEARE_RELATIVE, labels=("PPL", "Δ%", "Δ%"), paper_signed=True)


def brackets_table(res: Results, variant: str, split: str) -> str:
    """Rows T; per mode: accuracy (%), difference to softmax (points), the paper's accuracy."""
    return _mode_table(res, "brackets", variant, values=lambda g: g.values("accuracy", split),
                       fmt_value=lambda v: fmt_stat(stat(v.values()), digits=2, scale=100.0),
                       compare=point_difference, paper=PAPER_BRACKETS_ACCURACY, labels=("acc %", "Δ pts", "%"),
                       paper_signed=False)


def _mode_table(res: Results, task: str, variant: str, *, values, fmt_value, compare, paper: dict,
                labels: tuple[str, str, str], paper_signed: bool) -> str:
    """Rows T; per (mode, method): the metric, its comparison with softmax, the paper's number if any.

    values(group) -> {seed: value}; compare(baseline values, values) -> Comparison; labels name the metric,
    comparison and paper columns. Paper columns appear for the base variant only.
    """
    cols = res.columns(task, variant)

    def has_paper(mode: str) -> bool:
        return variant == "base" and any(k[0] == mode for k in paper)

    value_label, compare_label, paper_label = labels
    header = ["T"]
    for mode, method in cols:
        lab = _label(mode, method)
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
                row.append(_fmt_num(paper.get((mode, T)), signed=paper_signed))
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
                cells = [_fmt_pm(p, e) for p, e in zip(fit.params, fit.errors)] + [f"{fit.rms:.3g}"]
            rows.append([variant, _label(mode, method), str(fit.n_T), *cells, fit.message or "ok"])
    header = ["variant", "mode", "T values", "a", "b", "c", "RMS residual", "note"]
    return md_table(header, rows), fits


def coupling_table(res: Results, task: str) -> tuple[str, dict]:
    """Per T: seeds, mean |J|, share of variance explained by distance, seed-to-seed correlation."""
    sets = coupling_sets(res, task)
    rows, stats = [], {}
    for T, (g, Js) in sets.items():
        corr = seed_correlation(Js)
        r2 = float(np.nanmean([distance_r2(J) for J in Js])) if Js else math.nan
        stats[T] = (len(Js), corr, r2)
        rows.append([str(T), _label(g.mode, g.method), str(len(Js)), f"{np.mean([np.abs(J).mean() for J in Js]):.3f}",
                     _fmt_num(r2), _fmt_num(corr)])
    header = ["T", "mode", "seeds", "mean abs(J)", "R² of J by distance", "correlation between seeds"]
    return md_table(header, rows), stats


def coupling_sets(res: Results, task: str) -> dict[int, tuple[Group, list[np.ndarray]]]:
    """The h+J runs' J (head 0) per T, from variant base if it has any, preferring exact enumeration."""
    variants = [v for v in res.variants(task)
                if any(k[:2] == (task, v) and k[3] == "h+J" for k in res.groups)]
    if not variants:
        return {}
    variant = variants[0]
    out = {}
    for T in res.Ts(task, variant):
        g = res.pick(task, variant, T, "h+J")
        Js = list(g.couplings().values()) if g else []
        if Js:
            out[T] = (g, Js)
    return out


# ----------------------------------------------------------------------------------------------------- plots

def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)


def _finish(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> None:
    """Labels, title and legend of a one-panel plot, then save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7)
    _save(fig, path)


def _style(mode: str, method: str) -> dict:
    return {"color": MODE_COLORS.get(mode, "tab:gray"), "linestyle": "-" if method == "exact" else "--"}


TASK_PLOTS = {
    "shakespeare": {"metric": "ppl", "split": "val", "scale": 1.0, "ylabel": "validation perplexity",
                    "diff": relative_improvement, "dlabel": "improvement over softmax (%)"},
    "brackets": {"metric": "accuracy", "split": "test", "scale": 100.0, "ylabel": "test accuracy (%)",
                 "diff": point_difference, "dlabel": "difference to softmax (points)"},
}


def plot_metric(res: Results, task: str, variant: str, path: Path) -> None:
    """Left: the metric against T per mode (mean ± std over seeds); right: the difference to softmax."""
    spec = TASK_PLOTS[task]
    cols, Ts = res.columns(task, variant), res.Ts(task, variant)
    fig = _figure(8.5, 3.2)
    ax, dax = fig.subplots(1, 2)
    for i, (mode, method) in enumerate(cols):
        jitter = (i - (len(cols) - 1) / 2) * 0.05
        points, diffs = [], []
        for T in Ts:
            g = res.get(task, variant, T, mode, method)
            vals = g.values(spec["metric"], spec["split"]) if g else {}
            s = stat(vals.values())
            if s is not None:
                points.append((T + jitter, s.mean * spec["scale"], np.nan_to_num(s.std) * spec["scale"]))
            base = res.baseline(task, variant, T, method)
            c = spec["diff"](base.values(spec["metric"], spec["split"]) if base else {}, vals)
            if c is not None and mode != BASELINE:
                diffs.append((T + jitter, c.mean, np.nan_to_num(c.std)))
        style = _style(mode, method)
        for axis, data in ((ax, points), (dax, diffs)):
            if data:
                x, y, e = np.array(data).T
                axis.errorbar(x, y, yerr=e, marker="o", ms=3, capsize=2, lw=1, label=_label(mode, method), **style)
        if variant == "base":
            _plot_paper(ax if task == "brackets" else dax, task, mode, style["color"])
    dax.axhline(0, color="0.6", lw=0.8)
    for axis, ylabel in ((ax, spec["ylabel"]), (dax, spec["dlabel"])):
        axis.set_xlabel("T")
        axis.set_ylabel(ylabel)
        axis.tick_params(labelsize=8)
    ax.legend(fontsize=7)
    fig.suptitle(f"{task}, variant {variant} (open markers: paper)", fontsize=9)
    _save(fig, path)


def _plot_paper(axis, task: str, mode: str, color: str) -> None:
    paper = PAPER_SHAKESPEARE_RELATIVE if task == "shakespeare" else PAPER_BRACKETS_ACCURACY
    pts = sorted((T, v) for (m, T), v in paper.items() if m == mode)
    if pts:
        x, y = np.array(pts).T
        axis.plot(x, y, linestyle="none", marker="o", ms=6, mfc="none", color=color)


def plot_fits(res: Results, variant: str, fits: dict, path: Path) -> None:
    fig = _figure(4.5, 3.2)
    ax = fig.subplots()
    for mode, method in res.columns("shakespeare", variant):
        pts = []
        for T in res.Ts("shakespeare", variant):
            g = res.get("shakespeare", variant, T, mode, method)
            s = stat((g.values("ppl") if g else {}).values())
            if s is not None:
                pts.append((T, s.mean, np.nan_to_num(s.std)))
        if not pts:
            continue
        style = _style(mode, method)
        x, y, e = np.array(pts).T
        ax.errorbar(x, y, yerr=e, marker="o", ms=3, capsize=2, linestyle="none", color=style["color"],
                    label=_label(mode, method))
        fit = fits.get((variant, mode, method))
        if fit is not None and fit.params is not None:
            a, b, c = fit.params
            t = np.linspace(x.min(), x.max(), 100)
            ax.plot(t, a * np.exp(-b * t) + c, lw=1, **style)
    _finish(fig, ax, "T", "validation perplexity", f"shakespeare, {variant}: fit a·exp(-bT)+c", path)


def plot_couplings(sets: dict, task: str, path: Path) -> None:
    """A row of heatmaps (one per T) of the seed-mean J, diverging colours centred at 0."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure(2.3 * len(sets) + 0.3, 2.6)
    axes = np.atleast_1d(fig.subplots(1, len(sets)))
    for axis, (T, (_, Js)) in zip(axes, sets.items()):
        J = np.mean(Js, axis=0)
        vmax = float(np.abs(J).max()) or 1.0
        im = axis.imshow(J, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        axis.set_title(f"T={T} ({len(Js)} seeds)", fontsize=8)
        axis.set_xlabel("k", fontsize=8)
        axis.set_ylabel("j", fontsize=8)
        axis.tick_params(labelsize=6)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
        cbar = fig.colorbar(im, ax=axis, fraction=0.046, pad=0.04)
        cbar.ax.tick_params(labelsize=6)
    fig.suptitle(f"{task}: learned J (h+J, head 0, mean over seeds)", fontsize=9)
    _save(fig, path)


def plot_distance(sets: dict, task: str, path: Path) -> None:
    """Mean J_jk against |j - k| per T, mean over seeds with ± std band."""
    import matplotlib

    fig = _figure(4.5, 3.2)
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"]
    for i, (T, (_, Js)) in enumerate(sets.items()):
        profiles = np.array([distance_profile(J) for J in Js])
        d = np.arange(1, T)
        mean = profiles.mean(axis=0)
        color = cmap(i / max(1, len(sets) - 1))
        ax.plot(d, mean, marker="o", ms=3, lw=1, color=color, label=f"T={T}")
        if len(Js) > 1:
            std = profiles.std(axis=0, ddof=1)
            ax.fill_between(d, mean - std, mean + std, color=color, alpha=0.2, lw=0)
    ax.axhline(0, color="0.6", lw=0.8)
    _finish(fig, ax, "|j - k|", "mean J_jk", f"{task}: J against distance (band: ± std over seeds)", path)


# ------------------------------------------------------------------------------------------ task sections

def shakespeare_section(res: Results, out: Path) -> list[str]:
    lines = ["## Tiny Shakespeare (character level)", "",
             "PPL: validation perplexity, mean ± std over seeds (n seeds). Δ%: (PPL_softmax - PPL_mode) / "
             "PPL_softmax × 100, positive = better than softmax; per seed where softmax has the same seed, "
             "mean ± std over those seeds († from the means when no seed is shared). Paper Δ%: the paper's "
             "relative improvement (it does not say whether over all positions or the last one).", ""]
    lines += _variant_tables(res, out, "shakespeare", shakespeare_table, "perplexity",
                             (("ppl", "Shakespeare: perplexity, all positions"),
                              ("ppl_last", "Shakespeare: perplexity, last position only")))
    table, fits = fit_table(res)
    lines += ["### Perplexity against T: fit PPL(T) = a·exp(-b·T) + c", "",
              "Least squares over all seeds' perplexities (all positions); ± is sqrt(diag(pcov)).", "", table, ""]
    for variant in res.variants("shakespeare"):
        if any(f.params is not None for (v, *_), f in fits.items() if v == variant):
            png = f"fit_shakespeare_{variant}.png"
            plot_fits(res, variant, fits, out / png)
            lines += [f"![shakespeare {variant}: fits]({png})", ""]
    return lines


def brackets_section(res: Results, out: Path) -> list[str]:
    lines = ["## Bracket matching", "",
             "Accuracy of the position head over closing brackets (percent), mean ± std over seeds (n seeds); the test "
             "split is the headline. Δ pts: accuracy minus softmax's, per seed where softmax has the same seed († "
             "from the means). Paper %: the paper's accuracy (full model).", ""]
    return lines + _variant_tables(res, out, "brackets", brackets_table, "accuracy",
                                   (("test", "Brackets: test accuracy"), ("val", "Brackets: validation accuracy")))


def _variant_tables(res: Results, out: Path, task: str, table: Callable, noun: str, kinds) -> list[str]:
    """Per variant: one table per (key, title) of ``kinds`` and the metric-against-T plot."""
    lines = []
    for variant in res.variants(task):
        for key, title in kinds:
            lines += [f"### {title} (variant `{variant}`)", "", table(res, variant, key), ""]
        png = f"metric_{task}_{variant}.png"
        plot_metric(res, task, variant, out / png)
        lines += [f"![{task} {variant}: {noun} against T]({png})", ""]
    return lines


def couplings_section(res: Results, out: Path) -> list[str]:
    lines = []
    for task in res.tasks():
        sets = coupling_sets(res, task)
        if not sets:
            continue
        g = next(iter(sets.values()))[0]
        table, _ = coupling_table(res, task)
        heat, dist = f"couplings_{task}.png", f"coupling_distance_{task}.png"
        plot_couplings(sets, task, out / heat)
        plot_distance(sets, task, out / dist)
        lines += [f"### {task} (variant `{g.variant}`)", "", table, "",
                  f"![{task}: learned J]({heat})", "", f"![{task}: J against distance]({dist})", ""]
    if not lines:
        return []
    return ["## Learned couplings J (h+J, head 0)", "",
            "R² of J by distance: share of the variance of the off-diagonal J explained by |j - k| alone "
            "(per seed, averaged). Correlation between seeds: mean Pearson correlation of the off-diagonal J "
            "over pairs of seeds.", "", *lines]


# -------------------------------------------------------------------------------------------- the paper's claims

@dataclass
class Claim:
    title: str
    paper: str
    summary: str
    lines: list


def _claim_table(rows: list[list[str]], first: str = "T") -> str:
    return md_table([first, "paper", "measured", "verdict"], rows)


def _rel(res: Results, T: int, mode: str, metric: str = "ppl") -> Comparison | None:
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
        paper = _paper_shakespeare("h+J", T)
        rows.append([str(T), _fmt_num(paper, signed=True) + " %" if paper is not None else "",
                     fmt_comparison(c) + " %" if c else "", v.text])
    return Claim("h+J ahead of softmax on Shakespeare (level at T=4, ahead from T=6)",
                 "h+J level with softmax at T=4 (-0.02 %), then ahead: +0.43 % (T=6) … +1.04 % (T=14)",
                 summarize(verdicts), [_claim_table(rows)])


def claim_hj_grows(res: Results) -> Claim:
    from scipy.stats import linregress

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
    paper_slope = linregress(*np.array(paper_pts).T).slope
    paper = f"the improvement grows with T (slope of the paper's six numbers: {paper_slope:+.3f} % per unit T)"
    title = "h+J's advantage grows with T (Shakespeare, T ≤ 14)"
    if len(set(Ts)) < 2:
        return Claim(title, paper, "not measured", ["Fewer than two T values with both h+J and softmax."])
    fit = linregress(Ts, ys)
    measured = f"slope {fit.slope:+.3f} ± {fit.stderr:.3f} % per unit T over T = {', '.join(map(str, sorted(set(Ts))))}"
    word = "agrees" if fit.slope > 0 else "does not agree"
    if not enough:
        text = f"{word} (too few seeds to test: fewer than 3 paired seeds at some T)"
    elif abs(fit.slope) < fit.stderr:
        text = f"{word} in sign only (within noise: the slope is smaller than its standard error; {_fmt_p(fit.pvalue)})"
    elif fit.pvalue < ALPHA:
        text = f"{word} (significant: {_fmt_p(fit.pvalue)}, linear regression over seeds)"
    else:
        text = f"{word} in sign only (not significant: {_fmt_p(fit.pvalue)}, linear regression over seeds)"
    return Claim(title, paper, text, [f"Measured: {measured}. Verdict: {text}."])


def claim_h_behind(res: Results) -> Claim:
    rows, verdicts = [], []
    for T in _paper_range(res, 8):
        c = _rel(res, T, "h")
        v = verdict(c, "less")
        verdicts.append(v)
        paper = _paper_shakespeare("h", T)
        rows.append([str(T), _fmt_num(paper, signed=True) + " %" if paper is not None else "(behind)",
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
            if _paper_shakespeare("J", T) is not None:
                rows.append([str(T), f"{_paper_shakespeare('J', T):+.2f} %", "", "not measured"])
                verdicts.append(Verdict(None, False, "not measured"))
            continue
        worst = max(others, key=lambda g: np.mean(list(g.values("ppl").values())))
        c = combine([worst.values("ppl"), J.values("ppl")], lambda o, j: (j - o) / o * 100.0)
        v = verdict(c, "greater")
        verdicts.append(v)
        paper = _paper_shakespeare("J", T)
        rows.append([str(T), f"{paper:+.2f} % vs softmax" if paper is not None else "(worst)",
                     f"J's PPL above the next worst ({worst.mode}) by {fmt_comparison(c)} %", v.text])
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
        p_hi, p_lo = _paper_brackets(hi, T), _paper_brackets(lo, T)
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
            if n < 2 or not math.isfinite(corr):
                v = Verdict(None, False, "not measured (fewer than 2 seeds)")
            else:
                stable = corr >= STABLE_CORRELATION
                v = Verdict(stable, False, f"{'agrees' if stable else 'does not agree'} (correlation "
                            f"{'≥' if stable else '<'} {STABLE_CORRELATION}, a threshold chosen here)")
            verdicts.append(v)
            rows.append([f"{task} T={T}", "stable, distance-dependent",
                         f"correlation between seeds {_fmt_num(corr)}, R² by distance {_fmt_num(r2)}", v.text])
    return Claim("The learned J has a distance-dependent structure stable across seeds",
                 "distance-dependent J, stable across seeds (no numbers)", summarize(verdicts),
                 [_claim_table(rows, first="runs")] if rows else ["No h+J runs with couplings."])


def agreement_section(res: Results) -> list[str]:
    claims = [claim_hj_ahead(res), claim_hj_grows(res), claim_h_behind(res), claim_j_worst(res),
              claim_brackets_order(res), claim_noffn_gap(res), claim_three_body(res), claim_j_structure(res)]
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
        paper = _paper_shakespeare("h+J", T)
        rows.append([str(T), g.method if g else "", fmt_comparison(c) + " %" if c else "not measured",
                     str(c.n) if c else "", _fmt_num(paper, signed=True)])
    lines = ["## Extension past the paper", "",
             f"Shakespeare windows beyond the paper's largest (T = {PAPER_MAX_T}); variant `base`.", "",
             md_table(["T", "h+J method", "h+J Δ% vs softmax", "paired seeds", "paper Δ%"], rows), ""]
    return lines + [_growth_statement(measured, beyond), ""]


def _show(values: dict, scale: float) -> str:
    return fmt_stat(stat(values.values()), scale=scale)


def _paired(c: Comparison | None, unit: str) -> str:
    return fmt_comparison(c) + unit if c else ""


def sampler_section(res: Results) -> list[str]:
    """Models trained through a sampler (DQA, PT, Gibbs, ...) against the same grid point trained exactly,
    and, where the runs were also evaluated with exact marginals, how the gap splits into training and
    evaluation."""
    rows, split_rows = [], []
    for (task, variant, T, mode, method), g in sorted(res.groups.items(), key=lambda kv: (
            kv[0][0] != "shakespeare", kv[0][0], kv[0][1], kv[0][2], _mode_rank(kv[0][3]), kv[0][4])):
        exact = res.get(task, variant, T, mode, "exact")
        if method in ("exact", "reference") or exact is None or task not in TASK_PLOTS:
            continue
        spec = TASK_PLOTS[task]
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
                     _duration(statistics.mean(r.wall_time_s for r in g.runs.values()))])
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


def _growth_statement(measured: dict[int, Comparison], beyond: list[int]) -> str:
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


# ---------------------------------------------------------------------------------------------------- report

def write_report(results_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir/README.md``, its PNGs and ``runs.jsonl.gz`` (the data behind them, small enough to
    commit) from ``results_dir/runs/*.json`` or an archive; returns the README's path."""
    results_dir, out = Path(results_dir), Path(out_dir)
    runs = load_runs(results_dir)
    res = Results(runs)
    out.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(out / ARCHIVE, "wb", mtime=0) as f:  # after loading: the source may be this file
        f.write("".join(json.dumps(r.raw, separators=(",", ":")) + "\n" for r in runs).encode())
    lines = header_section(res, results_dir)
    lines += sampler_section(res)
    if "shakespeare" in res.tasks():
        lines += shakespeare_section(res, out)
    if "brackets" in res.tasks():
        lines += brackets_section(res, out)
    lines += couplings_section(res, out)
    if any(r.variant == "base" for r in runs):  # the paper's claims are checked on the base variant only
        lines += agreement_section(res)
        lines += extension_section(res)
    path = out / "README.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
