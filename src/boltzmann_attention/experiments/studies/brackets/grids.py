"""The bracket study's grids: the ladder of settings, its decisions, and the runs of each stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...recipes import with_field_bias
from ...sweep import Grid, beyond

PREFIX = "cal-"  # the variants of the calibration runs
CALIBRATION_T = 16
CALIBRATION_SEEDS = (0, 1, 2)
CALIBRATION_LR = 3e-3  # softmax's best lr (strong-baselines study, Shakespeare T = 8 and 12)
BAND = (0.85, 0.95)    # the rule: softmax's mean test accuracy in this band ...
TARGET = 0.90          # ... and the closest to this


@dataclass(frozen=True)
class Setting:
    """One difficulty setting of the bracket task: its name, what it changes, and the TrainConfig options."""

    name: str
    about: str
    options: tuple[tuple[str, object], ...]

    @property
    def variant(self) -> str:
        return PREFIX + self.name

    @property
    def overrides(self) -> dict:
        return dict(self.options)


_DEDUP = (("deduplicate", True),)
_LONG = (("min_fill", 0.5), ("max_fill", 0.875))
_DEEP_LONG = _DEDUP + (("open_probability", 0.75),) + _LONG

# The calibration ladder, a priori from easy to hard (chosen before any run; the statistics of each are in
# the report): de-duplication first (the old task's memorisable part), then deeper nesting and longer
# matches (open probability 0.75: mean depth 3.5 at T = 16 against 2.5, match distance 5.9 against 4.0),
# longer words with less filler (p / (T // 2) in [0.5, 0.875], p = 4..7 at T = 16: filler 31% against 44%;
# not the longest word, p = 8, of which the window holds too few distinct sequences to de-duplicate: 1430
# at open probability 1/2), nesting deeper still, and last fewer training sequences (the old 20000 are seen
# about 13 times in 4000 steps of 64).
SETTINGS = (
    Setting("easy", "the old generator (every default)", ()),
    Setting("dedup", "validation and test de-duplicated against training", _DEDUP),
    Setting("deep", "dedup, open probability 0.75 (deeper nesting)", _DEDUP + (("open_probability", 0.75),)),
    Setting("deep-long", "deep, words of 50-87.5% of the longest (min_fill 0.5, max_fill 0.875)", _DEEP_LONG),
    Setting("deeper-long", "deep-long with open probability 0.9", _DEDUP + (("open_probability", 0.9),) + _LONG),
    Setting("deep-long-5k", "deep-long with 5000 training sequences", _DEEP_LONG + (("train_sequences", 5000),)),
    Setting("deep-long-2k", "deep-long with 2000 training sequences", _DEEP_LONG + (("train_sequences", 2000),)),
) + tuple(  # the second stage (protocol.md)
    Setting(f"deep-long-{n}", f"deep-long with {n} training sequences", _DEEP_LONG + (("train_sequences", n),))
    for n in (1000, 500, 400, 350, 300, 250, 125))  # 400, 350 and 300: the third stage
BY_VARIANT = {s.variant: s for s in SETTINGS}


def calibration_grids(field_bias: str, d: Decisions | None = None) -> list[Grid]:
    """Softmax at T = 16 with the FFN, one grid per setting in the ladder's order, seed by seed within each.
    ``field_bias`` does not apply (softmax has no field bias)."""
    return [Grid(("brackets",), (CALIBRATION_T,), modes=("softmax",), seeds=(seed,), variant=s.variant,
                 overrides={"lr": CALIBRATION_LR, **s.overrides})
            for s in SETTINGS for seed in CALIBRATION_SEEDS]


# ------------------------------------------------------------------------- the experiments (brackets-hard)

HARD_PREFIX = "hard-"  # the variants of the experiments on CHOSEN: hard-[noffn-]lr<lr>
MODES = ("softmax", "h", "J", "h+J", "h+K", "h+J+K")
LR_T = 16
LR_SEEDS = (0, 1, 2)
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
NEAR_TIE = 0.005  # stage 1's rule: validation accuracies this close to the best count as tied
SEEDS = (0, 1, 2, 3, 4)
GRID_TS = (16, 12, 8)  # in the order they run
LONG_T = 20
LONG_MODES = ("softmax", "h", "J", "h+J")  # what T = 20's budget affords (protocol.md)
FFN_SETTINGS = (True, False)  # with the FFN (d_ff 128), without it (d_ff 0)
# ABLATION[mode]: the same mode without its last coupling, the comparison that says what that coupling adds.
ABLATION = {"h+J": "h", "h+K": "h", "h+J+K": "h+J"}
NOFFN_CHECK_MODES = ("softmax", "h", "J", "h+J")  # stage 3 (post hoc): the lr check without the FFN


@dataclass(frozen=True)
class Decisions:
    """The decisions made from runs (``decisions.json``; the measurement behind each: the report and
    ``protocol.md``)."""

    chosen: str = ""  # the calibration's chosen setting
    extra_learning_rates: dict[str, tuple[float, ...]] = field(default_factory=dict)  # stage 1: mode -> lrs added
    diverged: dict[str, tuple[float, ...]] = field(default_factory=dict)  # stage 1: mode -> lrs that diverged
    best_lr: dict[str, float] = field(default_factory=dict)  # stage 1: mode -> lr
    noffn_check_extra: dict[str, tuple[float, ...]] = field(default_factory=dict)  # stage 3: mode -> lrs added


FULL, CALIBRATION = "full", "brackets-calibration"  # the profiles whose report archives the report reads
READS = (FULL, CALIBRATION)


def chosen_setting(d: Decisions) -> Setting:
    return next(s for s in SETTINGS if s.name == d.chosen)


def hard_variant(lr: float, ffn: bool = True) -> str:
    """``hard-lr<lr>`` with the FFN, ``hard-noffn-lr<lr>`` without it."""
    return f"{HARD_PREFIX}{'' if ffn else 'noffn-'}lr{lr:g}"


def _hard_grid(d: Decisions, T: int, mode: str, seed: int, lr: float, ffn: bool = True) -> Grid:
    overrides = {"lr": lr, **chosen_setting(d).overrides, **({} if ffn else {"d_ff": 0})}
    return Grid(("brackets",), (T,), modes=(mode,), seeds=(seed,), variant=hard_variant(lr, ffn),
                overrides=overrides)


def mode_learning_rates(mode: str, d: Decisions) -> tuple[float, ...]:
    """Stage 1's lrs for ``mode``: the grid and those added beyond its edge, in increasing order."""
    return tuple(sorted(set(LEARNING_RATES) | set(d.extra_learning_rates.get(mode, ()))))


