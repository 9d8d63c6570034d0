"""The realsize study's grids and decisions."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...arms import Arm
from ...config import TrainConfig
from ...recipes import NANOGPT, NANOGPT_T, with_field_bias
from ...sweep import Grid

WINDOW = 16  # the coupled window's W
RANGE = 8    # the relative couplings' range (mean field and banded exact: one model)
ARMS = (
    Arm("softmax", "softmax"),
    Arm("h", "h"),
    Arm(f"window{WINDOW}", "h+J", (("coupling", "window"), ("coupling_window", WINDOW))),
    Arm(f"meanfield{RANGE}", "h+J", (("coupling", "relative"), ("coupling_range", RANGE)), "meanfield"),
    Arm(f"banded{RANGE}", "h+J", (("coupling", "relative"), ("coupling_range", RANGE)), "banded"),
)
BY_NAME = {a.name: a for a in ARMS}
COUPLED = tuple(a.name for a in ARMS if "J" in a.mode)  # the h+J arms, each compared with h

PREFIX = "rs-"
SEEDS = (0, 1, 2)
LR_SEEDS = (0,)
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
NANOGPT_LR = NANOGPT["lr"]  # 1e-3: ties go towards it
NEAR_TIE = 0.01             # nats: stage 1's rule counts validation losses this close to the lowest as tied
MEMORY_PROBE_STEPS = 3
LONG_T = 256
LONG_BATCH = 12      # stage 3: only T changes from stage 2 (how this was chosen: protocol.md)
LONG_STEPS = 2000
LONG_EVAL_WINDOWS = 512


@dataclass(frozen=True)
class Decisions:
    """The decisions made from runs (``decisions.json``; the measurement behind each: the report and
    ``protocol.md``)."""

    extra_learning_rates: dict[str, tuple[float, ...]] = field(default_factory=dict)  # stage 1: arm -> lrs added
    diverged: dict[str, tuple[float, ...]] = field(default_factory=dict)  # stage 1: arm -> lrs that diverged
    best_lr: dict[str, float] = field(default_factory=dict)  # stage 1: arm -> lr
    fastest: str = f"window{WINDOW}"  # the fastest h+J arm at T = 256, by speed alone


def long_arms(d: Decisions) -> tuple[str, ...]:
    """Stage 3's arms: softmax, h and the fastest h+J arm."""
    return ("softmax", "h", d.fastest)


def variant(arm: str, lr: float, T: int = NANOGPT_T) -> str:
    """``rs-<arm>-lr<lr>`` at T = 64; at T = 256 with the batch and steps of stage 3."""
    return f"{PREFIX}{arm}-lr{lr:g}" + ("" if T == NANOGPT_T else f"-b{LONG_BATCH}-steps{LONG_STEPS}")


def overrides(arm: Arm, lr: float, T: int = NANOGPT_T) -> dict:
    """The TrainConfig fields of ``arm`` at ``lr`` and context length T (besides task, T, mode, method, seed)."""
    long = {} if T == NANOGPT_T else {"batch_size": LONG_BATCH, "steps": LONG_STEPS,
                                      "eval_interval": max(1, LONG_STEPS // 8), "eval_windows": LONG_EVAL_WINDOWS}
    return {**NANOGPT, **arm.overrides, "lr": lr, "memory_probe_steps": MEMORY_PROBE_STEPS, **long}


def config(arm: Arm, T: int = NANOGPT_T, lr: float = NANOGPT_LR, **changes) -> TrainConfig:
    """The TrainConfig of ``arm`` (seed 0), with ``changes`` (e.g. for timing at another batch size)."""
    return TrainConfig.build(task="shakespeare", T=T, mode=arm.mode, method=arm.method,
                             **{**overrides(arm, lr, T), **changes})


def _grid(arm: str, T: int, seed: int, lr: float) -> Grid:
    a = BY_NAME[arm]
    return Grid(("shakespeare",), (T,), modes=(a.mode,), methods=(a.method,), seeds=(seed,),
                variant=variant(arm, lr, T), overrides=overrides(a, lr, T))


def arm_learning_rates(arm: str, d: Decisions) -> tuple[float, ...]:
    """Stage 1's lrs for ``arm``: the grid and those added beyond its edge, in increasing order."""
    return tuple(sorted(set(LEARNING_RATES) | set(d.extra_learning_rates.get(arm, ()))))


def learning_rate_grids(d: Decisions) -> list[Grid]:
    """Stage 1: every arm at every one of its lrs, T = 64, the cheap arms first."""
    return [_grid(a.name, NANOGPT_T, seed, lr) for seed in LR_SEEDS for a in ARMS
            for lr in arm_learning_rates(a.name, d)]


def seed_grids(d: Decisions) -> list[Grid]:
    """Stage 2 (seed by seed, so that paired comparisons complete early) and stage 3, only for the arms whose
    lr is decided."""
    best = d.best_lr
    grids = [_grid(a.name, NANOGPT_T, seed, best[a.name]) for seed in SEEDS for a in ARMS if a.name in best]
    return grids + [_grid(arm, LONG_T, seed, best[arm]) for seed in SEEDS for arm in long_arms(d) if arm in best]


def realsize_grids(field_bias: str, d: Decisions) -> list[Grid]:
    """Every stage (protocol.md); ``field_bias`` sets the field bias of the modes other than softmax."""
    return with_field_bias(learning_rate_grids(d) + seed_grids(d), field_bias)
