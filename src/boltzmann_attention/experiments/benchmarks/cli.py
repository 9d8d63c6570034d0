"""The boltzmann-attention-bench command: every benchmark of the package, one subcommand each.

    boltzmann-attention-bench methods [--quick | --targets | --smoke] [--threads N] [--json PATH]
    boltzmann-attention-bench steps [--sizes T ...] [--batch N] [--compiled] | steps --profile NAME [--match TEXT]
    boltzmann-attention-bench approximations [--only accuracy | scaling] [--plot PNG] [--json PATH]
    boltzmann-attention-bench window [--T N] [--B N] [--W N] [--threads N ...] [--repeats N]
    boltzmann-attention-bench window-paths [--W N ...] [--B N] [--H N] [--T N] [--rounds N] [--threads N]
    boltzmann-attention-bench chain-scan [--chunks N ...] [--B N] [--H N] [--T N] [--w N] [--rounds N]
    boltzmann-attention-bench gpu [--dry-run] [--out DIR] [--T N ...] [--budget-s S] [--commit HASH]
    boltzmann-attention-bench banded [--baseline COMMIT] [--T N] [--heads N] [--d-model N]
    boltzmann-attention-bench relative-steps [--sizes T ...] [--ranges b ...] [--breakdown] [--batch N] [--layers N]
    boltzmann-attention-bench grid-throughput --before CHECKOUT [--after CHECKOUT] [--profile NAME]
    boltzmann-attention-bench dqa-calibration DIR [--quick]
    boltzmann-attention-bench qpu DIR [--quick]

Every table starts with the stamp (machine, threads, load, torch, python, commit, time); every ratio in it is
between rows measured in the same run. Arguments and output paths are checked before anything is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from ...provenance import package_version
from ..tables import plural
from ..train import check_output_path
from . import approximations, chain_scan, dqa, gpu, layers, training, window_paths
from .common import machine_stamp, stamp_line

NO_MATPLOTLIB = '--plot needs matplotlib: pip install -e ".[experiments]"'


DECISIONS_HELP = ("decisions that replace the profile's study's own, as a JSON object, to time the runs they would "
                  "add, e.g. '{\"CHOSEN\": 2}' for every arm at a calibrated study's setting 2 (default: the "
                  "study's decisions.json)")

def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _command(sub, name: str, text: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="boltzmann-attention-bench", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:13]))
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _command(sub, "methods", "fwd+bwd time and peak memory of each marginal method inside attention, the "
                                 "paper model's training step per mode, and the speed targets")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes, about a minute (default: off)")
    size.add_argument("--targets", action="store_true",
                      help="only the rows the targets need (exact T = 16, 20, 24, naive T = 16) and the training "
                           "steps at T = 4, 8, 12, 16 (default: off)")
    size.add_argument("--smoke", action="store_true",
                      help="the tiniest case of every kind of row, seconds: checks the command, measures nothing "
                           "(default: off)")
    p.add_argument("--no-steps", action="store_true", help="skip the training-step table (default: off)")
    p.add_argument("--threads", type=positive_int, default=2,
                   help="torch threads per measured process; 1 on a machine shared with other jobs, where two "
                        "processes of 2 threads on 2 cores spin (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the results to this JSON file (default: none)")

    p = _command(sub, "steps", "training steps side by side: the paper's model per mode and context length T, or with "
                               "--profile every distinct step configuration of a profile's runs")
    p.add_argument("--profile", help="time this profile's step configurations instead (default: none, the paper's "
                                     "model)")
    p.add_argument("--match", metavar="TEXT",
                   help="with --profile: only the configurations whose run name contains TEXT (default: all)")
    p.add_argument("--decisions", metavar="JSON", help="with --profile: " + DECISIONS_HELP)
    p.add_argument("--sizes", type=positive_int, nargs="+", default=list(range(4, 17)),
                   help="without --profile: the context lengths T (default: 4 to 16)")
    p.add_argument("--batch", type=positive_int, default=64,
                   help="without --profile: batch size (default: %(default)s)")
    p.add_argument("--steps", type=positive_int, default=10,
                   help="with --profile: steps per configuration and round (default: %(default)s)")
    p.add_argument("--warmup", type=positive_int, default=2,
                   help="warm-up steps per configuration (default: %(default)s)")
    p.add_argument("--rounds", type=positive_int,
                   help="interleaved rounds over all candidates (default: 7, with --profile 3)")
    p.add_argument("--compiled", action="store_true",
                   help="without --profile: each mode (softmax, h, h+J, a coupled window of 4, h+J by method "
                        "configurations, couplings from keys and from the query) eager against "
                        "torch.compile(fullgraph=True), interleaved (default: off)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the times to this JSON file (default: none)")

    p = _command(sub, "approximations", "marginal error against exact and wall time of every method, and forward "
                                        "time against n for the methods that scale")
    p.add_argument("--only", choices=("accuracy", "scaling"),
                   help="only one of the two tables (default: both)")
    p.add_argument("--smoke", action="store_true",
                   help="n = 4 (accuracy) and 6, 12 (scaling), 2 queries: checks the command (default: off)")
    p.add_argument("--threads", type=positive_int, default=2, help="torch threads (default: %(default)s)")
    p.add_argument("--plot", metavar="PNG", help="also plot the tables into this PNG file (default: none)")
    p.add_argument("--json", metavar="PATH", help="also write the rows to this JSON file (default: none)")

    for name, text in (("window", "the coupled window and Toeplitz mean field / TAP layers against mode h, "
                                  "their solver iterations, and their errors against banded exact"),
                       ("banded", "mode h against the banded exact layer (range 8), optionally against "
                                  "ising/banded.py of an earlier commit")):
        p = _command(sub, name, text)
        p.add_argument("--T", type=positive_int, default=1024, help="sequence length (default: %(default)s)")
        p.add_argument("--B", type=positive_int, default=8, help="batch size (default: %(default)s)")
        p.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2],
                       help="torch thread counts, one table column each (default: 1 2)")
        p.add_argument("--repeats", type=positive_int, default=5,
                       help="alternating rounds of one step per layer (default: %(default)s)")
        p.add_argument("--json", metavar="PATH", help="also write the times to this JSON file (default: none)")
        if name == "window":
            p.add_argument("--W", type=positive_int, default=16, help="coupled window length (default: %(default)s)")
            p.add_argument("--no-accuracy", action="store_true",
                           help="skip the error table against banded exact (default: off)")
        else:
            p.add_argument("--baseline", metavar="COMMIT",
                           help="also time the layer through ising/banded.py as it was at COMMIT of the git "
                                "repository of the current folder (default: none)")
            p.add_argument("--heads", type=positive_int, default=1, help="heads of both layers (default: %(default)s)")
            p.add_argument("--d-model", type=positive_int, default=64,
                           help="model width of both layers (default: %(default)s)")

    p = _command(sub, "window-paths", "the coupled window's two exact paths (split enumeration, configurations "
                                      "through SDPA) side by side, fwd+bwd, per W: the measurements of the rule "
                                      "ising.window.choose_path")
    p.add_argument("--W", type=positive_int, nargs="+", default=list(range(4, 17, 2)),
                   help="window lengths (default: 4 6 ... 16)")
    p.add_argument("--B", type=positive_int, default=12, help="batch size (default: %(default)s)")
    p.add_argument("--H", type=positive_int, default=4, help="heads (default: %(default)s)")
    p.add_argument("--T", type=positive_int, default=256, help="sequence length (default: %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=3,
                   help="interleaved rounds after one warm-up call each (default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the rows to this JSON file (default: none)")

    p = _command(sub, "chain-scan", "method chain's two forms (sequential recursion, chunked scan) side by side, "
                                    "fwd+bwd of the marginals with couplings per query, per chunk length")
    p.add_argument("--chunks", type=positive_int, nargs="+", default=[4, 8, 16],
                   help="chunk lengths (default: 4 8 16)")
    p.add_argument("--B", type=positive_int, default=8, help="batch size (default: %(default)s)")
    p.add_argument("--H", type=positive_int, default=2, help="heads (default: %(default)s)")
    p.add_argument("--T", type=positive_int, default=52, help="sequence length (default: %(default)s)")
    p.add_argument("--w", type=positive_int, default=4, help="coupling range, the band's width (default: %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=3,
                   help="interleaved rounds after one warm-up call each (default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the rows to this JSON file (default: none)")

    p = _command(sub, "gpu", "the GPU check: the CUDA tests, then fwd+bwd of each layer against SDPA (flash) at T = "
                             "1024 to 8192, into report/benchmark/gpu.md; under 8 minutes on one GPU")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny sizes on the CPU, tests only collected, into a temporary folder: seconds, checks the "
                        "command (default: off)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="folder of gpu.md and gpu.json (default: report/benchmark, with --dry-run a temporary one)")
    p.add_argument("--T", type=positive_int, nargs="+", help="sequence lengths (default: 1024 2048 4096 8192)")
    p.add_argument("--budget-s", type=positive_int, default=290,
                   help="seconds of timings after which the remaining cells are not run (default: %(default)s)")
    p.add_argument("--cell-s", type=positive_int, default=30,
                   help="a layer is not run at 2T when its cell there (4 times a call at T, for the warm-up and each "
                        "repeat) would take longer than this (default: %(default)s)")
    p.add_argument("--tests-s", type=positive_int, default=120,
                   help="time limit of the CUDA tests' pytest run (default: %(default)s)")
    p.add_argument("--commit", help="the commit to stamp where the checkout has no git history (default: git's)")

    p = _command(sub, "relative-steps", "training steps of the find-the-block model: h+J with relative couplings "
                                        "(exact by method 'banded') against h-rope, interleaved, with the speed "
                                        "targets (range 4 <= 2.5x, range 6 <= 4x)")
    p.add_argument("--sizes", type=positive_int, nargs="+", default=[128, 256],
                   help="context lengths T (default: 128 256)")
    p.add_argument("--ranges", type=positive_int, nargs="+", default=[4, 6],
                   help="coupling ranges b (default: 4 6)")
    p.add_argument("--batch", type=positive_int, default=32, help="batch size (default: %(default)s)")
    p.add_argument("--layers", type=positive_int, default=2, help="transformer blocks (default: %(default)s)")
    p.add_argument("--heads", type=positive_int, default=2, help="attention heads (default: %(default)s)")
    p.add_argument("--d-model", type=positive_int, default=64, help="model width (default: %(default)s)")
    p.add_argument("--breakdown", action="store_true",
                   help="also profile one step of each: the banded solve's share and its operator calls "
                        "(default: off)")
    p.add_argument("--steps", type=positive_int, default=3,
                   help="steps per configuration and round (default: %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=3,
                   help="interleaved rounds over the configurations (default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the rows to this JSON file (default: none)")

    p = _command(sub, "grid-throughput", "the time a profile's grid spends in training steps, in two source trees "
                                         "side by side (two processes at once, one thread each)")
    p.add_argument("--before", type=Path, required=True, metavar="CHECKOUT",
                   help="checkout of the old version, a folder with src/boltzmann_attention (required)")
    p.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[4], metavar="CHECKOUT",
                   help="checkout of the new version (default: the one this command runs from)")
    p.add_argument("--profile", default="full", help="the profile whose grid is timed (default: %(default)s)")
    p.add_argument("--decisions", metavar="JSON", help=DECISIONS_HELP)
    p.add_argument("--steps", type=positive_int, default=6,
                   help="timed steps per configuration and round (default: %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=5,
                   help="rounds over all configurations (default: %(default)s)")

    p = _command(sub, "dqa-calibration", "DQA's effective temperature and its calibration to exp(-E), written to "
                                         "DIR/README.md, calibration.png and calibration.json")
    p.add_argument("dir", metavar="DIR", help="output folder, created if missing (required)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and anneal times: a smoke test (default: off)")

    p = _command(sub, "qpu", "the QPU path: windows tiled per call on production-size Zephyr and Pegasus graphs, the "
                             "temperature calibration and chain breaks on the mock with this package's physics, reads "
                             "for a marginal error, and seconds per token against T for every path (QPU from "
                             "D-Wave's published timing), written to DIR/README.md, qpu.png and qpu.json; needs the "
                             "[qpu] extra")
    p.add_argument("dir", metavar="DIR", help="output folder, created if missing (required)")
    p.add_argument("--quick", action="store_true", help="small graphs, few reads and sizes: a smoke test of seconds "
                                                        "(default: off)")
    return parser


def _check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every output path writable (its folder created) and matplotlib present for --plot, before any work."""
    for flag in ("json", "plot"):
        path = getattr(args, flag, None)
        if path is not None:
            try:
                check_output_path(path, f"--{flag} file")
            except ValueError as e:
                parser.error(str(e))
    if getattr(args, "plot", None) is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(NO_MATPLOTLIB, file=sys.stderr)
            sys.exit(2)
    if args.command in ("dqa-calibration", "qpu"):
        try:
            check_output_path(Path(args.dir) / "README.md", f"{args.command} report")
        except ValueError as e:
            parser.error(str(e))
    if args.command == "qpu":
        try:
            import dwave.system  # noqa: F401
            import minorminer  # noqa: F401
        except ImportError:
            print('qpu needs D-Wave\'s packages: pip install -e ".[qpu]"', file=sys.stderr)
            sys.exit(2)
    if args.command == "grid-throughput":
        for flag in ("before", "after"):
            tree = getattr(args, flag)
            if not (tree / "src" / "boltzmann_attention").is_dir():
                parser.error(f"--{flag} {tree}: not a checkout of this project (no src/boltzmann_attention)")
    if args.command in ("grid-throughput", "steps") and args.profile is not None:
        from ..studies import profile, profiles

        if args.profile not in profiles():
            parser.error(f"--profile {args.profile!r}: choose one of {', '.join(profiles())}")
        if args.decisions is not None:
            try:
                profile(args.profile, decisions=args.decisions)
            except ValueError as e:
                parser.error(f"--decisions: {e}")
    if args.command == "steps" and args.profile is None and (args.match, args.decisions) != (None, None):
        parser.error("--match and --decisions apply with --profile only")
    if args.command == "steps" and args.profile is not None and args.compiled:
        parser.error("--compiled applies without --profile only")


