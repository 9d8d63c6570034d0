"""The arm of a study: one attention variant, by name, mode, config options and marginal method.

Every study names its arms with this record (a study with more to say of an arm extends it), so that what an
arm is, and the questions asked of it, are written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import modes


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


__all__ = ["Arm", "stage_grids"]


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
