"""The conjunction study's task, settings, arms and grids (protocol.md)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ... import blocks
from ...arms import Arm, StagedDecisions, staged_grid, staged_variant
from ...arms import calibration_outcome as staged_outcome
from ...conjunction import ANALYSIS

PREFIX = "cj-"
TASK = {"block_size": 5, "query_size": 2, "conjunction": True, "answer": "marker"}
LAYERS, HEADS = 4, 2
RECIPE = {"batch_size": 32, "beta2": 0.99, "weight_decay": 0.1, "grad_clip": 1.0, "min_lr_ratio": 0.1,
          "fused_optimizer": False, "init": "gpt2"}
WARMUP_SHARE, EVALUATIONS = 0.05, 8
REFERENCE_LR = 1e-3
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
NEAR_TIE = 0.01          # nats per answer token: the lr rule's tie
SOLVED = 0.05            # the calibration's bar: the best arm's validation error at most this
TUNING_SEED = 0
SEEDS = (0, 1, 2)
DECISIVE_SEEDS = (3, 4)
MARGIN = 2.0             # points of test error: the TOST margin
UNSOLVED = 0.50          # all four decisive arms above this mean test error: the comparison decides nothing
RANGE, RANK = 4, 16


@dataclass(frozen=True)
class Setting:
    """The task's number of blocks (T follows), the model width and the run length."""

    num_blocks: int
    d_model: int
    steps: int

    @property
    def T(self) -> int:
        return blocks.length(TASK["block_size"], TASK["query_size"], self.num_blocks, TASK["answer"])

    @property
    def name(self) -> str:
        return f"b{self.num_blocks}-d{self.d_model}-steps{self.steps}"

    @property
    def overrides(self) -> dict:
        return {**TASK, **RECIPE, "num_blocks": self.num_blocks, "n_layers": LAYERS, "n_heads": HEADS,
                "d_model": self.d_model, "d_ff": 4 * self.d_model, "steps": self.steps,
                "warmup_steps": round(WARMUP_SHARE * self.steps), "eval_interval": self.steps // EVALUATIONS}


# the calibration's settings, in the order they are run: larger models and longer runs, then fewer blocks
SETTINGS = tuple(Setting(b, d, steps) for b in (8, 4, 3) for d, steps in ((64, 8000), (64, 32000), (128, 32000)))


_ROPE = (("position", "rope"),)
_BAND = (("coupling_range", RANGE),)
_CONTENT = _BAND + (("coupling_rank", RANK),)
ARMS = {a.name: a for a in (
    Arm("softmax-rope", "softmax", _ROPE),
    Arm("mta", "mta", _ROPE),
    Arm("stickbreaking", "stickbreaking", (("position", "none"),)),
    Arm("h-rope", "h", _ROPE),
    Arm(f"relative{RANGE}", "h+J", _ROPE + (("coupling", "relative"),) + _BAND, "banded"),
    Arm(f"keys{RANGE}", "h+J", _ROPE + (("coupling", "keys"),) + _CONTENT, "chain"),
    Arm(f"keys{RANGE}-step", "h+J-step", _ROPE + (("coupling", "keys"),) + _CONTENT),
    Arm(f"query{RANGE}", "h+J", _ROPE + (("coupling", "query"),) + _CONTENT, "chain"),
)}
CALIBRATION_ARMS = ("softmax-rope", "mta", "stickbreaking")
SINGLE_SCORE = ("softmax-rope", "stickbreaking", "h-rope")
CONTENT = (f"keys{RANGE}", f"query{RANGE}")
CONTROL, STATIC = f"keys{RANGE}-step", f"relative{RANGE}"


Decisions = StagedDecisions  # decisions.json: the calibration's progress and the stages' choices


variant = partial(staged_variant, PREFIX)  # (arm, setting, lr) -> the variant's name
grid = partial(staged_grid, "blocks", PREFIX, ANALYSIS, ARMS)  # (arm, setting, lr, seeds) -> one Grid
calibration_outcome = partial(staged_outcome, solved=SOLVED)  # the calibration's rule with this study's bar