def _write_json(path: str | None, data: dict, indent: int | None = 1) -> None:
    if path is not None:
        with open(path, "w") as f:
            json.dump(data, f, indent=indent)


def run_methods(args) -> None:
    stamp = machine_stamp(args.threads)
    step_options = {"sizes": (4, 8, 12, 16) if args.quick or args.targets else range(4, 17)}
    if args.smoke:
        cases, step_options = layers.smoke_cases(), {"sizes": (4,), "rounds": 1, "batch": 4}
    else:
        cases = layers.target_cases() if args.targets else layers.default_cases(args.quick)
    results = []
    for case in cases:
        results.append(layers.run_case(case, args.threads))
        r = results[-1]
        print(f"  {case.method:9s} T={case.T:<5d} B={case.B:<3d} causal={case.causal!s:5s} "
              f"{1e3 * r.seconds:9.1f} ms {r.peak_mb:7.0f} MB", flush=True)
    steps = None if args.no_steps else training.training_step_rows(**step_options)
    print()
    print(layers.format_table(results, stamp))
    if steps:
        print(f"\nTraining step of the paper's model (batch {step_options.get('batch', 64)}, 1 thread), median "
              "wall ms, modes interleaved:\n")
        print(training.training_step_table(steps))
    print("\nTargets, ratios of this run:\n")
    print("\n".join(layers.target_lines(results, steps)) or "(no target's rows were measured)")
    _write_json(args.json, {"machine": stamp, "results": [asdict(r) for r in results], "steps": steps})


