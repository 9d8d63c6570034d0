"""The Match3 study: its premise measured on every setting it may run, its grids, and its calibration rule."""

import importlib

import pytest

from boltzmann_attention.experiments.recipes import DEFAULT_FIELD_BIAS
from boltzmann_attention.experiments.studies import load_decisions, profile

grids = importlib.import_module("boltzmann_attention.experiments.studies.match3.grids")
report = importlib.import_module("boltzmann_attention.experiments.studies.match3.report")
study = importlib.import_module("boltzmann_attention.experiments.studies.match3")


@pytest.mark.parametrize("T", sorted({s.T for s in grids.SETTINGS}))
def test_no_single_token_decides_a_label_at_any_setting(T):
    setting = next(s for s in grids.SETTINGS if s.T == T)
    alone, pairs = report.premise(setting)
    bound = 0.5 + 4 * (0.25 / 2000) ** 0.5
    assert alone < bound and pairs < bound


def test_the_modulus_makes_about_half_of_uniform_draws_positive():
    import torch

    from boltzmann_attention.experiments.tasks import match3
    for T in (8, 12):
        x = torch.randint(0, grids.modulus(T), (20000, T), generator=torch.Generator().manual_seed(T))
        assert abs(float(match3.labels(x, grids.modulus(T)).float().mean()) - 0.5) < 0.05


def test_the_calibration_grids_and_every_arms_config_are_valid():
    first = study.PROFILES["match3"]("", grids.Decisions())
    assert [g.variant for g in first] == [grids.variant(a, grids.SETTINGS[0], grids.REFERENCE_LR)
                                          for a in grids.CALIBRATION_ARMS]
    (_, cfg), = list(first[0].runs())
    assert (cfg.data.task, cfg.data.T, cfg.data.modulus, cfg.steps) == ("match3", 12, 79, 8000)
    for arm in grids.ARMS:
        for _, cfg in grids.grid(arm, grids.SETTINGS[0], 1e-3, (0,)).runs():
            cfg.validate()
    chosen = study.PROFILES["match3"]("", grids.Decisions(chosen=1, best_lr={a: 1e-3 for a in grids.ARMS},
                                                    best_single="h-rope", best_content="keys"))
    assert {g.variant.split("-T")[0] for g in chosen} == {f"{grids.PREFIX}{a}" for a in grids.ARMS}


def test_the_calibration_rule():
    assert grids.calibration_outcome([0.3, None, 0.2]) is None
    assert grids.calibration_outcome([0.3, 0.05, 0.2]) == "pass"
    assert grids.calibration_outcome([0.3, 0.06, 0.2]) == "next"


def test_the_decisions_load_and_the_profile_is_registered():
    d = load_decisions(study)
    assert isinstance(d, grids.Decisions) and d.chosen is None
    assert "match3" in study.PROFILES and study.HELP["match3"]
    assert len(profile("match3", DEFAULT_FIELD_BIAS)) == len(grids.CALIBRATION_ARMS) * d.calibration_settings
