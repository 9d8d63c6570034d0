"""The priors study's grids and decisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest

from ...arms import Arm
from ...coattention import ANALYSIS as COATTENTION
from ...recipes import NANOGPT, NANOGPT_T
from ...sweep import Grid, beyond


def _window(W: int, *more) -> tuple:
    return (("coupling", "window"), ("coupling_window", W), *more)


ARMS = (  # this study's own arms
    Arm("softmax-rope", "softmax", (("position", "rope"),)),
    Arm("softmax-alibi", "softmax", (("position", "alibi"),)),
    Arm("softmax-slot16", "softmax", (("slot_bias", 16),)),
    Arm("fox", "fox", (("position", "none"),)),
    Arm("stickbreaking", "stickbreaking", (("position", "none"),)),
    Arm("h-alibi", "h", (("position", "alibi"),)),
    Arm("h-slot16", "h", (("slot_bias", 16),)),
    Arm("window16-slot16", "h+J", _window(16, ("slot_bias", 16))),
    Arm("window8-slot8", "h+J", _window(8, ("slot_bias", 8))),
)
REUSED = (Arm("softmax", "softmax"), Arm("h", "h"), Arm("window16", "h+J", _window(16)))  # the real-size runs
SOFTMAX_POSITIONS = {"softmax": "learned", "softmax-rope": "rope", "softmax-alibi": "alibi",
                     "softmax-slot16": "slot16"}
DECISIVE = ("window16-slot16", "h-slot16")  # (coupled, its uncoupled twin)

READS = ("realsize",)
PREFIX = "pr-"
REALSIZE_PREFIX = "rs-"
REALSIZE_LR = 3e-3  # the real-size study's decided lr of its softmax, h and window16 (its decisions.json)
SEEDS = (0, 1, 2)
LONG_SEEDS = (0, 1, 2, 3, 4)  # the decisive pair at T = 256
LR_SEEDS = (0,)
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
NANOGPT_LR = NANOGPT["lr"]
NEAR_TIE = 0.01      # nats: stage 1's tie (the real-size rule)
CHOICE_TIE = 0.005   # nats: stage 2's choices between arms (means over 3 seeds); ties go to the faster arm
MEMORY_PROBE_STEPS = 3
LONG_T = 256
LONG_BATCH = 12
LONG_STEPS = 2000
LONG_EVAL_WINDOWS = 512


@dataclass(frozen=True)
class Decisions:
    """The decisions made from runs (``decisions.json``; the measurements behind them: the report)."""

    extra_learning_rates: dict[str, tuple[float, ...]] = field(default_factory=dict)  # stage 1: arm -> lrs added
    diverged: dict[str, tuple[float, ...]] = field(default_factory=dict)   # stage 1: arm -> lrs that diverged
    best_lr: dict[str, float] = field(default_factory=dict)                # stage 1: arm -> lr
    softmax_position: str | None = None   # stage 2: the best of SOFTMAX_POSITIONS (None: not decided)
    best_uncoupled: str | None = None     # stage 2: the best arm without couplings
    best_coupled: str | None = None       # stage 2: the best arm with couplings
    long_lr: dict[str, float] = field(default_factory=dict)   # stage 3: the decisive pair's lr at T = 256
    equal_compute_steps: int | None = None  # stage 4: the best uncoupled arm's steps at the coupled arm's time


def window_at_softmax_position(d: Decisions) -> Arm | None:
    """The coupled window (W = 16) with the position scheme best for softmax (stage 2), once decided; None
    when that is the learned embedding or the slot bias, which window16 and window16-slot16 already are."""
    if d.softmax_position in (None, "learned", "slot16"):
        return None
    return Arm(f"window16-{d.softmax_position}", "h+J", _window(16, ("position", d.softmax_position)))


def own_arms(d: Decisions) -> tuple[Arm, ...]:
    extra = window_at_softmax_position(d)
    return ARMS + ((extra,) if extra else ())


def all_arms(d: Decisions) -> dict[str, Arm]:
    return {a.name: a for a in REUSED + own_arms(d)}


def variant(arm: str, lr: float, T: int = NANOGPT_T, steps: int | None = None) -> str:
    """``pr-<arm>-lr<lr>`` at T = 64; at T = 256 with stage 3's batch and steps (stage 4: its steps)."""
    if arm in {a.name for a in REUSED}:
        return f"{REALSIZE_PREFIX}{arm}-lr{lr:g}" + ("" if T == NANOGPT_T else f"-b{LONG_BATCH}-steps{LONG_STEPS}")
    long = "" if T == NANOGPT_T else f"-b{LONG_BATCH}-steps{steps or LONG_STEPS}"
    return f"{PREFIX}{arm}-lr{lr:g}{long}"


