"""The learning-rate rule the real-size studies fix before their runs, in one place.

Each arm runs a grid of learning rates (half a decade apart); the lowest validation loss wins; losses within
``near_tie`` nats of the lowest count as tied, and among those the lr the fewest half-decade steps from a
reference lr (nanoGPT's 1e-3) wins, then the smaller. A winner at the edge of the lrs run so far adds the next
lr half a decade beyond it, until the winner is inside. :func:`decide` applies the rule to a study's runs and
:func:`table_rows` lays out its table.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from .stats import stat
from .sweep import beyond
from .tables import fmt_num, fmt_stat


def choose_lr(losses: dict[float, float], near_tie: float, reference_lr: float) -> float | None:
    """The rule on {lr: validation loss}; None when there is no lr."""
    if not losses:
        return None
    best = min(losses.values())
    tied = [lr for lr, loss in losses.items() if loss <= best + near_tie + 1e-12]
    return min(tied, key=lambda lr: (abs(round(2 * math.log10(lr / reference_lr))), lr))


def edge_extension(lr: float, lrs: tuple[float, ...]) -> float | None:
    """The lr to add when ``lr`` (the rule's choice) is the smallest or largest of ``lrs`` (sorted), else None."""
    if lr == lrs[0]:
        return beyond(lr, up=False)
    if lr == lrs[-1]:
        return beyond(lr, up=True)
    return None


def decide(arms, lrs_of: Callable, losses_of: Callable, diverged: dict, near_tie: float, reference_lr: float
           ) -> dict[str, tuple[float | None, float | None]]:
    """Per arm whose runs are all there at every lr of ``lrs_of(arm)`` (those in ``diverged[arm]`` aside):
    (the rule's lr, the lr to add beyond the edge or None). ``losses_of(arm, lr)``: {seed: loss} of the seeds
    the rule reads, None while one of them is missing."""
    out = {}
    for arm in arms:
        losses = {}
        for lr in lrs_of(arm):
            if lr in diverged.get(arm, ()):
                continue
            seeds = losses_of(arm, lr)
            if seeds is None:
                break
            losses[lr] = statistics.mean(seeds.values())
        else:
            chosen = choose_lr(losses, near_tie, reference_lr)
            out[arm] = (chosen, edge_extension(chosen, lrs_of(arm)) if chosen is not None else None)
    return out


def table_rows(arms, lrs_of: Callable, found_of: Callable, decided: dict, diverged: dict, seeds) -> list[list]:
    """The learning-rate table's rows: arm, lr (bold: the rule's choice), the validation loss of ``seeds``
    (or 'diverged') and ms per step of the same runs. ``found_of(arm, lr)``: {"loss": {seed: ...},
    "step_s": {seed: ...}}. Lrs without a run yet are left out."""
    rows = []
    for arm in arms:
        for lr in lrs_of(arm):
            found = found_of(arm, lr)
            loss = {s: v for s, v in found["loss"].items() if s in seeds}
            step_s = [v for s, v in found["step_s"].items() if s in seeds]  # the same runs as the loss
            failed = lr in diverged.get(arm, ())
            if not loss and not failed:
                continue
            bold = decided.get(arm, (None,))[0] == lr
            rows.append([arm, f"**{lr:g}**" if bold else f"{lr:g}",
                         "diverged" if failed else fmt_stat(stat(loss.values()), digits=4),
                         fmt_num(1000 * statistics.mean(step_s), 0) if step_s else ""])
    return rows
