"""Benchmark: forward+backward time and peak memory of each marginal method inside attention.

Run ``boltzmann-attention-bench`` (or ``python -m boltzmann_attention.benchmark``). Every row runs in a
fresh process, so its peak memory (growth of the resident set during fwd+bwd, inputs excluded) is its
own. Ratios compare rows of the same run: the machine is shared and noisy, so only side-by-side
measurements are comparable. The table is stamped with machine, torch version and commit.

Baselines:
- ``naive``: enumeration as usually written: logits over all 2^T configurations for every query, a
  softmax, then a contraction with the spin table (causal prefixes get their own coupling energies).
- ``sdpa``: torch.nn.functional.scaled_dot_product_attention, the softmax attention it replaces.
- ``matmul``: a plain matmul of the split method's GEMM shape, (B*T, 2^(T/2)) @ (2^(T/2), 2^(T/2)).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial

import torch
import torch.nn.functional as F

from .attention import boltzmann_attention
from .ising.reference import configurations, negative_energies
from .provenance import machine_info

HEAD_DIM = 64

# Sampler settings of the training runs through samplers (the experiments' 'sampling' profile imports these):
# DQA at the paper's 200 Trotter steps and 5 ns (the defaults of ising.annealing) with its straight-through
# estimator; PT and Gibbs with few sweeps, since every training step samples afresh. Gibbs with nudged
# gradients is gradient-free in J.
TRAINING_SAMPLER_OPTIONS = {
    "dqa": {"num_samples": 100, "gradient": "ste"},
    "pt": {"num_samples": 64, "warmup": 16, "num_replicas": 4, "gradient": "covariance"},
    "gibbs": {"num_samples": 64, "warmup": 16, "gradient": "nudged"},
}


@dataclass
class Case:
    method: str  # exact | banded | meanfield | tap | naive | sdpa | matmul
    T: int
    B: int
    causal: bool = True
    bandwidth: int | None = None  # couplings J_jk = 0 for |j-k| > bandwidth


@dataclass
class Result:
    case: Case
    seconds: float  # median fwd+bwd time
    peak_mb: float  # resident-set growth during the timed runs
    gflops: float | None = None  # 'matmul': its rate; non-causal 'exact': its two GEMMs' FLOPs / forward time


def naive_enumeration_attention(q, k, v, J, causal: bool):
    """Reference-style enumeration (the baseline the split method is measured against).

    q, k: (B, 1, T, E); J: (T, T). For causal attention, query i sees keys 0..i; absent spins are
    made free (zero field and couplings) and their marginals zeroed, as in ``ising.reference``.
    """
    T = q.shape[-2]
    spins = configurations(T, dtype=q.dtype)                       # (2^T, T)
    h = q @ k.transpose(-1, -2) / HEAD_DIM**0.5                    # (B, 1, T, T)
    if causal:
        keep = torch.ones(T, T, dtype=torch.bool).tril()           # row i: keys present for query i
        h = h * keep
        coupling_energy = negative_energies(torch.zeros(T, T, dtype=q.dtype), J * keep[:, :, None]
                                            * keep[:, None, :], None, spins)  # (T, 2^T): one per prefix
    else:
        coupling_energy = negative_energies(torch.zeros(T, dtype=q.dtype), J, None, spins)
    p = torch.softmax(h @ spins.T + coupling_energy, dim=-1)       # (B, 1, T, 2^T)
    weights = (p @ spins + 1) / 2
    if causal:
        weights = weights * keep
    return weights @ v


def _inputs(case: Case):
    g = torch.Generator().manual_seed(0)
    shape = (case.B, 1, case.T, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_() for _ in range(3))
    distance = (torch.arange(case.T)[:, None] - torch.arange(case.T)[None, :]).abs()
    band = case.bandwidth if case.bandwidth is not None else case.T
    J = 0.1 * torch.randn(case.T, case.T, generator=g) * ((distance > 0) & (distance <= band))
    J = ((J + J.T) / 2).requires_grad_()
    return q, k, v, J


def _step_function(case: Case):
    """(fwd+bwd closure, forward-only closure or None, FLOPs of the forward's GEMMs or None)."""
    if case.method == "matmul":
        half = 2 ** (case.T // 2)
        a, b = torch.randn(case.B * case.T, half), torch.randn(half, half)
        return (lambda: a @ b), None, 2 * a.shape[0] * half * half
    q, k, v, J = _inputs(case)
    if case.method == "sdpa":
        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
    elif case.method == "naive":
        def forward():
            return naive_enumeration_attention(q, k, v, J, case.causal)
    else:
        options = {"bandwidth": case.bandwidth} if case.method == "banded" else {}

        def forward():
            return boltzmann_attention(q, k, v, couplings=J[None], method=case.method, is_causal=case.causal,
                                       bias=-1.0, method_options=options)

    def step():
        forward().sum().backward()

    if case.method == "exact" and not case.causal:  # Z = u^T K v: two GEMMs of 2 * (B*T) * 2^T FLOPs each
        return step, forward, 2 * 2 * case.B * case.T * 2**case.T
    return step, None, None


def _timed(fn, min_runs: int = 3, budget_s: float = 5.0) -> float:
    fn()  # warm-up
    times, start = [], time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < budget_s and len(times) < 20):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _measure(case: Case, threads: int = 2) -> dict:
    torch.set_num_threads(threads)
    step, forward, flops = _step_function(case)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = _timed(step)
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    gflops = None
    if flops is not None:
        with torch.no_grad():
            gflops = flops / _timed(forward if forward else step) / 1e9
    return {"seconds": seconds, "peak_mb": peak, "gflops": gflops}


def _child(case, queue, threads):
    queue.put(_measure(case, threads))


def run_case(case: Case, threads: int = 2) -> Result:
    """Measure one case in a fresh process (so peak memory is its own) with ``threads`` threads."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(case, queue, threads))
    proc.start()
    out = queue.get()
    proc.join()
    return Result(case=case, **out)


def default_cases(quick: bool) -> list[Case]:
    exact_T = [8, 12, 16] if quick else [8, 12, 16, 20]
    cases = []
    for T in exact_T:
        cases += [Case(m, T, 64) for m in ("exact", "naive", "sdpa")]
        cases += [Case("exact", T, 64, causal=False), Case("matmul", T, 64)]
    if not quick:
        cases = [c for c in cases if not (c.method == "naive" and c.T > 16)]  # 64*20*2^20 floats: ~5 GB
        cases += [Case("exact", 24, 8), Case("exact", 24, 8, causal=False), Case("sdpa", 24, 8),
                  Case("matmul", 24, 8)]
    long_T = [64, 256] if quick else [64, 256, 1024]
    for T in long_T:
        cases += [Case(m, T, 8, bandwidth=8) for m in ("banded", "meanfield", "tap")] + [Case("sdpa", T, 8)]
    return cases


def target_cases() -> list[Case]:
    """Only the rows issue 13's targets need (a few minutes instead of the full table)."""
    return [Case("exact", 16, 64), Case("naive", 16, 64), Case("sdpa", 16, 64), Case("exact", 20, 64),
            Case("exact", 24, 8), Case("sdpa", 24, 8)]


def machine_stamp(threads: int = 2) -> dict:
    info = machine_info()
    return {"cpu": info["processor"], "threads": threads, "torch": info["torch"], "python": info["python"],
            "commit": info["commit"], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": os.getloadavg()[0], "cores": os.cpu_count()}


def ratio_words(baseline_s: float, seconds: float) -> str:
    """'3.2x faster' when seconds < baseline_s, '1.4x slower' otherwise (never '0.7x faster')."""
    ratio = baseline_s / seconds if seconds <= baseline_s else seconds / baseline_s
    shown = f"{ratio:.0f}" if ratio >= 100 else f"{ratio:.3g}"
    return f"{shown}x {'faster' if seconds <= baseline_s else 'slower'}"


def stamp_line(stamp: dict) -> str:
    return (f"Machine: {stamp['cpu']}, {stamp['threads']} threads, load average {stamp['load']:.1f} on "
            f"{stamp['cores']} cores at the start; torch {stamp['torch']}; python {stamp['python']}; "
            f"commit {stamp['commit']}; {stamp['date']}")


def format_table(results: list[Result], stamp: dict) -> str:
    """Markdown table; ratios are against rows of the same run with the same T, B and causality."""
    def find(method, case):
        return next((r for r in results if r.case.method == method and r.case.T == case.T
                     and r.case.B == case.B and r.case.causal == case.causal), None)

    lines = [stamp_line(stamp), "",
             "| method | T | B | causal | band | fwd+bwd ms | peak MB | vs naive | vs SDPA | GFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r.case
        naive, sdpa = find("naive", c), find("sdpa", c)
        speedup = ratio_words(naive.seconds, r.seconds) if naive and c.method == "exact" else ""
        slowdown = ratio_words(sdpa.seconds, r.seconds) if sdpa and c.method not in ("sdpa", "matmul") else ""
        gflops = f"{r.gflops:.0f}" if r.gflops else ""
        mm = find("matmul", Case("matmul", c.T, c.B))
        if c.method == "exact" and r.gflops and mm:
            gflops += f" ({100 * r.gflops / mm.gflops:.0f}% of matmul)"
        band = str(c.bandwidth) if c.bandwidth else ""
        causal = "yes" if c.causal else "no"
        ms = f"{1e3 * r.seconds:.1f}"
        if c.method == "matmul":
            causal, ms = "", f"{1e3 * r.seconds:.2f} (fwd)"
        lines.append(f"| {c.method} | {c.T} | {c.B} | {causal} | {band} | {ms} | {r.peak_mb:.0f} | {speedup} | "
                     f"{slowdown} | {gflops} |")
    return "\n".join(lines)


STEP_MODES = ("softmax", "h", "h+J")


def training_step_rows(sizes=range(4, 17), modes=STEP_MODES, batch: int = 64, rounds: int = 7,
                       vocab: int = 65, threads: int = 1) -> list[dict]:
    """Median wall time of one full training step (forward, loss, backward, gradient clipping, optimiser
    from ``experiments.train.build_optimizer``) of the paper's model (1 layer, 1 head, d_model 64, d_ff 128)
    per mode and window T, batch ``batch``, ``threads`` threads (1: the setting under which two training
    processes share the 2 cores without OpenMP spinning). The modes are interleaved step by step
    (``rounds`` rounds after two warm-up steps each), so their ratios are side by side on a noisy machine.
    """
    from .experiments.model import Model, ModelConfig, loss_fn  # lazily: the library never needs them
    from .experiments.train import TrainConfig, build_optimizer

    torch.set_num_threads(threads)
    rows = []
    for T in sizes:
        steps = {}
        for mode in modes:
            torch.manual_seed(0)
            model = Model(ModelConfig(vocab_size=vocab, max_len=T, mode=mode))
            optimizer = build_optimizer(model, TrainConfig(T=T, mode=mode))
            x, y = torch.randint(0, vocab, (batch, T)), torch.randint(0, vocab, (batch, T))

            def step(model=model, optimizer=optimizer, x=x, y=y):
                loss = loss_fn(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            steps[mode] = step
            step(), step()
        times = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode, step in steps.items():
                start = time.perf_counter()
                step()
                times[mode].append(time.perf_counter() - start)
        rows.append({"T": T, **{mode: statistics.median(t) for mode, t in times.items()}})
    return rows


def training_step_table(rows: list[dict]) -> str:
    modes = [m for m in rows[0] if m != "T"]
    others = [m for m in modes if m != "softmax"]
    lines = ["| T | " + " | ".join(f"{m} ms" for m in modes) + " | " + " | ".join(f"{m} vs softmax" for m in others)
             + " |", "|---" * (1 + len(modes) + len(others)) + "|"]
    for r in rows:
        lines.append(f"| {r['T']} | " + " | ".join(f"{1e3 * r[m]:.2f}" for m in modes) + " | "
                     + " | ".join(f"{r[m] / r['softmax']:.2f}x" for m in others) + " |")
    return "\n".join(lines)


def target_lines(results: list[Result], steps: list[dict] | None) -> list[str]:
    """Issue 13's targets, each as a ratio of rows measured in this run: (description, measured, met)."""
    def exact(T, B):
        return next((r.seconds for r in results if r.case.method == "exact" and r.case.causal
                     and r.case.T == T and r.case.B == B), None)

    naive16 = next((r.seconds for r in results if r.case.method == "naive" and r.case.T == 16), None)
    out = []

    def add(text, value, ok):
        out.append(f"- {text}: {value} -- {'met' if ok else 'MISSED'}")

    t16, t20, t24 = exact(16, 64), exact(20, 64), exact(24, 8)
    if t16 and naive16:
        add("exact causal h+J fwd+bwd, T = 16, B = 64: >= 200x faster than naive enumeration",
            f"{naive16 / t16:.0f}x ({1e3 * t16:.1f} ms vs {1e3 * naive16:.0f} ms)", naive16 / t16 >= 200)
    if t16 and t20:
        add("T = 20 within 5x of T = 16", f"{t20 / t16:.1f}x ({1e3 * t20:.1f} ms)", t20 / t16 <= 5)
    if t24:
        add("T = 24 (B = 8) under 0.3 s", f"{t24:.3f} s", t24 < 0.3)
    row = next((r for r in steps or [] if r["T"] == 12), None)
    if row and "h+J" in row:
        add("training step, T = 12: h+J within 1.5x of softmax", f"{row['h+J'] / row['softmax']:.2f}x",
            row["h+J"] / row["softmax"] <= 1.5)
    if row and "h" in row:
        add("training step, T = 12: h within 1.1x of softmax", f"{row['h'] / row['softmax']:.2f}x",
            row["h"] / row["softmax"] <= 1.1)
    return out


def accuracy_rows(sizes=(12, 16), queries: int = 16, coupling_std: float = 0.3, seed: int = 0,
                  field_mean: float = 0.0, field_std: float = 1.0, methods: tuple[str, ...] | None = None,
                  threads: int = 2) -> list[dict]:
    """Marginal error against the float64 brute-force reference, and wall time, for every method (dense J).

    h ~ N(field_mean, field_std^2), J_jk ~ N(0, coupling_std^2) (symmetric, dense), float64, one call per
    row, ``threads`` threads; ``methods``: only these (default all). DQA is not a Boltzmann sampler: its
    'error' is the distance between its final-state marginals and the Boltzmann ones, not a sampling error;
    'target_beta=1.0' is DQA at the energy scale calibrated to approximate exp(-E) (ising.annealing).
    """
    from . import ising

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
                 bandwidth: int = 8, seed: int = 0) -> list[dict]:
    """Forward time of one marginals call for Q = ``queries`` systems of n spins, for the methods that scale.

    Couplings J_jk ~ N(0, (coupling_std / sqrt(bandwidth))^2) for 0 < |j - k| <= bandwidth, else 0, so every
    method (banded included) solves the same problem; h ~ N(0, 1); float32, no gradient, 2 threads. Exact
    enumeration runs where it can (n <= 24) for comparison. Gibbs and PT sample as in the 'sampling'
    profile's training runs (TRAINING_SAMPLER_OPTIONS, which that profile imports), so the cost is what one
    training step pays per call; SQA (not trained here) runs 100 sweeps with 16 slices.
    """
    from . import ising

    def sampling(options: dict) -> dict:  # forward only: the gradient option does not apply
        return {k: v for k, v in options.items() if k != "gradient"} | {"seed": 0}

    torch.set_num_threads(2)
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
                seconds = _timed(call, min_runs=2, budget_s=3.0)
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


def _log_axes(ax, xlabel: str, ylabel: str, title: str, legend_size: int = 6) -> None:
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
        _log_axes(ax, "wall time per call (s)", "mean |error| of the marginals",
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


# ------------------------------------------------------------------ DQA in its Boltzmann regime (issue 15)

DQA_ANNEAL_TIMES = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)  # ns
DQA_SCALES = tuple(float(c) for c in torch.logspace(-3, 0.5, 15, dtype=torch.float64))


def dqa_steps(anneal_time_ns: float) -> int:
    """Trotter steps with dt <= 25 ps (the defaults' step, 5 ns / 200), at least 200."""
    return max(200, math.ceil(40 * anneal_time_ns))


def _held_out(n: int, num: int, field_factor: float = 1.0, coupling_factor: float = 1.0, seed: int = 1):
    """Systems of the calibration's distribution (fields and couplings scaled by the factors), another seed."""
    from .ising.annealing import CALIBRATION_SYSTEMS as S
    from .ising.annealing import calibration_systems

    return calibration_systems(n, num, field_factor * S["field_mean"], field_factor * S["field_std"],
                               coupling_factor * S["coupling_std"], seed)


def _quantiles(x: torch.Tensor) -> dict:
    return {"median": float(x.median()), "min": float(x.min()), "max": float(x.max())}


def _dqa_point(systems, **anneal) -> dict:
    """beta_eff, the KL left at beta_eff and the KL to exp(-E), over all systems of a list of (h, J)."""
    from .ising.annealing import boltzmann_kl, effective_beta

    fits = [effective_beta(h, J, **anneal) for h, J in systems]
    beta, kl = torch.cat([f.beta for f in fits]), torch.cat([f.kl for f in fits])
    kl1 = torch.cat([boltzmann_kl(h, J, **anneal) for h, J in systems])
    return {"beta": _quantiles(beta), "kl_at_beta": _quantiles(kl), "kl_to_boltzmann": _quantiles(kl1)}


def dqa_calibration_rows(quick: bool = False) -> dict:
    """The measurements of report/dqa_calibration/ (issue 15), one core. Systems: the calibration's
    distribution (ising.annealing.CALIBRATION_SYSTEMS) with seed 1, held out from the fit (seed 0).

    sweep: beta_eff against energy scale and anneal time (n = 4, 6, 8, 16 systems each); times: the
    calibrated scale per anneal time, and beta_eff of fields-only (J = 0) and couplings-only (h = 0)
    systems there; sizes: n = 4..16 at the default calibration and calibrated per size; scales: fields or
    couplings scaled by a factor (n = 8); accuracy: marginal errors of DQA settings against exact.
    """
    from .ising.annealing import CALIBRATION_SYSTEMS, calibrate_energy_scale

    torch.set_num_threads(1)
    times = (1.0, 5.0) if quick else DQA_ANNEAL_TIMES
    sizes = (4, 8) if quick else (4, 6, 8, 10, 12, 14, 16)
    per_size = {n: 16 if n <= 10 else {12: 8, 14: 4}.get(n, 2) for n in sizes}
    fit_sizes = CALIBRATION_SYSTEMS["sizes"]
    held = [_held_out(n, 16) for n in fit_sizes]
    out = {"calibration_systems": {k: list(v) if isinstance(v, tuple) else v for k, v in CALIBRATION_SYSTEMS.items()}}
    start = time.perf_counter()
    out["sweep"] = [{"anneal_time_ns": t, "energy_scale": c, **_dqa_point(held, anneal_time_ns=t,
                                                                            trotter_steps=dqa_steps(t),
                                                                            energy_scale=c)}
                    for t in times for c in (DQA_SCALES[::3] if quick else DQA_SCALES)]
    out["times"] = []
    for schedule, t in [("linear", t) for t in times] + [("dwave_quadratic", 5.0)]:
        anneal = {"anneal_time_ns": t, "trotter_steps": dqa_steps(t), "schedule": schedule}
        row = {"schedule": schedule, "anneal_time_ns": t, "trotter_steps": anneal["trotter_steps"]}
        try:
            c = calibrate_energy_scale(1.0, **anneal)
        except ValueError as e:
            out["times"].append({**row, "error": str(e)})
            continue
        fields_only = [(h, torch.zeros_like(J)) for h, J in held]
        couplings_only = [(torch.zeros_like(h), J) for h, J in held]
        row.update(energy_scale=c, **_dqa_point(held, energy_scale=c, **anneal),
                   beta_fields_only=_dqa_point(fields_only, energy_scale=c, **anneal)["beta"],
                   beta_couplings_only=_dqa_point(couplings_only, energy_scale=c, **anneal)["beta"])
        out["times"].append(row)
    c_default = calibrate_energy_scale(1.0)
    out["default_energy_scale"] = c_default
    out["sizes"] = []
    for n in sizes:
        systems = [_held_out(n, per_size[n])]
        row = {"n": n, "systems": per_size[n], **_dqa_point(systems, energy_scale=c_default),
               "kl_at_scale_1": _dqa_point(systems, energy_scale=1.0)["kl_to_boltzmann"]}
        if n <= (8 if quick else 16):
            c_n = calibrate_energy_scale(1.0, sizes=(n,), num_systems=per_size[n])
            row.update(own_energy_scale=c_n, own=_dqa_point(systems, energy_scale=c_n))
        out["sizes"].append(row)
    out["scales"] = []
    factors = [("fields", k) for k in ((0.5, 1.0, 2.0) if quick else (0.25, 0.5, 1.0, 2.0, 4.0))]
    factors += [("couplings", k) for k in ((0.0, 2.0) if quick else (0.0, 0.5, 2.0, 4.0))]
    s = CALIBRATION_SYSTEMS
    for which, k in factors:
        fk, ck = (k, 1.0) if which == "fields" else (1.0, k)
        systems = [_held_out(8, 16, fk, ck)]
        c_k = calibrate_energy_scale(1.0, sizes=(8,), field_mean=fk * s["field_mean"], field_std=fk * s["field_std"],
                                     coupling_std=ck * s["coupling_std"])
        out["scales"].append({"scaled": which, "factor": k, "field_mean": fk * s["field_mean"],
                              "field_std": fk * s["field_std"], "coupling_std": ck * s["coupling_std"],
                              **_dqa_point(systems, energy_scale=c_default), "own_energy_scale": c_k,
                              "own": _dqa_point(systems, energy_scale=c_k)})
    accuracy_sizes = (8,) if quick else (12, 16)
    out["accuracy"] = {name: accuracy_rows(sizes=accuracy_sizes, methods=("dqa",), threads=1, **dist)
                       for name, dist in dqa_distributions().items()}
    out.update(dqa_bias_rows(quick, c_default))
    out["seconds"] = time.perf_counter() - start
    return out


def dqa_distributions() -> dict:
    """The two distributions of the DQA accuracy tables: the calibration's, and the samplers table's."""
    from .ising.annealing import CALIBRATION_SYSTEMS as S

    return {"training-like": {k: S[k] for k in ("field_mean", "field_std", "coupling_std")},
            "samplers table": {"field_mean": 0.0, "field_std": 1.0, "coupling_std": 0.3}}


def dqa_bias_rows(quick: bool, energy_scale: float) -> dict:
    """Two measurements without sampling noise, at the calibrated ``energy_scale`` (default anneal):

    noise_free: the error of DQA's final-state marginals (``dqa_exact_marginals``, no samples) against exact,
    on the systems of :func:`accuracy_rows`, at energy scale 1 and at ``energy_scale``; two_scales: the KL to
    exp(-E) when DQA runs on (h, k J) instead of (h, J), k = 1..2 (held-out systems, n = 4, 6, 8): a k > 1
    that lowers it means the couplings need their own, larger scale.
    """
    from . import ising
    from .ising.annealing import _energies, _kl, anneal_distribution, dqa_exact_marginals

    sizes = (8,) if quick else (12, 16)
    noise_free = []
    for name, dist in dqa_distributions().items():
        for n, h, J in accuracy_systems(sizes, 16, dist["coupling_std"], 0, dist["field_mean"], dist["field_std"]):
            truth = ising.marginals(h, J, method="reference")
            for scale in (1.0, energy_scale):
                err = (dqa_exact_marginals(h, J, None, None, energy_scale=scale) - truth).abs()
                noise_free.append({"distribution": name, "n": n, "energy_scale": scale,
                                   "max_error": float(err.max()), "mean_error": float(err.mean())})
    two_scales = []
    held = [_held_out(n, 16) for n in (4, 6, 8)]
    for k in (1.0, 1.25, 1.5, 1.75, 2.0):
        kl = torch.cat([_kl(anneal_distribution(h, k * J, energy_scale=energy_scale),
                            torch.log_softmax(-_energies(h, J, None), -1)) for h, J in held])
        two_scales.append({"coupling_factor": k, "kl_to_boltzmann": _quantiles(kl)})
    return {"noise_free": noise_free, "two_scales": two_scales}


def _q(d: dict, digits: int = 3) -> str:
    """'median [min, max]'."""
    return f"{d['median']:.{digits}g} [{d['min']:.{digits}g}, {d['max']:.{digits}g}]"


def _dqa_summary(data: dict) -> list[str]:
    """The report's headline numbers, each read off the tables below."""
    def span(values, digits=3):
        return f"{min(values):.{digits}g} to {max(values):.{digits}g}"

    out = []
    times = [r for r in data["times"] if r["schedule"] == "linear" and "energy_scale" in r]
    default = next((r for r in times if r["anneal_time_ns"] == 5.0), None)
    if times:
        out.append(f"beta_eff = 1 is reached at every anneal time measured (linear schedule, "
                   f"{span([r['anneal_time_ns'] for r in times])} ns): calibrated scale "
                   f"{span([r['energy_scale'] for r in times])}, median beta_eff on held-out systems "
                   f"{span([r['beta']['median'] for r in times])}, median KL to exp(-E) "
                   f"{span([r['kl_to_boltzmann']['median'] for r in times])} (n = 4, 6, 8).")
    sizes = data["sizes"]
    own = [r["own_energy_scale"] for r in sizes if "own_energy_scale" in r]
    if own:
        out.append(f"The scale is stable across sizes: fitted on one n at a time ({sizes[0]['n']}..{sizes[-1]['n']}) "
                   f"it is {span(own)} (default fit {data['default_energy_scale']:.4g}).")
    large = [r for r in sizes if r["n"] >= 10] or sizes[-1:]
    kl = [r["kl_to_boltzmann"]["median"] for r in large]
    per_spin = [r["kl_to_boltzmann"]["median"] / r["n"] for r in sizes]
    out.append(f"KL to exp(-E) at the calibrated scale grows with n: median "
               f"{sizes[0]['kl_to_boltzmann']['median']:.3g} at n = {sizes[0]['n']}, {span(kl)} at "
               f"n = {large[0]['n']}..{large[-1]['n']} (per spin {span(per_spin)}); at energy scale 1 (the sampling "
               f"study) it is {span([r['kl_at_scale_1']['median'] for r in sizes])}.")
    if default:
        ratio = default["beta_couplings_only"]["median"] / default["beta_fields_only"]["median"]
        out.append(f"Fields and couplings do not share one temperature: at the calibrated 5 ns anneal, systems "
                   f"with J = 0 have beta_eff {default['beta_fields_only']['median']:.3g}, systems with h = 0 "
                   f"{default['beta_couplings_only']['median']:.3g} ({ratio:.2f}x).")
    fields = [r for r in data["scales"] if r["scaled"] == "fields"]
    if fields:
        out.append("Against the field scale (n = 8, fields x " + ", ".join(f"{r['factor']:g}" for r in fields)
                   + "): beta_eff at the default calibration " + ", ".join(f"{r['beta']['median']:.2f}" for r in fields)
                   + "; KL to exp(-E) " + ", ".join(f"{r['kl_to_boltzmann']['median']:.2g}" for r in fields)
                   + " (recalibrated: " + ", ".join(f"{r['own']['kl_to_boltzmann']['median']:.2g}" for r in fields)
                   + "). Weak fields leave the couplings' hotter temperature exposed.")
    free = {(r["distribution"], r["n"], r["energy_scale"] == 1.0): r for r in data.get("noise_free", [])}
    for name in dict.fromkeys(r["distribution"] for r in data.get("noise_free", [])):
        n = max(r["n"] for r in data["noise_free"] if r["distribution"] == name)
        cal, one = free.get((name, n, False)), free.get((name, n, True))
        if cal and one:
            out.append(f"Marginals ({name}, n = {n}, no sampling noise): mean |error| against exact "
                       f"{cal['mean_error']:.3g} calibrated (max {cal['max_error']:.2g}), {one['mean_error']:.3g} at "
                       f"energy scale 1 (max {one['max_error']:.2g}).")
    return out


def dqa_calibration_markdown(data: dict, stamp: dict, plot: str | None) -> str:
    """report/dqa_calibration/README.md from :func:`dqa_calibration_rows`."""
    from .experiments.tables import md_table

    s = data["calibration_systems"]
    c0 = data["default_energy_scale"]
    lines = ["# DQA in its Boltzmann regime: effective temperature and calibration (issue 15)", "",
             "Generated by `boltzmann-attention-bench --dqa-calibration report/dqa_calibration`; do not edit by hand.",
             "", stamp_line(stamp) + f"; {data['seconds']:.0f} s on one core.", "",
             "beta_eff of an anneal: per system, the beta minimising KL(p_DQA || p_beta), p_beta proportional to "
             "exp(-beta E) with E the package's energy of the unscaled h and J (`ising.annealing.effective_beta`); "
             "'KL at beta_eff' is what is left there (how far DQA is from *any* Boltzmann distribution), 'KL to "
             "exp(-E)' is KL(p_DQA || p_1), the distance to what Boltzmann attention computes. Both in nats, over all "
             "2^n states. Cells: median [min, max] over the systems.", "",
             f"Systems (`CALIBRATION_SYSTEMS`): h_j ~ N({s['field_mean']}, {s['field_std']}^2), J_jk ~ N(0, "
             f"{s['coupling_std']}^2), n in {tuple(s['sizes'])}, {s['num_systems']} per size; the calibration fits "
             f"seed {s['seed']}, every table here uses seed 1 (held out). Why these: h+J models trained on "
             "Shakespeare fed their marginals fields of mean -1.28 to -1.46 and std 0.38 to 0.52 (T = 4, 8, 16), "
             "the committed runs' learned J have an rms of 0.12 to 0.29 per entry; see `calibrate_energy_scale`.",
             "", f"Calibrated energy scale at the defaults (5 ns, linear schedule, 200 steps): **{c0:.4g}** "
             "(the sampling study ran at energy scale 1).", ""]
    lines += ["## Summary", ""] + [f"- {line}" for line in _dqa_summary(data)] + [""]
    if plot:
        lines += [f"![beta_eff and KL against energy scale and anneal time]({plot})", ""]
    lines += ["## beta_eff against energy scale and anneal time", "",
              "Held-out systems n = 4, 6, 8 (48). Trotter steps: dt <= 25 ps. Beyond a scale of about 0.3 the "
              "systems' energy spread times the scale exceeds the ~5.5 that a 25 ps step resolves (see "
              "`ising/annealing.py`), so the right-hand end is the digitised dynamics, not the continuous anneal.",
              ""]
    times = sorted({r["anneal_time_ns"] for r in data["sweep"]})
    scales = sorted({r["energy_scale"] for r in data["sweep"]})
    cell = {(r["anneal_time_ns"], r["energy_scale"]): r for r in data["sweep"]}
    for key, title in (("beta", "median beta_eff"), ("kl_at_beta", "median KL at beta_eff"),
                       ("kl_to_boltzmann", "median KL to exp(-E)")):
        lines += [f"{title}:", "", md_table(["energy scale"] + [f"{t:g} ns" for t in times],
                  [[f"{c:.3g}"] + [f"{cell[t, c][key]['median']:.3g}" for t in times] for c in scales]), ""]
    lines += ["## Calibrated scale per anneal time", "",
              "`calibrate_energy_scale(1.0, anneal_time_ns=t, trotter_steps=...)`, evaluated on the held-out "
              "systems. 'fields only' / 'couplings only': beta_eff of the same systems with J = 0 / h = 0 at that "
              "scale: one temperature for both would make them equal.", ""]
    rows = []
    for r in data["times"]:
        head = [r["schedule"], f"{r['anneal_time_ns']:g}", str(r["trotter_steps"])]
        if "error" in r:
            rows.append(head + ["not bracketed: " + r["error"]] + [""] * 6)
            continue
        rows.append(head + [f"{r['energy_scale']:.4g}", f"{r['energy_scale'] * r['anneal_time_ns']:.4g}",
                            _q(r["beta"]), _q(r["kl_at_beta"]), _q(r["kl_to_boltzmann"]),
                            _q(r["beta_fields_only"]), _q(r["beta_couplings_only"])])
    lines += [md_table(["schedule", "anneal ns", "steps", "scale c", "c x t (ns)", "beta_eff", "KL at beta_eff",
                        "KL to exp(-E)", "beta_eff fields only", "beta_eff couplings only"], rows), ""]
    lines += ["## KL at beta_eff = 1 against n", "",
              f"The default anneal at the calibrated scale {c0:.4g} (fitted on n = 4, 6, 8), and at a scale "
              "calibrated on that n alone; 'scale 1': the sampling study's operating point.", ""]
    rows = []
    for r in data["sizes"]:
        own = r.get("own")
        rows.append([str(r["n"]), str(r["systems"]), _q(r["beta"]), _q(r["kl_at_beta"]), _q(r["kl_to_boltzmann"]),
                     f"{r['kl_to_boltzmann']['median'] / r['n']:.3g}", _q(r["kl_at_scale_1"]),
                     f"{r['own_energy_scale']:.4g}" if own else "", _q(own["kl_to_boltzmann"]) if own else ""])
    lines += [md_table(["n", "systems", "beta_eff", "KL at beta_eff", "KL to exp(-E)", "median KL / n",
                        "KL to exp(-E) at scale 1", "scale fitted at this n", "KL to exp(-E) there"], rows), ""]
    lines += ["## KL at beta_eff = 1 against the field and coupling scale", "",
              f"n = 8, 16 held-out systems, fields (mean and std) or couplings scaled by a factor; at the default "
              f"calibrated scale {c0:.4g} and at a scale calibrated on that distribution (n = 8).", ""]
    rows = [[r["scaled"], f"{r['factor']:g}", f"N({r['field_mean']:.3g}, {r['field_std']:.3g}^2)",
             f"{r['coupling_std']:.3g}", _q(r["beta"]), _q(r["kl_at_beta"]), _q(r["kl_to_boltzmann"]),
             f"{r['own_energy_scale']:.4g}", _q(r["own"]["beta"]), _q(r["own"]["kl_to_boltzmann"])]
            for r in data["scales"]]
    lines += [md_table(["scaled", "factor", "h", "std J", "beta_eff", "KL at beta_eff", "KL to exp(-E)",
                        "own scale", "beta_eff there", "KL to exp(-E) there"], rows), ""]
    lines += ["## Marginal error of DQA against exact (sampler accuracy table)", "",
              "`accuracy_rows` restricted to DQA, 16 queries per n, 1000 samples (statistical error up to "
              "~0.03 per marginal), one thread. 'target_beta=1.0' is the calibrated DQA. 'training-like': the "
              "calibration's distribution; 'samplers table': h ~ N(0, 1), J ~ N(0, 0.3^2) as in "
              "report/benchmark/.", ""]
    for name, rows_ in data["accuracy"].items():
        lines += [f"{name}:", "", accuracy_table(rows_), ""]
    if "noise_free" not in data:
        return "\n".join(lines)
    lines += ["Without sampling noise: the final state's own marginals (`dqa_exact_marginals`) on the same systems, "
              f"at energy scale 1 (the default) and at the calibrated {c0:.4g}.", "",
              md_table(["distribution", "n", "energy scale", "max abs error", "mean abs error"],
                       [[r["distribution"], str(r["n"]), f"{r['energy_scale']:.4g}", f"{r['max_error']:.3g}",
                         f"{r['mean_error']:.3g}"] for r in data["noise_free"]]), ""]
    lines += ["## One scale for fields and couplings?", "",
              "At the calibrated scale, DQA run on (h, k J) and compared with exp(-E(h, J)): held-out n = 4, 6, 8 "
              "(48 systems). k = 1 is `target_beta=1.0`; a smaller KL at k > 1 means the couplings come out "
              "hotter than the fields and would need their own scale (not implemented: one energy_scale "
              "multiplies both).", "",
              md_table(["k (J multiplied by)", "KL to exp(-E)"],
                       [[f"{r['coupling_factor']:g}", _q(r["kl_to_boltzmann"])] for r in data["two_scales"]]), ""]
    return "\n".join(lines)


def plot_dqa_calibration(data: dict, path: str) -> None:
    """Left: median beta_eff against energy scale per anneal time; middle: KL at beta_eff and to exp(-E);
    right: KL to exp(-E) at the calibrated scale against n."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.6, 3.6), dpi=72)
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    times = sorted({r["anneal_time_ns"] for r in data["sweep"]})
    calibrated = {r["anneal_time_ns"]: r["energy_scale"] for r in data["times"]
                  if r["schedule"] == "linear" and "energy_scale" in r}
    for k, t in enumerate(times):
        pts = sorted((r["energy_scale"], r["beta"]["median"], r["kl_at_beta"]["median"],
                      r["kl_to_boltzmann"]["median"]) for r in data["sweep"] if r["anneal_time_ns"] == t)
        c, beta, kl, kl1 = zip(*pts)
        ax1.plot(c, beta, marker="o", ms=3, color=f"C{k}", label=f"{t:g} ns")
        ax2.plot(c, kl, marker="o", ms=3, color=f"C{k}", label=f"{t:g} ns")
        ax2.plot(c, kl1, ls=":", color=f"C{k}")
        if t in calibrated:
            ax1.axvline(calibrated[t], color=f"C{k}", lw=0.6, ls="--")
    ax1.axhline(1.0, color="k", lw=0.6)
    _log_axes(ax1, "energy scale c", "median beta_eff", "beta_eff (dashed: calibrated c)")
    _log_axes(ax2, "energy scale c", "median KL (nats)", "KL at beta_eff (solid), to exp(-E) (dotted)")
    rows = data["sizes"]
    n = [r["n"] for r in rows]
    for key, label, color in (("kl_to_boltzmann", f"calibrated c = {data['default_energy_scale']:.3g}", "C0"),
                              ("kl_at_scale_1", "c = 1 (sampling study)", "C3")):
        med = [r[key]["median"] if key in r else r["kl_to_boltzmann"]["median"] for r in rows]
        lo = [m - r[key]["min"] for m, r in zip(med, rows)]
        hi = [r[key]["max"] - m for m, r in zip(med, rows)]
        ax3.errorbar(n, med, yerr=[lo, hi], marker="o", ms=3, capsize=2, color=color, label=label)
    ax3.set_yscale("log")
    ax3.set_xlabel("n (spins)")
    ax3.set_ylabel("KL to exp(-E) (nats)")
    ax3.set_title("5 ns: median [min, max] over held-out systems", fontsize=8)
    ax3.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path)


def write_dqa_calibration(out_dir: str, quick: bool = False) -> None:
    """Measure (:func:`dqa_calibration_rows`) and write README.md, calibration.png and calibration.json."""
    os.makedirs(out_dir, exist_ok=True)
    stamp = machine_stamp(1)
    data = dqa_calibration_rows(quick)
    with open(os.path.join(out_dir, "calibration.json"), "w") as f:
        json.dump({"machine": stamp, **data}, f, separators=(",", ":"))
    plot = None
    try:
        plot_dqa_calibration(data, os.path.join(out_dir, "calibration.png"))
        plot = "calibration.png"
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(dqa_calibration_markdown(data, stamp, plot) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--accuracy", action="store_true",
                        help="instead: marginal error against exact and wall time of every method (n = 12, 16)")
    parser.add_argument("--scaling", action="store_true",
                        help="instead (or with --accuracy): time against n = 16..256 for the methods that scale")
    parser.add_argument("--plot", help="with --accuracy or --scaling: write their plot to this PNG")
    parser.add_argument("--no-steps", action="store_true", help="skip the training-step table")
    parser.add_argument("--targets", action="store_true",
                        help="only the rows of issue 13's targets (exact T = 16, 20, 24, naive T = 16) and the "
                             "training steps at T = 4, 8, 12, 16")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads per measured process (1 on a machine shared with other jobs: two "
                             "processes with 2 threads each on 2 cores spin and run ~20x slower)")
    parser.add_argument("--dqa-calibration", metavar="DIR",
                        help="instead: DQA's effective temperature and its calibration (issue 15), written to "
                             "DIR/README.md, calibration.png and calibration.json (with --quick: a smoke test)")
    args = parser.parse_args(argv)
    if args.dqa_calibration:
        write_dqa_calibration(args.dqa_calibration, quick=args.quick)
        return
    if args.plot:  # before any work: the plot is the last step of a run of minutes
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print('--plot needs matplotlib: pip install -e ".[experiments]"', file=sys.stderr)
            sys.exit(2)
    stamp = machine_stamp(args.threads)
    if args.accuracy or args.scaling:
        print(stamp_line(stamp) + "\n")
        accuracy = accuracy_rows() if args.accuracy else None
        scaling = scaling_rows() if args.scaling else None
        for rows, table in ((accuracy, accuracy_table), (scaling, scaling_table)):
            if rows:
                print(table(rows) + "\n", flush=True)
        if args.plot:
            plot_rows(accuracy, scaling, args.plot)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": stamp, "accuracy": accuracy, "scaling": scaling}, f, indent=1)
        return
    results = []
    for case in target_cases() if args.targets else default_cases(args.quick):
        results.append(run_case(case, args.threads))
        r = results[-1]
        print(f"  {case.method:9s} T={case.T:<5d} B={case.B:<3d} causal={case.causal!s:5s} "
              f"{1e3 * r.seconds:9.1f} ms {r.peak_mb:7.0f} MB", flush=True)
    steps = None
    if not args.no_steps:
        steps = training_step_rows(sizes=(4, 8, 12, 16) if args.quick or args.targets else range(4, 17))
    print()
    print(format_table(results, stamp))
    if steps:
        print("\nTraining step of the paper's model (batch 64, 1 thread), median wall ms, modes interleaved:\n")
        print(training_step_table(steps))
    print("\nTargets (issue 13), ratios of this run:\n")
    print("\n".join(target_lines(results, steps)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": stamp, "results": [asdict(r) for r in results], "steps": steps}, f, indent=1)


if __name__ == "__main__":
    main()
