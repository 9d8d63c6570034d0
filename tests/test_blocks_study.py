"""The find-the-block study: its grids follow the protocol's stages, its rules choose as written, its arms
differ as the protocol says, and its report states the decision rule's outcome from the runs."""

import importlib
import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from boltzmann_attention.experiments import studies
from boltzmann_attention.experiments.config import TrainConfig
from boltzmann_attention.experiments.results import Results, load_runs
from boltzmann_attention.experiments.studies.blocks import grids as G

R = importlib.import_module("boltzmann_attention.experiments.studies.blocks.report")  # the module, not report()
DECIDED = G.Decisions(chosen=True, best_lr={a: 1e-3 for a in G.ARMS} | {"mta": 3e-3}, best_single="fox")


def _names(d):
    return [name for grid in G.blocks_grids("learn-half-log-T", d) for name, _ in grid.runs()]


def test_the_profile_is_registered_and_every_stage_config_is_valid():
    assert [n.split("-bk-")[1] for n in _names(studies.load_decisions(studies.study_of_profile("blocks")))][:2] == [
        "softmax-rope-n5-l2-b10-steps4000-lr0.001-s0", "mta-n5-l2-b10-steps4000-lr0.001-s0"]
    for grid in G.blocks_grids("learn-half-log-T", DECIDED):
        for _, cfg in grid.runs():
            cfg.validate()


def test_the_stages_appear_as_decided_and_the_calibration_runs_are_stage_1s():
    assert len(_names(G.Decisions())) == 2
    more = G.Decisions(calibration=({"num_blocks": 20, "steps": 4000},))
    assert [n.split("-")[1] for n in _names(more)] == ["T67", "T67", "T127", "T127"]
    names = _names(DECIDED)
    assert len(names) == len(set(names)) == 2 + (3 * 8 - 2) + 2 * 8 + 2 * 3
    assert sum("-s0" in n and "lr0.001" in n and "softmax-rope" in n for n in names) == 1
    for arm, seeds in (("relative4", range(5)), ("step4", range(5)), ("fox", range(5)), ("mta", range(3)),
                       ("h-rope", range(3))):
        lr = DECIDED.best_lr[arm]
        assert {n[-1] for n in names if f"-bk-{arm}-" in n and f"lr{lr:g}-" in n} == {str(s) for s in seeds}, arm
    assert any("bk-relative4-n5-l2-b10-steps4000-lr0.003-s0" in n and "-banded-" in n for n in names)


def _flat(arm, d=DECIDED):
    grid = G.grid(arm, d.setting, 1e-3, (0,))
    return grid.runs()[0][1].flat()


def test_the_arms_differ_as_the_protocol_says():
    coupled, control, h = _flat("relative4"), _flat("step4"), _flat("h-rope")
    assert {k for k in coupled if coupled[k] != control[k]} == {"mode", "method"}
    assert {k for k in coupled if coupled[k] != h[k]} == {"mode", "method", "coupling", "coupling_range"}
    assert coupled["coupling_range"] == 4 and coupled["method"] == "banded" and coupled["position"] == "rope"
    for arm in ("h-rope", "relative4", "step4", "window16-slot16"):
        assert _flat(arm)["field_bias_init"] == pytest.approx(-math.log(67)) and _flat(arm)["learn_field_bias"]
    assert {_flat(a)["position"] for a in ("stickbreaking", "fox")} == {"none"}
    soft = _flat("softmax-rope")
    assert [soft[k] for k in ("n_layers", "n_heads", "d_model", "batch_size", "steps")] == [4, 2, 64, 32, 4000]


