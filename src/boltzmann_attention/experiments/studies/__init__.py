"""The studies: one module per study, each owning its grids (profiles) and its report.

    paper.py     the paper's tables and claims (profiles quick and full); the default report
    fair.py      fair baselines: field-bias variants, convergence, sensitivity of J (profile fair)
    sampling.py  models trained through DQA, PT and Gibbs against exact marginals (profile sampling), and
                 through DQA in its Boltzmann regime, calibrated to exp(-E) (profile dqa-boltzmann)
    baselines.py strong baselines: nanoGPT's init, per-mode learning rates, training length, the nanoGPT
                 check (profile baselines)
    brackets.py  bracket matching with headroom: the difficulty calibrated on softmax (profile
                 brackets-calibration), and the mechanisms on the chosen setting (profile brackets-hard)
    realsize.py  does J help in a real-size model: nanoGPT's CPU configuration, softmax, h and three h+J
                 variants (coupled window, mean field, banded exact), T = 64 and 256 (profile realsize)

A study module provides ``PROFILES`` ({profile name: grids(field_bias) -> list of Grid}), ``owns(results)``
(whether a results folder is this study's) and ``report(results, results_dir, out) -> Markdown lines``.
Adding a study is adding its module and a line in ``STUDIES``. The CLI uses only the names below.
"""

from __future__ import annotations

from pathlib import Path

from ..results import Results, load_runs, write_archive
from ..sweep import DEFAULT_FIELD_BIAS, FIELD_BIASES, PAPER_FIELD_BIAS, Grid, field_bias_config
from . import baselines, brackets, fair, paper, realsize, sampling

__all__ = ["DEFAULT_FIELD_BIAS", "FIELD_BIASES", "PAPER_FIELD_BIAS", "PROFILES", "STUDIES", "profile",
           "study_of", "write_report"]

# In the order of the CLI's profiles. A results folder's report is that of the first study after the default
# (paper) that owns it, else the default's.
STUDIES = (paper, fair, sampling, baselines, brackets, realsize)
DEFAULT_STUDY = paper

PROFILES = tuple(name for study in STUDIES for name in study.PROFILES)


def profile(name: str, field_bias: str = DEFAULT_FIELD_BIAS) -> list[Grid]:
    """The grids of profile ``name``; ``field_bias`` (a key of FIELD_BIASES) sets the field bias of the
    Boltzmann modes (the fair study's bias comparison runs every variant whatever it is)."""
    field_bias_config(field_bias, 2)  # validates the name
    for study in STUDIES:
        if name in study.PROFILES:
            return study.PROFILES[name](field_bias)
    raise ValueError(f"unknown profile {name!r}; choose one of {PROFILES}")


def study_of(res: Results):
    """The study module whose report fits these results."""
    return next((s for s in STUDIES if s is not DEFAULT_STUDY and s.owns(res)), DEFAULT_STUDY)


def write_report(results_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir/README.md``, its PNGs and ``runs.jsonl.gz`` (the data behind them, small enough to
    commit) from ``results_dir/runs/*.json`` or from such an archive; returns the README's path."""
    results_dir, out = Path(results_dir), Path(out_dir)
    runs = load_runs(results_dir)
    res = Results(runs)
    out.mkdir(parents=True, exist_ok=True)
    write_archive(runs, out)  # after loading: the source may be this file
    lines = study_of(res).report(res, results_dir, out)
    path = out / "README.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
