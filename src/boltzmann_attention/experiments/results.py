"""Run results as the reports read them: loading, checking and grouping over seeds.

A sweep writes one JSON per run (``<results>/runs/<name>.json``, see :func:`..train.write_result`); a report
also writes every run into ``runs.jsonl.gz`` beside it, and :func:`load_runs` reads either. :func:`problems`
says what is wrong with a result (the sweep uses it to decide whether a run is finished); :class:`Results`
leaves out the runs whose metrics are unusable and says which and why (``Results.excluded``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from .. import modes
from ..options import OPTIONS
from . import tasks
from .config import MeasureConfig, TrainConfig
from .train.checkpoints import result_lock, write_result

ARCHIVE = "runs.jsonl.gz"  # every run's result, one JSON per line, written next to each report
MODE_ORDER = ("softmax", "h+J", "h", "J", "h+K", "h+J+K")
BASELINE = "softmax"
INFO_KEYS = ("machine", "processor", "cpus", "torch", "python", "commit")


# ---------------------------------------------------------------------------------------------- identity

NAMED = ("task", "T", "mode", "method", "seed")       # the config fields a run's readable name carries
MEASURED = tuple(f.name for f in fields(MeasureConfig))  # what is recorded, not what is trained


def identity(config: dict) -> dict:
    """The flat config fields that make a trained model what it is, less those the readable run name carries
    and the measurement settings (how often to evaluate, the memory probe)."""
    return {k: v for k, v in config.items() if k not in NAMED and k not in MEASURED}


def config_hash(config: dict) -> str:
    """8 hex digits of the SHA-256 of :func:`identity` (flat config in, as ``TrainConfig.flat()`` gives): the
    part of a run's file name that tells apart runs whose readable names agree."""
    text = json.dumps(identity(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _distinguished(runs: list[Run]) -> tuple[list[Run], dict[str, tuple[str, tuple[str, ...]]]]:
    """The runs, where runs of one (task, variant, T, mode, method) were trained with different configs each
    relabelled ``<variant> [field=value, ...]`` with the fields that differ between them, so that a report
    never shows one config's numbers under another's label; and {new label: (its variant, those fields)}."""
    by_key: dict[tuple, list[Run]] = {}
    for r in runs:
        by_key.setdefault(r.key, []).append(r)
    labels, parents = {}, {}
    for group in by_key.values():
        ids = [identity(r.config) for r in group]
        differ = sorted({k for i in ids for k in i if any(j.get(k) != i.get(k) for j in ids)})
        if differ:
            for r, i in zip(group, ids):
                labels[id(r)] = f"{r.variant} [{', '.join(f'{k}={i.get(k)}' for k in differ)}]"
                parents[labels[id(r)]] = (r.variant, tuple(differ))
    return [replace(r, variant=labels[id(r)]) if id(r) in labels else r for r in runs], parents


# ---------------------------------------------------------------------------------------------- checking

def _metric_problem(where: str, key: str, value) -> str | None:
    """Why a metric value is unusable, or None: not a number, not finite, or outside its range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{where} is {'missing' if value is None else f'a {type(value).__name__} ({value!r:.20})'}"
    if not math.isfinite(value):
        return f"{where} is {value}"
    name = key.split("_")[0]
    if name == "ppl" and value < 1:
        return f"{where} = {value:g} is below 1"
    if name == "loss" and value < 0:
        return f"{where} = {value:g} is negative"
    if name in ("accuracy", "error") and not 0 <= value <= 1:
        return f"{where} = {value:g} is outside [0, 1]"
    return None


def metric_problems(task: str, metrics) -> list[str]:
    """What is wrong with a run's metrics: the task's headline metric missing, or any value unusable."""
    if not isinstance(metrics, dict):
        return ["metrics is not a dict"]
    found = []
    if task in tasks.REGISTRY:
        split, key = tasks.REGISTRY[task].headline
        if not isinstance(metrics.get(split), dict) or key not in metrics[split]:
            found.append(f"metrics.{split}.{key} is missing")
    for split, values in metrics.items():
        if not isinstance(values, dict):
            found.append(f"metrics.{split} is not a dict")
            continue
        for key, value in values.items():
            problem = _metric_problem(f"metrics.{split}.{key}", key, value)
            if problem:
                found.append(problem)
    return found


def problems(result) -> list[str]:
    """What keeps a parsed result JSON from counting as a finished run (empty when it is fine)."""
    if not isinstance(result, dict):
        return ["not a JSON object"]
    missing = [k for k in ("config", "metrics") if not isinstance(result.get(k), dict)]
    if missing:
        return [f"{k} is missing" for k in missing]
    saved = result["config"]
    flat = {k: v for part in (saved, *(v for v in saved.values() if isinstance(v, dict))) for k, v in part.items()}
    missing = [k for k in ("task", "T", "mode", "method", "seed") if k not in flat]
    if missing:
        return [f"config.{k} is missing" for k in missing]
    return metric_problems(str(flat["task"]), result["metrics"])


def file_problems(path: str | Path) -> list[str]:
    """What is wrong with a result file: unreadable, not JSON (e.g. truncated), or :func:`problems`."""
    try:
        return problems(json.loads(Path(path).read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"unreadable: {e}"]


# ----------------------------------------------------------------------------------------------- loading

@dataclass
class Run:
    """One result JSON."""

    path: Path
    name: str
    task: str
    variant: str
    T: int
    mode: str
    method: str
    seed: int
    config: dict
    metrics: dict
    wall_time_s: float
    steps_run: int | None
    couplings: np.ndarray | None  # (H, T, T), or (H, W, W) by slot for the window: learned J of layer 0
    info: dict
    raw: dict  # the whole result, as loaded

    @property
    def key(self) -> tuple:
        return (self.task, self.variant, self.T, self.mode, self.method)

    def problems(self) -> list[str]:
        return metric_problems(self.task, self.metrics)


def load_runs(results: str | Path) -> list[Run]:
    """Every ``runs/*.json`` below a results folder (``*.tmp`` files of unfinished writes are ignored), or
    every line of a ``runs.jsonl.gz`` archive written with a report. Raises ValueError naming the file of a
    malformed result."""
    results = Path(results)
    if results.is_file():
        with gzip.open(results, "rt") as f:
            return [_load_run(Path(f"{results}:{i + 1}"), line) for i, line in enumerate(f) if line.strip()]
    runs_dir = results / "runs"
    paths = sorted(runs_dir.glob("*.json"))
    if not paths:
        raise ValueError(f"no run results (*.json) in {runs_dir}")
    return [_load_run(p, p.read_text()) for p in paths]


def write_archive(runs: list[Run], out: Path) -> Path:
    """Every run's result into ``out/runs.jsonl.gz`` (reproducible bytes: no timestamp)."""
    path = out / ARCHIVE
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write("".join(json.dumps(r.raw, separators=(",", ":")) + "\n" for r in runs).encode())
    return path


def unpack_archive(archive: str | Path, results_dir: str | Path) -> list[Path]:
    """Write every run of a ``runs.jsonl.gz`` archive to ``results_dir/runs/<run name>.json``, so that a sweep
    into that folder adds runs beside them (the archived ones count as finished) and the folder's report covers
    both, e.g. a committed study and a new profile of the same study. A file already there is left alone when
    it holds the same result; one with another result is a ValueError (nothing is overwritten). Returns the
    paths written."""
    runs = load_runs(archive)
    folder = Path(results_dir) / "runs"
    for r in runs:
        name = r.raw.get("run")
        if not isinstance(name, str) or not name or Path(name).name != name or name.startswith("."):
            raise ValueError(f"{r.path}: the run has no usable name ({name!r}); only a sweep's results can be unpacked")
        path = folder / f"{name}.json"
        if path.exists() and json.loads(path.read_text()) != r.raw:
            raise ValueError(f"{path} already holds another result than {r.path}; nothing was written")
    written = []
    for r in runs:
        path = folder / f"{r.raw['run']}.json"
        with result_lock(path):  # checked again: another writer may have been faster
            if path.exists():
                if json.loads(path.read_text()) != r.raw:
                    raise ValueError(f"{path} already holds another result than {r.path}; it was not replaced")
                continue
            write_result(r.raw, path)
            written.append(path)
    return written


def _load_run(path: Path, text: str) -> Run:
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed result file {path}: {e}") from None
    try:
        cfg = TrainConfig.from_dict(d["config"]).flat()  # nested, or flat from before the nesting (LEGACY)
        T = int(cfg["T"])
        metrics = d["metrics"]
        if not isinstance(metrics.get("val"), dict):
            raise KeyError("metrics.val")
        run = Run(path=path, name=str(d.get("run", path.stem)), task=str(cfg["task"]),
                  variant=str(d.get("variant", "base")), T=T, mode=str(cfg["mode"]), method=str(cfg["method"]),
                  seed=int(d.get("seed", cfg["seed"])), config=cfg, metrics=metrics,
                  wall_time_s=float(d.get("wall_time_s") or 0.0), steps_run=d.get("steps_run"),
                  couplings=None, info={k: d.get(k) for k in INFO_KEYS}, raw=d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"result file {path} lacks a field or has a bad one: {e!r}") from None
    if layer0(d, "couplings") is not None:
        J = np.asarray(layer0(d, "couplings"), dtype=np.float32).astype(float)
        J = J[None] if J.ndim == 2 else J
        n = int(cfg["coupling_window"]) if cfg.get("coupling") == "window" else T  # the window's J: by slot
        if J.ndim != 3 or J.shape[1:] != (n, n):
            raise ValueError(f"result file {path}: couplings have shape {J.shape}, expected (H, {n}, {n})")
        run.couplings = J
    return run


def layer0(raw: dict, key: str):
    """Layer 0's learned ``key`` ('couplings', 'field_bias') of a result: under ``layers``, or at the top level
    in results written before every layer was kept; None when the run has none."""
    if key in raw:
        return raw[key]
    return ((raw.get("layers") or [{}])[0] or {}).get(key)


# ---------------------------------------------------------------------------------------------- grouping

NO_MEASURES = {"loss": {}, "step_s": {}, "peak_mib": {}, "steps_mib": {}}  # Group.measures of no runs

@dataclass
class Group:
    """The runs of one grid point over seeds."""

    task: str
    variant: str
    T: int
    mode: str
    method: str
    runs: dict  # seed -> Run

    def values(self, metric: str, split: str = "val") -> dict[int, float]:
        """seed -> metric, leaving out runs without a finite value."""
        out = {}
        for seed, run in self.runs.items():
            v = run.metrics.get(split, {}).get(metric)
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[seed] = float(v)
        return out

    def measures(self) -> dict[str, dict[int, float]]:
        """Per seed: the validation loss ("loss"), the seconds per training step ("step_s": the run's wall time,
        which sums every segment of a resumed run and includes its evaluations, over its configured steps;
        ``steps_run`` counts only the last segment), and the memory probe's peak RSS and steps' memory in MiB
        ("peak_mib", "steps_mib") where recorded."""
        memory = {s: r.raw.get("memory") or {} for s, r in self.runs.items()}
        return {"loss": self.values("loss"),
                "step_s": {s: r.wall_time_s / r.config["steps"] for s, r in self.runs.items()},
                "peak_mib": {s: m["peak_rss_mib"] for s, m in memory.items() if m.get("peak_rss_mib") is not None},
                "steps_mib": {s: m["steps_mib"] for s, m in memory.items() if m.get("steps_mib") is not None}}

    def curves(self, metric: str = "loss") -> dict[int, dict[int, float]]:
        """step -> {seed: validation ``metric``}, in step order, at the evaluations during training that every
        run of the group recorded (from the runs' histories)."""
        by_step: dict[int, dict[int, float]] = {}
        for seed, run in self.runs.items():
            for h in run.raw.get("history") or ():
                if metric in h:
                    by_step.setdefault(int(h["step"]), {})[seed] = float(h[metric])
        return {step: v for step, v in sorted(by_step.items()) if len(v) == len(self.runs)}

    def couplings(self) -> dict[int, np.ndarray]:
        """seed -> J of head 0, (T, T)."""
        return {s: r.couplings[0] for s, r in self.runs.items() if r.couplings is not None}


def mode_rank(mode: str) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


def variant_rank(variant: str) -> tuple:
    return (variant != "base", variant)


class Results:
    """The usable runs, grouped by (task, variant, T, mode, method).

    ``runs`` holds the usable ones; ``excluded`` the (run, reasons) left out for unusable metrics (see
    :func:`metric_problems`); ``duplicates`` names the files of a grid point and seed seen twice.
    """

    def __init__(self, runs: list[Run]):
        runs, self.parents = _distinguished(runs)
        self.all_runs = runs
        self.excluded: list[tuple[Run, list[str]]] = [(r, r.problems()) for r in runs if r.problems()]
        left_out = {id(r) for r, _ in self.excluded}
        self.runs = [r for r in runs if id(r) not in left_out]
        self.groups: dict[tuple, Group] = {}
        self.duplicates: list[str] = []
        for run in sorted(self.runs, key=lambda r: str(r.path)):
            g = self.groups.setdefault(run.key, Group(*run.key, runs={}))
            if run.seed in g.runs:
                self.duplicates.append(f"{run.path.name} (same grid point and seed as {g.runs[run.seed].path.name})")
                continue
            g.runs[run.seed] = run

    def tasks(self) -> list[str]:
        return sorted({k[0] for k in self.groups}, key=lambda t: (t != "shakespeare", t))

    def variants(self, task: str) -> list[str]:
        return sorted({k[1] for k in self.groups if k[0] == task}, key=variant_rank)

    def Ts(self, task: str, variant: str) -> list[int]:
        return sorted({k[2] for k in self.groups if k[:2] == (task, variant)})

    def columns(self, task: str, variant: str) -> list[tuple[str, str]]:
        """The (mode, method) pairs present, in the paper's order of modes, exact enumeration first."""
        cols = {(k[3], k[4]) for k in self.groups if k[:2] == (task, variant)}
        return sorted(cols, key=lambda c: (mode_rank(c[0]), c[0], c[1] != "exact", c[1]))

    def get(self, task: str, variant: str, T: int, mode: str, method: str) -> Group | None:
        return self.groups.get((task, variant, T, mode, method))

    def pick(self, task: str, variant: str, T: int, mode: str, method: str | None = None) -> Group | None:
        """The group of a mode at T: the given method if present, else exact, else any."""
        found = [g for k, g in self.groups.items() if k[:4] == (task, variant, T, mode)]
        for preferred in (method, "exact"):
            for g in found:
                if g.method == preferred:
                    return g
        return min(found, key=lambda g: g.method) if found else None

    def baseline(self, task: str, variant: str, T: int, method: str | None = None) -> Group | None:
        """The softmax runs to compare a variant's runs with: its own, or, for runs relabelled by the options that
        tell them apart (``<variant> [field=value, ...]``), the softmax runs of their variant when softmax uses
        none of those options (say hand-run h+J runs of two couplings against one softmax run)."""
        own = self.pick(task, variant, T, BASELINE, method)
        if own is not None or variant not in self.parents:
            return own
        parent, differ = self.parents[variant]
        softmax = modes.get(BASELINE)
        if all(name in OPTIONS and not OPTIONS[name].used(softmax) for name in differ):
            return self.pick(task, parent, T, BASELINE, method)
        return None
