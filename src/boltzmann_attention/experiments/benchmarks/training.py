"""Training steps timed: the paper's model per mode and window, any set of run configurations side by side,
and a profile's grid in two source trees side by side.

A step is what a run makes: forward, loss, backward, gradient clipping and the optimiser of
``experiments.train.build_optimizer``. Every measurement here interleaves its candidates (:func:`interleaved`,
or two processes at once for two trees), so its ratios are side by side on a shared machine.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..model import Model, loss_fn
from ..train import TrainConfig, build_optimizer, model_config, setup_run, train_step
from .common import interleaved, medians, stamp_line

STEP_MODES = ("softmax", "h", "h+J")


def training_step_rows(sizes=range(4, 17), modes=STEP_MODES, batch: int = 64, rounds: int = 7,
                       vocab: int = 65, threads: int = 1, warmup: int = 2) -> list[dict]:
    """Median wall time of one training step of the paper's model (1 layer, 1 head, d_model 64, d_ff 128)
    per mode and context length T, batch ``batch``, ``threads`` threads (1: the setting under which two training
    processes share the 2 cores without OpenMP spinning). The modes are interleaved step by step
    (``rounds`` rounds after ``warmup`` steps each). Returns one {T, mode: seconds, ...} per T.
    """
    torch.set_num_threads(threads)
    rows = []
    for T in sizes:
        steps = {}
        for mode in modes:
            torch.manual_seed(0)
            cfg = TrainConfig.build(T=T, mode=mode)
            model = Model(model_config(cfg, vocab))
            optimizer = build_optimizer(model, cfg)
            x, y = torch.randint(0, vocab, (batch, T)), torch.randint(0, vocab, (batch, T))

            def step(model=model, optimizer=optimizer, x=x, y=y):
                loss = loss_fn(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            steps[mode] = step
        rows.append({"T": T, **medians(interleaved(steps, rounds=rounds, warmup=warmup))})
    return rows


def training_step_table(rows: list[dict]) -> str:
    """:func:`training_step_rows` as a Markdown table: ms per mode and each mode's ratio to softmax."""
    modes = [m for m in rows[0] if m != "T"]
    others = [m for m in modes if m != "softmax"]
    lines = ["| T | " + " | ".join(f"{m} ms" for m in modes) + " | " + " | ".join(f"{m} vs softmax" for m in others)
             + " |", "|---" * (1 + len(modes) + len(others)) + "|"]
    for r in rows:
        lines.append(f"| {r['T']} | " + " | ".join(f"{1e3 * r[m]:.2f}" for m in modes) + " | "
                     + " | ".join(f"{r[m] / r['softmax']:.2f}x" for m in others) + " |")
    return "\n".join(lines)


COMPILED_MODES = {"softmax": {"mode": "softmax"}, "h": {"mode": "h"}, "h+J": {"mode": "h+J"},
                  "window": {"mode": "h+J", "coupling": "window", "coupling_window": 4},
                  "configurations": {"mode": "h+J", "method": "configurations"},
                  "keys": {"mode": "h+J", "coupling": "keys", "coupling_rank": 16},
                  "query": {"mode": "h+J", "coupling": "query", "coupling_rank": 16}}


