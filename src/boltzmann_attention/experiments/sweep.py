"""Sweeps over task x T x mode x method x seed, and the paper's profiles.

A run is named by its grid point (``shakespeare-T8-h+J-exact-base-s0``). Its result is written atomically to
``<out>/runs/<name>.json`` and its checkpoint to ``<out>/checkpoints/<name>.pt``; a sweep skips runs whose
result exists and resumes a killed run from its checkpoint, so nothing finished is lost.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..benchmark import TRAINING_SAMPLER_OPTIONS
from .train import TrainConfig, train, write_result

# The paper's numbers (arXiv:2606.12478), as summarised in shared/docs/BOLTZMANN_ATTENTION.md.
# Shakespeare: relative improvement of validation perplexity over softmax, percent (positive = better).
PAPER_SHAKESPEARE_RELATIVE = {
    ("h+J", 4): -0.02, ("h+J", 6): 0.43, ("h+J", 8): 0.81, ("h+J", 10): 0.92, ("h+J", 12): 1.08,
    ("h+J", 14): 1.04, ("h", 8): -3.08, ("h", 12): -7.14, ("J", 14): -14.73,
}
# Brackets: accuracy over closing brackets, percent.
PAPER_BRACKETS_ACCURACY = {("h+J", 16): 95.97, ("softmax", 16): 93.08, ("h", 16): 90.06, ("J", 16): 87.42}

PAPER_MODES = ("softmax", "h+J", "h", "J")

# The field bias b of modes h, J and h+J (one per head), as (learnable, coefficient c) with b = c * log(T) at
# initialisation. The weights are sigmoid(2h), so b is a logit bias of 2b: "learn-half-log-T" starts at
# sigmoid attention's recommended logit bias -log T (Ramapuram et al., 2024). The paper's energy has no bias
# term, so "fixed-0" is the paper-faithful parametrisation.
FIELD_BIASES = {
    "fixed-0": (False, 0.0),
    "learn-0": (True, 0.0),
    "learn-half-log-T": (True, -0.5),
    "fixed-log-T": (False, -1.0),
}
DEFAULT_FIELD_BIAS = "learn-half-log-T"  # TrainConfig's default (field_bias_init=None, learn_field_bias=True)
PAPER_FIELD_BIAS = "fixed-0"


def field_bias_config(name: str, T: int) -> dict:
    """The TrainConfig fields of field-bias variant ``name`` at window T."""
    if name not in FIELD_BIASES:
        raise ValueError(f"unknown field bias {name!r}; choose one of {sorted(FIELD_BIASES)}")
    learnable, coefficient = FIELD_BIASES[name]
    return {"field_bias_init": coefficient * math.log(T) + 0.0, "learn_field_bias": learnable}


@dataclass
class Grid:
    """A grid of runs sharing one variant (a label plus TrainConfig overrides, and optionally a field-bias
    variant of FIELD_BIASES, resolved per T into field_bias_init and learn_field_bias)."""

    tasks: tuple[str, ...]
    Ts: tuple[int, ...]
    modes: tuple[str, ...] = PAPER_MODES
    methods: tuple[str, ...] = ("exact",)
    seeds: tuple[int, ...] = (0, 1, 2)
    variant: str = "base"
    overrides: dict = field(default_factory=dict)
    field_bias: str | None = None

    def runs(self) -> list[tuple[str, TrainConfig]]:
        out = []
        for task in self.tasks:
            for T in self.Ts:
                overrides = dict(self.overrides)
                if self.field_bias is not None:
                    overrides.update(field_bias_config(self.field_bias, T))
                for mode in self.modes:
                    for method in self.methods:
                        for seed in self.seeds:
                            cfg = TrainConfig(task=task, T=T, mode=mode, method=method, seed=seed, **overrides)
                            out.append((run_name(cfg, self.variant), cfg))
        return out


def run_name(cfg: TrainConfig, variant: str = "base") -> str:
    return f"{cfg.task}-T{cfg.T}-{cfg.mode}-{cfg.method}-{variant}-s{cfg.seed}"


def profile(name: str, field_bias: str = DEFAULT_FIELD_BIAS) -> list[Grid]:
    """The grids of a profile. 'quick' fits in about 15 minutes on 2 cores; 'full' is the paper's tables;
    'fair' is the fair-baselines study (:func:`fair_grids`); 'sampling' trains through samplers
    (:func:`sampling_grids`). ``field_bias`` (a key of FIELD_BIASES) sets the field bias of every Boltzmann
    mode in 'quick', 'full' and 'sampling', and of the convergence and J-sensitivity runs in 'fair' (its bias
    study runs every variant)."""
    field_bias_config(field_bias, 2)  # validates the name
    if name == "fair":
        return fair_grids(field_bias)
    grids = sampling_grids() if name == "sampling" else _paper_profile(name)
    if field_bias == DEFAULT_FIELD_BIAS:  # TrainConfig's defaults already are this variant
        return grids
    return [replace(g, field_bias=field_bias) for g in grids]


def _paper_profile(name: str) -> list[Grid]:
    if name == "quick":
        return [Grid(("shakespeare",), (4, 8), seeds=(0,), overrides={"steps": 1000, "eval_interval": 250}),
                Grid(("brackets",), (8,), seeds=(0,), overrides={"steps": 1000, "eval_interval": 250})]
    if name == "full":
        return [
            Grid(("shakespeare",), (4, 6, 8, 10, 12, 14)),
            Grid(("brackets",), (4, 6, 8, 10, 12, 14, 16)),
            Grid(("brackets",), (8, 12, 16), variant="noffn", overrides={"d_ff": 0}),
            Grid(("shakespeare", "brackets"), (8, 12), modes=("h+K", "h+J+K")),
            Grid(("shakespeare",), (16, 20), modes=("softmax", "h+J", "h"), seeds=(0,)),
        ]
    raise ValueError(f"unknown profile {name!r}; choose one of {PROFILES}")


PROFILES = ("quick", "full", "fair", "sampling")

# Training through samplers (profile 'sampling'). DQA at the paper's 200 Trotter steps and 5 ns (the
# defaults of ising.annealing) with its straight-through estimator; PT and Gibbs with few sweeps, since every
# training step samples afresh.
DQA_OPTIONS = TRAINING_SAMPLER_OPTIONS["dqa"]
PT_OPTIONS = TRAINING_SAMPLER_OPTIONS["pt"]
NUDGED_OPTIONS = TRAINING_SAMPLER_OPTIONS["gibbs"]  # Gibbs, gradient-free in J


def sampling_grids() -> list[Grid]:
    """Models trained through sampled marginals against the same models trained with exact marginals.

    In the order they run (cheapest first), each after its exact references: DQA-trained h+J at T = 4;
    PT-trained h+J and gradient-free J-only training (Gibbs, nudged) at T = 4; then the rest of the paper's
    DQA grid, T = 6 and 8 (about 4 and 9 minutes per run, one thread each, two runs at a time on 2 cores:
    the 30 sampled runs took 50 minutes with ``--jobs 2``). Last, variant 'sampling-trotter800': the same
    5 ns anneal in 4x finer Trotter steps at T = 6 on Shakespeare, with its own exact references, to test
    whether DQA's gap to exact comes from the digitised (aliased) dynamics of 200 steps.
    """
    seeds, both, variant, fine = (0, 1, 2), ("shakespeare", "brackets"), "sampling", "sampling-trotter800"

    def sampled(Ts, mode, method, options):
        return Grid(both, Ts, modes=(mode,), methods=(method,), seeds=seeds, variant=variant,
                    overrides={"method_options": options})

    def exact(Ts, modes):
        return Grid(both, Ts, modes=modes, seeds=seeds, variant=variant)

    return [exact((4,), ("softmax", "h+J")), sampled((4,), "h+J", "dqa", DQA_OPTIONS),
            exact((4,), ("J",)), sampled((4,), "h+J", "pt", PT_OPTIONS), sampled((4,), "J", "gibbs", NUDGED_OPTIONS),
            exact((6, 8), ("softmax", "h+J")), sampled((6, 8), "h+J", "dqa", DQA_OPTIONS),
            Grid(("shakespeare",), (6,), modes=("softmax", "h+J"), seeds=seeds, variant=fine),
            Grid(("shakespeare",), (6,), modes=("h+J",), methods=("dqa",), seeds=seeds, variant=fine,
                 overrides={"method_options": {**DQA_OPTIONS, "trotter_steps": 800}})]


FAIR_SEEDS = (0, 1, 2, 3, 4)
FAIR_T = 12
J_LR_MULTIPLIERS = (0.3, 3.0)   # besides 1.0, which is the bias study's run
J_INIT_STD = 0.1                # "small random" couplings: N(0, 0.1^2), against 0 by default
NOFFN = "noffn-"  # variant prefix of the brackets runs without the FFN (d_ff = 0)


def fair_grids(field_bias: str = DEFAULT_FIELD_BIAS) -> list[Grid]:
    """The fair-baselines study, in the order it is run (the most important grids first).

    1. Every field-bias variant for h, h+J and J against one softmax baseline, at T = 12 on both tasks.
    2. Convergence: softmax, h and h+J trained 4x longer at T = 12 on Shakespeare.
    3. The field-bias study on brackets without the FFN (T = 12), where the modes do not all reach 100%.
    4. Sensitivity of J (h+J and J) at T = 12: its learning-rate multiplier and its initialisation, on
       Shakespeare and on brackets without the FFN (with the FFN every mode saturates at T = 12).
    5. The field-bias study again at T = 8 on Shakespeare.
    Seeds are paired: a seed fixes the initialisation and the data order for every mode. Stages 2 and 4 use
    ``field_bias`` (the default's variant); their 1x / zero-init counterpart is the bias-study run.
    Variants: ``fair`` (softmax), ``bias-<b>``, ``long``, ``long-bias-<b>``, ``jlr<m>-bias-<b>``,
    ``jinit<std>-bias-<b>``, each prefixed with NOFFN for the brackets runs without the FFN.
    """
    seeds, T, boltzmann = FAIR_SEEDS, FAIR_T, ("h", "h+J", "J")
    settings = {"shakespeare": ("shakespeare", "", {}), "brackets": ("brackets", "", {}),
                "brackets-noffn": ("brackets", NOFFN, {"d_ff": 0})}

    def bias_study(setting: str, Ts: tuple[int, ...]) -> list[Grid]:
        task, prefix, overrides = settings[setting]
        return [Grid((task,), Ts, modes=("softmax",), seeds=seeds, variant=f"{prefix}fair", overrides=overrides)] + [
            Grid((task,), Ts, modes=boltzmann, seeds=seeds, variant=f"{prefix}bias-{b}", overrides=overrides,
                 field_bias=b) for b in FIELD_BIASES]

    def sensitivity(setting: str, mode: str) -> list[Grid]:
        task, prefix, overrides = settings[setting]
        grids = [Grid((task,), (T,), modes=(mode,), seeds=seeds, variant=f"{prefix}jlr{m:g}-bias-{field_bias}",
                      overrides={**overrides, "coupling_lr_multiplier": m}, field_bias=field_bias)
                 for m in J_LR_MULTIPLIERS]
        return grids + [Grid((task,), (T,), modes=(mode,), seeds=seeds,
                             variant=f"{prefix}jinit{J_INIT_STD:g}-bias-{field_bias}",
                             overrides={**overrides, "coupling_init_std": J_INIT_STD}, field_bias=field_bias)]

    grids = bias_study("shakespeare", (T,)) + bias_study("brackets", (T,))
    grids.append(Grid(("shakespeare",), (T,), modes=("softmax",), seeds=seeds, variant="long",
                      overrides={"steps": 16000}))
    grids.append(Grid(("shakespeare",), (T,), modes=("h", "h+J"), seeds=seeds, variant=f"long-bias-{field_bias}",
                      overrides={"steps": 16000}, field_bias=field_bias))
    grids += bias_study("brackets-noffn", (T,))
    for mode in ("h+J", "J"):
        grids += sensitivity("shakespeare", mode) + sensitivity("brackets-noffn", mode)
    return grids + bias_study("shakespeare", (8,))


def _run_one(args) -> tuple[str, str | None]:
    """Train one grid point; returns (name, None) or (name, error message). One failure does not stop a sweep."""
    name, cfg_dict, variant, out, threads, progress = args
    torch.set_num_threads(threads)
    cfg = TrainConfig.from_dict(cfg_dict)
    out = Path(out)
    checkpoint = out / "checkpoints" / f"{name}.pt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = train(cfg, checkpoint=checkpoint, progress=progress)
    except Exception as e:  # reported by sweep(), which goes on with the other runs
        return name, f"{type(e).__name__}: {e}"
    result.update(run=name, variant=variant)
    write_result(result, out / "runs" / f"{name}.json")
    checkpoint.unlink(missing_ok=True)
    return name, None


def sweep(grids: list[Grid], out: str | Path, jobs: int = 1, dry_run: bool = False,
          threads: int | None = None) -> list[str]:
    """Run every grid point whose result does not exist yet; returns the names run.

    Every config is validated first, so a bad grid fails before any training. ``jobs`` processes run in
    parallel, sharing the machine's cores (``threads`` torch threads each, default cores / jobs). A run
    that fails (e.g. a checkpoint from another config) is reported and the others go on; at the end a
    RuntimeError lists the failures.
    """
    out = Path(out)
    todo, seen = [], set()
    for grid in grids:
        for name, cfg in grid.runs():
            cfg.validate()
            if name in seen or (out / "runs" / f"{name}.json").exists():
                continue
            seen.add(name)
            todo.append((name, asdict(cfg), grid.variant))
    if dry_run or not todo:
        return [t[0] for t in todo]
    threads = threads or max(1, (os.cpu_count() or 1) // jobs)
    tasks = [(name, cfg, variant, str(out), threads, jobs == 1) for name, cfg, variant in todo]
    from .progress import progress as tqdm

    if jobs == 1:
        outcomes = [_run_one(t) for t in tqdm(tasks, desc="sweep", unit="run")]
    else:
        with mp.get_context("spawn").Pool(jobs) as pool:
            outcomes = list(tqdm(pool.imap_unordered(_run_one, tasks), total=len(tasks), desc="sweep", unit="run"))
    failures = [f"{name}: {error}" for name, error in outcomes if error]
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(tasks)} runs failed:\n" + "\n".join(failures))
    return [t[0] for t in todo]


def with_overrides(grids: list[Grid], **overrides) -> list[Grid]:
    """The same grids with extra TrainConfig overrides (e.g. fewer steps for a smoke test)."""
    return [replace(g, overrides={**g.overrides, **overrides}) for g in grids]
