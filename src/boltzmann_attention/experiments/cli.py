"""The boltzmann-attention command: train one model, sweep a grid, write a report, reproduce a profile, or explore
what a model learned.

Every result is a JSON file with the resolved config, metrics, history, learned couplings, wall time and
provenance (machine, torch version, commit). Sweeps skip finished runs and resume killed ones.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import MISSING
from pathlib import Path

from .. import ising
from ..provenance import package_version
from .config import FIELDS, INITS, TASKS, TrainConfig
from .recipes import DEFAULT_FIELD_BIAS, FIELD_BIASES, PAPER_FIELD_BIAS
from .results import config_hash
from .sweep import CLUSTER_EXTRA, EXECUTORS, run_name
from .tables import plural

CHOICES = {"method": tuple(sorted(ising.METHODS))}  # choices not written on the field itself

EXPERIMENTS_EXTRA = 'pip install "boltzmann-attention[experiments]"'
# How a field's default reads in --help where its value alone would mislead.
SHOWN_DEFAULTS = {"field_bias_init": "-log(T) / 2", "coupling_range": "T - 1"}


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
    """One --flag per config field (by its flat name), with its valid values, its help and its default once."""
    for name, f in FIELDS.items():
        default = f.default_factory() if f.default is MISSING else f.default
        kind = str(f.type)
        if name == "method_options":
            parse, metavar = _json_object, "JSON"
        elif kind.startswith("bool"):
            parse, metavar = _boolean, "{true,false}"
        elif kind.startswith("int | None"):
            parse, metavar = _optional_int, "{INT,none}"
        elif kind.startswith("float | None"):
            parse, metavar = _optional_float, "{FLOAT,none}"
        else:
            parse = {"int": int, "float": float}.get(kind, str)
            metavar = None if "choices" in f.metadata else name.upper()
        choices = CHOICES.get(name, f.metadata.get("choices"))
        shown = SHOWN_DEFAULTS.get(name, json.dumps(default) if isinstance(default, dict) else default)
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=parse, default=default, choices=choices,
                            metavar=None if choices else metavar, help=f"{f.metadata['help']} (default: {shown})")


def _require(*modules: str, extra: str = EXPERIMENTS_EXTRA) -> None:
    """Stop with one line naming the extra to install if a package the command needs is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"error: this command needs {', '.join(missing)}; install the extra: {extra}")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from . import studies

    parser = argparse.ArgumentParser(prog="boltzmann-attention", description=__doc__.strip())
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,sweep,report,reproduce,explore}")
    defaults = argparse.ArgumentDefaultsHelpFormatter

    p_train = sub.add_parser("train", help="train one model and write its results JSON",
                             description="Train one model and write its results JSON.",
                             usage="%(prog)s [options]   (every option: --help)")
    _add_config_arguments(p_train)
    p_train.add_argument("--out", help="results JSON path (default: results/runs/<run name>-<config hash>.json, "
                                       "where `report` looks by default; the hash covers every config field the "
                                       "name does not)")
    p_train.add_argument("--checkpoint", help="checkpoint path; an existing one is resumed "
                                              "(default: next to --out, <out stem>.ckpt.pt, removed when the run ends)")
    p_train.add_argument("--threads", type=int, help="torch threads for this run (default: torch's setting; "
                                                     "use 1 when two runs share 2 cores)")
    p_train.add_argument("--checkpoint-interval", type=int, default=500, metavar="STEPS",
                         help="steps between checkpoints, the most a killed run loses (default: %(default)s)")

    p_sweep = sub.add_parser("sweep", help="a grid of task x T x mode x method x seed; skips finished runs",
                             description="Run a grid of task x T x mode x method x seed; finished runs are "
                                         "skipped and killed ones resume.", formatter_class=defaults)
    p_sweep.add_argument("--tasks", nargs="+", default=["shakespeare"], choices=TASKS, help="tasks")
    p_sweep.add_argument("--T", nargs="+", type=int, default=[8], help="context lengths T")
    p_sweep.add_argument("--modes", nargs="+", default=["softmax", "h+J", "h", "J"],
                         choices=FIELDS["mode"].metadata["choices"], help="modes")
    p_sweep.add_argument("--methods", nargs="+", default=["exact"], choices=CHOICES["method"], help="methods")
    p_sweep.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds")
    p_sweep.add_argument("--variant", default="base", help="label for runs with --set overrides")
    p_sweep.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                         help="TrainConfig overrides, values as JSON (e.g. steps=2000 d_ff=0)")
    p_sweep.add_argument("--out", default="results", help="results folder")
    p_sweep.add_argument("--jobs", type=int, default=1, help="parallel processes (each gets cores // jobs threads)")
    _add_executor_arguments(p_sweep)

    p_report = sub.add_parser("report", help="tables and plots from a results folder",
                              description="Write tables and plots from a results folder.", formatter_class=defaults)
    p_report.add_argument("--results", default="results", help="results folder (with runs/)")
    p_report.add_argument("--out", default=argparse.SUPPRESS,
                          help="report folder (default: report/<name of the results folder>)")

    p_repro = sub.add_parser("reproduce", help="sweep and report for a profile of the paper's experiments",
                             description="Sweep a profile's grid, then write its report.")
    try:  # a broken study folder must not stop the other commands: reproduce names it when it runs
        profiles, shown = studies.profiles(), studies.profile_help()
    except studies.StudyError as e:
        profiles, shown = None, f"(the studies cannot be listed: {e})"
    p_repro.add_argument("--profile", choices=profiles, default="quick",
                         help=shown.replace("%", "%%") + " (default: %(default)s)")
    p_repro.add_argument("--field-bias", choices=sorted(FIELD_BIASES), default=DEFAULT_FIELD_BIAS,
                         help=f"field bias of the Boltzmann modes (default {DEFAULT_FIELD_BIAS}, chosen by the fair "
                              f"study; {PAPER_FIELD_BIAS} is the paper's energy, which has no bias term)")
    p_repro.add_argument("--init", choices=INITS,
                         help="the model's initialisation for every run (default: the profile's own: 'torch' for "
                              "full, fair and sampling, which keep the first recipe of their committed reports; "
                              "TrainConfig's gpt2 elsewhere)")
    p_repro.add_argument("--out", help="results folder (default: results/<profile>[-bias-<field bias>][-init-<init>])")
    p_repro.add_argument("--report", help="report folder (default: report/<profile>[-bias-<field bias>][-init-<init>])")
    p_repro.add_argument("--jobs", type=int, default=2, help="parallel processes (default: %(default)s)")
    _add_executor_arguments(p_repro, "(default: %(default)s)")
    p_repro.add_argument("--resume-from", metavar="ARCHIVE",
                         help="first unpack a report's runs.jsonl.gz into the results folder, where they count as "
                              "finished (e.g. report/<profile>/runs.jsonl.gz, to go on with a committed study on "
                              "another machine); a different result already there is an error, nothing is replaced")
    p_repro.add_argument("--estimate-only", action="store_true",
                         help="time the profile's step configurations, print the cost estimate and stop "
                              "(it writes nothing)")
    p_repro.add_argument("--no-estimate", dest="estimate", action="store_false",
                         help="start at once, without first timing two training steps of each of the profile's step "
                              "configurations for a cost estimate (the quick profile never times)")
    p_explore = sub.add_parser("explore", help="one offline HTML page of what a model learned: J, attention, curves",
                               description="Write one self-contained HTML page (Plotly, offline) of what a model "
                                           "learned: per layer and head J as a heat map and by distance, the "
                                           "attention weights for a text with the couplings and with J = 0, the "
                                           "marginals against sigmoid(2h), the training curves; for a run archive, "
                                           "its arms' headline metrics.", formatter_class=defaults)
    p_explore.add_argument("source", help="a run's result JSON (its model kept in final/ or as <name>.ckpt.pt "
                                          "beside it), a checkpoint, a converted Hugging Face model's folder, a "
                                          "report's runs.jsonl.gz or folder, or a results folder")
    p_explore.add_argument("--text", help="the text to attend over, in the task's characters, at most T of them "
                                          "(default: the run's first validation sequence)")
    p_explore.add_argument("--ids", help="token ids to attend over, comma-separated (a converted model without a "
                                         "saved tokenizer), instead of --text")
    p_explore.add_argument("--out", default="explore.html", help="the HTML file to write")
    return parser, {"train": p_train, "sweep": p_sweep, "report": p_report, "reproduce": p_repro,
                    "explore": p_explore}


