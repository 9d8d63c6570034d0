"""The Match3 study's task, settings, arms and grids (protocol.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from ...arms import Arm, StagedDecisions, staged_grid, staged_variant
from ...arms import calibration_outcome as staged_outcome
from ...conjunction import MATCH3

PREFIX = "m3-"
LAYERS, HEADS = 4, 2
RECIPE = {"batch_size": 32, "beta2": 0.99, "weight_decay": 0.1, "grad_clip": 1.0, "min_lr_ratio": 0.1,
          "fused_optimizer": False, "init": "gpt2"}
WARMUP_SHARE, EVALUATIONS = 0.05, 8
REFERENCE_LR = 1e-3
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
NEAR_TIE = 0.01          # nats per answer: the lr rule's tie
SOLVED = 0.05            # the calibration's bar: the best arm's validation error at most this
TUNING_SEED = 0
SEEDS = (0, 1, 2)
DECISIVE_SEEDS = (3, 4)
MARGIN = 2.0             # points of test error: the TOST margin
UNSOLVED = 0.40          # all four decisive arms above this mean test error: the comparison decides nothing
RANK = 16


def modulus(T: int) -> int:
    """The modulus at which about half of uniform sequences are positive: the (T - 1)(T - 2) / 2 pairs of keys
    before the query miss a given residue with probability about exp(-pairs / M) = 1/2."""
    return round((T - 1) * (T - 2) / 2 / math.log(2))


@dataclass(frozen=True)
class Setting:
    """The sequence length T (the modulus follows), the model width and the run length."""

    T: int
    d_model: int
    steps: int

    @property
    def modulus(self) -> int:
        return modulus(self.T)

    @property
    def name(self) -> str:
        return f"T{self.T}-d{self.d_model}-steps{self.steps}"

    @property
    def overrides(self) -> dict:
        return {**RECIPE, "modulus": self.modulus, "n_layers": LAYERS, "n_heads": HEADS, "d_model": self.d_model,
                "d_ff": 4 * self.d_model, "steps": self.steps, "warmup_steps": round(WARMUP_SHARE * self.steps),
                "eval_interval": self.steps // EVALUATIONS}


# the calibration's settings, in the order they are run: larger models and longer runs, then shorter sequences
SETTINGS = tuple(Setting(T, d, steps) for T in (12, 8) for d, steps in ((64, 8000), (64, 32000), (128, 32000)))

_ROPE = (("position", "rope"),)
_CONTENT = (("coupling_rank", RANK),)
ARMS = {a.name: a for a in (
    Arm("softmax-rope", "softmax", _ROPE),
    Arm("mta", "mta", _ROPE),
    Arm("stickbreaking", "stickbreaking", (("position", "none"),)),
    Arm("h-rope", "h", _ROPE),
    Arm("relative", "h+J", _ROPE + (("coupling", "relative"),), "exact"),
    Arm("keys", "h+J", _ROPE + (("coupling", "keys"),) + _CONTENT, "exact"),
    Arm("keys-step", "h+J-step", _ROPE + (("coupling", "keys"),) + _CONTENT),
    Arm("query", "h+J", _ROPE + (("coupling", "query"),) + _CONTENT, "exact"),
)}
CALIBRATION_ARMS = ("softmax-rope", "mta", "stickbreaking")
SINGLE_SCORE = ("softmax-rope", "stickbreaking", "h-rope")
CONTENT = ("keys", "query")
CONTROL, STATIC = "keys-step", "relative"


# the probe (protocol.md): the coupled arms at a setting where the calibration's arms fail, once it has run out
PROBE_SETTING = 5        # index (from 1) in SETTINGS
PROBE_ARMS = ("h-rope", "relative", "keys", "keys-step", "query", "query-step")
PROBE_ONLY = {"query-step": Arm("query-step", "h+J-step", _ROPE + (("coupling", "query"),) + _CONTENT)}
ALL_ARMS = {**ARMS, **PROBE_ONLY}  # the stages' arms and the probe's
PROBE_CONTROLS = {"keys": "keys-step", "query": "query-step"}  # each content arm's one-step control
PROBE_CONFIRM_SEEDS = (1, 2)
OFF_CHANCE = 0.45        # a probe arm's validation error below this is off chance: the probe's next step runs


@dataclass(frozen=True)
class Decisions(StagedDecisions):
    """decisions.json: the calibration's progress and the stages' choices, and the probe's two steps."""

    probe: bool = False          # the probe's runs on the tuning seed (once the calibration has run out)
    probe_confirm: bool = False  # its second step (some probe arm off chance): more seeds, the baselines' lrs

    def __post_init__(self):
        super().__post_init__()
        ran_out = self.chosen is None and self.calibration_settings == len(SETTINGS)
        if (self.probe or self.probe_confirm) and not ran_out:
            raise ValueError(f"PROBE needs the calibration to have run out (CALIBRATION_SETTINGS {len(SETTINGS)}, "
                             "no CHOSEN): the probe asks which arm learns Match3 where no calibration arm does")
        if self.probe_confirm and not self.probe:
            raise ValueError("PROBE_CONFIRM needs PROBE: the probe's second step follows its first")




variant = partial(staged_variant, PREFIX)  # (arm, setting, lr) -> the variant's name
grid = partial(staged_grid, "match3", PREFIX, MATCH3, ALL_ARMS)  # (arm, setting, lr, seeds) -> a Grid
calibration_outcome = partial(staged_outcome, solved=SOLVED)  # the calibration's rule with this study's bar


def probe_grids(d: Decisions) -> list:
    """The probe's runs (protocol.md): the probe arms on the tuning seed at the reference lr; with its second step,
    the probe and calibration arms on more seeds and the calibration arms and h-rope at the other lrs."""
    if not d.probe:
        return []
    s = SETTINGS[PROBE_SETTING - 1]
    out = [grid(arm, s, REFERENCE_LR, (TUNING_SEED,)) for arm in PROBE_ARMS]
    if d.probe_confirm:
        out += [grid(arm, s, REFERENCE_LR, PROBE_CONFIRM_SEEDS) for arm in PROBE_ARMS + CALIBRATION_ARMS]
        out += [grid(arm, s, lr, (TUNING_SEED,)) for arm in CALIBRATION_ARMS + ("h-rope",)
                for lr in LEARNING_RATES if lr != REFERENCE_LR]
    return out