@pytest.mark.parametrize("e_s, e_m, tried, expected", [
    (0.55, 0.10, [G.FIRST], "pass"),
    (0.55, 0.30, [G.FIRST], G.Setting(10, 8000)),                      # MTA not clearly lower: longer, once
    (0.55, 0.30, [G.FIRST, G.Setting(10, 8000)], G.Setting(20, 8000)),  # ... then more blocks
    (0.10, 0.00, [G.FIRST], G.Setting(20, 4000)),                      # too easy
    (0.95, 0.95, [G.FIRST], G.Setting(10, 8000)),                      # nothing learns: longer ...
    (0.95, 0.95, [G.FIRST, G.Setting(10, 8000)], G.Setting(5, 8000)),   # ... then fewer blocks
    (0.95, 0.05, [G.FIRST], G.Setting(5, 4000)),                       # softmax fails alone: easier
    (0.10, 0.0, [G.Setting(20), G.FIRST], "failed"),                   # a setting already run
    (0.10, 0.0, [G.FIRST, G.Setting(10, 8000), G.Setting(20, 8000), G.Setting(40, 8000)], "failed"),  # a fifth
])
def test_the_calibration_rule(e_s, e_m, tried, expected):
    assert G.calibration_step(e_s, e_m, tried) == expected


def test_a_setting_sets_T_and_scales_the_schedule_with_the_steps():
    s = G.Setting(20, 8000)
    assert s.T == 127 and s.overrides["warmup_steps"] == 400 and s.overrides["eval_interval"] == 1000


def test_beats_is_a_mean_difference_beyond_the_larger_seed_spread():
    a, b = {0: 0.10, 1: 0.12, 2: 0.11}, {0: 0.20, 1: 0.30, 2: 0.25}
    assert G.spread(a, b) == pytest.approx(0.05) and G.beats(a, b) and not G.beats(b, a)
    assert not G.beats({0: 0.10, 1: 0.30}, {0: 0.25, 1: 0.35})  # 0.1 apart, spread 0.14
    assert G.best_single({"softmax-rope": (0.5, 1), "stickbreaking": (0.4, 2), "fox": (0.4, 1), "h-rope": (0.6, 1)}
                         ) == "fox"
    assert G.best_single({"softmax-rope": (0.5, 1)}) is None


def _write(root, errors, d=DECIDED, lr_of=None):
    """A result JSON per (arm, lr, seed) with validation and test error ``errors[(arm, lr)][seed]``; the loss
    is the error (the rules read the loss, the report both). Relative arms record couplings f(d) = 0.1 d."""
    for (arm, lr), by_seed in errors.items():
        s = d.setting or G.FIRST
        grid = G.grid(arm, s, lr, tuple(by_seed))
        for name, cfg in grid.runs():
            e = by_seed[cfg.seed]
            m = {"loss": e, "error": e, "accuracy": 1 - e / 2}
            result = {"run": name, "variant": grid.variant, "config": asdict(cfg), "seed": cfg.seed,
                      "steps_run": cfg.steps, "wall_time_s": 200.0, "metrics": {"val": m, "test": m},
                      "history": [], "machine": "x86_64", "cpus": 2, "torch": "2.13.0", "python": "3.11",
                      "commit": "abc"}
            if cfg.attention.coupling == "relative":
                J = [[[0.1 * abs(i - j) if 0 < abs(i - j) <= 4 else 0.0 for j in range(s.T)] for i in range(s.T)]] * 2
                result["layers"] = [{"couplings": J}] * 4
            path = root / "runs" / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))


def test_the_calibration_and_the_lr_rule_decide_from_the_runs(tmp_path):
    _write(tmp_path, {("softmax-rope", 1e-3): {0: 0.6}, ("mta", 1e-3): {0: 0.4}}, G.Decisions())
    res = Results(load_runs(tmp_path))
    [(s, e_s, e_m, outcome)] = R.decide_calibration(res, G.Decisions())
    assert (s, e_s, e_m, outcome) == (G.FIRST, 0.6, 0.4, G.Setting(10, 8000))
    text = "\n".join(R.report(res, _context(tmp_path, G.Decisions())))
    assert "| 1 | 5 | 2 | 10 | 67 | 4000 | 60.0 | 40.0 | next: 10 blocks, 8000 steps |" in text
    assert "add it to CALIBRATION" in text
    d = G.Decisions(chosen=True)
    lrs = {(a, lr): {0: 0.5} for a in G.ARMS for lr in G.LEARNING_RATES}
    lrs[("fox", 3e-3)] = {0: 0.3}       # the edge: add 1e-2
    lrs[("h-rope", 3e-4)] = {0: 0.495}  # within the tie of 1e-3: 1e-3
    _write(tmp_path, lrs, d)
    decided = R.decide_lrs(Results(load_runs(tmp_path)), d)
    assert decided["fox"] == (3e-3, 1e-2) and decided["h-rope"] == (1e-3, None) and len(decided) == 8


