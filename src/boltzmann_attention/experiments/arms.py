"""The arm of a study: one attention variant, by name, mode, config options and marginal method.

Every study names its arms with this record (a study with more to say of an arm extends it), so that what an
arm is, and the questions asked of it, are written once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import modes
from .sweep import Grid


@dataclass(frozen=True)
class Arm:
    """name; mode (a layer mode); options: TrainConfig fields by flat name, as (name, value) pairs; method: the
    marginal method of a mode that has one."""

    name: str
    mode: str
    options: tuple[tuple[str, object], ...] = ()
    method: str = "exact"

    @property
    def overrides(self) -> dict:
        """The options as a dict of TrainConfig fields."""
        return dict(self.options)

    @property
    def coupled(self) -> bool:
        """Whether the mode has pairwise couplings."""
        return modes.get(self.mode).couplings

    @property
    def boltzmann(self) -> bool:
        """Whether the mode has a field bias on h (the sigmoid and Boltzmann modes)."""
        return modes.get(self.mode).field_bias

    def group(self, res, task: str, variant: str, T: int):
        """This arm's runs of ``variant`` at context length T in ``res`` (a results.Results): a Group, or None."""
        return res.get(task, variant, T, self.mode, self.method)

    def values(self, res, task: str, variant: str, T: int, metric: str, split: str) -> dict[int, float]:
        """{seed: the metric on the split} of :meth:`group`'s runs ({} without runs)."""
        g = self.group(res, task, variant, T)
        return {} if g is None else g.values(metric, split)


__all__ = ["Arm", "StagedDecisions", "calibrated_grids", "calibration_note", "calibration_outcome",
           "stage_grids", "staged_grid", "staged_profile", "staged_variant"]


def stage_grids(grid, arms, lrs, best_lr: dict, decisive, *, calibration_arms=(), reference_lr: float,
                tuning_seed: int, seeds: tuple[int, ...], decisive_seeds: tuple[int, ...]) -> list:
    """The three stages of a study whose setting is chosen: (1) every arm at each of its learning rates
    (``lrs(arm)``, those that did not diverge) on the tuning seed, less the calibration arms' runs at the
    reference lr (the calibration ran them); (2) every arm at its best lr on the other ``seeds``; (3) the
    ``decisive`` arms at their best lr on ``decisive_seeds``. ``grid(arm, lr, seeds)`` makes one grid."""
    out = [grid(arm, lr, (tuning_seed,)) for arm in arms for lr in lrs(arm)
           if not (arm in calibration_arms and lr == reference_lr)]
    out += [grid(arm, best_lr[arm], tuple(x for x in seeds if x != tuning_seed)) for arm in arms if arm in best_lr]
    out += [grid(arm, best_lr[arm], decisive_seeds) for arm in decisive if arm in best_lr]
    return out


@dataclass(frozen=True)
class StagedDecisions:
    """The decisions of a study that calibrates its setting, then runs the three stages (its ``decisions.json``;
    the measurements behind them: its report). A study subclasses it to say which setting ``chosen`` names."""

    calibration_settings: int = 1       # how many of the study's settings have been started, in order
    chosen: int | None = None           # the index (from 1) of the setting that passed
    # settings (from 1, as strings in decisions.json) whose runs would break the study's cost cap: not run, but for
    # the calibration arms listed, whose runs there were made before the cap (planned, so archived and reported)
    over_budget: dict[int, tuple[str, ...]] = field(default_factory=dict)
    extra_learning_rates: dict[str, tuple[float, ...]] = field(default_factory=dict)
    diverged: dict[str, tuple[float, ...]] = field(default_factory=dict)
    best_lr: dict[str, float] = field(default_factory=dict)
    best_single: str | None = None
    best_content: str | None = None

    def learning_rates(self, arm: str, base: tuple[float, ...]) -> tuple[float, ...]:
        """The arm's learning rates: the study's ``base`` ones and those the lr rule added at an edge."""
        return tuple(sorted(set(base) | set(self.extra_learning_rates.get(arm, ()))))

    def decisive(self, control: str, static: str) -> tuple[str, ...]:
        """Stage 3's arms: the best content arm, its one-step control, static couplings and the best single score."""
        return tuple(a for a in (self.best_content, control, static, self.best_single) if a)

    def __post_init__(self):  # decisions.json's keys are strings: the settings' indices as ints, once
        over = {}
        for key, arms in self.over_budget.items():
            if not (isinstance(key, int) or isinstance(key, str) and key.isdigit()):
                raise ValueError(f"OVER_BUDGET entry {key!r}: a key must be a setting's index (from 1)")
            over[int(key)] = tuple(arms)
        object.__setattr__(self, "over_budget", over)

    def started(self, settings: tuple, calibration_arms: tuple[str, ...]) -> list[tuple[int, object, tuple]]:
        """(index from 1, setting, the calibration arms run there) of every setting the calibration has reached, in
        order: those up to ``calibration_settings`` (or ``chosen``); at a setting over the cost cap, only the arms
        that ran there before the cap. ValueError for an over-budget entry that names no setting, the chosen one,
        or an arm that is not a calibration arm."""
        for i, arms in self.over_budget.items():
            if not 1 <= i <= len(settings) or i == self.chosen or not set(arms) <= set(calibration_arms):
                raise ValueError(f"OVER_BUDGET entry {i}: {list(arms)} must name a setting (1 to {len(settings)}), "
                                 f"not the chosen one, and calibration arms only ({', '.join(calibration_arms)})")
        limit = self.calibration_settings if self.chosen is None else self.chosen
        return [(i, s, self.over_budget.get(i, calibration_arms)) for i, s in enumerate(settings[:limit], 1)]

    def is_over_budget(self, index: int) -> bool:
        """Whether setting ``index`` (from 1) is over the study's cost cap."""
        return index in self.over_budget


