"""The shared learning-rate stage (experiments/lr_rule.py): the rule against a brute-force reading of its text, and
its decisions, table and notes on hand-built losses whose outcome the written rule gives."""

import random

import pytest

from boltzmann_attention.experiments import lr_rule

LRS = (3e-4, 1e-3, 3e-3)
GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)  # half a decade apart


def _by_the_text(scores, near_tie, reference_lr, higher=False):
    """The rule as protocol.md words it, read literally: walk the lrs from the fewest steps along GRID from the
    reference to the most (then the smaller first) and take the first whose score is within the tie of the best."""
    best = max(scores.values()) if higher else min(scores.values())
    order = sorted(scores, key=lambda lr: (abs(GRID.index(lr) - GRID.index(reference_lr)), lr))
    return next(lr for lr in order if abs(scores[lr] - best) <= near_tie + 1e-12)


def test_the_rule_is_its_text_on_random_grids():
    rng = random.Random(0)
    grid = GRID
    for _ in range(2000):
        lrs = rng.sample(grid, rng.randint(1, len(grid)))
        scores = {lr: round(rng.uniform(1.8, 1.85), 3) for lr in lrs}  # on a 1e-3 lattice: many exact ties
        near_tie, higher = rng.choice((0.0, 0.005, 0.01)), rng.random() < 0.5
        assert lr_rule.choose_lr(scores, near_tie, 1e-3, higher=higher) == _by_the_text(scores, near_tie, 1e-3,
                                                                                         higher)


@pytest.mark.parametrize("scores, kwargs, chosen", [
    ({3e-4: 1.95, 1e-3: 1.905, 3e-3: 1.90}, {"near_tie": 0.01, "reference_lr": 1e-3}, 1e-3),  # tied: nearest
    ({3e-4: 1.95, 1e-3: 1.905, 3e-3: 1.90}, {"near_tie": 0.001, "reference_lr": 1e-3}, 3e-3),  # outside the tie
    ({1e-3: 1.90, 3e-3: 1.90}, {}, 1e-3),  # no tie band, no reference: an exact tie goes to the smaller
    ({1e-3: 0.90, 3e-3: 0.903, 1e-2: 0.80}, {"near_tie": 0.005, "higher": True}, 1e-3),  # higher: tied, smaller
    ({1e-3: 0.90, 3e-3: 0.903, 1e-2: 0.80}, {"near_tie": 0.005, "higher": True,  # the second score breaks it
                                             "second": {1e-3: 0.5, 3e-3: 0.6, 1e-2: 0.9}}, 3e-3),
    ({1e-3: 0.90, 3e-3: 0.903}, {"near_tie": 0.001, "higher": True, "second": {1e-3: 0.9, 3e-3: 0.1}}, 3e-3),
    ({}, {}, None),
])
def test_the_rule_s_parameters(scores, kwargs, chosen):
    assert lr_rule.choose_lr(scores, **kwargs) == chosen


# Seed 0's validation loss per arm and lr; worked out by the rule (ties within 0.01 nats to the lr nearest 1e-3):
LOSSES = {
    "tied": {3e-4: 2.00, 1e-3: 1.905, 3e-3: 1.90},  # 3e-3 lowest, 1e-3 within the tie and nearer: 1e-3, inside
    "edge": {3e-4: 2.00, 1e-3: 1.95, 3e-3: 1.80},   # 3e-3, the largest run: the rule adds 1e-2
    "part": {3e-4: 1.99, 1e-3: 1.95},               # 3e-3 diverged (loses); 1e-3 is inside the lrs run
    "missing": {3e-4: 1.9, 3e-3: 1.8},              # 1e-3 not run yet: no decision
    "failed": {},                                   # every lr diverged
}
DIVERGED = {"part": (3e-3,), "failed": LRS}
STEP_S = {3e-4: 0.1, 1e-3: 0.2, 3e-3: 0.3}


def _decide(**rule):
    return lr_rule.decide(LOSSES, lambda arm: LRS, lambda arm, lr: LOSSES[arm].get(lr), DIVERGED, **rule)


def test_the_decisions_on_hand_built_losses():
    assert _decide(near_tie=0.01, reference_lr=1e-3) == {
        "tied": (1e-3, None), "edge": (3e-3, 1e-2), "part": (1e-3, None), "failed": (None, None)}
    assert _decide(near_tie=0.01, reference_lr=1e-3, extend=False)["edge"] == (3e-3, None)  # no extension
    assert _decide()["tied"] == (3e-3, 1e-2)  # without a tie band the lowest loss wins, at the edge


def test_the_table_and_notes_on_hand_built_losses():
    decided = _decide(near_tie=0.01, reference_lr=1e-3)

    def cells(arm, lr):
        runs = {"loss": {0: LOSSES[arm][lr]}, "step_s": {0: STEP_S[lr]}} if lr in LOSSES[arm] else \
            {"loss": {}, "step_s": {}}
        return lr_rule.loss_cells(runs, (0,))

    text = lr_rule.table(["arm", "lr", "validation loss", "ms per step"], LOSSES, lambda arm: LRS, cells, decided,
                         DIVERGED)
    rows = [line for line in text.splitlines()[2:]]
    assert rows[:3] == ["| tied | 0.0003 | 2.0000 (n=1) | 100 |", "| tied | **0.001** | 1.9050 (n=1) | 200 |",
                        "| tied | 0.003 | 1.9000 (n=1) | 300 |"]
    assert "| edge | **0.003** | 1.8000 (n=1) | 300 |" in rows
    assert "| part | 0.003 | diverged |  |" in rows and "| part | **0.001** | 1.9500 (n=1) | 200 |" in rows
    assert [r for r in rows if r.startswith("| missing |")] == ["| missing | 0.0003 | 1.9000 (n=1) | 100 |",
                                                                 "| missing | 0.003 | 1.8000 (n=1) | 300 |"]
    assert [r for r in rows if r.startswith("| failed |")] == [f"| failed | {lr:g} | diverged |  |" for lr in LRS]
    assert len(rows) == 3 + 3 + 3 + 2 + 3
    assert lr_rule.table(["arm", "lr", "loss"], LOSSES, lambda arm: LRS, lambda arm, lr: None, decided) == ""
    labelled = lr_rule.table(["arm", "lr", "validation loss", "ms per step"], ["tied"], lambda arm: LRS, cells,
                             decided, label=lambda arm, lr: f"{lr:g}" + (" (recorded)" if lr == 3e-3 else ""))
    assert "| tied | 0.003 (recorded) |" in labelled and "| tied | **0.001** |" in labelled
    notes = lr_rule.decision_notes(list(LOSSES), decided, {"tied": 1e-3, "part": 3e-3}, "decisions.json")
    assert notes == ("Not decided yet (runs missing): missing. edge: best at 0.003, the grid's edge, so the rule adds "
                     "lr 0.01 (EXTRA_LEARNING_RATES; not run yet). failed: every lr diverged. Chosen: tied 0.001, "
                     "part 0.001 (BEST_LR in decisions.json differs for part: update it).")


def test_the_seeds_the_rule_reads():
    assert lr_rule.seeds_mean({0: 1.0, 1: 2.0, 2: 4.0}, (0, 1)) == 1.5  # seed 2 is not read
    assert lr_rule.seeds_mean({0: 1.0}, (0, 1)) is None  # seed 1 missing
