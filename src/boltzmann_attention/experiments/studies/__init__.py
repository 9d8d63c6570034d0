"""The registry of studies: every folder here with an ``__init__.py`` is a study, found when it is asked for.

A study folder ``<name>/`` holds

* ``__init__.py``: ``PROFILES`` ({profile name: grids(field_bias, decisions) -> list of Grid}), ``HELP``
  ({profile name: one line for the command's help}), ``owns(results)`` (whether a results folder is this
  study's, by the study's own rule), and ``report(results, context) -> Markdown lines`` (the context:
  :class:`..report.ReportContext`). Optional: ``Decisions`` (a dataclass the folder's ``decisions.json`` is
  read into, its keys the field names in capitals), ``READS`` (the profiles whose report archives the report
  reads; the registry hands their paths), ``SETS_INIT`` (profiles whose grids choose the initialisation, so
  ``reproduce --init`` is refused for them) and ``DEFAULT = True`` (the study whose report takes any results
  folder no other study owns; exactly one).
* ``protocol.md``: the rules written before the runs and the measurements behind each choice, dated; the
  report quotes it (``context.protocol``).
* ``decisions.json``: the decisions made from runs (best learning rates, lrs added, diverged runs, ...).

Adding a study is adding its folder. A study imports only the layers below (``report``, ``claims``,
``sweep``, ``recipes``, ...), never another study.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import warnings
from pathlib import Path
from types import ModuleType

from ..recipes import DEFAULT_FIELD_BIAS, field_bias
from ..report import ReportContext
from ..results import Results, load_runs, write_archive
from ..sweep import Grid

__all__ = ["StudyError", "all_studies", "load_decisions", "profile", "profile_help", "profiles", "protocol",
           "sets_own_init", "study_of", "study_of_profile", "write_report"]

PROTOCOL = "protocol.md"
DECISIONS = "decisions.json"
ARCHIVE = "runs.jsonl.gz"


class StudyError(ValueError):
    """A study folder that cannot be used: its message names the study and its file, in one line."""


def _load(info: pkgutil.ModuleInfo) -> ModuleType:
    """The study package ``info`` imported and its names checked; StudyError naming it and its file otherwise."""
    where = Path(info.module_finder.path) / info.name / "__init__.py"
    try:
        study = importlib.import_module(f"{__name__}.{info.name}")
    except Exception as e:  # any error inside a study's code: name the study instead of a traceback
        raise StudyError(f"study {info.name!r} ({where}) cannot be imported: {type(e).__name__}: {e}") from e
    problems = []
    if not isinstance(getattr(study, "PROFILES", None), dict) or not all(
            isinstance(k, str) and callable(v) for k, v in study.PROFILES.items()):
        problems.append("PROFILES must be a dict of profile names to grid functions")
    elif not isinstance(getattr(study, "HELP", None), dict) or set(study.HELP) != set(study.PROFILES):
        problems.append("HELP must be a dict with one line per profile")
    problems += [f"{f}() is missing" for f in ("owns", "report") if not callable(getattr(study, f, None))]
    if problems:
        raise StudyError(f"study {info.name!r} ({where}): {'; '.join(problems)}")
    return study


def all_studies() -> list[ModuleType]:
    """Every study package under this one (its search path included), the default study first, then by name.
    StudyError (a ValueError) naming the study and its file for a folder that cannot be imported or lacks its
    names, and for a profile name that two studies use."""
    found = [_load(info) for info in pkgutil.iter_modules(__path__) if info.ispkg and not info.name.startswith("_")]
    owner = {}
    for study in found:
        for profile_name in study.PROFILES:
            if profile_name in owner:
                raise StudyError(f"profile {profile_name!r} is defined by two studies, {name(owner[profile_name])!r} "
                                 f"({owner[profile_name].__file__}) and {name(study)!r} ({study.__file__}): rename "
                                 "one")
            owner[profile_name] = study
    defaults = [s for s in found if getattr(s, "DEFAULT", False)]
    if len(defaults) != 1:
        raise StudyError(f"exactly one study must set DEFAULT = True, found {[name(s) for s in defaults]}")
    return defaults + sorted((s for s in found if s not in defaults), key=name)


def name(study: ModuleType) -> str:
    return study.__name__.rsplit(".", 1)[1]


def folder(study: ModuleType) -> Path:
    return Path(study.__file__).parent


def profiles() -> tuple[str, ...]:
    """Every profile of every study, in the order of :func:`all_studies`."""
    return tuple(p for study in all_studies() for p in study.PROFILES)


def study_of_profile(profile_name: str) -> ModuleType:
    for study in all_studies():
        if profile_name in study.PROFILES:
            return study
    raise ValueError(f"unknown profile {profile_name!r}; choose one of {profiles()}")


def profile_help() -> str:
    """The command's help on --profile: each profile's line, from its study."""
    return "; ".join(f"{p}: {study.HELP[p]}" for study in all_studies() for p in study.PROFILES)


def sets_own_init(profile_name: str) -> bool:
    """Whether the profile's grids choose the initialisation themselves (``reproduce --init`` is refused)."""
    return profile_name in getattr(study_of_profile(profile_name), "SETS_INIT", ())