def _context(root, d):
    from boltzmann_attention.experiments.report import ReportContext
    return ReportContext(root, root / "out", d, "# T\n\nThe rules.\n")


@pytest.mark.parametrize("coupled, control, mta, expected", [
    (0.05, 0.30, 0.30, ["Couplings add what scores cannot", "**yes**", "Ising inference", "**yes**"]),
    (0.05, 0.05, 0.05, ["**yes**", "Ising inference (it also beats the one-step control step4): **no**",
                        "**local score mixing**"]),
    (0.50, 0.50, 0.50, ["scores cannot (relative4 beats softmax-rope, stickbreaking, fox and h-rope by more than the "
                        "seed spread): **no**", "**local score mixing**"]),
])
def test_the_report_states_the_decision_rule(tmp_path, coupled, control, mta, expected):
    noise = {0: 0.0, 1: 0.01, 2: -0.01, 3: 0.005, 4: -0.005}
    mean = {a: 0.5 for a in G.ARMS} | {"relative4": coupled, "step4": control, "mta": mta}
    seeds = {a: (range(5) if a in G.decisive(DECIDED) else range(3)) for a in G.ARMS}
    _write(tmp_path, {(a, DECIDED.best_lr[a]): {s: mean[a] + noise[s] for s in seeds[a]} for a in G.ARMS})
    res = Results(load_runs(tmp_path))
    assert R.decide_best_single(res, DECIDED) == "softmax-rope"  # all level in error and loss: the first
    text = "\n".join(R.report(res, _context(tmp_path, DECIDED)))
    rule = text.split("### The decision rule")[1]
    for phrase in expected:
        assert phrase in rule
    assert "| relative4 | 0 | 0 | +0.100 ± 0.000 | +0.200 ± 0.000 | +0.300 ± 0.000 | +0.400 ± 0.000 | 5 |" in text
    row = next(line for line in text.splitlines() if line.startswith("| fox − relative4 |"))
    assert f"{100 * (0.5 - coupled):+.1f} [" in row and "| 5 |" in row


def test_the_report_waits_for_every_seed_before_the_rule(tmp_path):
    _write(tmp_path, {(a, DECIDED.best_lr[a]): {0: 0.5, 1: 0.5} for a in G.ARMS})
    text = "\n".join(R.report(Results(load_runs(tmp_path)), _context(tmp_path, DECIDED)))
    assert "## Every arm at its lr" in text and "### The decision rule" not in text


def test_the_registry_picks_this_study_for_its_runs(tmp_path):
    _write(tmp_path / "results", {("softmax-rope", 1e-3): {0: 0.6}, ("mta", 1e-3): {0: 0.1}}, G.Decisions())
    readme = studies.write_report(tmp_path / "results", tmp_path / "report" / "blocks").read_text()
    assert "## Calibration" in readme and "| 60.0 | 10.0 | pass |" in readme
    assert TrainConfig.from_dict(load_runs(tmp_path / "results")[0].config).data.task == "blocks"


ARCHIVE = Path(__file__).parents[1] / "report" / "blocks" / "runs.jsonl.gz"


@pytest.mark.skipif(not ARCHIVE.exists(), reason="the study's archive is not in this checkout")
def test_the_recorded_decisions_are_the_rules_output_on_the_archived_runs():
    d = studies.load_decisions(studies.study_of_profile("blocks"))
    res = Results(load_runs(ARCHIVE))
    outcomes = [outcome for _, _, _, outcome in R.decide_calibration(res, d)]
    ran = [o for o in outcomes if o is not None]
    assert [G.Setting(**s) for s in d.calibration] == ran[:len(d.calibration)]  # each next setting the rule's
    assert d.chosen == (outcomes[-1] == "pass")
    for arm, (lr, extra) in R.decide_lrs(res, d).items():
        assert (d.best_lr[arm] == lr) if extra is None else (extra in d.extra_learning_rates[arm])
