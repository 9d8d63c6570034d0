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


def accuracy_rows(sizes=(12, 16), queries: int = 16, coupling_std: float = 0.3, seed: int = 0) -> list[dict]:
    """Marginal error against the float64 brute-force reference, and wall time, for every method (dense J).

    h ~ N(0, 1), J_jk ~ N(0, coupling_std^2) (symmetric, dense), float64, one call per row, 2 threads.
    DQA is not a Boltzmann sampler: its 'error' is the distance between its final-state marginals and the
    Boltzmann ones, not a sampling error.
    """
    from . import ising

    torch.set_num_threads(2)
    settings = [("exact", {}), ("meanfield", {}), ("tap", {})]
    settings += [("gibbs", {"num_samples": s, "warmup": 100, "seed": 0}) for s in (100, 1000, 10000)]
    settings += [("pt", {"num_samples": s, "warmup": 100, "seed": 0}) for s in (100, 1000)]
    settings += [("dqa", {"num_samples": 1000, "seed": 0}),
                 ("dqa", {"num_samples": 1000, "seed": 0, "anneal_time_ns": 1.0, "energy_scale": 0.25}),
                 ("sqa", {"num_samples": 1024, "seed": 0})]
    rows = []
    g = torch.Generator().manual_seed(seed)
    for n in sizes:
        h = torch.randn(queries, n, dtype=torch.float64, generator=g)
        W = torch.randn(n, n, dtype=torch.float64, generator=g) * coupling_std
        J = W.triu(1) + W.triu(1).T
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
    if "anneal_time_ns" in parts:
        return f"{float(parts['anneal_time_ns']):g} ns"
    return parts.get("num_samples", "")


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
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("wall time per call (s)")
        ax.set_ylabel("mean |error| of the marginals")
        ax.set_title("error against time (o: n=12, s: n=16)", fontsize=8)
        ax.legend(fontsize=6)
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
    args = parser.parse_args(argv)
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
