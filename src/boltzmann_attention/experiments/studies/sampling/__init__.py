"""Models trained through samplers (DQA, PT, Gibbs) against the same models trained with exact marginals:
profiles ``sampling`` and ``dqa-boltzmann`` and their report.

The sampler settings are the shared recipe's (:data:`..recipes.TRAINING_SAMPLER_OPTIONS`, the values the
benchmark measures the samplers at). ``sampling`` runs DQA at energy scale 1, its near-adiabatic regime;
``dqa-boltzmann`` runs it at the energy scale calibrated to approximate exp(-E) (``target_beta=1.0``, see
``ising.annealing.calibrate_energy_scale``). Both profiles' runs can share one results folder (every variant
starts with ``sampling``), and its report then holds both regimes. Why each setting is what it is, and what it
cost: ``protocol.md``.
"""

from __future__ import annotations

import inspect
import statistics
from dataclasses import replace

from ....ising.annealing import ANNEAL_OPTIONS, dqa_marginals
from ...recipes import BEST_LR, CHOSEN_INIT, FIRST_RECIPE, TRAINING_SAMPLER_OPTIONS, with_field_bias
from ...report import (
    TASK_METRICS,
    ReportContext,
    brackets_section,
    couplings_section,
    header_section,
    sampler_section,
    shakespeare_section,
    summarize,
    verdict,
)
from ...results import Group, Results, mode_rank
from ...stats import Paired, stat
from ...sweep import Grid, with_overrides
from ...tables import duration, fmt_comparison, fmt_stat, md_table, table_with_holm

# DQA at the paper's 200 Trotter steps and 5 ns (the defaults of ising.annealing) with its straight-through
# estimator; PT and Gibbs with few sweeps, since every training step samples afresh.
DQA_OPTIONS = TRAINING_SAMPLER_OPTIONS["dqa"]
PT_OPTIONS = TRAINING_SAMPLER_OPTIONS["pt"]
NUDGED_OPTIONS = TRAINING_SAMPLER_OPTIONS["gibbs"]  # Gibbs, gradient-free in J
VARIANT = "sampling"


def sampling_grids(field_bias: str, decisions: None = None) -> list[Grid]:
    """Models trained through sampled marginals against the same models trained with exact marginals.

    In the order they run (cheapest first), each after its exact references: DQA-trained h+J at T = 4;
    PT-trained h+J and gradient-free J-only training (Gibbs, nudged) at T = 4; then the rest of the paper's
    DQA grid, T = 6 and 8. Last, variant 'sampling-trotter800': the same 5 ns anneal in 4x finer Trotter steps
    at T = 6 on Shakespeare, with its own exact references. In the first recipe (``recipes.FIRST_RECIPE``), as
    committed.
    """
    seeds, both, variant, fine = (0, 1, 2), ("shakespeare", "brackets"), VARIANT, f"{VARIANT}-trotter800"

    def sampled(Ts, mode, method, options):
        return Grid(both, Ts, modes=(mode,), methods=(method,), seeds=seeds, variant=variant,
                    overrides={"method_options": options})

    def exact(Ts, modes):
        return Grid(both, Ts, modes=modes, seeds=seeds, variant=variant)

    return with_overrides(with_field_bias([
        exact((4,), ("softmax", "h+J")), sampled((4,), "h+J", "dqa", DQA_OPTIONS),
        exact((4,), ("J",)), sampled((4,), "h+J", "pt", PT_OPTIONS), sampled((4,), "J", "gibbs", NUDGED_OPTIONS),
        exact((6, 8), ("softmax", "h+J")), sampled((6, 8), "h+J", "dqa", DQA_OPTIONS),
        Grid(("shakespeare",), (6,), modes=("softmax", "h+J"), seeds=seeds, variant=fine),
        Grid(("shakespeare",), (6,), modes=("h+J",), methods=("dqa",), seeds=seeds, variant=fine,
             overrides={"method_options": {**DQA_OPTIONS, "trotter_steps": 800}})], field_bias), **FIRST_RECIPE)


