"""Experiment throughput before and after (issue 13): the time a profile's grid spends in training steps,
for two source trees measured side by side.

    python scripts/grid_throughput.py --before /path/to/old/checkout [--profile full] [--steps 30]

The profile's runs are grouped into configurations (task, T, mode, variant overrides); each configuration's
training step (a batch from the task's own data, forward, loss, backward, gradient clipping and the
optimiser of ``experiments.train.build_optimizer``) is timed in two processes at once, one per tree, one
thread each: the setting under which the sweep runs two jobs on the 2 cores. The grid's estimate is
sum over runs of (steps of the run) x (median step time of its configuration); evaluation, data set-up and
checkpoints are left out, so it is a lower bound on a sweep's wall time (which is this sum over 2 jobs).
The trees must both provide ``TrainConfig``, ``Task``, ``build_optimizer`` and ``loss_fn``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

MEASURE = r"""
import json, statistics, sys, time, torch
from boltzmann_attention.experiments.model import Model, loss_fn
from boltzmann_attention.experiments.train import Task, TrainConfig, build_optimizer
torch.set_num_threads(1)
configs, steps, rounds = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
setups = []
for c in configs:
    cfg = TrainConfig(**c)
    task = Task(cfg)
    torch.manual_seed(0)
    model = Model(cfg.model_config(task.vocab_size))
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
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            if r or i >= 2:
                t.append(time.perf_counter() - start)
out = [statistics.median(t) for t in times]
print(json.dumps(out))
"""

# TrainConfig fields that change the step's cost (the rest, e.g. lr, only its numbers)
COST_FIELDS = ("task", "T", "mode", "method", "d_model", "n_heads", "n_layers", "d_ff", "batch_size")


def configurations(profile: str) -> tuple[list[dict], list[tuple[int, int]]]:
    """The profile's distinct step configurations, and per run (index of its configuration, its steps)."""
    from boltzmann_attention.experiments.studies import profile as grids

    configs, runs = [], []
    for grid in grids(profile):
        for _, cfg in grid.runs():
            key = {f: getattr(cfg, f) for f in COST_FIELDS}
            if key not in configs:
                configs.append(key)
            runs.append((configs.index(key), cfg.steps))
    return configs, runs


def commit(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the old version")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1],
                        help="checkout of the new version (default: this one)")
    parser.add_argument("--profile", default="full")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over all configurations")
    args = parser.parse_args()
    configs, runs = configurations(args.profile)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.time()
    procs = {name: subprocess.Popen([sys.executable, "-c", MEASURE, json.dumps(configs), str(args.steps),
                                     str(args.rounds)],
                                    env={**env, "PYTHONPATH": str(tree / "src")}, stdout=subprocess.PIPE,
                                    text=True)
             for name, tree in trees.items()}
    step = {}
    for name, proc in procs.items():
        stdout, _ = proc.communicate()
        if proc.returncode:
            sys.exit(f"the {name} tree ({trees[name]}) failed")
        step[name] = json.loads(stdout.strip().splitlines()[-1])
    import torch
    print(f"machine {platform.machine()} ({os.cpu_count()} cpus), torch {torch.__version__}, before "
          f"{commit(trees['before'])}, after {commit(trees['after'])}, profile {args.profile}, "
          f"{len(runs)} runs in {len(configs)} configurations, median of {args.rounds} rounds x {args.steps} "
          f"steps, 1 thread per process, both processes at once; load average {os.getloadavg()[0]:.2f} at the end; "
          f"{time.time() - start:.0f} s\n")
    print("| task | T | mode | d_ff | before ms | after ms | after / before |\n|---|---|---|---|---|---|---|")
    for i, c in enumerate(configs):
        b, a = step["before"][i], step["after"][i]
        print(f"| {c['task']} | {c['T']} | {c['mode']} | {c['d_ff']} | {1e3 * b:.2f} | {1e3 * a:.2f} | "
              f"{a / b:.2f}x |")
    total = {name: sum(steps * s[i] for i, steps in runs) for name, s in step.items()}
    print(f"\nGrid's training steps, summed over runs: before {total['before'] / 3600:.2f} h, after "
          f"{total['after'] / 3600:.2f} h ({total['after'] / total['before']:.2f}x); with 2 jobs the wall time "
          f"is about half: {total['before'] / 7200:.2f} h and {total['after'] / 7200:.2f} h.")
    print(f"Median step ratio over configurations: "
          f"{statistics.median(a / b for a, b in zip(step['after'], step['before'])):.2f}x")


if __name__ == "__main__":
    main()
