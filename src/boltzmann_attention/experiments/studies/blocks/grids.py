"""The find-the-block study's arms, settings, rules and grids (protocol.md)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ... import blocks
from ...arms import Arm, stage_grids
from ...sweep import Grid

PREFIX = "bk-"
MODEL = {"n_layers": 4, "n_heads": 2, "d_model": 64, "d_ff": 256, "init": "gpt2"}
RECIPE = {"batch_size": 32, "beta2": 0.99, "weight_decay": 0.1, "grad_clip": 1.0, "min_lr_ratio": 0.1,
          "fused_optimizer": False}
STEPS, WARMUP, EVAL_INTERVAL = 4000, 200, 500
REFERENCE_LR = 1e-3          # the calibration's lr and the lr rule's reference
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
NEAR_TIE = 0.01              # nats per answer letter: the lr rule's tie
TUNING_SEED = 0
SEEDS = (0, 1, 2)            # stage 2
DECISIVE_SEEDS = (3, 4)      # stage 3
BAND = (0.20, 0.90)          # calibration: softmax-rope's validation error in this band ...
CLEARLY_LOWER = 0.5          # ... and mta's at most this fraction of it
MAX_CALIBRATIONS = 4
RANGE = 4                    # the couplings' and the control's range b


_ROPE = (("position", "rope"),)
_NONE = (("position", "none"),)
_RELATIVE = (("coupling", "relative"), ("coupling_range", RANGE))
ARMS = {a.name: a for a in (
    Arm("softmax-rope", "softmax", _ROPE),
    Arm("mta", "mta", _ROPE),
    Arm("stickbreaking", "stickbreaking", _NONE),
    Arm("fox", "fox", _NONE),
    Arm("h-rope", "h", _ROPE),
    Arm(f"relative{RANGE}", "h+J", _ROPE + _RELATIVE, "banded"),
    Arm(f"step{RANGE}", "h+J-step", _ROPE + _RELATIVE),
    Arm("window16-slot16", "h+J", (("position", "learned"), ("coupling", "window"), ("coupling_window", 16),
                                   ("slot_bias", 16))),
)}
CALIBRATION_ARMS = ("softmax-rope", "mta")
SINGLE_SCORE = ("softmax-rope", "stickbreaking", "fox", "h-rope")
COUPLED, CONTROL = f"relative{RANGE}", f"step{RANGE}"


@dataclass(frozen=True)
class Setting:
    """The task's difficulty and the run length: N, L and the number of blocks (T follows), and the steps."""

    num_blocks: int = blocks.NUM_BLOCKS
    steps: int = STEPS
    block_size: int = blocks.BLOCK_SIZE
    query_size: int = blocks.QUERY_SIZE

    @property
    def T(self) -> int:
        return blocks.length(self.block_size, self.query_size, self.num_blocks)

    @property
    def name(self) -> str:
        return f"n{self.block_size}-l{self.query_size}-b{self.num_blocks}-steps{self.steps}"

    @property
    def overrides(self) -> dict:
        scale = self.steps / STEPS
        return {**MODEL, **RECIPE, "steps": self.steps, "warmup_steps": round(WARMUP * scale),
                "eval_interval": round(EVAL_INTERVAL * scale), "block_size": self.block_size,
                "query_size": self.query_size, "num_blocks": self.num_blocks}


FIRST = Setting()


@dataclass(frozen=True)
class Decisions:
    """The decisions made from runs (``decisions.json``; the measurements behind them: the report)."""

    calibration: tuple[dict, ...] = ()  # the settings after the first, each {"num_blocks": .., "steps": ..}
    chosen: bool = False                # the last calibration setting passed
    extra_learning_rates: dict[str, tuple[float, ...]] = field(default_factory=dict)
    diverged: dict[str, tuple[float, ...]] = field(default_factory=dict)
    best_lr: dict[str, float] = field(default_factory=dict)
    best_single: str | None = None

    def settings(self) -> list[Setting]:
        return [FIRST] + [Setting(**s) for s in self.calibration]

    @property
    def setting(self) -> Setting | None:
        """The chosen setting, None while the calibration goes on."""
        return self.settings()[-1] if self.chosen else None


