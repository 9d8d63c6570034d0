"""Models trained through samplers (DQA, PT, Gibbs) against the same models trained with exact marginals:
profile ``sampling`` and its report.

The sampler settings are the library's (:data:`boltzmann_attention.benchmark.TRAINING_SAMPLER_OPTIONS`), so
the benchmark measures the samplers as they are trained here.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ...benchmark import TRAINING_SAMPLER_OPTIONS
from ..report import TASK_METRICS, brackets_section, couplings_section, header_section, shakespeare_section, verdict
from ..results import Results, mode_rank
from ..stats import Paired, stat
from ..sweep import Grid, with_field_bias
from ..tables import duration, fmt_comparison, fmt_stat, md_table

# DQA at the paper's 200 Trotter steps and 5 ns (the defaults of ising.annealing) with its straight-through
# estimator; PT and Gibbs with few sweeps, since every training step samples afresh.
DQA_OPTIONS = TRAINING_SAMPLER_OPTIONS["dqa"]
PT_OPTIONS = TRAINING_SAMPLER_OPTIONS["pt"]
NUDGED_OPTIONS = TRAINING_SAMPLER_OPTIONS["gibbs"]  # Gibbs, gradient-free in J
VARIANT = "sampling"


def sampling_grids(field_bias: str) -> list[Grid]:
    """Models trained through sampled marginals against the same models trained with exact marginals.

    In the order they run (cheapest first), each after its exact references: DQA-trained h+J at T = 4;
    PT-trained h+J and gradient-free J-only training (Gibbs, nudged) at T = 4; then the rest of the paper's
    DQA grid, T = 6 and 8 (about 4 and 9 minutes per run, one thread each, two runs at a time on 2 cores:
    the 30 sampled runs took 50 minutes with ``--jobs 2``). Last, variant 'sampling-trotter800': the same
    5 ns anneal in 4x finer Trotter steps at T = 6 on Shakespeare, with its own exact references, to test
    whether DQA's gap to exact comes from the digitised (aliased) dynamics of 200 steps.
    """
    seeds, both, variant, fine = (0, 1, 2), ("shakespeare", "brackets"), VARIANT, f"{VARIANT}-trotter800"

    def sampled(Ts, mode, method, options):
        return Grid(both, Ts, modes=(mode,), methods=(method,), seeds=seeds, variant=variant,
                    overrides={"method_options": options})

    def exact(Ts, modes):
        return Grid(both, Ts, modes=modes, seeds=seeds, variant=variant)

    return with_field_bias([
        exact((4,), ("softmax", "h+J")), sampled((4,), "h+J", "dqa", DQA_OPTIONS),
        exact((4,), ("J",)), sampled((4,), "h+J", "pt", PT_OPTIONS), sampled((4,), "J", "gibbs", NUDGED_OPTIONS),
        exact((6, 8), ("softmax", "h+J")), sampled((6, 8), "h+J", "dqa", DQA_OPTIONS),
        Grid(("shakespeare",), (6,), modes=("softmax", "h+J"), seeds=seeds, variant=fine),
        Grid(("shakespeare",), (6,), modes=("h+J",), methods=("dqa",), seeds=seeds, variant=fine,
             overrides={"method_options": {**DQA_OPTIONS, "trotter_steps": 800}})], field_bias)


PROFILES = {"sampling": sampling_grids}


# ---------------------------------------------------------------------------------------------------- report

def owns(res: Results) -> bool:
    """True when every run is of this study's variants (``sampling``, ``sampling-*``)."""
    return bool(res.all_runs) and all(r.variant == VARIANT or r.variant.startswith(f"{VARIANT}-")
                                      for r in res.all_runs)


def report(res: Results, results_dir: Path, out: Path) -> list[str]:
    """Header, the sampler comparison, the task tables and the learned couplings."""
    lines = header_section(res, results_dir)
    lines += sampler_section(res)
    if "shakespeare" in res.tasks():
        lines += shakespeare_section(res, out)
    if "brackets" in res.tasks():
        lines += brackets_section(res, out)
    return lines + couplings_section(res, out)


