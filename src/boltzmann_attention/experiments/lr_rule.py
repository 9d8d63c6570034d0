"""The learning-rate stage of the studies, in one place: the rule, its decisions, its table and its notes.

Each arm runs a grid of learning rates (half a decade apart) and the best score wins: the lowest (a validation
loss) or, for a rule that says so, the highest (an accuracy). Scores within ``near_tie`` of the best count as
tied; among those the highest ``second`` score wins where the rule has a second score, else the lr the fewest
half-decade steps from a reference lr (nanoGPT's 1e-3) where it has one, then the smaller lr. A winner at the edge
of the lrs run so far adds the next lr half a decade beyond it, until the winner is inside (unless the rule says
otherwise); an lr whose run diverged loses. A study's protocol.md names its parameters. :func:`decide` applies
the rule to a study's runs, :func:`table` lays out the stage's table and :func:`decision_notes` the line under it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from .stats import stat
from .sweep import beyond
from .tables import fmt_num, fmt_stat, md_table


def choose_lr(scores: dict[float, float], near_tie: float = 0.0, reference_lr: float | None = None, *,
              higher: bool = False, second: dict[float, float] | None = None, step: float = 10 ** 0.5
              ) -> float | None:
    """The rule on {lr: score} (lower is better; ``higher``: higher is better); ``second``: {lr: the tie-break's
    score, higher is better}, for a rule that breaks ties by it instead of by ``reference_lr``; ``step``: the
    grid's factor, by which steps from ``reference_lr`` are counted (half a decade; the same rule serves a grid
    of lr multipliers with ``reference_lr`` 1). None when there is no lr."""
    if not scores:
        return None
    sign = -1.0 if higher else 1.0
    best = min(sign * v for v in scores.values())
    tied = [lr for lr, v in scores.items() if sign * v <= best + near_tie + 1e-12]
    if second is not None:
        return min(tied, key=lambda lr: (-second[lr], lr))
    steps = (lambda lr: 0) if reference_lr is None else (lambda lr: abs(round(math.log(lr / reference_lr)
                                                                                / math.log(step))))
    return min(tied, key=lambda lr: (steps(lr), lr))


def edge_extension(lr: float, lrs: tuple[float, ...], step: float | None = None) -> float | None:
    """The lr to add when ``lr`` (the rule's choice) is the smallest or largest of ``lrs`` (sorted), else None:
    half a decade beyond it on the grid 1, 3, 10, 30, ... (``sweep.beyond``), or a factor ``step`` beyond it."""
    if lr not in (lrs[0], lrs[-1]):
        return None
    up = lr == lrs[-1]
    if step is None:
        return beyond(lr, up=up)
    return lr * step if up else lr / step


def seeds_mean(values: dict[int, float], seeds) -> float | None:
    """The mean of ``values`` ({seed: value}) over ``seeds``; None while one of them is missing."""
    return statistics.mean(values[s] for s in seeds) if all(s in values for s in seeds) else None


def decide(arms, lrs_of: Callable, score_of: Callable, diverged: dict, near_tie: float = 0.0,
           reference_lr: float | None = None, *, higher: bool = False, second_of: Callable | None = None,
           extend: bool = True) -> dict[str, tuple[float | None, float | None]]:
    """Per arm whose runs are all there at every lr of ``lrs_of(arm)`` (sorted; those in ``diverged[arm]``
    aside): (the rule's lr or None when every lr diverged, the lr to add beyond the edge or None).
    ``score_of(arm, lr)``: the score the rule reads (e.g. :func:`seeds_mean` of the validation losses), None
    while a run is missing; ``second_of(arm, lr)``: the tie-break's score, for a rule that has one;
    ``extend=False``: a rule without edge extension. The rule's parameters: :func:`choose_lr`."""
    out = {}
    for arm in arms:
        lrs = lrs_of(arm)
        scores = {lr: score_of(arm, lr) for lr in lrs if lr not in diverged.get(arm, ())}
        if None in scores.values():
            continue
        second = None if second_of is None else {lr: second_of(arm, lr) for lr in scores}
        chosen = choose_lr(scores, near_tie, reference_lr, higher=higher, second=second)
        out[arm] = (chosen, edge_extension(chosen, lrs) if extend and chosen is not None else None)
    return out


def table(header: list[str], arms, lrs_of: Callable, cells: Callable, decided: dict, diverged: dict | None = None,
          label: Callable | None = None) -> str:
    """The stage's table ("" without a row): per arm and lr with a run or in ``diverged[arm]``, the arm, the lr
    (``label(arm, lr)``, else the lr; bold: the rule's choice in ``decided``) and ``cells(arm, lr)``, the
    columns after the lr (None: no run yet), the first of them 'diverged' for an lr that diverged."""
    rows = []
    for arm in arms:
        for lr in lrs_of(arm):
            found, failed = cells(arm, lr), lr in (diverged or {}).get(arm, ())
            if found is None and not failed:
                continue
            found = found or [""] * (len(header) - 2)
            name = label(arm, lr) if label else f"{lr:g}"
            rows.append([arm, f"**{name}**" if decided.get(arm, (None,))[0] == lr else name,
                         *(["diverged", *found[1:]] if failed else found)])
    return md_table(header, rows) if rows else ""


def loss_cells(measures: dict[str, dict[int, float]], seeds) -> list[str] | None:
    """The validation loss of ``seeds`` (mean ± std) and the ms per step of the same runs, from
    :meth:`..results.Group.measures`: the cells after the lr in :func:`table`; None without a run."""
    loss = {s: v for s, v in measures["loss"].items() if s in seeds}
    step_s = [v for s, v in measures["step_s"].items() if s in seeds]
    if not loss:
        return None
    return [fmt_stat(stat(loss.values()), digits=4), fmt_num(1000 * statistics.mean(step_s), 0) if step_s else ""]


def decision_notes(names, decided: dict, best_lr: dict, where: str) -> str:
    """The line under a stage's learning-rate table: the names (modes, arms) not decided yet, those that
    diverged at every lr, those whose best lr is at the grid's edge (the rule adds the next lr), and the
    choices, with a reminder where the BEST_LR recorded in ``where`` differs. ``decided``: :func:`decide`'s."""
    missing = [n for n in names if n not in decided]
    notes = [f"Not decided yet (runs missing): {', '.join(missing)}."] if missing else []
    for name, (chosen, extra) in decided.items():
        if chosen is None:
            notes.append(f"{name}: every lr diverged.")
        elif extra is not None:
            notes.append(f"{name}: best at {chosen:g}, the grid's edge, so the rule adds lr {extra:g} "
                         "(EXTRA_LEARNING_RATES; not run yet).")
    best = {n: lr for n, (lr, extra) in decided.items() if lr is not None and extra is None}
    if best:
        differs = [n for n, lr in best.items() if best_lr.get(n) != lr]
        notes.append("Chosen: " + ", ".join(f"{n} {lr:g}" for n, lr in best.items())
                     + (f" (BEST_LR in {where} differs for {', '.join(differs)}: update it)" if differs else "")
                     + ".")
    return " ".join(notes)
