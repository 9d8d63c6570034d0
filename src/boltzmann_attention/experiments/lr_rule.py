"""The learning-rate rule the real-size studies fix before their runs, in one place.

Each arm runs a grid of learning rates (half a decade apart); the lowest validation loss wins; losses within
``near_tie`` nats of the lowest count as tied, and among those the lr the fewest half-decade steps from a
reference lr (nanoGPT's 1e-3) wins, then the smaller. A winner at the edge of the lrs run so far adds the next
lr half a decade beyond it, until the winner is inside.
"""

from __future__ import annotations

import math

from .sweep import beyond


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
