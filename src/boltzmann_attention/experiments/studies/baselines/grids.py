"""The baselines study's grids and decisions."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...model import INITS
from ...recipes import (
    DEFAULT_FIELD_BIAS,
    FIELD_BIASES,
    J_INIT_STD,
    J_LR_MULTIPLIERS,
    NANOGPT,
    NANOGPT_T,
    with_field_bias,
)
from ...sweep import Grid

MODES = ("softmax", "h", "J", "h+J")
INIT_SEEDS = (0, 1, 2, 3, 4)
SEEDS = (0, 1, 2)
INIT_TS = (12, 8)
BASE_LR = 3e-3  # the package's learning rate so far: the init study's
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
STEPS = (4000, 16000, 64000)
CONVERGENCE_T = 12
GRID_STEPS = 16000  # stage 5's training length (how it was fixed: protocol.md)
GRID_TS = (8, 12, 4, 6, 10, 14)  # in the order they run: the init study's windows first
GRID_SEEDS = (0, 1, 2, 3, 4)
FAIR_T = 12
LONG_TS = (16, 20)  # exact's cost grows as 2^T: 3 seeds, no J-only (as in the paper)
LONGEST_T = 24  # stage 7, last
LONG_MODES = ("softmax", "h", "h+J")


@dataclass(frozen=True)
class Decisions:
    """The decisions of the earlier stages (``decisions.json``; the measurement behind each: the report)."""

    chosen_init: str = "gpt2"  # stage 1
    extra_learning_rates: dict[str, tuple[float, ...]] = field(default_factory=dict)  # stage 2: mode -> lrs added
    best_lr: dict[str, float] = field(default_factory=dict)  # stage 2: mode -> lr


FULL = "full"  # the profile whose report archive holds the first recipe's runs (the claims then and now)
READS = (FULL,)
SETS_INIT = ("baselines",)  # its first stage compares the inits itself
PREFIX = "init-"  # every variant of this study but the nanoGPT check
NANOGPT_VARIANT = "nanogpt"


def variant(init: str, lr: float = BASE_LR, steps: int = 4000) -> str:
    """``init-<init>[-lr<lr>][-steps<steps>]``: the parts that differ from the init study's settings."""
    return f"{PREFIX}{init}" + ("" if lr == BASE_LR else f"-lr{lr:g}") + ("" if steps == 4000 else f"-steps{steps}")


def _grid(T: int, modes, seeds, init: str, lr: float = BASE_LR, steps: int = 4000) -> Grid:
    overrides = {"init": init, "lr": lr, "steps": steps, "fused_optimizer": False}
    if steps != 4000:
        overrides["eval_interval"] = steps // 16
    return Grid(("shakespeare",), (T,), modes=tuple(modes), seeds=seeds, variant=variant(init, lr, steps),
                overrides=overrides)


def baselines_grids(field_bias: str, d: Decisions) -> list[Grid]:
    """The stages in the order they run: init, the nanoGPT check (before any further comparison), learning
    rates, training length, the paper's grid, the fair study, T = 24 (a stage whose decision is not made yet
    has no grid)."""
    grids = [_grid(T, MODES, INIT_SEEDS, init) for T in INIT_TS for init in INITS]
    grids.append(Grid(("shakespeare",), (NANOGPT_T,), modes=("softmax",), seeds=SEEDS, variant=NANOGPT_VARIANT,
                      overrides=NANOGPT))
    grids += [_grid(T, MODES, SEEDS, d.chosen_init, lr) for T in INIT_TS for lr in LEARNING_RATES if lr != BASE_LR]
    grids += [_grid(T, (mode,), SEEDS, d.chosen_init, lr) for mode, lrs in d.extra_learning_rates.items()
              for T in INIT_TS for lr in lrs]
    for steps in STEPS[1:]:
        grids += [_grid(CONVERGENCE_T, (mode,), SEEDS, d.chosen_init, lr, steps) for mode, lr in d.best_lr.items()]
    grids += paper_grid(d)
    longest = [_grid(LONGEST_T, (mode,), (seed,), d.chosen_init, d.best_lr[mode], GRID_STEPS)
               for seed in SEEDS for mode in LONG_MODES]
    return with_field_bias(grids, field_bias) + fair_grids(field_bias, d) + with_field_bias(longest, field_bias)


def paper_grid(d: Decisions) -> list[Grid]:
    """Stage 5, seed by seed within each T so that paired comparisons complete early. At T = 12 the first
    three seeds are stage 3's 16000-step runs (the same names)."""
    grids = [_grid(T, (mode,), (seed,), d.chosen_init, d.best_lr[mode], GRID_STEPS)
             for T in GRID_TS for seed in GRID_SEEDS for mode in MODES]
    return grids + [_grid(T, (mode,), (seed,), d.chosen_init, d.best_lr[mode], GRID_STEPS)
                    for T in LONG_TS for seed in SEEDS for mode in LONG_MODES]



FAIR_MODES = ("h", "h+J", "J")
SENSITIVITY_MODES = ("h+J", "J")


def fair_variants(field_bias: str = DEFAULT_FIELD_BIAS) -> dict[str, tuple[dict, str | None, tuple[str, ...]]]:
    """Stage 6's settings: suffix of the variant name -> (TrainConfig overrides, field bias, modes). The
    empty suffix is stage 5's run at the default field bias."""
    out = {"": ({}, None, FAIR_MODES)}
    out |= {f"-bias-{b}": ({}, b, FAIR_MODES) for b in FIELD_BIASES if b != field_bias}
    out |= {f"-jlr{m:g}": ({"coupling_lr_multiplier": m}, None, SENSITIVITY_MODES) for m in J_LR_MULTIPLIERS}
    out[f"-jinit{J_INIT_STD:g}"] = ({"coupling_init_std": J_INIT_STD}, None, SENSITIVITY_MODES)
    return out


def fair_grids(field_bias: str, d: Decisions) -> list[Grid]:
    """Stage 6, seed by seed: h, h+J and J with every other field bias, and J's sensitivity (its lr multiplier
    and a random initialisation) for h+J and J, at T = FAIR_T, each mode at its best lr."""
    grids = []
    for seed in GRID_SEEDS:
        for suffix, (overrides, bias, modes) in fair_variants(field_bias).items():
            if not suffix:
                continue
            for mode in modes:
                g = _grid(FAIR_T, (mode,), (seed,), d.chosen_init, d.best_lr[mode], GRID_STEPS)
                named = bias or (None if field_bias == DEFAULT_FIELD_BIAS else field_bias)
                grids.append(replace(g, variant=g.variant + suffix, overrides={**g.overrides, **overrides},
                                     field_bias=None if named is None else FIELD_BIASES[named]))
    return grids