def inductor_cache_state() -> str:
    """Where torch.compile's inductor cache is and whether it held anything at the start: the first compiled
    step is cold only with an empty one (run with TORCHINDUCTOR_CACHE_DIR set to a new folder for that)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = Path(cache_dir())
    empty = not folder.exists() or not any(folder.iterdir())
    return f"{folder} ({'empty at the start: cold' if empty else 'in use before: warm'})"


def compiled_step_rows(sizes=(8, 16), modes=tuple(COMPILED_MODES), batch: int = 64, rounds: int = 7,
                       vocab: int = 65, threads: int = 1, warmup: int = 2) -> list[dict]:
    """The training step of the paper's model eager and under ``torch.compile(model, fullgraph=True)``, per mode
    and context length T: the same step as :func:`training_step_rows` (the optimiser and clipping stay eager), both
    variants of every mode interleaved step by step. 'window' is the coupled window of min(4, T) keys. Method
    'exact' and the window's marginals are opaque operators to the compiler, solved once per compiled step
    (the backward differentiates the graph the forward kept; see ising/opaque.py). Returns one {T, mode,
    eager, compiled, compile_s} per mode and T: median seconds per step, and the wall time of the first
    compiled step (compilation included)."""
    torch.set_num_threads(threads)
    rows = []
    for T in sizes:
        for mode in modes:
            layer = dict(COMPILED_MODES[mode])
            if "coupling_window" in layer:
                layer["coupling_window"] = min(layer["coupling_window"], T)
            steps, compile_s = {}, None
            for variant in ("eager", "compiled"):
                torch.manual_seed(0)
                cfg = TrainConfig.build(T=T, **layer)
                model = Model(model_config(cfg, vocab))
                optimizer = build_optimizer(model, cfg)
                forward = torch.compile(model, fullgraph=True) if variant == "compiled" else model
                x, y = torch.randint(0, vocab, (batch, T)), torch.randint(0, vocab, (batch, T))

                def step(model=model, forward=forward, optimizer=optimizer, x=x, y=y):
                    loss = loss_fn(forward(x), y)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                if variant == "compiled":
                    start = time.perf_counter()
                    step()
                    compile_s = time.perf_counter() - start
                steps[variant] = step
            times = medians(interleaved(steps, rounds=rounds, warmup=warmup))
            rows.append({"T": T, "mode": mode, **times, "compile_s": compile_s})
    return rows


def compiled_step_table(rows: list[dict]) -> str:
    """:func:`compiled_step_rows` as a Markdown table: eager and compiled ms, their ratio, the first compiled
    step's wall time."""
    lines = ["| T | mode | eager ms | compiled ms | compiled / eager | first compiled step s |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['T']} | {r['mode']} | {1e3 * r['eager']:.2f} | {1e3 * r['compiled']:.2f} | "
                     f"{r['compiled'] / r['eager']:.2f}x | {r['compile_s']:.1f} |")
    return "\n".join(lines)


def time_steps(configs: dict[str, TrainConfig], steps: int = 10, rounds: int = 3, warmup: int = 2,
               threads: int = 1) -> dict[str, list[float]]:
    """Seconds per training step of each config, side by side in this process: each is built (as a run
    builds it) and makes ``warmup`` steps, then in each of ``rounds`` rounds every config in turn makes
    ``steps`` steps, so that a change in the machine's load hits them alike. Returns {name: [seconds per
    step, one per round]}. Sets torch's threads to ``threads``."""
    torch.set_num_threads(threads)
    runs = {name: setup_run(cfg) for name, cfg in configs.items()}

    def stepper(name: str):
        task, model, optimizer, _, generator = runs[name]
        cfg = configs[name]
        return lambda: train_step(model, model, optimizer, *task.batch(cfg.batch_size, generator), cfg)

    return interleaved({name: stepper(name) for name in runs}, rounds=rounds, warmup=warmup, calls=steps)


def timing_table(times: dict[str, list[float]], reference: str = "softmax") -> str:
    """``time_steps``'s measurement as text: ms per step (median of the rounds, and their range) and the
    ratio of the medians to ``reference``'s."""
    ref = statistics.median(times[reference]) if reference in times else None
    width = max([32] + [len(name) for name in times])
    lines = []
    for name, values in times.items():
        m = statistics.median(values)
        ratio = f"{m / ref:6.1f}" if ref else ""
        lines.append(f"{name:<{width}} {1000 * m:8.1f} ({1000 * min(values):.1f}-{1000 * max(values):.1f}) {ratio}")
    return "\n".join(lines)


# ---------------------------------------------------- relative couplings (banded) against h-rope, per step

RELATIVE_TARGETS = {4: 2.5, 6: 4.0}  # coupling range: the largest step time accepted, relative to h-rope's


def relative_step_configs(T: int, ranges=tuple(RELATIVE_TARGETS), batch: int = 32, layers: int = 2, heads: int = 2,
                          d_model: int = 64) -> dict[str, TrainConfig]:
    """The find-the-block task's step at context length T: h-rope (sigmoid attention with RoPE, field bias -log T)
    and h+J with relative couplings of each range b, exact by method 'banded', with RoPE."""
    base = dict(task="blocks", T=T, position="rope", batch_size=batch, n_layers=layers, n_heads=heads,
                d_model=d_model)
    configs = {"h-rope": TrainConfig.build(mode="h", field_bias_init=-math.log(T), **base)}
    for b in ranges:
        configs[f"relative {b}"] = TrainConfig.build(mode="h+J", coupling="relative", coupling_range=b,
                                                     method="banded", **base)
    return configs