def main(argv=None) -> int:
    parser, subparsers = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # name the subcommand's options, not the top level's
        subparsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return _dispatch(args)
    except ValueError as e:  # a bad option, file or config: a usage error
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # a file that cannot be read or written: named
        where = f"{e.filename}: " if e.filename is not None else ""
        print(f"error: {where}{e.strerror or one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - failed runs of a sweep, errors of other libraries: one line each
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # one line, not the tracebacks of every frame and worker
        resume = " (the same command resumes: finished runs are kept, a killed one restarts from its checkpoint)" \
            if args.command in ("train", "sweep", "reproduce") else ""
        print(f"interrupted{resume}", file=sys.stderr)
        return 130


def one_line(e: BaseException) -> str:
    """An error's message on one line: its first line, then the others joined by '; ' (a sweep's failed runs, one
    each)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    text = lines[0] + (" " + "; ".join(lines[1:]) if len(lines) > 1 else "")
    return text if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {text}"


def _add_executor_arguments(parser, default: str = "") -> None:
    parser.add_argument("--executor", choices=EXECUTORS, default="processes",
                        help="where the runs train: local processes, or cluster jobs through submitit (Slurm; "
                             f"{CLUSTER_EXTRA}), which write the same files into the results folder, one the jobs "
                             f"must share {default}".rstrip())
    parser.add_argument("--executor-option", nargs="*", default=[], metavar="KEY=VALUE", dest="executor_options",
                        help="submitit's AutoExecutor parameters, values as JSON or plain words (e.g. "
                             "cluster=slurm slurm_partition=cpu timeout_min=600 cpus_per_task=4; cluster=local runs "
                             "the jobs as local processes)")


def _key_values(items: list[str], flag: str, known=None, words: bool = False) -> dict:
    """KEY=VALUE items with JSON values; ``known``: the config fields allowed as keys (None: any key);
    ``words``: a value that is not JSON is taken as a string (cluster=slurm), else it is an error."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or (known is not None and key not in known):
            expected = "KEY=VALUE" if known is None else f"FIELD=VALUE with FIELD one of {sorted(known)}"
            raise ValueError(f"{flag} {item!r}: expected {expected}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            if not words:
                raise ValueError(f"{flag} {item!r}: the value must be JSON (strings in double quotes)") from None
            out[key] = value
    return out


def _sweep_overrides(items: list[str]) -> dict:
    return _key_values(items, "--set", set(FIELDS))


def _dispatch(args) -> int:
    from . import studies
    from . import sweep as experiments
    from .train import check_output_folder

    if args.command == "train":
        from .train import check_output_path, default_checkpoint, train

        cfg = TrainConfig.build(**{name: getattr(args, name) for name in FIELDS})
        # where `report` looks; the hash tells apart runs whose readable names agree (a full and a window h+J)
        default = f"results/runs/{run_name(cfg)}-{config_hash(cfg.flat())}.json"
        out = Path(args.out if args.out is not None else default)
        check_output_path(out, "result")
        if out.exists():
            experiments.same_config(out, cfg)  # a result of another config is never replaced
        checkpoint = Path(args.checkpoint) if args.checkpoint else default_checkpoint(out)
        print(f"results -> {out}, checkpoint -> {checkpoint} (a killed run resumes from it)", file=sys.stderr)
        result = train(cfg, checkpoint=checkpoint, checkpoint_interval=args.checkpoint_interval, out=out,
                       threads=args.threads)
        if result is not None:  # None on DDP ranks other than 0
            experiments.write_own_result(result, out, cfg)  # unless another config's result appeared meanwhile
            if not args.checkpoint:  # the default one has served its purpose
                checkpoint.unlink(missing_ok=True)
            print(json.dumps(result["metrics"]), f"({result['wall_time_s']:.1f} s) -> {out}")
    elif args.command == "sweep":
        if args.jobs < 1:
            raise ValueError(f"--jobs must be an integer >= 1 (parallel processes), got {args.jobs}")
        grid = experiments.Grid(tuple(args.tasks), tuple(args.T), tuple(args.modes), tuple(args.methods),
                                tuple(args.seeds), args.variant, _sweep_overrides(args.set))
        names = experiments.sweep([grid], check_output_folder(args.out, "results"), jobs=args.jobs,
                                  **_executor(args))
        print(f"{plural(len(names), 'run')} done -> {args.out}/runs")
    elif args.command == "report":
        _require("matplotlib", "scipy")
        out = check_output_folder(getattr(args, "out", None) or Path("report") / Path(args.results).resolve().name,
                                  "report")
        print(f"report -> {_write_report(args.results, out)}")
    elif args.command == "explore":
        from .explore import EXPLORE_EXTRA, explore

        _require("plotly", extra=EXPLORE_EXTRA)
        if args.ids is not None and args.text is not None:
            raise ValueError("give --text or --ids, not both")
        try:
            text = args.text if args.ids is None else [int(i) for i in args.ids.split(",")]
        except ValueError:
            raise ValueError(f"--ids must be comma-separated integers, got {args.ids!r}") from None
        print(f"explorer -> {explore(args.source, text=text, out=args.out)}")
    elif args.command == "reproduce":
        if args.jobs < 1:
            raise ValueError(f"--jobs must be an integer >= 1 (parallel processes), got {args.jobs}")
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
        if args.estimate_only and not args.estimate:
            raise ValueError("--estimate-only and --no-estimate contradict each other")
        # both checked before any run; --estimate-only creates neither
        out = check_output_folder(args.out or f"results/{name}", "results", create=not args.estimate_only)
        report = check_output_folder(args.report or f"report/{name}", "report", create=not args.estimate_only)
        if args.estimate_only:  # writes nothing: the runs of --resume-from's archive count as finished
            from .results import load_runs

            archived = {r.raw.get("run") for r in load_runs(args.resume_from)} if args.resume_from else set()
            print(_estimate(grids, out, args.jobs, finished=archived), flush=True)
            return 0
        if args.resume_from is not None:
            from .results import unpack_archive

            written = unpack_archive(args.resume_from, out)
            print(f"unpacked {plural(len(written), 'run')} of {args.resume_from} into {out}/runs", flush=True)
        if args.estimate and args.profile != "quick":
            print(_estimate(grids, out, args.jobs), flush=True)
        start = time.perf_counter()
        names = experiments.sweep(grids, out, jobs=args.jobs, **_executor(args))
        print(f"{plural(len(names), 'run')} in {time.perf_counter() - start:.0f} s -> {out}/runs")
        print(f"report -> {_write_report(out, report)}")
    return 0


def _executor(args) -> dict:
    options = _key_values(args.executor_options, "--executor-option", words=True)
    return {"executor": args.executor, "executor_options": options}


def _estimate(grids, out: Path, jobs: int, finished: frozenset[str] | set[str] = frozenset()) -> str:
    """The cost of the runs still to do (neither in ``out`` nor named in ``finished``), from two training steps of
    each distinct step configuration timed now."""
    import statistics

    import torch

    from . import sweep as experiments
    from .benchmarks.training import step_key, time_steps

    todo = set(experiments.sweep(grids, out, dry_run=True)) - set(finished)
    runs = {name: cfg for grid in grids for name, cfg in grid.runs() if name in todo}
    if not runs:
        return "nothing to run: every run of the profile has a finished result"
    key = lambda cfg: json.dumps(step_key(cfg), sort_keys=True, default=str)  # noqa: E731
    timed = {}
    for name, cfg in runs.items():
        timed.setdefault(key(cfg), (name, cfg))
    threads = torch.get_num_threads()
    try:
        times = time_steps({name: cfg for name, cfg in timed.values()}, steps=2, rounds=1, warmup=1)
    finally:
        torch.set_num_threads(threads)
    step_s = {k: statistics.median(times[name]) for k, (name, _) in timed.items()}
    seconds = sum(cfg.steps * step_s[key(cfg)] for cfg in runs.values())
    return (f"{plural(len(runs), 'run')} to do: {_cost(seconds)} of one core, {_cost(seconds / max(1, jobs))} with "
            f"{plural(jobs, 'job')}, from 2 training steps of each of their {plural(len(timed), 'step configuration')}"
            " timed now (steps only: evaluations, memory probes and the machine's load add to it; --no-estimate "
            "skips this)")


def _cost(seconds: float) -> str:
    """An estimated time: in minutes under an hour, else in hours to a tenth."""
    minutes = round(seconds / 60)
    if minutes == 0:
        return "under a minute"
    return f"about {minutes} min" if minutes < 60 else f"about {seconds / 3600:.1f} h"


def _write_report(results, out) -> Path:
    """The report of the study that owns these results (the default study's when none does)."""
    from .studies import write_report

    return write_report(results, out)


if __name__ == "__main__":
    sys.exit(main())
