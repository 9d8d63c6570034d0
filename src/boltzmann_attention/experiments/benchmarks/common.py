"""What every benchmark shares: the stamp (machine, threads, load, torch, commit), side-by-side timing and
ratio wording.

Timings on a shared machine are only comparable when they are taken side by side: :func:`interleaved` runs
its candidates in turn, round after round, so a change in the machine's load hits them alike.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

from ...provenance import machine_info


def machine_stamp(threads: int | str = 2) -> dict:
    """Where and how a benchmark ran: CPU, ``threads`` (torch threads per process), torch, python, commit,
    UTC time, load average at the start and core count."""
    info = machine_info()
    return {"cpu": info["processor"], "threads": threads, "torch": info["torch"], "python": info["python"],
            "commit": info["commit"], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": os.getloadavg()[0], "cores": os.cpu_count()}


def stamp_line(stamp: dict) -> str:
    """The stamp as the one line every benchmark table starts with."""
    return (f"Machine: {stamp['cpu']}, {stamp['threads']} threads, load average {stamp['load']:.1f} on "
            f"{stamp['cores']} cores at the start; torch {stamp['torch']}; python {stamp['python']}; "
            f"commit {stamp['commit']}; {stamp['date']}")


def ratio_words(baseline_s: float, seconds: float) -> str:
    """'3.2x faster' when seconds < baseline_s, '1.4x slower' otherwise (never '0.7x faster')."""
    ratio = baseline_s / seconds if seconds <= baseline_s else seconds / baseline_s
    shown = f"{ratio:.0f}" if ratio >= 100 else f"{ratio:.3g}"
    return f"{shown}x {'faster' if seconds <= baseline_s else 'slower'}"


def timed(fn: Callable[[], object], min_runs: int = 3, budget_s: float = 5.0, max_runs: int = 20) -> float:
    """Median seconds of ``fn()`` after one warm-up call: at least ``min_runs`` calls, more while the budget
    lasts, at most ``max_runs``."""
    fn()
    times, start = [], time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < budget_s and len(times) < max_runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved(candidates: dict[str, Callable[[], object]], rounds: int, warmup: int = 1,
                calls: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each candidate, measured side by side in this process.

    Every candidate is called ``warmup`` times, then in each of ``rounds`` rounds every candidate in turn is
    called ``calls`` times. Returns {name: [seconds per call in that round, one per round]}, in the order of
    ``candidates``.
    """
    if rounds < 1 or warmup < 0 or calls < 1:
        raise ValueError(f"interleaved needs rounds >= 1, warmup >= 0 and calls >= 1; got {rounds}, {warmup}, "
                         f"{calls}")
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    out: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            out[name].append((time.perf_counter() - start) / calls)
    return out


def both_orders(candidates: dict[str, Callable[[], object]], rounds: int, sync=None) -> dict[str, float]:
    """{name: median seconds per call} over ``rounds`` :func:`interleaved` rounds after one warm-up call each, half
    of them in the opposite order, so that no candidate always runs right after the same other one. sync: called
    after each call (``torch.cuda.synchronize`` on a GPU)."""
    if sync is not None:
        candidates = {name: (lambda fn=fn: (fn(), sync())) for name, fn in candidates.items()}
    first = interleaved(candidates, rounds=(rounds + 1) // 2, warmup=1)
    second = interleaved(dict(reversed(candidates.items())), rounds=rounds // 2, warmup=0) if rounds > 1 else {}
    return {name: statistics.median(first[name] + second.get(name, [])) for name in candidates}


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """{name: median} of :func:`interleaved`'s measurement."""
    return {name: statistics.median(t) for name, t in times.items()}