def _show(values: dict, scale: float) -> str:
    return fmt_stat(stat(values.values()), scale=scale)


def _paired(c: Paired | None, unit: str) -> str:
    return fmt_comparison(c) + unit if c else ""


def sampler_section(res: Results) -> list[str]:
    """Models trained through a sampler (DQA, PT, Gibbs, ...) against the same grid point trained exactly,
    and, where the runs were also evaluated with exact marginals, how the gap splits into training and
    evaluation."""
    rows, split_rows = [], []
    for (task, variant, T, mode, method), g in sorted(res.groups.items(), key=lambda kv: (
            kv[0][0] != "shakespeare", kv[0][0], kv[0][1], kv[0][2], mode_rank(kv[0][3]), kv[0][4])):
        exact = res.get(task, variant, T, mode, "exact")
        if method in ("exact", "reference") or exact is None or task not in TASK_METRICS:
            continue
        spec = TASK_METRICS[task]
        unit = "%" if task == "shakespeare" else " pts"
        scale = spec["scale"]
        vals, ref = g.values(spec["metric"], spec["split"]), exact.values(spec["metric"], spec["split"])
        base = res.baseline(task, variant, T, "exact")
        base_vals = base.values(spec["metric"], spec["split"]) if base else {}
        c = spec["diff"](ref, vals)  # positive: the sampler-trained model is better
        options = json.dumps(next(iter(g.runs.values())).config.get("method_options") or {}, sort_keys=True)
        rows.append([task, str(T), mode, method, f"`{options}`", _show(ref, scale), _show(vals, scale),
                     fmt_comparison(spec["diff"](base_vals, ref)) if base_vals else "",
                     fmt_comparison(spec["diff"](base_vals, vals)) if base_vals else "",
                     _paired(c, unit), verdict(c, "level", unit.strip()).text,
                     duration(statistics.mean(r.wall_time_s for r in g.runs.values()))])
        exact_eval = g.values(spec["metric"], spec["split"] + "_exact")
        if exact_eval:
            trained = spec["diff"](ref, exact_eval)
            split_rows.append([task, str(T), mode, method, _show(vals, scale), _show(exact_eval, scale),
                               _show(ref, scale), _paired(trained, unit), verdict(trained, "level", unit.strip()).text,
                               _paired(spec["diff"](exact_eval, vals), unit)])
    if not rows:
        return []
    lines = ["## Trained through samplers", "",
             "Each sampler-trained model against the same grid point (task, T, mode, seeds) trained with exact "
             "marginals. Metric: validation perplexity (Shakespeare, all positions) or test accuracy (brackets), "
             "mean ± std over seeds; 'vs softmax' is the Δ of the report's tables (% or points, positive = better "
             "than softmax); 'sampler − exact' is paired over seeds (positive = the sampler-trained model is "
             "better). Wall time: mean per run.", "",
             md_table(["task", "T", "mode", "method", "options", "exact", "sampler", "exact vs softmax",
                       "sampler vs softmax", "sampler − exact", "level with exact?", "time per run"], rows), ""]
    if split_rows:
        lines += ["### Training or evaluation?", "",
                  "The sampler-trained weights evaluated twice: through their sampler (as above) and with exact "
                  "marginals. 'training' compares the second with the exact-trained model; 'evaluation' compares "
                  "the two evaluations of the same weights. The weights were fitted to their sampler's "
                  "distribution, which for DQA is not the Boltzmann one, so exact marginals can be the worse "
                  "evaluation: a large 'evaluation' difference means the model relies on what its sampler does, "
                  "not that the sampler is noisy. Paired over seeds, positive = the first named is better.", "",
                  md_table(["task", "T", "mode", "method", "sampler-trained, sampler eval",
                            "sampler-trained, exact eval", "exact-trained", "training: exact eval − exact-trained",
                            "level?", "evaluation: sampler eval − exact eval"], split_rows), ""]
    return lines