# DQA in its Boltzmann regime: the calibrated anneal with each of two gradient estimators.
BOLTZMANN = f"{VARIANT}-boltzmann"  # the exact-trained references; the DQA runs are f"{BOLTZMANN}-<gradient>"
BOLTZMANN_GRADIENTS = ("ste", "covariance")
BOLTZMANN_TS = (4, 6, 8)
BOLTZMANN_SEEDS = (0, 1, 2)
BOLTZMANN_STEPS = 4000  # the sampling study's length, not the baselines' 16000 (why: protocol.md)
BOLTZMANN_DQA = {**DQA_OPTIONS, "target_beta": 1.0}  # gradient set per variant


def boltzmann_recipe(mode: str) -> dict:
    """The strong recipe (:mod:`..recipes`): nanoGPT's init, the mode's best learning rate and unfused AdamW,
    at BOLTZMANN_STEPS steps (every schedule complete)."""
    return {"init": CHOSEN_INIT, "lr": BEST_LR[mode], "fused_optimizer": False, "steps": BOLTZMANN_STEPS}


def boltzmann_grids(field_bias: str, decisions: None = None) -> list[Grid]:
    """DQA-trained h+J against exact-trained h+J with DQA in its Boltzmann regime.

    DQA at the defaults (5 ns, linear schedule, 200 Trotter steps, 100 samples per query) with
    ``target_beta=1.0``, with each gradient estimator, straight-through ('ste', variant
    ``sampling-boltzmann-ste``) and covariance (``sampling-boltzmann-covariance``); Shakespeare and brackets,
    BOLTZMANN_TS, BOLTZMANN_SEEDS; exact-trained softmax and h+J with the same seeds and recipe (variant
    ``sampling-boltzmann``) as references. Every DQA run is also evaluated with exact marginals (``val_exact``,
    ``test_exact``). Recipe: :func:`boltzmann_recipe`. In the order they run: the exact references, then DQA
    at each T for both tasks and both gradients.
    """
    grids = [Grid(("shakespeare", "brackets"), BOLTZMANN_TS, modes=(mode,), seeds=BOLTZMANN_SEEDS,
                  variant=BOLTZMANN, overrides=boltzmann_recipe(mode)) for mode in ("softmax", "h+J")]
    grids += [Grid(("shakespeare", "brackets"), (T,), modes=("h+J",), methods=("dqa",), seeds=BOLTZMANN_SEEDS,
                   variant=f"{BOLTZMANN}-{gradient}",
                   overrides={**boltzmann_recipe("h+J"), "method_options": {**BOLTZMANN_DQA, "gradient": gradient}})
              for T in BOLTZMANN_TS for gradient in BOLTZMANN_GRADIENTS]
    return with_field_bias(grids, field_bias)


PROFILES = {"sampling": sampling_grids, "dqa-boltzmann": boltzmann_grids}
HELP = {"sampling": "models trained through DQA, PT and Gibbs against exact",
        "dqa-boltzmann": "models trained through DQA at its energy scale calibrated to exp(-E), against exact"}


# ---------------------------------------------------------------------------------------------------- report

def owns(res: Results) -> bool:
    """True when every run is of this study's variants (``sampling``, ``sampling-*``)."""
    return bool(res.all_runs) and all(r.variant == VARIANT or r.variant.startswith(f"{VARIANT}-")
                                      for r in res.all_runs)


def report(res: Results, context: ReportContext) -> list[str]:
    """Header, the sampler comparison, DQA's two regimes, the task tables and the learned couplings (all but
    the header on :func:`view`)."""
    out = context.out
    lines = header_section(res, context.results_dir)
    res = view(res)
    lines += sampler_section(res)
    lines += regime_section(res)
    if "shakespeare" in res.tasks():
        lines += shakespeare_section(res, out)
    if "brackets" in res.tasks():
        lines += brackets_section(res, out)
    return lines + couplings_section(res, out)


def view(res: Results) -> Results:
    """The runs with the DQA runs of variant ``sampling-boltzmann-<gradient>`` moved into
    ``sampling-boltzmann`` (beside their exact references) as method ``dqa-<gradient>``, so that each gradient
    is its own column and row."""
    prefix = f"{BOLTZMANN}-"
    return Results([replace(r, variant=BOLTZMANN, method=f"{r.method}-{r.variant[len(prefix):]}")
                    if r.variant.startswith(prefix) else r for r in res.runs])


def _show(values: dict, scale: float) -> str:
    return fmt_stat(stat(values.values()), scale=scale)