def learning_rate_grids(d: Decisions) -> list[Grid]:
    """Stage 1, seed by seed: every mode at every lr at T = 16 with the FFN."""
    grids = [_hard_grid(d, LR_T, mode, seed, lr) for seed in LR_SEEDS for lr in LEARNING_RATES for mode in MODES]
    return grids + [_hard_grid(d, LR_T, mode, seed, lr) for seed in LR_SEEDS for mode in MODES
                    for lr in d.extra_learning_rates.get(mode, ())]


def experiment_grids(d: Decisions) -> list[Grid]:
    """Stage 2, seed by seed within each T (both FFN settings of a seed before the next), only the modes
    whose lr is decided (in BEST_LR)."""
    best = d.best_lr
    grids = [_hard_grid(d, T, mode, seed, best[mode], ffn) for T in GRID_TS for seed in SEEDS
             for ffn in FFN_SETTINGS for mode in MODES if mode in best]
    return grids + [_hard_grid(d, LONG_T, mode, seed, best[mode], ffn) for seed in SEEDS for ffn in FFN_SETTINGS
                    for mode in LONG_MODES if mode in best]


def noffn_check_lrs(mode: str, d: Decisions) -> tuple[float, ...]:
    """Stage 3's lrs for ``mode``: its BEST_LR, the lr half a decade on either side and those in
    NOFFN_CHECK_EXTRA, in increasing order."""
    lr = d.best_lr[mode]
    return tuple(sorted({beyond(lr, up=False), lr, beyond(lr, up=True), *d.noffn_check_extra.get(mode, ())}))


def noffn_check_grids(d: Decisions) -> list[Grid]:
    """Stage 3 (post hoc), seed by seed: NOFFN_CHECK_MODES without the FFN at T = 16 at noffn_check_lrs (the
    runs at BEST_LR are stage 2's)."""
    return [_hard_grid(d, LR_T, mode, seed, lr, ffn=False) for seed in LR_SEEDS for mode in NOFFN_CHECK_MODES
            if mode in d.best_lr for lr in noffn_check_lrs(mode, d)]


def hard_grids(field_bias: str, d: Decisions) -> list[Grid]:
    """The three stages (protocol.md); ``field_bias`` sets the Boltzmann modes' field bias."""
    return with_field_bias(learning_rate_grids(d) + experiment_grids(d) + noffn_check_grids(d), field_bias)
