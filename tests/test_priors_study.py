"""The priors study: its grids follow the protocol's stages, its rules choose as written, its report runs."""

import dataclasses

import pytest

from boltzmann_attention.experiments import studies
from boltzmann_attention.experiments.results import Results, load_runs
from boltzmann_attention.experiments.studies import priors

RECORDED = studies.load_decisions(priors)


def _runs(d):
    return [run for grid in priors.priors_grids("learn-half-log-T", d) for run in grid.runs()]


def test_stage_1_is_every_new_arm_at_every_lr_and_every_config_is_valid():
    d = priors.Decisions()
    runs = _runs(d)
    assert len(runs) == len(priors.ARMS) * len(priors.LEARNING_RATES)
    for name, cfg in runs:
        cfg.validate()
        assert cfg.seed == 0 and cfg.data.T == 64 and cfg.batch_size == 12 and cfg.steps == 2000
        assert name.split("-pr-")[1].rsplit("-lr", 1)[0] in {a.name for a in priors.ARMS}
    by_arm = {name.split("-pr-")[1].rsplit("-lr", 1)[0]: cfg for name, cfg in runs}
    assert by_arm["h-slot16"].attention.slot_bias == 16 and by_arm["h-slot16"].attention.mode == "h"
    assert by_arm["window16-slot16"].attention.coupling_window == 16
    assert by_arm["window16-slot16"].attention.slot_bias == 16
    assert by_arm["fox"].model.position == "none" and by_arm["softmax-rope"].model.position == "rope"
    # the twin differs from the coupled arm in the couplings only
    a, b = by_arm["h-slot16"].flat(), by_arm["window16-slot16"].flat()
    assert {k for k in a if a[k] != b[k]} == {"mode", "coupling", "coupling_window"}


def test_later_stages_appear_only_once_decided():
    best = {a.name: 3e-3 for a in priors.ARMS}
    d = dataclasses.replace(RECORDED, best_lr=best)
    names = [n for n, _ in _runs(d)]
    assert sum("-s1" in n and "T64" in n for n in names) == len(priors.ARMS)  # stage 2's seeds 1 and 2
    # stage 3's arms that need no choice of stage 2 start as soon as their stage-1 lr is decided: the decisive
    # pair's lr check and window8-slot8's seeds
    long = sorted(n.split("-pr-")[1] for n in names if "T256" in n)
    assert long == sorted([f"{a}-lr{lr}-b12-steps2000-s0" for a in priors.DECISIVE for lr in ("0.001", "0.003", "0.01")]
                          + [f"window8-slot8-lr0.003-b12-steps2000-s{s}" for s in priors.SEEDS])
    assert not any("T256" in n for n in (n for n, _ in _runs(dataclasses.replace(d, best_lr={}))))
    d = dataclasses.replace(d, softmax_position="rope", best_uncoupled="h-slot16")
    names = [n for n, _ in _runs(d)]
    assert any("pr-window16-rope-lr0.0003-s0" in n for n in names)  # the window at softmax's position: stage 1
    long = [n for n in names if "T256" in n]
    # the decisive pair's lr check (seed 0, the stage-1 lr and one step either side), no seeds before LONG_LR
    assert sorted(n.split("-pr-")[1] for n in long if "window16-slot16" in n) == [
        f"window16-slot16-lr{lr}-b12-steps2000-s0" for lr in ("0.001", "0.003", "0.01")]
    d = dataclasses.replace(d, long_lr={"window16-slot16": 3e-3, "h-slot16": 1e-2}, equal_compute_steps=5000)
    names = {n for n, _ in _runs(d)}  # a run in two stages (seed 0 at the checked lr) is one run
    assert sum("pr-window16-slot16-lr0.003-b12-steps2000-s" in n for n in names) == 5
    assert sum("pr-h-slot16-lr0.01-b12-steps2000-s" in n for n in names) == 5
    assert sum("pr-h-slot16-lr0.01-b12-steps5000-s" in n for n in names) == 3  # stage 4


@pytest.mark.parametrize("losses, steps, chosen", [
    ({"a": 1.80, "b": 1.79, "c": 1.70}, {"a": 1, "b": 1, "c": 5}, "c"),
    ({"a": 1.700, "b": 1.704}, {"a": 5, "b": 1}, "b"),  # tied within 0.005 nats: the faster
    ({"a": 1.700, "b": 1.706}, {"a": 5, "b": 1}, "a"),
])
def test_stage_2_choice_rule(losses, steps, chosen):
    found = {a: {"loss": {s: v for s in priors.SEEDS}, "step_s": {s: steps[a] for s in priors.SEEDS}}
             for a, v in losses.items()}
    assert priors.choose_arm(found) == chosen
    found["a"]["loss"].pop(2)
    assert priors.choose_arm(found) is None  # not until every arm has its seeds


def test_report_on_stage_1_runs(tmp_path):
    from test_report import shakespeare_val, write_run

    for a, loss in (("h-slot16", 1.9), ("window16-slot16", 1.8)):
        arm = {x.name: x for x in priors.ARMS}[a]
        for lr in priors.LEARNING_RATES:
            write_run(tmp_path, "shakespeare", 64, arm.mode, 0, variant=priors.variant(a, lr),
                      val=shakespeare_val(2.7 ** (loss + (0.1 if lr != 3e-3 else 0))),
                      **priors.overrides(arm, lr))
    res = Results(load_runs(tmp_path))
    assert priors.owns(res)
    fresh = priors.Decisions()  # the rule on these runs alone, whatever decisions.json holds now
    decided = priors.decide_learning_rates(res, fresh)
    assert decided["h-slot16"] == (3e-3, 1e-2)  # best at the edge: the rule adds 1e-2
    lines = "\n".join(priors.report(res, studies.context(priors, tmp_path, tmp_path / "out", decisions=fresh)))
    assert "Stage 1" in lines and "window16-slot16" in lines and "**0.003**" in lines
