"""Grids of runs (task x T x mode x method x seed) and resumable sweeps over them.

A run is named by its grid point (``shakespeare-T8-h+J-exact-base-s0``). Its result is written atomically to
``<out>/runs/<name>.json`` and its checkpoint to ``<out>/checkpoints/<name>.pt``; a sweep skips runs whose
result exists and resumes a killed run from its checkpoint, so nothing finished is lost. A finished run's last
checkpoint is kept as ``<out>/final/<name>.pt`` (the trained model, for analyses after the run: ``train.load_final``);
a grid can name analyses (``train.Analysis``, such as the co-attention measurement of :mod:`.coattention`) that
its runs record; a finished run that lacks one gets it from its kept model when a sweep next passes over it.

The grids of each study (the paper's profiles, the fair baselines, ...) live in ``studies/``; the command line
resolves a profile's grids there and hands them to :func:`sweep`.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import signal
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import torch

from .. import modes
from ..validation import check_int
from .results import MEASURED
from .train import Analysis, TrainConfig, load_final, result_lock, train, write_result

DEFAULT_MODES = ("softmax", "h+J", "h", "J")  # the paper's four modes

class FieldBias(NamedTuple):
    """A field bias b = coefficient * log(T) per head at initialisation, learnable or fixed: the field-bias
    fields of a run at context length T, for every mode that has a field bias."""

    learnable: bool
    coefficient: float

    def config(self, T: int) -> dict:
        """The TrainConfig fields of this field bias at context length T."""
        return {"field_bias_init": self.coefficient * math.log(T) + 0.0, "learn_field_bias": self.learnable}


@dataclass
class Grid:
    """A grid of runs sharing one variant (a label plus TrainConfig overrides, and optionally a field bias
    resolved per T into field_bias_init and learn_field_bias of the modes that have one)."""

    tasks: tuple[str, ...]
    Ts: tuple[int, ...]
    modes: tuple[str, ...] = DEFAULT_MODES
    methods: tuple[str, ...] = ("exact",)
    seeds: tuple[int, ...] = (0, 1, 2)
    variant: str = "base"
    overrides: dict = field(default_factory=dict)
    field_bias: FieldBias | None = None
    analyses: tuple[Analysis, ...] = ()

    def __post_init__(self):
        if self.field_bias is not None and not isinstance(self.field_bias, FieldBias):
            raise TypeError(f"Grid.field_bias is a FieldBias or None, not {self.field_bias!r} "
                            "(recipes.field_bias(name) gives the named ones)")

    def runs(self) -> list[tuple[str, TrainConfig]]:
        out = []
        for task in self.tasks:
            for T in self.Ts:
                for mode in self.modes:
                    overrides = dict(self.overrides)
                    if self.field_bias is not None and modes.get(mode).field_bias:  # softmax has none
                        overrides.update(self.field_bias.config(T))
                    for method in self.methods:
                        for seed in self.seeds:
                            cfg = TrainConfig.build(task=task, T=T, mode=mode, method=method, seed=seed, **overrides)
                            out.append((run_name(cfg, self.variant), cfg))
        return out


def run_name(cfg: TrainConfig, variant: str = "base") -> str:
    return f"{cfg.data.task}-T{cfg.data.T}-{cfg.attention.mode}-{cfg.attention.method}-{variant}-s{cfg.seed}"


def beyond(lr: float, up: bool) -> float:
    """The next learning rate half a decade beyond ``lr`` on the grid 1, 3, 10, 30, ... x 10^k (3e-2 above
    1e-2, 3e-4 below 1e-3): where a study's rule extends an lr grid whose best is at its edge."""
    k = round(2 * math.log10(lr)) + (1 if up else -1)
    exponent, odd = divmod(k, 2)
    return float(f"{3 if odd else 1}e{exponent}")


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_run(jobs: int, threads: int | None = None) -> int:
    """Torch threads for each of ``jobs`` concurrent runs, so that together they never oversubscribe the
    cores: ``threads`` if given, else max(1, cores // jobs), capped by OMP_NUM_THREADS when that is set."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        return threads
    n = max(1, available_cores() // max(1, jobs))
    env = os.environ.get("OMP_NUM_THREADS", "")
    return min(n, int(env)) if env.isdigit() and int(env) >= 1 else n


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CHECKPOINT_INTERVAL = 100  # steps: a killed run loses at most this many (saving takes well under a step's time)


def _run_one(args) -> tuple[str, str | None]:
    """Train one grid point; returns (name, None) or (name, error message). One failure does not stop a sweep."""
    name, cfg_dict, variant, analyses, out, threads, progress = args
    before = torch.get_num_threads()  # restored: a run may share its caller's process (submitit's debug executor)
    torch.set_num_threads(threads)  # before any heavy work; the pool's children also inherit OMP_NUM_THREADS
    cfg = TrainConfig.from_dict(cfg_dict)
    out = Path(out)
    checkpoint = out / "checkpoints" / f"{name}.pt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = train(cfg, checkpoint=checkpoint, checkpoint_interval=CHECKPOINT_INTERVAL, progress=progress,
                       out=out / "runs" / f"{name}.json", analyses=analyses)
        result.update(run=name, variant=variant)
        write_own_result(result, out / "runs" / f"{name}.json", cfg)
    except Exception as e:  # reported by sweep(), which goes on with the other runs
        return name, f"{type(e).__name__}: {e}"
    finally:
        torch.set_num_threads(before)
    final = out / "final" / f"{name}.pt"
    final.parent.mkdir(parents=True, exist_ok=True)
    if checkpoint.exists():
        os.replace(checkpoint, final)
    return name, None


def _measure_kept(path: Path, kept: Path, analyses: tuple[Analysis, ...]) -> bool:
    """Add to the finished run at ``path`` the analyses it applies to and has not recorded (or recorded in an
    older version), measured on its kept model; True if any was added."""
    raw = json.loads(path.read_text())
    cfg = _saved_config(path, raw)
    missing = [a for a in analyses if a.applies(cfg) and not (raw.get(a.name) and a.current(raw[a.name]))]
    if not missing or not kept.exists():
        return False
    task, model = load_final(kept)
    measured = {a.name: a.run(model, task) for a in missing}
    with result_lock(path):  # another writer may have replaced the result meanwhile: then it is left alone
        if json.loads(path.read_text()) != raw:
            return False
        write_result({**raw, **measured}, path)
    return True


def _saved_config(path: Path, raw) -> TrainConfig:
    """The config of the result ``raw`` read from ``path``; ValueError naming the file when it does not parse."""
    try:
        return TrainConfig.from_dict(raw["config"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: its config does not parse ({e}); nothing is replaced: move the file aside (a "
                         "sweep then runs it again) or correct it") from None


def same_config(path: Path, cfg: TrainConfig) -> None:
    """ValueError when the finished result at ``path`` was trained with another config than the grid's run of
    the same name: counting it as finished would report it under this run's name. The measurement settings
    (how often to evaluate, the memory probe) change what is recorded, not the trained model: not compared."""
    saved = {k: v for k, v in _saved_config(path, json.loads(path.read_text())).flat().items() if k not in MEASURED}
    wanted = {k: v for k, v in cfg.flat().items() if k not in MEASURED}
    if saved != wanted:
        diff = {k: (saved.get(k), v) for k, v in wanted.items() if saved.get(k) != v}
        raise ValueError(f"{path} holds a run of another config than this run of the same name (recorded, wanted): "
                         f"{diff}; nothing is replaced: move it aside, or write elsewhere (--out, or a variant)")


def write_own_result(result: dict, path: Path, cfg: TrainConfig) -> None:
    """Write the result of a run of ``cfg`` to ``path``, unless a finished result of another config is there: two
    sweeps (or a sweep and ``train``) of different configs may both have found the place free when they started.
    The check and the write hold the folder's lock (:func:`.train.result_lock`), so of two writers the second sees
    the first's result. Another config's result stays; this one is written beside it as ``<name>.json.conflict``
    (``-2``, ... if taken) and a ValueError names both. A broken file there is kept as ``.broken``, as a sweep
    keeps it."""
    from .results import file_problems

    with result_lock(path):
        if path.exists():
            if file_problems(path):
                _set_aside(path)
            else:
                try:
                    same_config(path, cfg)
                except ValueError as e:
                    aside = _free_name(path, "conflict")
                    write_result(result, aside)
                    raise ValueError(f"{e}. This run's result is kept as {aside}") from None
        write_result(result, path)


def _free_name(path: Path, suffix: str) -> Path:
    """``<name>.<suffix>``, or ``<name>.<suffix>-2``, ... : the first that does not exist."""
    target = path.with_name(f"{path.name}.{suffix}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{suffix}-{n}")
    return target


def _set_aside(path: Path) -> Path:
    """Rename a broken result to ``<name>.json.broken`` (``.broken-2``, ... if taken); nothing is deleted."""
    target = _free_name(path, "broken")
    path.rename(target)
    return target


EXECUTORS = ("processes", "submitit")  # where the runs train: local processes, or jobs through submitit (Slurm)
CLUSTER_EXTRA = 'pip install "boltzmann-attention[cluster]"'


def sweep(grids: list[Grid], out: str | Path, jobs: int = 1, dry_run: bool = False,
          threads: int | None = None, executor: str = "processes", executor_options: dict | None = None
          ) -> list[str]:
    """Run every grid point without a finished result; returns the names run (or, with ``dry_run``, to run).

    Every config is validated first, so a bad grid fails before any training. A result counts as finished
    when it parses and has its config and usable metrics (:func:`.results.file_problems`); a broken one (e.g.
    truncated) is renamed to ``<name>.json.broken`` and its run done again. One line says how many finished
    runs were skipped.

    Threads: ``jobs`` processes run in parallel with ``threads`` torch threads each, by default
    max(1, cores // jobs) (:func:`threads_per_run`), so that they never oversubscribe the cores: spinning
    OpenMP threads of runs sharing a core slow everything down many times. Each child gets OMP_NUM_THREADS
    (and MKL's, OpenBLAS's) before it imports torch. Two sweeps started side by side do not know of each
    other: run one sweep with ``jobs`` = 2 instead, or give each OMP_NUM_THREADS = cores / 2 (the default
    never exceeds it).

    Executor "submitit" submits each run as a job through submitit (``executor_options``: its
    ``AutoExecutor`` parameters, e.g. ``{"cluster": "slurm", "slurm_partition": "cpu", "timeout_min": 600,
    "cpus_per_task": 4}``; cluster "local" runs the jobs as local processes, "debug" in this one), its logs in
    ``out/submitit``. Each job runs the same function as a local process and writes the same files, so the
    folder must be one the jobs share; resume, archives and results are the same. ``jobs`` does not apply
    (the scheduler decides how many run at once); each job gets ``threads`` torch threads, by default the
    ``cpus_per_task`` it asks for (1 if it does not).

    A run that fails (e.g. a checkpoint from another config) is reported and the others go on; at the end a
    RuntimeError lists the failures.
    """
    from .results import file_problems

    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choose one of {EXECUTORS}")
    if executor_options and executor == "processes":
        raise ValueError("executor_options apply to executor 'submitit' only; the local processes take --jobs "
                         "(each process gets cores // jobs threads)")
    if executor == "processes":
        check_int("jobs", jobs, 1)
    if threads is not None:
        check_int("threads", threads, 1)
    if executor_options and "cpus_per_task" in executor_options:  # it sets each job's threads: checked now
        check_int("executor option cpus_per_task", executor_options["cpus_per_task"], 1)
    out = Path(out)
    todo, seen, skipped, broken, unmeasured = [], set(), 0, [], []
    for grid in grids:
        for name, cfg in grid.runs():
            cfg.validate()
            if name in seen:
                continue
            seen.add(name)
            path = out / "runs" / f"{name}.json"
            if path.exists():
                found = file_problems(path)
                if not found:
                    same_config(path, cfg)
                    skipped += 1
                    if grid.analyses:
                        unmeasured.append((path, grid.analyses))
                    continue
                broken.append((path, found))
            todo.append((name, asdict(cfg), grid.variant, grid.analyses))
    if skipped:
        print(f"skipped {skipped} finished run{'s' if skipped != 1 else ''} in {out / 'runs'}")
    if not dry_run:
        measured = sum(_measure_kept(path, out / "final" / f"{path.stem}.pt", analyses)
                       for path, analyses in unmeasured)
        if measured:
            print(f"recorded the grids' analyses of {measured} finished run{'s' if measured != 1 else ''} "
                  "from their kept models")
    if dry_run or not todo:
        return [t[0] for t in todo]
    for path, found in broken:
        print(f"re-running {path.stem}: its result is broken ({'; '.join(found)}); kept as {_set_aside(path).name}")
    if executor == "submitit":
        outcomes = _submitit_outcomes(todo, out, dict(executor_options or {}), threads)
        failures = [f"{name}: {error}" for name, error in outcomes if error]
        if failures:
            raise RuntimeError(f"{len(failures)} of {len(todo)} run{'s' if len(todo) != 1 else ''} failed:\n"
                               + "\n".join(failures))
        return [t[0] for t in todo]
    threads = threads_per_run(jobs, threads)
    if jobs > available_cores():
        print(f"warning: {jobs} jobs on {available_cores()} cores share cores (one thread each)")
    tasks = [(name, cfg, variant, analyses, str(out), threads, jobs == 1) for name, cfg, variant, analyses in todo]
    from .progress import progress as tqdm

    if jobs == 1:
        before = torch.get_num_threads()
        try:
            outcomes = [_run_one(t) for t in tqdm(tasks, desc="sweep", unit="run")]
        finally:
            torch.set_num_threads(before)
    else:
        saved = {k: os.environ.get(k) for k in THREAD_VARIABLES}
        os.environ.update({k: str(threads) for k in THREAD_VARIABLES})  # inherited by the spawned children
        try:
            # leaving the pool stops the workers; Ctrl-C reaches the parent only
            with _exit_on_sigterm(), mp.get_context("spawn").Pool(jobs, _ignore_sigint) as pool:
                outcomes = list(tqdm(pool.imap_unordered(_run_one, tasks), total=len(tasks), desc="sweep",
                                     unit="run"))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    failures = [f"{name}: {error}" for name, error in outcomes if error]
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(tasks)} run{'s' if len(tasks) != 1 else ''} failed:\n"
                           + "\n".join(failures))
    return [t[0] for t in todo]


def _submitit_outcomes(todo: list, out: Path, options: dict, threads: int | None) -> list[tuple[str, str | None]]:
    """Every run of ``todo`` as a submitit job (one job array), waited for; (name, error or None) per run. A job
    that dies (killed by the scheduler, out of memory) counts as its run's failure, with submitit's message."""
    try:
        import submitit
    except ImportError:
        raise ValueError(f"executor 'submitit' needs submitit: {CLUSTER_EXTRA}") from None
    cluster = options.pop("cluster", None)
    try:  # submitit's errors (unknown cluster, no Slurm here) as one line naming the option
        executor = submitit.AutoExecutor(folder=out / "submitit", cluster=cluster)
    except Exception as e:  # noqa: BLE001 - submitit raises RuntimeError, ValueError, ...
        raise ValueError(f"executor option cluster={cluster!r}: {_first_line(e)}") from None
    threads = threads if threads is not None else options.get("cpus_per_task", 1)
    try:
        executor.update_parameters(**options)
    except Exception as e:  # noqa: BLE001 - an unknown parameter is a NameError, a mistyped one an AssertionError
        raise ValueError(f"executor_options {options}: {_first_line(e)}") from None
    tasks = [(name, cfg, variant, analyses, str(out), threads, False) for name, cfg, variant, analyses in todo]
    jobs = executor.map_array(_run_one, tasks)
    print(f"submitted {len(jobs)} run{'s' if len(jobs) != 1 else ''} through submitit "
          f"({executor.cluster}; logs in {out / 'submitit'})")
    outcomes = []
    for (name, *_), job in zip(tasks, jobs):
        try:
            outcomes.append(job.result())
        except Exception as e:  # the job itself failed, not the run inside it (that returns its error)
            outcomes.append((name, f"job {job.job_id} failed: {type(e).__name__}: {_first_line(e)}"))
    return outcomes


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _ignore_sigint() -> None:
    """A worker's start: Ctrl-C is the parent's to handle (it stops the pool), not every worker's traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def _exit_on_sigterm():
    """Within the block, SIGTERM raises SystemExit, so that a killed sweep leaves its pool and the pool stops its
    workers; by default they would each run on to the end of their current run, beside the next sweep's.
    (Only the main thread can set a handler; elsewhere this does nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def with_overrides(grids: list[Grid], **overrides) -> list[Grid]:
    """The same grids with extra TrainConfig overrides (e.g. fewer steps for a smoke test)."""
    return [replace(g, overrides={**g.overrides, **overrides}) for g in grids]
