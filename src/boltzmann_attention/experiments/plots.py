"""Small PNG plots, shared by every report.

matplotlib is imported inside the functions (never when the CLI starts), and figures are drawn on their own
Agg canvas, so nothing depends on pyplot's global state or on a display.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .results import BASELINE, Results
from .stats import distance_profile, stat
from .tables import label

DPI = 100
MODE_COLORS = {"softmax": "black", "h+J": "tab:blue", "h": "tab:orange", "J": "tab:green", "h+K": "tab:red",
               "h+J+K": "tab:purple"}


def figure(width: float, height: float):
    """A matplotlib Figure of width x height inches on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)


def finish(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> None:
    """Labels, title and legend of a one-panel plot, then save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7)
    save(fig, path)


def style(mode: str, method: str) -> dict:
    """A mode's colour; dashed for a method other than exact enumeration."""
    return {"color": MODE_COLORS.get(mode, "tab:gray"), "linestyle": "-" if method == "exact" else "--"}


def plot_metric(res: Results, task: str, variant: str, spec: dict, path: Path, paper: dict | None = None) -> None:
    """Left: the metric against T per mode (mean ± std over seeds); right: the difference to softmax.

    ``spec`` names the metric (see :data:`..report.TASK_METRICS`); ``paper`` ({(mode, T): value}) adds open
    markers on the panel that ``spec["paper_on"]`` names.
    """
    cols, Ts = res.columns(task, variant), res.Ts(task, variant)
    fig = figure(8.5, 3.2)
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
        st = style(mode, method)
        for axis, data in ((ax, points), (dax, diffs)):
            if data:
                x, y, e = np.array(data).T
                axis.errorbar(x, y, yerr=e, marker="o", ms=3, capsize=2, lw=1, label=label(mode, method), **st)
        if paper:
            _plot_paper(ax if spec["paper_on"] == "metric" else dax, paper, mode, st["color"])
    dax.axhline(0, color="0.6", lw=0.8)
    for axis, ylabel in ((ax, spec["ylabel"]), (dax, spec["dlabel"])):
        axis.set_xlabel("T")
        axis.set_ylabel(ylabel)
        axis.tick_params(labelsize=8)
    ax.legend(fontsize=7)
    fig.suptitle(f"{task}, variant {variant} (open markers: paper)", fontsize=9)
    save(fig, path)


def _plot_paper(axis, paper: dict, mode: str, color: str) -> None:
    pts = sorted((T, v) for (m, T), v in paper.items() if m == mode)
    if pts:
        x, y = np.array(pts).T
        axis.plot(x, y, linestyle="none", marker="o", ms=6, mfc="none", color=color)


def plot_fits(res: Results, variant: str, fits: dict, path: Path) -> None:
    """Shakespeare perplexity against T per mode with its fitted a·exp(-bT)+c."""
    fig = figure(4.5, 3.2)
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
        st = style(mode, method)
        x, y, e = np.array(pts).T
        ax.errorbar(x, y, yerr=e, marker="o", ms=3, capsize=2, linestyle="none", color=st["color"],
                    label=label(mode, method))
        fit = fits.get((variant, mode, method))
        if fit is not None and fit.params is not None:
            a, b, c = fit.params
            t = np.linspace(x.min(), x.max(), 100)
            ax.plot(t, a * np.exp(-b * t) + c, lw=1, **st)
    finish(fig, ax, "T", "validation perplexity", f"shakespeare, {variant}: fit a·exp(-bT)+c", path)


def plot_couplings(sets: dict, task: str, path: Path) -> None:
    """A row of heatmaps (one per T) of the seed-mean J, diverging colours centred at 0."""
    from matplotlib.ticker import MaxNLocator

    fig = figure(2.3 * len(sets) + 0.3, 2.6)
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
    save(fig, path)


def plot_distance(sets: dict, task: str, path: Path) -> None:
    """Mean J_jk against |j - k| per T, mean over seeds with ± std band."""
    import matplotlib

    fig = figure(4.5, 3.2)
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
    finish(fig, ax, "|j - k|", "mean J_jk", f"{task}: J against distance (band: ± std over seeds)", path)
