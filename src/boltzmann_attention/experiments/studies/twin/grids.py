"""The twin study's arms, its decisions and the grids of its stages (protocol.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import arms, lr_rule
from ...coattention import ANALYSIS as COATTENTION
from ...recipes import NANOGPT, NANOGPT_T
from ...sweep import Grid

LR = 3e-3            # every arm's base lr: the priors study's decided lr of these arms
SHORT_T, LONG_T = NANOGPT_T, 256
LONG_BATCH, LONG_STEPS, LONG_EVAL_WINDOWS = 12, 2000, 512
SEEDS = (0, 1, 2, 3, 4)  # stages B-D
TUNING_SEED = 0
NEAR_TIE = 0.01      # nats: the multiplier rule's tie
STEP = 4.0           # the multipliers' grid step
MEMORY_PROBE_STEPS = 3
PREFIX = "tw-"
PRIORS_PREFIX = "pr-"


@dataclass(frozen=True)
class Arm(arms.Arm):
    """An arm (:class:`...arms.Arm`) and which multiplier stage A tunes for it ("coupling", "slot_bias" or None)
    over which grid."""

    tuned: str | None = None
    grid: tuple[float, ...] = ()

    @property
    def has_slot_bias(self) -> bool:
        return "slot_bias" in dict(self.options)


def _window(W: int, *more) -> tuple:
    return (("coupling", "window"), ("coupling_window", W), *more)


def _pairs(W: int) -> tuple:
    return (("slot_bias", W), ("slot_bias_parametrization", "pairs"))


J_GRID = (0.25, 1.0, 4.0)
ARMS = {a.name: a for a in (
    Arm("window16-slot16", "h+J", _window(16, ("slot_bias", 16)), tuned="coupling", grid=J_GRID),
    Arm("window8-slot8", "h+J", _window(8, ("slot_bias", 8)), tuned="coupling", grid=J_GRID),
    Arm("h-slot16", "h", (("slot_bias", 16),), tuned="slot_bias", grid=(1.0, 4.0, 16.0, 64.0)),
    Arm("h-pairs16", "h", _pairs(16), tuned="slot_bias", grid=J_GRID),
    Arm("h-pairs8", "h", _pairs(8), tuned="slot_bias", grid=J_GRID),
    Arm("window16-rope", "h+J", _window(16, ("position", "rope"))),
    Arm("window8-rope", "h+J", _window(8, ("position", "rope"))),
    Arm("h-rope", "h", (("position", "rope"),)),
    Arm("h-rope-slot16", "h", (("position", "rope"), ("slot_bias", 16))),
    Arm("softmax-rope", "softmax", (("position", "rope"),)),
    Arm("stickbreaking", "stickbreaking", (("position", "none"),)),
)}
TUNED = tuple(n for n, a in ARMS.items() if a.tuned)
WINDOWS = ("window16-slot16", "window8-slot8")
# stage B: (coupled, twin) pairs, the family of question 1
DECISIVE = (("window16-slot16", "h-slot16"), ("window16-slot16", "h-pairs16"), ("window8-slot8", "h-slot16"),
            ("window8-slot8", "h-pairs8"))
# stage C: the rope arms, and (coupled, twin) pairs, the family of question 2
ROPE = ("window16-rope", "window8-rope", "h-rope", "h-rope-slot16", "softmax-rope", "stickbreaking")
ON_ROPE = (("window16-rope", "h-rope"), ("window16-rope", "h-rope-slot16"), ("window8-rope", "h-rope"),
           ("window8-rope", "h-rope-slot16"))
# where an arm of stage C takes its multiplier from: (the tuned arm, which multiplier)
BORROWS = {"window16-rope": "window16-slot16", "window8-rope": "window8-slot8", "h-rope-slot16": "h-slot16"}
# the priors study's arms whose runs at multiplier 1 are this study's (the same config), and the seeds its
# archive holds of each by (arm, T, steps): those are not run again
# stage E, the x16 check: the slot-bias twins at this multiplier in place of h-slot16's LONG_MULTIPLIER
X16 = 16.0
X16_ARMS = ("h-slot16", "h-rope-slot16")
FROM_PRIORS = ("window16-slot16", "window8-slot8", "h-slot16", "softmax-rope", "stickbreaking")
IN_PRIORS = {(arm, T, None): (0, 1, 2) for arm in FROM_PRIORS for T in (SHORT_T, LONG_T)}
IN_PRIORS.update({("window16-slot16", LONG_T, None): SEEDS, ("h-slot16", LONG_T, None): SEEDS,
                  ("stickbreaking", LONG_T, 1574): (0, 1, 2)})


@dataclass(frozen=True)
class Decisions:
    """The decisions made from runs (``decisions.json``; the measurements behind them: the report)."""

    extra_multipliers: dict[str, tuple[float, ...]] = field(default_factory=dict)  # A1: arm -> multipliers added
    diverged: dict[str, tuple[float, ...]] = field(default_factory=dict)           # A1: arm -> multipliers
    multiplier: dict[str, float] = field(default_factory=dict)                     # A1: arm -> its multiplier
    window_slot_multiplier: dict[str, float] = field(default_factory=dict)         # A2: window -> its slot bias's
    long_multiplier: dict[str, float] = field(default_factory=dict)                # A3: arm -> at T = 256
    best_coupled: str | None = None                                                # D
    best_uncoupled: str | None = None                                              # D
    equal_compute_steps: int | None = None                                         # D: the cheaper arm's steps
    equal_compute_arm: str | None = None                                           # D: the cheaper arm


@dataclass(frozen=True)
class Setting:
    """One arm at one T, multipliers and length: what a run is, apart from its seed."""

    arm: str
    T: int = SHORT_T
    coupling: float = 1.0    # coupling_lr_multiplier
    slot_bias: float = 1.0   # slot_bias_lr_multiplier
    steps: int | None = None  # None: the stage's standard length

    @property
    def variant(self) -> str:
        """``tw-<arm>[-jlr<c>][-slr<s>][-steps<n>]``, or the priors study's name of the same config."""
        arm = ARMS[self.arm]
        if self.arm in FROM_PRIORS and self.coupling == 1.0 and self.slot_bias == 1.0:
            long = "" if self.T == SHORT_T else f"-b{LONG_BATCH}-steps{self.steps or LONG_STEPS}"
            return f"{PRIORS_PREFIX}{self.arm}-lr{LR:g}{long}"
        name = PREFIX + self.arm + (f"-jlr{self.coupling:g}" if arm.coupled else "")
        name += f"-slr{self.slot_bias:g}" if arm.has_slot_bias else ""
        return name + (f"-steps{self.steps}" if self.steps else "")

    @property
    def overrides(self) -> dict:
        arm = ARMS[self.arm]
        out = {**NANOGPT, **dict(arm.options), "lr": LR, "memory_probe_steps": MEMORY_PROBE_STEPS}
        if arm.coupled:
            out["coupling_lr_multiplier"] = self.coupling
        if arm.has_slot_bias:
            out["slot_bias_lr_multiplier"] = self.slot_bias
        if self.T != SHORT_T:
            n = self.steps or LONG_STEPS
            out.update(batch_size=LONG_BATCH, steps=n, eval_interval=max(1, n // 8), eval_windows=LONG_EVAL_WINDOWS,
                       warmup_steps=round(NANOGPT["warmup_steps"] * n / LONG_STEPS))
        return out

    @property
    def from_priors(self) -> bool:
        return self.variant.startswith(PRIORS_PREFIX)

    def grid(self, seeds: tuple[int, ...]) -> Grid:
        """The grid of these seeds, less those the priors archive holds."""
        done = IN_PRIORS.get((self.arm, self.T, self.steps), ()) if self.from_priors else ()
        return Grid(("shakespeare",), (self.T,), modes=(ARMS[self.arm].mode,), methods=("exact",),
                    seeds=tuple(s for s in seeds if s not in done), variant=self.variant, overrides=self.overrides,
                    analyses=(COATTENTION,))


def with_multiplier(arm: str, m: float, d: Decisions, T: int = SHORT_T) -> Setting:
    """A tuned arm with its tuned multiplier at m (a window's slot bias at its stage-A2 choice, 1 until then)."""
    if ARMS[arm].tuned == "coupling":
        return Setting(arm, T, coupling=m, slot_bias=d.window_slot_multiplier.get(arm, 1.0))
    return Setting(arm, T, slot_bias=m)


def multipliers(arm: str, d: Decisions) -> tuple[float, ...]:
    """Stage A1's grid of a tuned arm, with the multipliers its edge extensions added."""
    return tuple(sorted(set(ARMS[arm].grid) | set(d.extra_multipliers.get(arm, ()))))


def neighbours(m: float) -> tuple[float, float, float]:
    """Stage A3: m and one grid step either side."""
    return m / STEP, m, m * STEP


def choose_multiplier(losses: dict[float, float], near_tie: float = NEAR_TIE) -> float | None:
    """The multiplier rule on {multiplier: validation loss}: the lowest wins; those within ``near_tie`` of it
    are tied, and the one the fewest grid steps from 1 wins, then the smaller; None without losses."""
    return lr_rule.choose_lr(losses, near_tie, 1.0, step=STEP)


def edge_extension(m: float, grid: tuple[float, ...]) -> float | None:
    """The multiplier to add when ``m`` (the rule's choice) is at the edge of ``grid`` (sorted), else None."""
    return lr_rule.edge_extension(m, grid, STEP)


def long_setting(arm: str, d: Decisions) -> Setting | None:
    """The arm as it runs in stages B-D at T = 256 (None until its multipliers are decided)."""
    if arm in TUNED:
        return with_multiplier(arm, d.long_multiplier[arm], d, LONG_T) if arm in d.long_multiplier else None
    if arm in BORROWS:
        source = BORROWS[arm]
        if source not in d.long_multiplier:
            return None
        m = d.long_multiplier[source]
        return Setting(arm, LONG_T, coupling=m) if ARMS[arm].coupled else Setting(arm, LONG_T, slot_bias=m)
    return Setting(arm, LONG_T)


def stage_a1(d: Decisions) -> list[Setting]:
    return [with_multiplier(arm, m, d) for arm in TUNED for m in multipliers(arm, d)
            if m not in d.diverged.get(arm, ())]


def stage_a2(d: Decisions) -> list[Setting]:
    """Each window at its decided c with its slot bias at h-slot16's decided s (when that s is not 1)."""
    s = d.multiplier.get("h-slot16")
    if s is None or s == 1.0:
        return []
    return [Setting(w, coupling=d.multiplier[w], slot_bias=s) for w in WINDOWS if w in d.multiplier]


def a2_ready(arm: str, d: Decisions) -> bool:
    """Whether a tuned arm's A3 check can start: its A1 decided and, for a window, its A2 too."""
    if arm not in d.multiplier:
        return False
    return ARMS[arm].tuned != "coupling" or arm in d.window_slot_multiplier


def stage_a3(d: Decisions) -> list[Setting]:
    return [with_multiplier(arm, m, d, LONG_T) for arm in TUNED if a2_ready(arm, d)
            for m in neighbours(d.multiplier[arm])]


def stage_bc(d: Decisions) -> list[Setting]:
    """Stages B and C: every arm at T = 256 whose multipliers are decided; the undecided-free arms first."""
    names = [n for n in ROPE if n not in BORROWS] + [n for n in (*TUNED, *BORROWS) if n not in ROPE or n in BORROWS]
    settings = [long_setting(n, d) for n in dict.fromkeys(names)]
    return [s for s in settings if s is not None]


def stage_d(d: Decisions) -> list[Setting]:
    if d.equal_compute_steps is None or d.equal_compute_arm is None:
        return []
    base = long_setting(d.equal_compute_arm, d)
    return [Setting(base.arm, LONG_T, base.coupling, base.slot_bias, d.equal_compute_steps)]


def stage_e(d: Decisions) -> list[Setting]:
    """Stage E: h-slot16 and h-rope-slot16 at T = 256 with the slot bias at x16, the check of h-slot16's
    LONG_MULTIPLIER (so only once that is decided)."""
    if "h-slot16" not in d.long_multiplier:
        return []
    return [Setting(arm, LONG_T, slot_bias=X16) for arm in X16_ARMS]


def twin_grids(field_bias: str, d: Decisions) -> list[Grid]:
    """Every stage whose rule's inputs are decided, in the protocol's order. The field bias is the default."""
    grids = [s.grid((TUNING_SEED,)) for s in stage_a1(d) + stage_a2(d) + stage_a3(d)]
    grids += [s.grid(SEEDS) for s in stage_bc(d) + stage_d(d) + stage_e(d)]
    return [g for g in grids if g.seeds]