def _paired(c: Paired | None, unit: str) -> str:
    return fmt_comparison(c) + unit if c else ""


# ------------------------------------------------------------------------------------- DQA's two regimes

DQA_DEFAULT_GRADIENT = inspect.signature(dqa_marginals).parameters["gradient"].default
REGIME_CLAIMS = (
    "DQA-trained h+J is level with exact-trained h+J, evaluated through DQA (the paper's claim)",
    "DQA-trained weights are level with exact-trained h+J when evaluated with exact marginals (DQA trains "
    "Boltzmann attention)",
    "DQA-trained weights do as well with exact marginals as through DQA (they do not rely on DQA's own output)",
)


def dqa_regime(options: dict) -> str:
    """DQA's operating point in a run's method options: 'Boltzmann (target_beta b)', 'near-adiabatic (energy
    scale 1)' (the default scale, where beta_eff is about 2.8 on training-like systems: report/dqa_calibration)
    or 'energy scale c', then any other anneal option that is not at its default."""
    if options.get("target_beta") is not None:
        text = f"Boltzmann (target_beta {options['target_beta']:g})"
    else:
        scale = 1.0 if options.get("energy_scale") is None else options["energy_scale"]
        text = "near-adiabatic (energy scale 1)" if scale == 1 else f"energy scale {scale:g}"
    extra = [f"{k} {options[k]}" for k, default in ANNEAL_OPTIONS.items()
             if k not in ("energy_scale", "target_beta") and k in options and options[k] != default]
    return ", ".join([text, *extra])


def _setting(g: Group) -> tuple[str, str, str]:
    """(regime, gradient, recipe) of a DQA-trained group, from its first run's config."""
    cfg = next(iter(g.runs.values())).config
    options = cfg.get("method_options") or {}
    recipe = f"init {cfg.get('init')}, lr {cfg.get('lr'):g}, {cfg.get('steps')} steps"
    return dqa_regime(options), str(options.get("gradient", DQA_DEFAULT_GRADIENT)), recipe


def _setting_rank(setting: tuple[str, str, str]) -> tuple:
    regime, gradient, recipe = setting
    return regime.startswith("Boltzmann"), regime, gradient != "ste", gradient, recipe


def _dqa_comparisons(res: Results) -> list[dict]:
    """Per DQA-trained group with an exact-trained one at its grid point: the setting and the three paired
    differences (through DQA and with exact marginals against exact-trained; DQA eval against exact eval)."""
    rows = []
    for (task, variant, T, mode, method), g in res.groups.items():
        exact = res.get(task, variant, T, mode, "exact")
        if method.split("-")[0] != "dqa" or exact is None or task not in TASK_METRICS:
            continue
        spec = TASK_METRICS[task]
        ref, through = exact.values(spec["metric"], spec["split"]), g.values(spec["metric"], spec["split"])
        exact_eval = g.values(spec["metric"], spec["split"] + "_exact")
        diffs = (spec["diff"](ref, through), spec["diff"](ref, exact_eval) if exact_eval else None,
                 spec["diff"](exact_eval, through) if exact_eval else None)
        rows.append({"task": task, "T": T, "mode": mode, "group": g, "setting": _setting(g), "ref": ref,
                     "through": through, "exact_eval": exact_eval, "diffs": diffs,
                     "unit": "%" if task == "shakespeare" else "pts", "scale": spec["scale"]})
    return sorted(rows, key=lambda r: (r["task"] != "shakespeare", r["task"], r["T"], mode_rank(r["mode"]),
                                       _setting_rank(r["setting"])))