def run_steps(args) -> None:
    stamp = machine_stamp(args.threads)
    args.rounds = args.rounds or (7 if args.profile is None else 3)
    if args.profile is None and args.compiled:
        cache = training.inductor_cache_state()
        rows = training.compiled_step_rows(sizes=args.sizes, batch=args.batch, rounds=args.rounds,
                                           threads=args.threads, warmup=args.warmup)
        print(stamp_line(stamp))
        print(f"Training step of the paper's model (batch {args.batch}), eager against torch.compile(fullgraph=True), "
              f"median of {args.rounds} interleaved rounds after the warm-up, wall ms; the first compiled step's "
              f"seconds with the inductor cache {cache}:\n")
        print(training.compiled_step_table(rows))
        _write_json(args.json, {"machine": stamp, "compiled_steps": rows})
        return
    if args.profile is None:
        rows = training.training_step_rows(sizes=args.sizes, batch=args.batch, rounds=args.rounds,
                                           threads=args.threads, warmup=args.warmup)
        print(stamp_line(stamp))
        print(f"Training step of the paper's model (batch {args.batch}), median of {args.rounds} interleaved rounds "
              "after the warm-up, wall ms:\n")
        print(training.training_step_table(rows))
        _write_json(args.json, {"machine": stamp, "steps": rows})
        return
    configs = training.profile_step_configs(args.profile, args.match, args.decisions)
    if not configs:
        sys.exit(f"no run of profile {args.profile} matches {args.match!r}")
    times = training.time_steps(configs, steps=args.steps, rounds=args.rounds, warmup=args.warmup,
                                threads=args.threads)
    reference = next((name for name, cfg in configs.items() if cfg.attention.mode == "softmax"), next(iter(configs)))
    print(stamp_line(stamp))
    schedule = (f"{plural(args.warmup, 'warm-up step')} each, then {plural(args.rounds, 'interleaved round')} of "
                f"{plural(args.steps, 'step')}")
    print(f"Profile {args.profile}: {plural(len(configs), 'step configuration')}, {schedule}; ms per step, median "
          f"of the rounds (their range), and the ratio to {reference}\n")
    print(training.timing_table(times, reference))
    _write_json(args.json, {"machine": stamp, "seconds_per_step": times})


