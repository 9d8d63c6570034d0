"""Small PNG plots, shared by every report.

matplotlib is imported inside the functions (never when the CLI starts), and figures are drawn on their own
Agg canvas, so nothing depends on pyplot's global state or on a display.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from .results import BASELINE, Results
from .stats import distance_profile, stat
from .tables import label, plural

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


def save(fig, path: Path):
    """Lay out and write the PNG; returns the figure (the tests look at it)."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return fig


def wrap(text: str, width_inches: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``width_inches`` at ``fontsize`` (a title is never clipped)."""
    chars = max(10, int(width_inches * 72 / (0.55 * fontsize)))
    return textwrap.fill(text, chars)


def title(ax, text: str, fontsize: float = 9) -> None:
    """A panel title wrapped to the panel's share of the figure's width."""
    columns = ax.get_subplotspec().get_gridspec().ncols if ax.get_subplotspec() else 1
    ax.set_title(wrap(text, 0.95 * ax.figure.get_figwidth() / columns, fontsize), fontsize=fontsize)


def suptitle(fig, text: str, fontsize: float = 9) -> None:
    """A figure title wrapped to the figure's width."""
    fig.suptitle(wrap(text, fig.get_figwidth(), fontsize), fontsize=fontsize)


def legend(ax, fontsize: float = 7, **kwargs) -> None:
    """A legend for every panel that has labelled artists (and none, without a warning, for one that has not)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, **kwargs)


def window_axis(ax, Ts) -> None:
    """An x-axis of context lengths T: a tick at each measured T, padded so that points offset around a single T
    stay on an axis labelled by T itself, never by the offsets."""
    Ts = sorted(set(Ts))
    if not Ts:
        return
    pad = max(1.0, 0.05 * (Ts[-1] - Ts[0]))
    ax.set_xlim(Ts[0] - pad, Ts[-1] + pad)
    ax.set_xticks(Ts)


def log_x_axis(ax) -> None:
    """A log x-axis labelled at 1-2-5 steps in plain numbers, once the data are drawn (matplotlib's default
    labels only the decades, or, over a short range, also its minor ticks, which then overlap)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ticks = [m * 10.0 ** e for e in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
             for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
    if len(ticks) < 2:
        return  # a range too short for two of them: matplotlib's own labels
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def finish(fig, ax, xlabel: str, ylabel: str, text: str, path: Path):
    """Labels, title and legend of a one-panel plot, then save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    title(ax, text)
    ax.tick_params(labelsize=8)
    legend(ax)
    return save(fig, path)


def style(mode: str, method: str) -> dict:
    """A mode's colour; dashed for a method other than exact enumeration."""
    return {"color": MODE_COLORS.get(mode, "tab:gray"), "linestyle": "-" if method == "exact" else "--"}


def plot_metric(res: Results, task: str, variant: str, spec: dict, path: Path, paper: dict | None = None):
    """Left: the metric against T per mode (mean ± std over seeds); right: the difference to softmax.

    ``spec`` names the metric (see :data:`..report.TASK_METRICS`); ``paper`` ({(mode, T): value}) adds open
    markers on the panel that ``spec["paper_on"]`` names.
    """
    cols, Ts = res.columns(task, variant), res.Ts(task, variant)
    fig = figure(8.5, 3.2)
    ax, dax = fig.subplots(1, 2)
    paper_Ts: set[int] = set()  # the windows of the paper's numbers shown
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
            paper_Ts |= _plot_paper(ax if spec["paper_on"] == "metric" else dax, paper, mode, st["color"])
    dax.axhline(0, color="0.6", lw=0.8)
    paper_axis = ax if spec["paper_on"] == "metric" else dax
    for axis, ylabel in ((ax, spec["ylabel"]), (dax, spec["dlabel"])):
        axis.set_xlabel("T")
        axis.set_ylabel(ylabel)
        axis.tick_params(labelsize=8)
        window_axis(axis, set(Ts) | (paper_Ts if axis is paper_axis else set()))
    if paper_Ts:  # one legend entry for the paper's open markers, on the panel that has them
        paper_axis.plot([], [], linestyle="none", marker="o", ms=6, mfc="none", color="0.4", label="paper")
    legend(ax)
    legend(dax)
    suptitle(fig, f"{task}, variant {variant}" + (" (open markers: paper)" if paper_Ts else ""))
    return save(fig, path)


def _plot_paper(axis, paper: dict, mode: str, color: str) -> set[int]:
    """The paper's numbers of a mode as open markers; returns their context lengths T."""
    pts = sorted((T, v) for (m, T), v in paper.items() if m == mode)
    if pts:
        x, y = np.array(pts).T
        axis.plot(x, y, linestyle="none", marker="o", ms=6, mfc="none", color=color)
    return {T for T, _ in pts}


def plot_fits(res: Results, variant: str, fits: dict, path: Path):
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
    window_axis(ax, res.Ts("shakespeare", variant))
    return finish(fig, ax, "T", "validation perplexity", f"shakespeare, {variant}: fit a·exp(-bT)+c", path)


def plot_couplings(sets: dict, task: str, path: Path):
    """A row of heatmaps (one per T) of the seed-mean J, diverging colours centred at 0."""
    from matplotlib.ticker import MaxNLocator

    fig = figure(2.3 * len(sets) + 0.3, 2.6)
    axes = np.atleast_1d(fig.subplots(1, len(sets)))
    for axis, (T, (_, Js)) in zip(axes, sets.items()):
        J = np.mean(Js, axis=0)
        vmax = float(np.abs(J).max()) or 1.0
        im = axis.imshow(J, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        title(axis, f"T={T} ({plural(len(Js), 'seed')})", fontsize=8)
        axis.set_xlabel("k", fontsize=8)
        axis.set_ylabel("j", fontsize=8)
        axis.tick_params(labelsize=6)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
        cbar = fig.colorbar(im, ax=axis, fraction=0.046, pad=0.04)
        cbar.ax.tick_params(labelsize=6)
        cbar.set_label("J_jk", fontsize=7)
    mode = next(iter(sets.values()))[0].mode
    suptitle(fig, f"{task}: learned J ({mode}, head 0, mean over seeds)")
    return save(fig, path)


def plot_distance(sets: dict, task: str, path: Path):
    """Mean J_jk against |j - k| per T, mean over seeds with ± std band."""
    import matplotlib
    from matplotlib.ticker import MaxNLocator

    fig = figure(4.5, 3.2)
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"]
    for i, (T, (_, Js)) in enumerate(sets.items()):
        profiles = np.array([distance_profile(J) for J in Js])
        d = np.arange(1, profiles.shape[1] + 1)  # J's own size: (T, T), or (W, W) by slot for the window
        mean = profiles.mean(axis=0)
        color = cmap(i / max(1, len(sets) - 1))
        ax.plot(d, mean, marker="o", ms=3, lw=1, color=color, label=f"T={T}")
        if len(Js) > 1:
            std = profiles.std(axis=0, ddof=1)
            ax.fill_between(d, mean - std, mean + std, color=color, alpha=0.2, lw=0)
    ax.axhline(0, color="0.6", lw=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    mode = next(iter(sets.values()))[0].mode
    name = task if mode == "h+J" else f"{task}, {mode}"  # h+J's plots are the reports' default
    return finish(fig, ax, "|j - k|", "mean J_jk", f"{name}: J against distance (band: ± std over seeds)", path)
