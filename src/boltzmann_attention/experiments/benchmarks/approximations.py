"""Approximate marginal methods measured against exact: their error and wall time on dense systems
(:func:`accuracy_rows`), and their forward time against the number of spins (:func:`scaling_rows`).

Errors are against the float64 brute-force reference on the same systems; a table's times are of one run.
"""

from __future__ import annotations

import time
from functools import partial

import torch

from ... import ising
from ..recipes import TRAINING_SAMPLER_OPTIONS
from .common import timed


def accuracy_rows(sizes=(12, 16), queries: int = 16, coupling_std: float = 0.3, seed: int = 0,
                  field_mean: float = 0.0, field_std: float = 1.0, methods: tuple[str, ...] | None = None,
                  threads: int = 2) -> list[dict]:
    """Marginal error against the float64 brute-force reference, and wall time, for every method (dense J).

    h ~ N(field_mean, field_std^2), J_jk ~ N(0, coupling_std^2) (symmetric, dense), float64, one call per
    row, ``threads`` threads; ``methods``: only these (default all). DQA is not a Boltzmann sampler: its
    'error' is the distance between its final-state marginals and the Boltzmann ones, not a sampling error;
    'target_beta=1.0' is DQA at the energy scale calibrated to approximate exp(-E) (ising.annealing).
    """
    torch.set_num_threads(threads)
    settings = [("exact", {}), ("meanfield", {}), ("tap", {})]
    settings += [("gibbs", {"num_samples": s, "warmup": 100, "seed": 0}) for s in (100, 1000, 10000)]
    settings += [("pt", {"num_samples": s, "warmup": 100, "seed": 0}) for s in (100, 1000)]
    settings += [("dqa", {"num_samples": 1000, "seed": 0}),
                 ("dqa", {"num_samples": 1000, "seed": 0, "anneal_time_ns": 1.0, "energy_scale": 0.25}),
                 ("dqa", {"num_samples": 1000, "seed": 0, "target_beta": 1.0}),
                 ("sqa", {"num_samples": 1024, "seed": 0})]
    settings = [(m, o) for m, o in settings if methods is None or m in methods]
    rows = []
    for n, h, J in accuracy_systems(sizes, queries, coupling_std, seed, field_mean, field_std):
        truth = ising.marginals(h, J, method="reference")  # float64 brute force
        for method, options in settings:
            start = time.perf_counter()
            with torch.no_grad():
                m = ising.marginals(h, J, method=method, **options)
            seconds = time.perf_counter() - start
            err = (m - truth).abs()
            shown = ", ".join(f"{k}={v}" for k, v in options.items() if k != "seed") or "defaults"
            rows.append({"n": n, "method": method, "options": shown, "seconds": seconds,
                         "max_error": float(err.max()), "mean_error": float(err.mean())})
    return rows


def accuracy_systems(sizes, queries: int, coupling_std: float, seed: int, field_mean: float, field_std: float):
    """The systems of :func:`accuracy_rows`: (n, h (queries, n), J (n, n) shared by the queries), float64."""
    g = torch.Generator().manual_seed(seed)
    for n in sizes:
        h = field_mean + field_std * torch.randn(queries, n, dtype=torch.float64, generator=g)
        W = torch.randn(n, n, dtype=torch.float64, generator=g) * coupling_std
        yield n, h, W.triu(1) + W.triu(1).T


def accuracy_table(rows: list[dict]) -> str:
    lines = ["| n | method | options | seconds | max abs error | mean abs error |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['n']} | {r['method']} | {r['options']} | {r['seconds']:.3f} | {r['max_error']:.2e} | "
              f"{r['mean_error']:.2e} |" for r in rows]
    return "\n".join(lines)