def overrides(arm: Arm, lr: float, T: int = NANOGPT_T, steps: int | None = None) -> dict:
    """The config fields of ``arm`` at ``lr`` and context length T (besides task, T, mode, method, seed)."""
    long = {}
    if T != NANOGPT_T:
        n = steps or LONG_STEPS
        long = {"batch_size": LONG_BATCH, "steps": n, "eval_interval": max(1, n // 8),
                "eval_windows": LONG_EVAL_WINDOWS, "warmup_steps": round(NANOGPT["warmup_steps"] * n / LONG_STEPS)}
    return {**NANOGPT, **arm.overrides, "lr": lr, "memory_probe_steps": MEMORY_PROBE_STEPS, **long}


def _grid(arm: Arm, T: int, seed: int, lr: float, steps: int | None = None) -> Grid:
    return Grid(("shakespeare",), (T,), modes=(arm.mode,), methods=(arm.method,), seeds=(seed,),
                variant=variant(arm.name, lr, T, steps), overrides=overrides(arm, lr, T, steps),
                analyses=(COATTENTION,))


def arm_learning_rates(arm: str, d: Decisions) -> tuple[float, ...]:
    return tuple(sorted(set(LEARNING_RATES) | set(d.extra_learning_rates.get(arm, ()))))


def long_arms(d: Decisions) -> tuple[str, ...]:
    """Stage 3's arms (each once): the decisive pair and window8-slot8, which need no choice of stage 2, and
    the best uncoupled arm, the best softmax variant and the best coupled arm once stage 2 has chosen them."""
    chosen = ()
    if d.best_uncoupled is not None and d.softmax_position is not None:
        softmax = next(a for a, p in SOFTMAX_POSITIONS.items() if p == d.softmax_position)
        chosen = (d.best_uncoupled, softmax)
    if d.best_coupled is not None:  # stage 4 compares against its stage-3 runs
        chosen += (d.best_coupled,)
    return tuple(dict.fromkeys((*DECISIVE, "window8-slot8", *chosen)))


def lr_at(name: str, d: Decisions, T: int = NANOGPT_T) -> float | None:
    """The lr an arm runs at in stages 2-4 (the reused arms at the real-size lr); None until decided."""
    if name in {a.name for a in REUSED}:
        return REALSIZE_LR
    if T != NANOGPT_T and name in d.long_lr:
        return d.long_lr[name]
    return d.best_lr.get(name)


def long_learning_rates(name: str, d: Decisions) -> tuple[float, ...]:
    """Stage 3's lr check of a decisive arm: its stage-1 lr and one half-decade step either side."""
    base = d.best_lr[name]
    return beyond(base, up=False), base, beyond(base, up=True)


def priors_grids(field_bias: str, d: Decisions) -> list[Grid]:
    """Every stage whose rule's inputs are decided (protocol.md). The field bias is the default one."""
    arms = all_arms(d)
    own = own_arms(d)
    grids = [_grid(a, NANOGPT_T, s, lr) for s in LR_SEEDS for a in own for lr in arm_learning_rates(a.name, d)]
    grids += [_grid(a, NANOGPT_T, s, d.best_lr[a.name]) for s in SEEDS for a in own if a.name in d.best_lr]
    checks, seeds = [], {}
    for name in long_arms(d):
        if name in {a.name for a in REUSED} or name not in d.best_lr:
            continue  # the real-size study ran softmax and h at T = 256; or its stage-1 lr is not decided yet
        if name in DECISIVE:  # stage 3's lr check, then its seeds once LONG_LR is decided
            checks += [_grid(arms[name], LONG_T, 0, lr) for lr in long_learning_rates(name, d)]
            if name not in d.long_lr:
                continue
        seeds[name] = [_grid(arms[name], LONG_T, s, lr_at(name, d, LONG_T))
                       for s in (LONG_SEEDS if name in DECISIVE else SEEDS)]
    # the lr checks first; then the seeds of the arms whose wall times fix stage 4, interleaved so that they
    # share the machine alike; then the others
    pair = [seeds.pop(n) for n in dict.fromkeys((d.best_coupled, d.best_uncoupled)) if n in seeds]
    grids += checks + [g for turn in zip_longest(*pair) for g in turn if g is not None]
    grids += [g for arm in seeds.values() for g in arm]
    if d.equal_compute_steps is not None and d.best_uncoupled is not None:
        name = d.best_uncoupled
        grids += [_grid(arms[name], LONG_T, s, lr_at(name, d, LONG_T), d.equal_compute_steps) for s in SEEDS]
    return grids