def relative_step_rows(sizes=(128, 256), ranges=tuple(RELATIVE_TARGETS), steps: int = 3, rounds: int = 3,
                       warmup: int = 1, threads: int = 1, **model) -> list[dict]:
    """Seconds per training step of :func:`relative_step_configs`, interleaved per T (:func:`time_steps`).
    Returns one {T, name: median seconds, ...} per T."""
    return [{"T": T, **medians(time_steps(relative_step_configs(T, ranges, **model), steps=steps, rounds=rounds,
                                          warmup=warmup, threads=threads))} for T in sizes]


def relative_step_table(rows: list[dict]) -> str:
    """:func:`relative_step_rows` as a Markdown table: ms per step and each range's ratio to h-rope, with its
    target where one is set."""
    names = [n for n in rows[0] if n not in ("T", "h-rope")]
    lines = ["| T | h-rope ms | " + " | ".join(f"{n} ms | {n} / h-rope (target)" for n in names) + " |",
             "|---:|---:|" + "---:|---:|" * len(names)]
    for r in rows:
        cells = []
        for n in names:
            ratio, target = r[n] / r["h-rope"], RELATIVE_TARGETS.get(int(n.split()[-1]))
            verdict = f" ({'met' if ratio <= target else 'missed'}: <= {target}x)" if target else ""
            cells.append(f"{1e3 * r[n]:.1f} | {ratio:.2f}x{verdict}")
        lines.append(f"| {r['T']} | {1e3 * r['h-rope']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def relative_step_breakdown(T: int, ranges=tuple(RELATIVE_TARGETS), threads: int = 1, **model) -> list[dict]:
    """Where each config's step time goes (one profiled step after two warm-up steps, torch.profiler): the
    banded solve's forward and backward (its autograd function ``_Banded``), the rest, and the number of aten
    operator calls in the step and in the solve. Returns one {name, step_ms, banded_forward_ms,
    banded_backward_ms, rest_ms, ops, banded_ops} per config of :func:`relative_step_configs`."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    rows = []
    for name, cfg in relative_step_configs(T, ranges, **model).items():
        task, net, optimizer, _, generator = setup_run(cfg)
        for _ in range(2):
            train_step(net, net, optimizer, *task.batch(cfg.batch_size, generator), cfg)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train_step(net, net, optimizer, *task.batch(cfg.batch_size, generator), cfg)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) / 1e3
        forward = sum(e.cpu_time_total for e in events if e.key == "_Banded") / 1e3
        backward = sum(e.cpu_time_total for e in events if e.key == "_BandedBackward") / 1e3
        ops = sum(e.count for e in events if e.key.startswith("aten::"))
        rows.append({"name": name, "step_ms": total, "banded_forward_ms": forward, "banded_backward_ms": backward,
                     "rest_ms": total - forward - backward, "ops": ops})
    base = next(r["ops"] for r in rows if r["name"] == "h-rope")
    for r in rows:
        r["banded_ops"] = r["ops"] - base  # the same model and step but the solve: its operator calls
    return rows


def relative_breakdown_table(T: int, rows: list[dict]) -> str:
    lines = ["| T | config | profiled step ms | banded forward ms | banded backward ms | rest ms | aten calls | "
             "of them the solve's | µs per solve call |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        banded = r["banded_forward_ms"] + r["banded_backward_ms"]
        per_call = f"{1e3 * banded / r['banded_ops']:.1f}" if r["banded_ops"] else ""
        lines.append(f"| {T} | {r['name']} | {r['step_ms']:.1f} | {r['banded_forward_ms']:.1f} | "
                     f"{r['banded_backward_ms']:.1f} | {r['rest_ms']:.1f} | {r['ops']} | {r['banded_ops']} | "
                     f"{per_call} |")
    return "\n".join(lines)


# ------------------------------------------------------------------- a profile's grid in two source trees

# Run in a fresh interpreter with one tree's src on its path; uses only names every tree provides.
GRID_MEASURE = r"""
import json, pathlib, statistics, sys, time, torch
import boltzmann_attention
if not pathlib.Path(boltzmann_attention.__file__ or "/").resolve().is_relative_to(pathlib.Path(sys.argv[4]).resolve()):
    sys.exit(f"boltzmann_attention was imported from {boltzmann_attention.__path__}, not from {sys.argv[4]}")
from boltzmann_attention.experiments.model import Model, loss_fn
from boltzmann_attention.experiments.train import Task, TrainConfig, build_optimizer
torch.set_num_threads(1)
configs, steps, rounds, defaults = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[5])
nested = hasattr(TrainConfig, "build")  # a tree with the nested config (flat names through build)
if nested:
    from boltzmann_attention.experiments.config import FLAT
    from boltzmann_attention.experiments.train import model_config
