"""The boltzmann-attention command: train one model, sweep a grid, write a report, or reproduce a profile.

Every result is a JSON file with the resolved config, metrics, history, learned couplings, wall time and
provenance (machine, torch version, commit). Sweeps skip finished runs and resume killed ones.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import MISSING, fields
from pathlib import Path

from .. import ising
from ..attention import MODES
from .model import INITS
from .sweep import DEFAULT_FIELD_BIAS, FIELD_BIASES, PAPER_FIELD_BIAS
from .train import COUPLINGS, TASKS, TrainConfig

EXPERIMENTS_EXTRA = 'pip install -e ".[experiments]"'

# Valid values and help of every TrainConfig field shown by `train` (and by `sweep --set`).
CHOICES = {"task": TASKS, "mode": MODES, "method": tuple(sorted(ising.METHODS)), "coupling": COUPLINGS, "init": INITS}
HELP = {
    "task": "the task",
    "T": "window length: the number of keys (spins) per query",
    "mode": "attention mode (softmax; h: sigmoid attention; J: couplings only; h+J: Boltzmann attention; "
            "h+K, h+J+K: three-body couplings)",
    "method": "how the marginals are computed (see the README's methods table)",
    "seed": "fixes the initialisation and the data order",
    "steps": "optimiser steps",
    "batch_size": "sequences per step",
    "lr": "peak learning rate (AdamW)",
    "warmup_steps": "linear warm-up steps, then cosine decay to min_lr_ratio * lr",
    "min_lr_ratio": "final learning rate as a fraction of lr",
    "weight_decay": "AdamW weight decay on weight matrices (never on J, K or the field bias)",
    "grad_clip": "gradient-norm clipping threshold",
    "eval_interval": "steps between validation evaluations",
    "eval_windows": "Shakespeare: number of fixed validation windows",
    "d_model": "model width",
    "n_heads": "attention heads",
    "n_layers": "transformer blocks",
    "d_ff": "FFN width; 0 removes the FFN",
    "coupling": "full: a free J for every pair of positions; relative: J = f(|j - k|); window: J between the "
                "last coupling_window keys of each query, by slot (method exact, any T)",
    "coupling_range": "relative: J = 0 beyond this distance (none: T - 1)",
    "coupling_window": "window: the number W of coupled keys of each query (none unless coupling is window)",
    "coupling_window_relative": "window: J_ab = f(|a - b|) instead of a free (W, W) matrix",
    "coupling_init_std": "standard deviation of J at initialisation (0: J starts at zero)",
    "coupling_lr_multiplier": "learning rate of J and K relative to lr",
    "field_bias_init": "initial field bias per head (default: -log(T) / 2)",
    "learn_field_bias": "whether the field bias is learned",
    "num_fillers": "brackets: number of filler symbols",
    "method_options": "JSON object of options for the marginal method, e.g. '{\"bandwidth\": 4}'",
    "init": "model initialisation: torch (PyTorch's defaults) or gpt2 (nanoGPT's N(0, 0.02))",
    "beta2": "AdamW's second-moment decay",
    "fused_optimizer": "AdamW's fused kernel (false: the per-tensor loop)",
    "train_sequences": "brackets: size of the fixed training set (validation and test: 2000 each)",
    "min_fill": "brackets: smallest word, as the fraction p / (T // 2) of its pairs p (at least one pair); "
                "the filler density is 1 - 2p / T",
    "max_fill": "brackets: largest word, as the fraction p / (T // 2) of its pairs p",
    "open_probability": "brackets: probability that the word opens a bracket where it may (higher: deeper "
                        "nesting)",
    "deduplicate": "brackets: redraw validation and test sequences that occur in the training set",
    "memory_probe_steps": "n > 0: before training, n training steps in a fresh process whose peak memory the "
                          "result records (0: off)",
}


def _boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"bandwidth\": 4}}', got {text!r}")
    return value


def _optional_float(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One --flag per TrainConfig field, with its valid values, default and help."""
    for f in fields(TrainConfig):
        default = {} if f.default is MISSING else f.default
        kind = {"int": int, "float": float, "str": str, "bool": _boolean}.get(str(f.type).split(" ")[0], str)
        if f.name == "field_bias_init":
            kind = _optional_float
        elif f.name in ("coupling_range", "coupling_window"):
            kind = _optional_int
        elif f.name == "method_options":
            kind = _json_object
        shown = "-log(T) / 2" if f.name == "field_bias_init" else json.dumps(default) if f.name == "method_options" \
            else default
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=default,
                            choices=CHOICES.get(f.name), metavar=None if f.name in CHOICES else f.name.upper(),
                            help=f"{HELP.get(f.name, f.name)} (default: {shown})")