def run_approximations(args) -> None:
    stamp = machine_stamp(args.threads)
    print(stamp_line(stamp) + "\n")
    accuracy_options = {"sizes": (4,), "queries": 2} if args.smoke else {}
    scaling_options = {"sizes": (6, 12), "queries": 2, "bandwidth": 2, "budget_s": 0.0} if args.smoke else {}
    accuracy = scaling = None
    if args.only in (None, "accuracy"):
        accuracy = approximations.accuracy_rows(**accuracy_options, threads=args.threads)
        print(approximations.accuracy_table(accuracy) + "\n", flush=True)
    if args.only in (None, "scaling"):
        scaling = approximations.scaling_rows(**scaling_options, threads=args.threads)
        print(approximations.scaling_table(scaling) + "\n", flush=True)
    if args.plot:
        approximations.plot_rows(accuracy, scaling, args.plot)
    _write_json(args.json, {"machine": stamp, "accuracy": accuracy, "scaling": scaling})


def run_window(args) -> None:
    banded = args.command == "banded"
    heads, d_model = (args.heads, args.d_model) if banded else (1, 64)
    stamp = machine_stamp(" / ".join(map(str, args.threads)))
    rows = {t: layers.window_times(args.T, args.B, getattr(args, "W", 16), t, args.repeats,
                                   getattr(args, "baseline", None), banded, heads, d_model) for t in args.threads}
    print(stamp_line(stamp))
    print(f"T = {args.T}, B = {args.B}, d_model {d_model}, {heads} head{'s' if heads > 1 else ''}, causal, float32, "
          f"fwd+bwd, median of {args.repeats} alternating rounds, ratios to mode h at the same thread count; "
          f"load average {os.getloadavg()[0]:.1f} at the end\n")
    print(layers.window_table(rows))
    _write_json(args.json, {"machine": stamp, "settings": {k: v for k, v in vars(args).items() if k != "json"},
                            "seconds": rows})
    if banded:
        return
    print(f"\nMean field / TAP solver on the layer's field (B = {args.B}, 1 thread): tol 1e-6, max over the causal "
          "row chunks\n")
    print("| layer | forward iterations | residual | backward iterations | residual |\n|---|---:|---:|---:|---:|")
    print("\n".join(layers.solver_iterations(args.T, args.B)))
    if args.no_accuracy:
        return
    print(f"\nWeights against method 'banded' (exact) at the same J, T = {args.T}, B = 1, h = q.k / 8 - 1 "
          f"(q, k ~ N(0, 1)), J_d = std N(0, 1) for d <= {layers.RANGE}; iterations (max 500) and the share of "
          f"queries that reached tol 1e-6\n")
    print("| coupling std | method | solver | iterations | converged | max error | mean error |\n"
          "|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(layers.window_errors(args.T)))


def run_chain_scan(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    stamp = machine_stamp(args.threads)
    rows = chain_scan.scan_rows(tuple(args.chunks), args.B, args.H, args.T, args.w, args.rounds)
    print(stamp_line(stamp))
    print(f"Method chain, B = {args.B}, H = {args.H}, T = {args.T} (a chain per query, causal), band width {args.w}, "
          f"float32, fwd+bwd of the marginals; median of {plural(args.rounds, 'interleaved round')}, wall ms; load "
          "average at the end of each row\n")
    print(chain_scan.scan_table(rows))
    _write_json(args.json, {"machine": stamp, "rows": rows})


def run_window_paths(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    stamp = machine_stamp(args.threads)
    rows = window_paths.path_rows(tuple(args.W), args.B, args.H, args.T, args.rounds)
    print(stamp_line(stamp))
    print(f"Coupled window, B = {args.B}, H = {args.H}, T = {args.T}, head dim 16, float32, causal, fwd+bwd; median "
          f"of {plural(args.rounds, 'interleaved round')}, wall ms; load average at the end of each row\n")
    print(window_paths.path_table(rows))
    _write_json(args.json, {"machine": stamp, "rows": rows})


def run_gpu(args) -> None:
    settings = gpu.dry_settings(args.out) if args.dry_run else gpu.Settings()
    if args.out is not None:
        settings.out = args.out
    if args.T is not None:
        settings.sizes = tuple(args.T)
    if not args.dry_run:
        settings.budget_s, settings.cell_s, settings.tests_s = args.budget_s, args.cell_s, args.tests_s
    settings.commit = args.commit
    gpu.run(settings)


def run_relative_steps(args) -> None:
    stamp = machine_stamp(args.threads)
    rows = training.relative_step_rows(sizes=args.sizes, ranges=args.ranges, steps=args.steps, rounds=args.rounds,
                                       threads=args.threads, batch=args.batch, layers=args.layers, heads=args.heads,
                                       d_model=args.d_model)
    print(stamp_line(stamp))
    print(f"Training step of the find-the-block model ({plural(args.layers, 'layer')}, "
          f"{plural(args.heads, 'head')}, d_model {args.d_model}, batch {args.batch}, RoPE), median of "
          f"{plural(args.rounds, 'interleaved round')} of {plural(args.steps, 'step')}, wall ms:\n")
    print(training.relative_step_table(rows))
    breakdown = {}
    if args.breakdown:
        print("\nOne profiled step each (torch.profiler, after two warm-up steps): the banded solve's forward and "
              "backward, the rest of the step, and aten operator calls (the solve's: the step's less h-rope's):\n")
        for T in args.sizes:
            breakdown[T] = training.relative_step_breakdown(T, args.ranges, threads=args.threads, batch=args.batch,
                                                           layers=args.layers, heads=args.heads, d_model=args.d_model)
            print(training.relative_breakdown_table(T, breakdown[T]))
    _write_json(args.json, {"machine": stamp, "relative_steps": rows, "breakdown": breakdown})


def run_grid_throughput(args) -> None:
    print(training.grid_throughput_report(args.profile, args.before, args.after, args.steps, args.rounds,
                                          args.decisions, machine_stamp(1)))


def run_dqa_calibration(args) -> None:
    dqa.write_dqa_calibration(args.dir, quick=args.quick)
    print(f"wrote {Path(args.dir) / 'README.md'}")


def run_qpu(args) -> None:
    from . import qpu

    qpu.write_qpu_report(args.dir, quick=args.quick)
    print(f"wrote {Path(args.dir) / 'README.md'}")


COMMANDS = {"methods": run_methods, "steps": run_steps, "approximations": run_approximations, "window": run_window,
            "banded": run_window, "window-paths": run_window_paths, "chain-scan": run_chain_scan,
            "gpu": run_gpu,
            "relative-steps": run_relative_steps, "grid-throughput": run_grid_throughput,
            "dqa-calibration": run_dqa_calibration, "qpu": run_qpu}


def main(argv=None) -> None:
    """Exit status 2 with one line for a bad argument (a ValueError), 1 with one line for any other error, 130 on
    Ctrl-C."""
    from ..cli import one_line

    parser = build_parser()
    args = parser.parse_args(argv)
    _check_outputs(parser, args)
    try:
        COMMANDS[args.command](args)
    except ValueError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - a failed measurement: one line, not a traceback
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