known = set(FLAT) if nested else set(TrainConfig.__dataclass_fields__)
setups = []
for c in configs:  # fields this tree does not have are dropped where they hold the default, refused otherwise
    needed = {k: v for k, v in c.items() if k not in known and v != defaults.get(k)}
    if needed:
        sys.exit(f"this tree's TrainConfig has no field for {needed}")
    kept = {k: v for k, v in c.items() if k in known}
    cfg = TrainConfig.build(**kept) if nested else TrainConfig(**kept)
    task = Task(cfg)
    torch.manual_seed(0)
    model = Model(model_config(cfg, task.vocab_size) if nested else cfg.model_config(task.vocab_size))
    setups.append((cfg, task, model, build_optimizer(model, cfg), torch.Generator().manual_seed(0)))
times = [[] for _ in configs]
for r in range(rounds):  # rounds over all configurations: a burst of load hits many, not one
    for t, (cfg, task, model, opt, gen) in zip(times, setups):
        for i in range(steps + (2 if r == 0 else 0)):
            x, y = task.batch(cfg.batch_size, gen)
            start = time.perf_counter()
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip if nested else cfg.grad_clip)
            opt.step()
            if r or i >= 2:
                t.append(time.perf_counter() - start)
out = [statistics.median(t) for t in times]
print(json.dumps(out))
"""

# TrainConfig fields that change a run's numbers or length, not the cost of one of its steps
NUMBERS_ONLY = ("seed", "steps", "lr", "warmup_steps", "min_lr_ratio", "weight_decay", "eval_interval",
                "eval_windows", "coupling_lr_multiplier", "memory_probe_steps")


def step_key(cfg: TrainConfig) -> dict:
    """The fields of ``cfg`` that may change the cost of a training step (all but ``NUMBERS_ONLY``)."""
    return {k: v for k, v in cfg.flat().items() if k not in NUMBERS_ONLY}


def _defaults() -> dict:
    """TrainConfig's default of every field of :func:`step_key`."""
    return step_key(TrainConfig())


def _profile_runs(profile: str, decisions: str | None = None) -> list[tuple[str, TrainConfig]]:
    """The profile's runs under its study's decisions, or under ``decisions`` (JSON: fields that replace them)."""
    from ..studies import profile as grids  # lazily: only the profile measurements need the studies

    return [run for grid in grids(profile, decisions=decisions) for run in grid.runs()]


def grid_configurations(profile: str, decisions: str | None = None) -> tuple[list[dict], list[tuple[int, int]]]:
    """The profile's distinct step configurations (their :func:`step_key`), and per run (index of its
    configuration, its steps); ``decisions`` as in :func:`_profile_runs`."""
    configs, runs = [], []
    for _, cfg in _profile_runs(profile, decisions):
        key = step_key(cfg)
        if key not in configs:
            configs.append(key)
        runs.append((configs.index(key), cfg.steps))
    return configs, runs