def scaling_rows(sizes=(16, 32, 64, 128, 256), queries: int = 64, coupling_std: float = 0.3,
                 bandwidth: int = 8, seed: int = 0, threads: int = 2, budget_s: float = 3.0) -> list[dict]:
    """Forward time of one marginals call for Q = ``queries`` systems of n spins, for the methods that scale: the
    median of 2 calls after a warm-up, and of more (up to 20) while ``budget_s`` seconds last.

    Couplings J_jk ~ N(0, (coupling_std / sqrt(bandwidth))^2) for 0 < |j - k| <= bandwidth, else 0, so every
    method (banded included) solves the same problem; h ~ N(0, 1); float32, no gradient, ``threads`` threads. Exact
    enumeration runs where it can (n <= 24) for comparison. Gibbs and PT sample as in the 'sampling'
    profile's training runs (``recipes.TRAINING_SAMPLER_OPTIONS``, which that study uses too), so the cost is what one
    training step pays per call; SQA (not trained here) runs 100 sweeps with 16 slices.
    """
    def sampling(options: dict) -> dict:  # forward only: the gradient option does not apply
        return {k: v for k, v in options.items() if k != "gradient"} | {"seed": 0}

    torch.set_num_threads(threads)
    settings = [("exact", {}), ("banded", {"bandwidth": bandwidth}), ("meanfield", {}), ("tap", {}),
                ("gibbs", sampling(TRAINING_SAMPLER_OPTIONS["gibbs"])),
                ("pt", sampling(TRAINING_SAMPLER_OPTIONS["pt"])),
                ("sqa", {"num_samples": 64, "sweeps": 100, "trotter_slices": 16, "seed": 0})]
    rows = []
    g = torch.Generator().manual_seed(seed)
    for n in sizes:
        h = torch.randn(queries, n, generator=g)
        W = torch.randn(n, n, generator=g) * (coupling_std / bandwidth ** 0.5)
        band = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() <= bandwidth
        J = (W.triu(1) + W.triu(1).T) * band
        for method, options in settings:
            if method == "exact" and n > 24:
                continue
            call = partial(ising.marginals, h, J, method=method, **options)
            with torch.no_grad():
                seconds = timed(call, min_runs=2, budget_s=budget_s)
            rows.append({"n": n, "method": method, "seconds": seconds})
    return rows


def scaling_table(rows: list[dict]) -> str:
    sizes = sorted({r["n"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["n"]): r["seconds"] for r in rows}
    lines = ["| method | " + " | ".join(f"n = {n}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{1e3 * cell[m, n]:.1f} ms" if (m, n) in cell else "" for n in sizes)
                     + " |")
    return "\n".join(lines)


def _short_options(options: str) -> str:
    """'num_samples=1000, warmup=100' -> '1000'; DQA's non-default anneal -> '1 ns'."""
    parts = dict(p.split("=", 1) for p in options.split(", ") if "=" in p)
    if "target_beta" in parts:
        return f"beta {float(parts['target_beta']):g}"
    if "anneal_time_ns" in parts:
        return f"{float(parts['anneal_time_ns']):g} ns"
    return parts.get("num_samples", "")


def log_axes(ax, xlabel: str, ylabel: str, title: str, legend_size: int = 6) -> None:
    """Log-log axes with labels, a small title and a legend."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=legend_size)


def plot_rows(accuracy: list[dict] | None, scaling: list[dict] | None, path: str) -> None:
    """Left: marginal error against wall time (one marker per setting, per n); right: time against n."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [p for p in (accuracy, scaling) if p]
    fig = Figure(figsize=(4.2 * len(panels), 3.4), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    i = 0
    if accuracy:
        ax = axes[i]
        i += 1
        colors = {m: f"C{k}" for k, m in enumerate(dict.fromkeys(r["method"] for r in accuracy))}
        for n, marker in zip(sorted({r["n"] for r in accuracy}), "os^D"):
            for r in (r for r in accuracy if r["n"] == n):
                err = max(r["mean_error"], 1e-17)
                ax.scatter(r["seconds"], err, marker=marker, s=20, color=colors[r["method"]])
                short = _short_options(r["options"])
                if short:
                    ax.annotate(short, (r["seconds"], err), fontsize=6, xytext=(3, 2), textcoords="offset points")
        for m, color in colors.items():
            ax.scatter([], [], color=color, label=m, s=20)
        log_axes(ax, "wall time per call (s)", "mean |error| of the marginals",
                  "error against time (o: n=12, s: n=16)")
    if scaling:
        ax = axes[i]
        for m in dict.fromkeys(r["method"] for r in scaling):
            pts = sorted((r["n"], r["seconds"]) for r in scaling if r["method"] == m)
            ax.plot(*zip(*pts), marker="o", ms=3, label=m)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (spins)")
        ax.set_ylabel("forward time per call (s)")
        ax.legend(fontsize=7)
        ax.set_title("time against n (64 systems)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