def regime_section(res: Results) -> list[str]:
    """DQA-trained against exact-trained models per DQA regime and gradient, evaluated through DQA and with
    exact marginals (paired 95% intervals), the claims per setting, and straight-through against
    covariance gradients."""
    rows = _dqa_comparisons(res)
    if not rows:
        return []
    cells = [[r["task"], str(r["T"]), r["mode"], *r["setting"], _show(r["ref"], r["scale"]),
              _show(r["through"], r["scale"]), _show(r["exact_eval"], r["scale"]) if r["exact_eval"] else "",
              *r["diffs"], duration(statistics.mean(x.wall_time_s for x in r["group"].runs.values()))]
             for r in rows]
    lines = ["## DQA's two regimes: near-adiabatic and Boltzmann", "",
             "DQA-trained models against exact-trained ones of the same recipe and seeds. 'near-adiabatic (energy "
             "scale 1)': DQA at the default energy scale, as in the sampling study (beta_eff about 2.8 on "
             "training-like systems, report/dqa_calibration); 'Boltzmann (target_beta 1)': DQA at the energy scale "
             "calibrated to approximate exp(-E). Every DQA-trained model is evaluated through DQA and, with the "
             "same weights, with exact marginals. Metric: validation perplexity (Shakespeare, all positions) or "
             "test accuracy (brackets, %), mean ± std over seeds. Differences: paired over seeds, mean [95% "
             "interval] (Student t), in % of perplexity or in accuracy points, positive = the first named is "
             "better; `*` p < 0.05, `**` also after a Holm correction over the table. Each row is paired within "
             "its recipe; rows of different recipes (the near-adiabatic rows come from the sampling study's) are "
             "not paired with each other.", "",
             table_with_holm(["task", "T", "mode", "DQA regime", "gradient", "recipe", "exact-trained",
                              "DQA-trained, DQA eval", "DQA-trained, exact eval", "through DQA − exact-trained",
                              "exact marginals − exact-trained", "DQA eval − exact eval", "time per run"], cells), ""]
    return lines + _claims_lines(rows) + _gradient_lines(res)


def _claims_lines(rows: list[dict]) -> list[str]:
    settings = sorted({r["setting"] for r in rows}, key=_setting_rank)
    table = []
    for i, claim in enumerate(REGIME_CLAIMS):
        row = [claim]
        for setting in settings:
            mine = [r for r in rows if r["setting"] == setting]
            verdicts = [verdict(r["diffs"][i], "level", r["unit"]) for r in mine]
            text = summarize(verdicts)
            off = [f"{r['task']} T = {r['T']} ({r['diffs'][i].mean:+.2f} {r['unit']})"
                   for r, v in zip(mine, verdicts) if v.agrees is False]
            row.append(text + (f"; not level: {', '.join(off)}" if off else ""))
        table.append(row)
    return ["### Claim by claim", "",
            "Per setting (DQA regime, gradient, recipe), over the rows above: a claim of 'level' agrees where the "
            "paired t-test finds no significant difference (p ≥ 0.05), so with 3 seeds 'agrees' means 'not shown "
            "to differ' (the 95% interval spans about ±4.3 standard errors of the mean), not 'shown to be equal'; "
            "the rows that do not agree are named with their mean difference.", "",
            md_table(["claim", *(", ".join(s) for s in settings)], table), ""]


def _gradient_lines(res: Results) -> list[str]:
    """Straight-through against covariance gradients where both trained the same grid point."""
    cells, verdicts = [], []
    for (task, variant, T, mode, method), ste in sorted(res.groups.items(), key=lambda kv: (
            kv[0][0] != "shakespeare", kv[0][0], kv[0][1], kv[0][2], mode_rank(kv[0][3]))):
        cov = res.get(task, variant, T, mode, "dqa-covariance")
        if method != "dqa-ste" or cov is None or task not in TASK_METRICS:
            continue
        spec = TASK_METRICS[task]
        split = spec["split"]
        through = spec["diff"](cov.values(spec["metric"], split), ste.values(spec["metric"], split))
        exact = spec["diff"](cov.values(spec["metric"], split + "_exact"), ste.values(spec["metric"], split + "_exact"))
        cells.append([task, str(T), mode, dqa_regime(next(iter(ste.runs.values())).config.get("method_options") or {}),
                      through, exact])
        verdicts += [verdict(c, "level", "%" if task == "shakespeare" else "pts") for c in (through, exact)]
    if not cells:
        return []
    return ["### Straight-through against covariance gradients", "",
            "The same grid point trained through DQA with each gradient estimator, paired over seeds: "
            "straight-through − covariance, positive = straight-through is better; % of perplexity or accuracy "
            "points, mean [95% interval], marks as above.", "",
            table_with_holm(["task", "T", "mode", "DQA regime", "through DQA", "with exact marginals"], cells), "",
            f"Level: {summarize(verdicts)}.", ""]