def variant(arm: str, s: Setting, lr: float) -> str:
    return f"{PREFIX}{arm}-{s.name}-lr{lr:g}"


def grid(arm: str, s: Setting, lr: float, seeds: tuple[int, ...]) -> Grid:
    a = ARMS[arm]
    overrides = {**s.overrides, **dict(a.options), "lr": lr}
    if a.boltzmann:
        overrides.update(field_bias_init=-math.log(s.T), learn_field_bias=True)
    return Grid(("blocks",), (s.T,), modes=(a.mode,), methods=(a.method,), seeds=seeds,
                variant=variant(arm, s, lr), overrides=overrides)


def calibration_step(e_s: float, e_m: float, tried: list[Setting]) -> Setting | str:
    """The calibration rule on softmax-rope's and mta's validation errors at the last of ``tried``: "pass",
    "failed", or the next setting."""
    low, high = BAND
    if low <= e_s <= high and e_m <= CLEARLY_LOWER * e_s:
        return "pass"
    last = tried[-1]
    longer_once = any(s.steps > STEPS for s in tried)
    more, fewer = (Setting(n, last.steps, last.block_size, last.query_size)
                   for n in (2 * last.num_blocks, max(1, last.num_blocks // 2)))
    longer = Setting(last.num_blocks, 2 * last.steps, last.block_size, last.query_size)
    if e_s < low:
        nxt = more
    elif e_s > high and e_m > high:
        nxt = fewer if longer_once else longer
    elif e_s > high:
        nxt = fewer
    else:
        nxt = more if longer_once else longer
    return "failed" if nxt in tried or len(tried) >= MAX_CALIBRATIONS else nxt


def learning_rates(arm: str, d: Decisions) -> tuple[float, ...]:
    return tuple(sorted(set(LEARNING_RATES) | set(d.extra_learning_rates.get(arm, ()))))


def best_single(errors: dict[str, tuple[float, float]]) -> str | None:
    """Stage 2's BEST_SINGLE from {arm: (mean validation error, mean validation loss)} over seeds 0-2."""
    found = {a: v for a, v in errors.items() if a in SINGLE_SCORE}
    return min(found, key=found.get) if len(found) == len(SINGLE_SCORE) else None


def decisive(d: Decisions) -> tuple[str, ...]:
    return (COUPLED, CONTROL) + ((d.best_single,) if d.best_single else ())


def blocks_grids(field_bias: str, d: Decisions) -> list[Grid]:
    """The calibration, then stages 1-3 as their inputs are decided. ``field_bias`` does not apply: every
    Boltzmann arm starts its field bias at -log T (protocol.md)."""
    grids = [grid(arm, s, REFERENCE_LR, (TUNING_SEED,)) for s in d.settings() for arm in CALIBRATION_ARMS]
    s = d.setting
    if s is None:
        return grids
    return grids + stage_grids(lambda arm, lr, seeds: grid(arm, s, lr, seeds), ARMS,
                               lambda arm: [lr for lr in learning_rates(arm, d) if lr not in d.diverged.get(arm, ())],
                               d.best_lr, decisive(d), calibration_arms=CALIBRATION_ARMS, reference_lr=REFERENCE_LR,
                               tuning_seed=TUNING_SEED, seeds=SEEDS, decisive_seeds=DECISIVE_SEEDS)


def spread(a: dict[int, float], b: dict[int, float]) -> float:
    """The seed spread of a comparison: the larger of the two arms' standard deviations over their seeds."""
    return max(statistics.stdev(v.values()) if len(v) > 1 else 0.0 for v in (a, b))


def beats(a: dict[int, float], b: dict[int, float]) -> bool:
    """Whether arm a's mean test error is below b's by more than the seed spread (protocol.md)."""
    return statistics.mean(b.values()) - statistics.mean(a.values()) > spread(a, b)
