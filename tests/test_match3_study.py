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
    probe = len(grids.PROBE_ARMS) if d.probe else 0
    assert len(profile("match3", DEFAULT_FIELD_BIAS)) == len(grids.CALIBRATION_ARMS) * d.calibration_settings + probe


RAN_OUT = len(grids.SETTINGS)


def test_the_probe_needs_the_calibration_to_have_run_out_and_plans_its_two_steps():
    with pytest.raises(ValueError, match="PROBE needs the calibration to have run out"):
        grids.Decisions(calibration_settings=RAN_OUT - 1, probe=True)
    with pytest.raises(ValueError, match="PROBE needs the calibration to have run out"):
        grids.Decisions(calibration_settings=RAN_OUT, chosen=2, probe=True)
    with pytest.raises(ValueError, match="PROBE_CONFIRM needs PROBE"):
        grids.Decisions(calibration_settings=RAN_OUT, probe_confirm=True)
    s = grids.SETTINGS[grids.PROBE_SETTING - 1]
    calibration = study.PROFILES["match3"]("", grids.Decisions(calibration_settings=RAN_OUT))
    assert len(calibration) == len(grids.CALIBRATION_ARMS) * RAN_OUT
    first = study.PROFILES["match3"]("", grids.Decisions(calibration_settings=RAN_OUT, probe=True))[len(calibration):]
    assert [g.variant for g in first] == [grids.variant(a, s, 1e-3) for a in grids.PROBE_ARMS]
    for g in first:
        (_, cfg), = list(g.runs())
        cfg.validate()
        assert (cfg.seed, cfg.data.T, cfg.data.modulus, cfg.steps, cfg.arch.d_model) == (0, 8, 30, 32000, 64)
    (_, step), = list(first[grids.PROBE_ARMS.index("query-step")].runs())
    assert (step.attention.mode, step.attention.coupling) == ("h+J-step", "query")  # query's one-step control
    second = study.PROFILES["match3"]("", grids.Decisions(calibration_settings=RAN_OUT, probe=True,
                                                          probe_confirm=True))[len(calibration) + len(first):]
    runs = {(g.variant, cfg.seed) for g in second for _, cfg in g.runs()}
    arms = grids.PROBE_ARMS + grids.CALIBRATION_ARMS
    assert {(grids.variant(a, s, 1e-3), x) for a in arms for x in (1, 2)} <= runs
    assert {(grids.variant(a, s, lr), 0) for a in grids.CALIBRATION_ARMS + ("h-rope",) for lr in (3e-4, 3e-3)} <= runs
    assert len(runs) == 2 * len(arms) + 2 * 4


def _probe_runs(root, errors: dict[tuple[str, float], dict[int, float]]):
    """Result JSONs at the probe's setting: {(arm, lr): {seed: error}}, the same on validation and test."""
    import json
    from dataclasses import asdict

    s = grids.SETTINGS[grids.PROBE_SETTING - 1]
    for (arm, lr), by_seed in errors.items():
        g = grids.grid(arm, s, lr, tuple(by_seed))
        for name, cfg in g.runs():
            e = by_seed[cfg.seed]
            m = {"loss": 0.69, "error": e, "accuracy": 1 - e}
            result = {"run": name, "variant": g.variant, "config": asdict(cfg), "seed": cfg.seed, "steps_run": s.steps,
                      "wall_time_s": 1.0, "metrics": {"val": m, "test": m}, "history": [],
                      "machine": "x86_64", "cpus": 2, "torch": "2.13.0", "python": "3.11", "commit": "abc"}
            path = root / "runs" / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))


def _probe_text(root, d) -> str:
    from boltzmann_attention.experiments.results import Results, load_runs

    return "\n".join(report.probe_section(Results(load_runs(root)), d))


def test_the_probes_first_step_ends_the_study_or_asks_for_the_second(tmp_path):
    d = grids.Decisions(calibration_settings=RAN_OUT, probe=True)
    chance = {a: {0: 0.5} for a in grids.PROBE_ARMS[:-1]}
    _probe_runs(tmp_path, {(a, 1e-3): e for a, e in chance.items()})
    assert "Waiting for the probe's runs." in _probe_text(tmp_path, d)
    _probe_runs(tmp_path, {("query-step", 1e-3): {0: 0.451}})  # 45.1%: not below the 45% of off chance
    ends = _probe_text(tmp_path, d)
    assert "No probe arm is off chance" in ends and "| query-step | 45.1 | 45.1 | 45.1 |" in ends
    _probe_runs(tmp_path, {("query", 1e-3): {0: 0.3}})
    assert "set PROBE_CONFIRM to true" in _probe_text(tmp_path, d)


def test_the_probes_second_step_by_its_rule(tmp_path):
    d = grids.Decisions(calibration_settings=RAN_OUT, probe=True, probe_confirm=True)
    seeds = {0: 0.0, 1: 0.0, 2: 0.0}
    errors = {(a, 1e-3): {x: 0.5 + 0.01 * x for x in seeds} for a in grids.PROBE_ARMS + grids.CALIBRATION_ARMS}
    errors[("query", 1e-3)] = {0: 0.01, 1: 0.02, 2: 0.03}  # the best content arm: solves on every seed
    errors[("keys", 1e-3)] = {0: 0.2, 1: 0.25, 2: 0.3}
    errors[("mta", 1e-3)] = {0: 0.45, 1: 0.47, 2: 0.49}     # the best of the field's arms by validation error
    errors.update({(a, lr): {0: 0.5} for a in grids.CALIBRATION_ARMS + ("h-rope",) for lr in (3e-4, 3e-3)})
    _probe_runs(tmp_path, errors)
    text = _probe_text(tmp_path, d)
    # h-rope, relative, query-step minus query: 50-52 minus 1-3, 49 points on every seed (std 0)
    assert "The best content arm is query" in text
    for other in ("h-rope", "relative", "query-step"):
        assert f"| {other} − query | +49.00 [+49.00, +49.00]** |" in text
    assert "| mta − query | +45.00 [+42.52, +47.48]** |" in text  # 44, 45, 46: 45 ± 4.303 x 1 / sqrt(3)
    assert "**Content couplings learn Match3 where the others do not**: yes (query)." in text
    _probe_runs(tmp_path, {("softmax-rope", 3e-3): {0: 0.05}})  # a calibration arm learns at another lr
    assert "learn Match3 where the others do not**: no (query; softmax-rope at lr 0.003 learns)." in \
        _probe_text(tmp_path, d)