def _frozen(value):
    """JSON lists as tuples, recursively, so that decisions compare and hash like the values they replace."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def load_decisions(study: ModuleType):
    """The study's ``decisions.json`` read into its ``Decisions`` (None for a study without one); a key that
    is not a field is an error naming the fields."""
    kind = getattr(study, "Decisions", None)
    if kind is None:
        return None
    path = folder(study) / DECISIONS
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError as e:
        raise StudyError(f"study {name(study)!r}: {path} is not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise StudyError(f"study {name(study)!r}: {path} must hold a JSON object of decisions")
    return kind(**_fields(kind, data, str(path)))


def _fields(kind, data: dict, where: str) -> dict:
    """The decisions ``data`` (keys as in decisions.json) as ``kind``'s field values; ValueError naming ``where``
    and the fields for a key that is not one."""
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = [k for k in data if k.lower() not in known]
    if unknown:
        raise ValueError(f"{where}: unknown decisions {unknown}; the fields are {sorted(k.upper() for k in known)}")
    return {k.lower(): _frozen(v) for k, v in data.items()}


def protocol(study: ModuleType) -> str:
    """The text of the study's ``protocol.md`` ("" when it has none)."""
    path = folder(study) / PROTOCOL
    return path.read_text() if path.exists() else ""


def profile(profile_name: str, field_bias_name: str = DEFAULT_FIELD_BIAS, decisions: str | None = None
            ) -> list[Grid]:
    """The grids of profile ``profile_name`` under its study's decisions; ``field_bias_name`` (a key of
    ``recipes.FIELD_BIASES``) sets the field bias of the Boltzmann modes (the fair study's bias comparison runs
    every variant whatever it is). ``decisions``: a JSON object of decisions that replace the study's own (to
    see the runs they would add); ValueError for a study without decisions or a key that is not one."""
    field_bias(field_bias_name)  # validates the name
    study = study_of_profile(profile_name)
    d = load_decisions(study)
    if decisions is not None:
        d = replaced_decisions(study, d, decisions)
    return study.PROFILES[profile_name](field_bias_name, d)


def replaced_decisions(study: ModuleType, d, text: str):
    """``d`` with the fields given in ``text`` (a JSON object, keys as in decisions.json) replaced."""
    if d is None:
        raise ValueError(f"study {name(study)!r} has no decisions to replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"decisions {text!r} are not JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"decisions {text!r} must be a JSON object")
    return dataclasses.replace(d, **_fields(type(d), data, f"decisions {text!r}"))


def study_of(res: Results) -> ModuleType:
    """The study whose report fits these results: the first other than the default that owns them, else the
    default."""
    default, *others = all_studies()
    for study in others:
        try:
            owned = study.owns(res)
        except Exception as e:  # a study's own rule failing: name it
            raise StudyError(f"study {name(study)!r} ({study.__file__}): owns() raised {type(e).__name__}: {e}") from e
        if owned:
            return study
    return default


def context(study: ModuleType, results_dir: Path, out: Path, decisions=None) -> ReportContext:
    """What ``study``'s report is handed: its decisions (``decisions``, else its folder's) and protocol, and
    the paths of the archives it reads (each profile's report folder beside ``out``)."""
    known = profiles()
    reads = getattr(study, "READS", ())
    unknown = [p for p in reads if p not in known]
    if unknown:
        raise ValueError(f"study {name(study)!r} reads the archives of unknown profiles {unknown}; known: {known}")
    archives = {p: out.parent / p / ARCHIVE for p in reads}
    for p, path in archives.items():
        if not path.exists():
            warnings.warn(f"the report of study {name(study)!r} reads the archive of profile {p!r} beside it, and "
                          f"{path} does not exist: the rows that come from it are left out (write the report of "
                          f"{p!r} there first, or copy its folder from report/)", stacklevel=3)
    return ReportContext(results_dir, out, load_decisions(study) if decisions is None else decisions, protocol(study),
                         archives)


def write_report(results_dir: str | Path, out_dir: str | Path, decisions=None) -> Path:
    """Write ``out_dir/README.md``, its PNGs and ``runs.jsonl.gz`` (the data behind them, small enough to
    commit) from ``results_dir/runs/*.json`` or from such an archive; returns the README's path. The report
    applies the owning study's decisions from its folder, or ``decisions`` when given (e.g. to see a report
    under other decisions)."""
    results_dir, out = Path(results_dir), Path(out_dir)
    runs = load_runs(results_dir)
    res = Results(runs)
    out.mkdir(parents=True, exist_ok=True)
    write_archive(runs, out)  # after loading: the source may be this file
    study = study_of(res)
    lines = study.report(res, context(study, results_dir, out, decisions))
    path = out / "README.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
