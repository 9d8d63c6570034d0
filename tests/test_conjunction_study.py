"""The conjunction study: its premise (no single letter names the block) measured on every setting it may run,
its calibration rule and its grids as protocol.md states them."""

import math

import pytest

from boltzmann_attention.experiments import blocks
from boltzmann_attention.experiments.studies.conjunction import PROFILES, grids
from boltzmann_attention.experiments.studies.conjunction.grids import (
    CALIBRATION_ARMS,
    SETTINGS,
    Decisions,
    calibration_outcome,
)
from boltzmann_attention.experiments.studies.conjunction.report import premise

conjunction_grids = PROFILES["conjunction"]


@pytest.mark.parametrize("num_blocks", sorted({s.num_blocks for s in SETTINGS}))
def test_every_setting_needs_both_letters_in_every_validation_and_test_sequence(num_blocks):
    s = next(s for s in SETTINGS if s.num_blocks == num_blocks)
    assert premise(s) == 1.0


def test_the_settings_grow_the_budget_then_shrink_the_blocks():
    assert [(s.num_blocks, s.d_model, s.steps) for s in SETTINGS[:3]] == [(8, 64, 8000), (8, 64, 32000),
                                                                       (8, 128, 32000)]
    assert [s.num_blocks for s in SETTINGS] == [8] * 3 + [4] * 3 + [3] * 3
    assert [s.T for s in SETTINGS[::3]] == [52, 28, 22]


def test_the_calibration_rule():
    assert calibration_outcome([0.5, None, 0.2]) is None
    assert calibration_outcome([0.5, 0.05, 0.9]) == "pass"
    assert calibration_outcome([0.5, 0.0501, 0.9]) == "next"


def test_the_calibration_runs_only_the_settings_started_then_every_arm():
    first = conjunction_grids("", Decisions())
    assert [g.variant for g in first] == [f"cj-{a}-b8-d64-steps8000-lr0.001" for a in CALIBRATION_ARMS]
    cfg = first[0].runs()[0][1]
    assert (cfg.data.conjunction, cfg.data.answer, cfg.data.num_blocks, cfg.data.T) == (True, "marker", 8, 52)
    assert (cfg.optim.warmup_steps, cfg.measure.eval_interval) == (400, 1000)
    two = conjunction_grids("", Decisions(calibration_settings=2))
    assert len(two) == 6 and two[-1].variant.startswith("cj-stickbreaking-b8-d64-steps32000")


def test_a_setting_over_the_cost_cap_is_reached_but_not_run_and_the_calibration_moves_on():
    from boltzmann_attention.experiments.arms import OVER_BUDGET, calibration_note

    d = Decisions(calibration_settings=4, over_budget={"3": ("softmax-rope",)})  # as read from decisions.json
    variants = [g.variant for g in conjunction_grids("", d)]
    # setting 3: only the run made before the cap is planned (so archived and reported); setting 4 runs in full
    assert [v for v in variants if "b8-d128" in v] == ["cj-softmax-rope-b8-d128-steps32000-lr0.001"]
    assert len(variants) == 10 and all(f"cj-{a}-b4-d64-steps8000-lr0.001" in variants for a in CALIBRATION_ARMS)
    assert [(i, arms) for i, _, arms in d.started(SETTINGS, CALIBRATION_ARMS)][2:] == \
        [(3, ("softmax-rope",)), (4, CALIBRATION_ARMS)]
    assert d.is_over_budget(3) and not d.is_over_budget(4)
    assert calibration_outcome([0.01, None, None], run=False) == OVER_BUDGET  # its runs' results do not count
    assert calibration_note(3, OVER_BUDGET, 9, "x") == "Setting 3 does not pass: set CALIBRATION_SETTINGS to 4 in x."
    assert calibration_note(9, OVER_BUDGET, 9, "x").startswith("No setting passes")
    for bad in ({"0": ()}, {"10": ()}, {"1": ()}, {"3": ("h-rope",)}, {"x": ()}):
        with pytest.raises(ValueError, match="OVER_BUDGET entry"):
            conjunction_grids("", Decisions(calibration_settings=4, chosen=1 if "1" in bad else None,
                                            over_budget=bad))


def test_the_committed_decisions_skip_setting_3_and_keep_its_run_from_before_the_cap():
    from boltzmann_attention.experiments.studies import conjunction, load_decisions

    d = load_decisions(conjunction)
    assert d.is_over_budget(3) and not any(d.is_over_budget(i) for i in (1, 2, 4, 5, 6, 7, 8, 9))


def test_the_boltzmann_arms_start_at_the_packages_field_bias():
    g = grids.grid("h-rope", SETTINGS[0], 1e-3, (0,))
    cfg = g.runs()[0][1]
    assert cfg.attention.field_bias_init == pytest.approx(-0.5 * math.log(blocks.length(5, 2, 8, "marker")))


def test_once_a_setting_is_chosen_every_arm_builds_a_valid_config_at_each_lr():
    d = Decisions(chosen=1)
    stage1 = conjunction_grids("", d)
    assert len(stage1) == 3 + len(grids.ARMS) * 3 - 3  # the calibration's runs are stage 1's at lr 1e-3
    configs = {g.variant: g.runs()[0][1] for g in stage1}  # each validated as it is built
    keys = configs["cj-keys4-b8-d64-steps8000-lr0.003"].attention
    assert (keys.mode, keys.coupling, keys.method, keys.coupling_range, keys.coupling_rank) == \
        ("h+J", "keys", "chain", 4, 16)
    assert configs["cj-keys4-step-b8-d64-steps8000-lr0.003"].attention.mode == "h+J-step"
    assert configs["cj-query4-b8-d64-steps8000-lr0.003"].attention.coupling == "query"
    d = Decisions(chosen=1, best_lr=dict.fromkeys(grids.ARMS, 1e-3), best_single="h-rope", best_content="keys4")
    later = conjunction_grids("", d)[len(stage1):]
    assert sorted(g.variant.split("-b8")[0] for g in later if g.seeds == (3, 4)) == \
        ["cj-h-rope", "cj-keys4", "cj-keys4-step", "cj-relative4"]