OVER_BUDGET = "over the cost cap: skipped"


def calibration_outcome(errors: list[float | None], solved: float, run: bool = True) -> str | None:
    """The calibration's rule on its arms' validation errors at one setting: "pass" when the best is at most
    ``solved``, "next" when every arm has run and none is, None while a run is missing; :data:`OVER_BUDGET` for a
    setting that is not run (``run`` False: over the study's cost cap), which the calibration passes over."""
    if not run:
        return OVER_BUDGET
    if any(e is None for e in errors):
        return None
    return "pass" if min(errors) <= solved else "next"


def calibration_stopped(index: int, outcome: str | None, settings: int) -> bool:
    """Whether the calibration has run out: the latest started setting ``index`` (from 1) is the last of
    ``settings`` and does not pass, so the study stops without its stages."""
    return index == settings and outcome in ("next", OVER_BUDGET)


def calibration_note(index: int, outcome: str | None, settings: int, where: str) -> str | None:
    """What the rule asks of the study's decisions after the latest started setting ``index`` (from 1)."""
    if outcome == "pass":
        return f"Setting {index} passes: set CHOSEN to {index} in {where}."
    if calibration_stopped(index, outcome, settings):
        return "No setting passes: the calibration has run out (protocol.md)."
    if outcome in ("next", OVER_BUDGET):
        return f"Setting {index} does not pass: set CALIBRATION_SETTINGS to {index + 1} in {where}."
    return None


def staged_variant(prefix: str, arm: str, s, lr: float) -> str:
    """A calibrated study's variant name: ``<prefix><arm>-<setting's name>-lr<lr>``."""
    return f"{prefix}{arm}-{s.name}-lr{lr:g}"


def staged_grid(task: str, prefix: str, analysis, arms: dict[str, Arm], arm: str, s, lr: float,
                seeds: tuple[int, ...]) -> Grid:
    """One grid of a calibrated study: ``arm`` at setting ``s`` (its T and overrides) and ``lr`` on ``seeds``, its
    runs asked for ``analysis``; a Boltzmann arm starts its field bias at the package's convention, -1/2 log T."""
    a = arms[arm]
    overrides = {**s.overrides, **dict(a.options), "lr": lr}
    if a.boltzmann:
        overrides.update(field_bias_init=-0.5 * math.log(s.T), learn_field_bias=True)
    return Grid((task,), (s.T,), modes=(a.mode,), methods=(a.method,), seeds=seeds,
                variant=staged_variant(prefix, arm, s, lr), overrides=overrides, analyses=(analysis,))


def staged_profile(grids):
    """The profile of a calibrated study (``grids(field_bias, decisions)``: the calibration, then stages 1-3 as
    their inputs are decided; the field bias does not apply, every Boltzmann arm starts at -1/2 log T) from its
    grids module: its ``SETTINGS``, ``grid``, ``ARMS`` and the constants that name the rest."""
    g = grids

    def profile(field_bias: str, d: StagedDecisions) -> list:
        return calibrated_grids(g.SETTINGS, d, g.grid, g.ARMS, calibration_arms=g.CALIBRATION_ARMS,
                                learning_rates=g.LEARNING_RATES, reference_lr=g.REFERENCE_LR,
                                tuning_seed=g.TUNING_SEED, seeds=g.SEEDS, decisive_seeds=g.DECISIVE_SEEDS,
                                control=g.CONTROL, static=g.STATIC)

    return profile


def calibrated_grids(settings: tuple, d: StagedDecisions, grid, arms, *, calibration_arms: tuple[str, ...],
                     learning_rates: tuple[float, ...], reference_lr: float, tuning_seed: int, seeds: tuple[int, ...],
                     decisive_seeds: tuple[int, ...], control: str, static: str) -> list:
    """The calibration's runs (``calibration_arms`` at ``reference_lr`` on the tuning seed, at every setting started;
    at one over the cost cap only those made before it), then, once a setting is chosen, :func:`stage_grids` at it.
    ``grid(arm, setting, lr, seeds)`` makes one grid."""
    out = [grid(arm, s, reference_lr, (tuning_seed,)) for _, s, run in d.started(settings, calibration_arms)
           for arm in run]
    if d.chosen is None:
        return out
    s = settings[d.chosen - 1]
    return out + stage_grids(lambda arm, lr, seeds_: grid(arm, s, lr, seeds_), arms,
                             lambda arm: [lr for lr in d.learning_rates(arm, learning_rates)
                                          if lr not in d.diverged.get(arm, ())],
                             d.best_lr, d.decisive(control, static), calibration_arms=calibration_arms,
                             reference_lr=reference_lr, tuning_seed=tuning_seed, seeds=seeds,
                             decisive_seeds=decisive_seeds)
