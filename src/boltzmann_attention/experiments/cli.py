"""The ``boltzmann-attention`` command: train, sweep, report, reproduce."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

from .train import TrainConfig


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One --flag per TrainConfig field, with the dataclass default."""
    for f in fields(TrainConfig):
        if f.name == "method_options":
            parser.add_argument("--method-options", type=json.loads, default={},
                                help="JSON dict of options for the marginal method, e.g. '{\"bandwidth\": 4}'")
            continue
        default = f.default
        kind = {"int": int, "float": float, "str": str, "bool": _boolean}.get(str(f.type).split(" ")[0])
        if f.name == "field_bias_init":
            kind = float
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind or str, default=default,
                            help=f"default: {default}")


def _boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def main(argv=None) -> int:
    from . import studies

    parser = argparse.ArgumentParser(prog="boltzmann-attention", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p_train = sub.add_parser("train", help="train one model and write its results JSON")
    _add_config_arguments(p_train)
    p_train.add_argument("--out", default="results/train.json", help="results JSON path")
    p_train.add_argument("--checkpoint", help="checkpoint path (resumes from it if it exists)")

    p_sweep = sub.add_parser("sweep", help="a grid of task x T x mode x method x seed; skips finished runs")
    p_sweep.add_argument("--tasks", nargs="+", default=["shakespeare"])
    p_sweep.add_argument("--T", nargs="+", type=int, default=[8])
    p_sweep.add_argument("--modes", nargs="+", default=["softmax", "h+J", "h", "J"])
    p_sweep.add_argument("--methods", nargs="+", default=["exact"])
    p_sweep.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p_sweep.add_argument("--variant", default="base", help="label for runs with --set overrides")
    p_sweep.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                         help="TrainConfig overrides, values as JSON (e.g. steps=2000 d_ff=0)")
    p_sweep.add_argument("--out", default="results")
    p_sweep.add_argument("--jobs", type=int, default=1, help="parallel processes")

    p_report = sub.add_parser("report", help="tables and plots from a results folder")
    p_report.add_argument("--results", default="results")
    p_report.add_argument("--out", default="report")

    p_repro = sub.add_parser("reproduce", help="sweep and report for the paper's tables")
    p_repro.add_argument("--profile", choices=studies.PROFILES, default="quick",
                         help="quick: a smoke test; full: the paper's tables; fair: the fair-baselines study; "
                              "sampling: models trained through DQA, PT and Gibbs against exact")
    p_repro.add_argument("--field-bias", choices=sorted(studies.FIELD_BIASES),
                         default=studies.DEFAULT_FIELD_BIAS,
                         help=f"field bias of the Boltzmann modes (default {studies.DEFAULT_FIELD_BIAS}, "
                              f"chosen by the fair study; {studies.PAPER_FIELD_BIAS} is the paper's energy, "
                              "which has no bias term)")
    p_repro.add_argument("--out", help="results folder (default: results/<profile>[-bias-<field bias>])")
    p_repro.add_argument("--report", help="report folder (default: report/<profile>[-bias-<field bias>])")
    p_repro.add_argument("--jobs", type=int, default=2)

    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _dispatch(args) -> int:
    from . import studies
    from . import sweep as experiments

    if args.command == "train":
        from .train import train, write_result

        cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
        result = train(cfg, checkpoint=args.checkpoint)
        if result is not None:  # None on DDP ranks other than 0
            write_result(result, args.out)
            print(json.dumps(result["metrics"]), f"({result['wall_time_s']:.1f} s) -> {args.out}")
    elif args.command == "sweep":
        overrides = {}
        for item in args.set:
            key, _, value = item.partition("=")
            overrides[key] = json.loads(value)
        grid = experiments.Grid(tuple(args.tasks), tuple(args.T), tuple(args.modes), tuple(args.methods),
                                tuple(args.seeds), args.variant, overrides)
        names = experiments.sweep([grid], args.out, jobs=args.jobs)
        print(f"{len(names)} runs done -> {args.out}/runs")
    elif args.command == "report":
        print(f"report -> {_write_report(args.results, args.out)}")
    elif args.command == "reproduce":
        name = args.profile
        if args.field_bias != studies.DEFAULT_FIELD_BIAS:
            name += f"-bias-{args.field_bias}"
        out = Path(args.out or f"results/{name}")
        start = time.perf_counter()
        names = experiments.sweep(studies.profile(args.profile, args.field_bias), out, jobs=args.jobs)
        print(f"{len(names)} runs in {time.perf_counter() - start:.0f} s -> {out}/runs")
        print(f"report -> {_write_report(out, args.report or f'report/{name}')}")
    return 0


def _write_report(results, out) -> Path:
    """The report of the study the results belong to (see studies.write_report)."""
    from .studies import write_report

    return write_report(results, out)


if __name__ == "__main__":
    sys.exit(main())