def _require(*modules: str) -> None:
    """Stop with one line naming the extra to install if a package the command needs is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"error: this command needs {', '.join(missing)}; install the extra: {EXPERIMENTS_EXTRA}")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from . import studies

    parser = argparse.ArgumentParser(prog="boltzmann-attention", description=__doc__.strip())
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,sweep,report,reproduce}")
    defaults = argparse.ArgumentDefaultsHelpFormatter

    p_train = sub.add_parser("train", help="train one model and write its results JSON",
                             description="Train one model and write its results JSON.",
                             usage="%(prog)s [options]   (every option: --help)")
    _add_config_arguments(p_train)
    p_train.add_argument("--out", default="results/train.json", help="results JSON path (default: %(default)s)")
    p_train.add_argument("--checkpoint", help="checkpoint path; an existing one is resumed "
                                              "(default: next to --out, <out stem>.ckpt.pt, removed when the run ends)")
    p_train.add_argument("--threads", type=int, help="torch threads for this run (default: torch's setting; "
                                                     "use 1 when two runs share 2 cores)")

    p_sweep = sub.add_parser("sweep", help="a grid of task x T x mode x method x seed; skips finished runs",
                             description="Run a grid of task x T x mode x method x seed; finished runs are "
                                         "skipped and killed ones resume.", formatter_class=defaults)
    p_sweep.add_argument("--tasks", nargs="+", default=["shakespeare"], choices=TASKS, help="tasks")
    p_sweep.add_argument("--T", nargs="+", type=int, default=[8], help="window lengths")
    p_sweep.add_argument("--modes", nargs="+", default=["softmax", "h+J", "h", "J"], choices=MODES, help="modes")
    p_sweep.add_argument("--methods", nargs="+", default=["exact"], choices=CHOICES["method"], help="methods")
    p_sweep.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds")
    p_sweep.add_argument("--variant", default="base", help="label for runs with --set overrides")
    p_sweep.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                         help="TrainConfig overrides, values as JSON (e.g. steps=2000 d_ff=0)")
    p_sweep.add_argument("--out", default="results", help="results folder")
    p_sweep.add_argument("--jobs", type=int, default=1, help="parallel processes (each gets cores // jobs threads)")

    p_report = sub.add_parser("report", help="tables and plots from a results folder",
                              description="Write tables and plots from a results folder.", formatter_class=defaults)
    p_report.add_argument("--results", default="results", help="results folder (with runs/)")
    p_report.add_argument("--out", help="report folder (default: report/<name of the results folder>)")

    p_repro = sub.add_parser("reproduce", help="sweep and report for a profile of the paper's experiments",
                             description="Sweep a profile's grid, then write its report.")
    p_repro.add_argument("--profile", choices=studies.profiles(), default="quick",
                         help=studies.profile_help().replace("%", "%%") + " (default: %(default)s)")
    p_repro.add_argument("--field-bias", choices=sorted(FIELD_BIASES), default=DEFAULT_FIELD_BIAS,
                         help=f"field bias of the Boltzmann modes (default {DEFAULT_FIELD_BIAS}, chosen by the fair "
                              f"study; {PAPER_FIELD_BIAS} is the paper's energy, which has no bias term)")
    p_repro.add_argument("--init", choices=INITS,
                         help="the model's initialisation for every run (default: TrainConfig's, gpt2; 'torch' is "
                              "the recipe of the committed full, fair and sampling studies)")
    p_repro.add_argument("--out", help="results folder (default: results/<profile>[-bias-<field bias>][-init-<init>])")
    p_repro.add_argument("--report", help="report folder (default: report/<profile>[-bias-<field bias>][-init-<init>])")
    p_repro.add_argument("--jobs", type=int, default=2, help="parallel processes (default: %(default)s)")
    return parser, {"train": p_train, "sweep": p_sweep, "report": p_report, "reproduce": p_repro}


def main(argv=None) -> int:
    parser, subparsers = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # name the subcommand's options, not the top level's
        subparsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return _dispatch(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _sweep_overrides(items: list[str]) -> dict:
    known = {f.name for f in fields(TrainConfig)}
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {sorted(known)}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"--set {item!r}: the value must be JSON (strings in double quotes)") from None
    return overrides


def _dispatch(args) -> int:
    from . import studies
    from . import sweep as experiments

    if args.command == "train":
        from .train import default_checkpoint, train, write_result

        cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
        cfg.validate()
        out = Path(args.out)
        checkpoint = Path(args.checkpoint) if args.checkpoint else default_checkpoint(out)
        print(f"results -> {out}, checkpoint -> {checkpoint} (a killed run resumes from it)", file=sys.stderr)
        result = train(cfg, checkpoint=checkpoint, out=out, threads=args.threads)
        if result is not None:  # None on DDP ranks other than 0
            write_result(result, out)
            if not args.checkpoint:  # the default one has served its purpose
                checkpoint.unlink(missing_ok=True)
            print(json.dumps(result["metrics"]), f"({result['wall_time_s']:.1f} s) -> {out}")
    elif args.command == "sweep":
        grid = experiments.Grid(tuple(args.tasks), tuple(args.T), tuple(args.modes), tuple(args.methods),
                                tuple(args.seeds), args.variant, _sweep_overrides(args.set))
        names = experiments.sweep([grid], args.out, jobs=args.jobs)
        print(f"{len(names)} runs done -> {args.out}/runs")
    elif args.command == "report":
        _require("matplotlib", "scipy")
        out = args.out or str(Path("report") / Path(args.results).resolve().name)
        print(f"report -> {_write_report(args.results, out)}")
    elif args.command == "reproduce":
        _require("matplotlib", "scipy")
        name = args.profile
        if args.field_bias != DEFAULT_FIELD_BIAS:
            name += f"-bias-{args.field_bias}"
        grids = studies.profile(args.profile, args.field_bias)
        if args.init is not None:
            if studies.sets_own_init(args.profile):
                raise ValueError(f"the {args.profile} profile compares the inits itself; drop --init")
            grids = experiments.with_overrides(grids, init=args.init)
            name += f"-init-{args.init}"
        out = Path(args.out or f"results/{name}")
        start = time.perf_counter()
        names = experiments.sweep(grids, out, jobs=args.jobs)
        print(f"{len(names)} runs in {time.perf_counter() - start:.0f} s -> {out}/runs")
        print(f"report -> {_write_report(out, args.report or f'report/{name}')}")
    return 0


def _write_report(results, out) -> Path:
    """The report of the study that owns these results (the default study's when none does)."""
    from .studies import write_report

    return write_report(results, out)


if __name__ == "__main__":
    sys.exit(main())
