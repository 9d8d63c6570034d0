"""Coupled window (issue 14 §1) against mode h and softmax, at the module level, fwd+bwd, side by side.

    PYTHONPATH=src python report/window/bench.py [--threads 1 2] [--repeats 7] [--T 1024] [--B 8] [--W 16]

Every row is a BoltzmannAttention layer (projections included), causal, one head, d_model 64, float32, on
the same x; a step is forward, sum of the output, backward. The layers run alternately in one process
(warm-up step first, then `repeats` rounds of one step each), so the load of other processes hits all
rows alike; the table gives the median step time and its ratio to mode h at the same thread count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from boltzmann_attention import BoltzmannAttention
from boltzmann_attention.provenance import machine_info


def layers(T: int, W: int, d_model: int = 64) -> dict[str, BoltzmannAttention]:
    torch.manual_seed(0)
    return {
        "h (sigmoid, materialised)": BoltzmannAttention(d_model, 1, max_len=T, mode="h"),
        "softmax (SDPA)": BoltzmannAttention(d_model, 1, max_len=T, mode="softmax"),
        f"h+J window W={W} (exact)": BoltzmannAttention(d_model, 1, max_len=T, coupling="window",
                                                        coupling_window=W, coupling_init_std=0.1),
        f"h+J window W={W}, relative (exact)": BoltzmannAttention(
            d_model, 1, max_len=T, coupling="window", coupling_window=W, coupling_window_relative=True,
            coupling_init_std=0.1),
    }


def measure(T: int, B: int, W: int, threads: int, repeats: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    mods = layers(T, W)
    x = torch.randn(B, T, 64)

    def step(m):
        m.zero_grad(set_to_none=True)
        m(x)[0].sum().backward()

    for m in mods.values():
        step(m)
    times: dict[str, list[float]] = {name: [] for name in mods}
    for _ in range(repeats):
        for name, m in mods.items():
            start = time.perf_counter()
            step(m)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--W", type=int, default=16)
    a = p.parse_args()
    info = machine_info()
    load = os.getloadavg()[0]
    rows = {t: measure(a.T, a.B, a.W, t, a.repeats) for t in a.threads}
    print(f"T = {a.T}, B = {a.B}, d_model 64, 1 head, causal, float32, fwd+bwd, median of {a.repeats} "
          f"alternating rounds; {info['processor']}, {info['cpus']} CPUs, torch {info['torch']}, "
          f"commit {info['commit']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{load:.1f} before, {os.getloadavg()[0]:.1f} after (other processes share the cores)\n")
    print("| layer | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}: ms | x h" for t in a.threads) + " |")
    print("|---|" + "---:|---:|" * len(a.threads))
    h = next(iter(rows[a.threads[0]]))
    for name in rows[a.threads[0]]:
        cells = " | ".join(f"{rows[t][name] * 1e3:.0f} | {rows[t][name] / rows[t][h]:.2f}" for t in a.threads)
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