def profile_step_configs(profile: str, match: str | None = None, decisions: str | None = None
                         ) -> dict[str, TrainConfig]:
    """One config per distinct step configuration of ``profile`` (the first run that has it), named by that
    run's name without its seed; with ``match``, only the names that contain it; with ``decisions`` (JSON), the
    runs under those decisions instead of the study's."""
    out, seen = {}, []
    for name, cfg in _profile_runs(profile, decisions):
        key = step_key(cfg)
        if key in seen or (match is not None and match not in name):
            continue
        seen.append(key)
        out[name.rsplit("-s", 1)[0]] = cfg
    return out


def _couplings(c: dict) -> str:
    """'full', 'relative 8', 'window 16' or 'window 16 relative'."""
    if c["coupling"] == "window":
        return f"window {c['coupling_window']}" + (" relative" if c["coupling_window_relative"] else "")
    return c["coupling"] + (f" {c['coupling_range']}" if c["coupling"] == "relative" and c["coupling_range"] else "")


def tree_commit(tree: Path) -> str:
    """The short commit of a checkout, '?' when it is not a git checkout."""
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "?"


def grid_step_times(configs: list[dict], trees: dict[str, Path], steps: int, rounds: int) -> dict[str, list[float]]:
    """Median step seconds of each configuration in each tree ({name: [one per configuration]}): one process
    per tree (its ``src`` first on the path, and the package imported from there, not from an installed
    copy), all at once, one thread each. RuntimeError naming the tree when its process fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = {}
    for name, tree in trees.items():
        argv = [GRID_MEASURE, json.dumps(configs), str(steps), str(rounds), str(tree / "src"), json.dumps(_defaults())]
        procs[name] = subprocess.Popen([sys.executable, "-c", *argv], env={**env, "PYTHONPATH": str(tree / "src")},
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, failed = {}, []
    for name, proc in procs.items():
        stdout, stderr = proc.communicate()
        if proc.returncode:
            failed.append(f"the {name} tree ({trees[name]}) failed (exit code {proc.returncode}): "
                          f"{stderr.strip().splitlines()[-1] if stderr.strip() else 'no message'}")
            continue
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    if failed:
        raise RuntimeError("; ".join(failed))
    return out


def grid_throughput_report(profile: str, before: Path, after: Path, steps: int, rounds: int, decisions: str | None,
                           stamp: dict) -> str:
    """The time ``profile``'s grid spends in training steps in two source trees, measured side by side.

    Each configuration's step is timed in both trees at once (:func:`grid_step_times`); the grid's estimate is
    the sum over runs of (steps of the run) x (median step time of its configuration): training steps only
    (no evaluation, data set-up or checkpoints), so a lower bound on a sweep's wall time."""
    configs, runs = grid_configurations(profile, decisions)
    trees = {"before": before.resolve(), "after": after.resolve()}
    start = time.time()
    step = grid_step_times(configs, trees, steps, rounds)
    lines = [stamp_line(stamp), "",
             f"Before {tree_commit(trees['before'])} ({trees['before']}), after {tree_commit(trees['after'])} "
             f"({trees['after']}); profile {profile}{'' if decisions is None else f' under decisions {decisions}'}, "
             f"{len(runs)} runs in {len(configs)} configurations, median of "
             f"{rounds} rounds x {steps} steps, 1 thread per process, both processes at once; load average "
             f"{os.getloadavg()[0]:.2f} at the end; {time.time() - start:.0f} s", "",
             "| task | T | mode | method | couplings | d_ff | before ms | after ms | after / before |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, c in enumerate(configs):
        b, a = step["before"][i], step["after"][i]
        lines.append(f"| {c['task']} | {c['T']} | {c['mode']} | {c['method']} | {_couplings(c)} | {c['d_ff']} | "
                     f"{1e3 * b:.2f} | {1e3 * a:.2f} | {a / b:.2f}x |")
    total = {name: sum(n * s[i] for i, n in runs) for name, s in step.items()}
    lines += ["", f"Grid's training steps, summed over runs: before {total['before'] / 3600:.2f} h, after "
              f"{total['after'] / 3600:.2f} h ({total['after'] / total['before']:.2f}x); with 2 jobs the wall time "
              f"is about half: {total['before'] / 7200:.2f} h and {total['after'] / 7200:.2f} h.",
              "Median step ratio over configurations: "
              f"{statistics.median(a / b for a, b in zip(step['after'], step['before'])):.2f}x"]
    return "\n".join(lines)
