"""The priors study: its grids follow the protocol's stages, its rules choose as written, its report runs."""

import dataclasses
import importlib

import pytest
from conftest import archives_missing

from boltzmann_attention.experiments import lr_rule, studies
from boltzmann_attention.experiments.results import Results, load_runs
from boltzmann_attention.experiments.studies import priors
from boltzmann_attention.experiments.studies.priors import grids as G

R = importlib.import_module("boltzmann_attention.experiments.studies.priors.report")  # the module, not report()

RECORDED = studies.load_decisions(priors)


def _runs(d):
    return [run for grid in G.priors_grids("learn-half-log-T", d) for run in grid.runs()]


def test_stage_1_is_every_new_arm_at_every_lr_and_every_config_is_valid():
    d = priors.Decisions()
    runs = _runs(d)
    assert len(runs) == len(G.ARMS) * len(G.LEARNING_RATES)
    for name, cfg in runs:
        cfg.validate()
        assert cfg.seed == 0 and cfg.data.T == 64 and cfg.batch_size == 12 and cfg.steps == 2000
        assert name.split("-pr-")[1].rsplit("-lr", 1)[0] in {a.name for a in G.ARMS}
    by_arm = {name.split("-pr-")[1].rsplit("-lr", 1)[0]: cfg for name, cfg in runs}
    assert by_arm["h-slot16"].attention.slot_bias == 16 and by_arm["h-slot16"].attention.mode == "h"
    assert by_arm["window16-slot16"].attention.coupling_window == 16
    assert by_arm["window16-slot16"].attention.slot_bias == 16
    assert by_arm["fox"].arch.position == "none" and by_arm["softmax-rope"].arch.position == "rope"
    # the twin differs from the coupled arm in the couplings only
    a, b = by_arm["h-slot16"].flat(), by_arm["window16-slot16"].flat()
    assert {k for k in a if a[k] != b[k]} == {"mode", "coupling", "coupling_window"}


def test_later_stages_appear_only_once_decided():
    best = {a.name: 3e-3 for a in G.ARMS}
    d = priors.Decisions(best_lr=best)  # the rule on these decisions alone, whatever decisions.json holds now
    names = [n for n, _ in _runs(d)]
    assert sum("-s1" in n and "T64" in n for n in names) == len(G.ARMS)  # stage 2's seeds 1 and 2
    # stage 3's arms that need no choice of stage 2 start as soon as their stage-1 lr is decided: the decisive
    # pair's lr check and window8-slot8's seeds
    long = sorted(n.split("-pr-")[1] for n in names if "T256" in n)
    assert long == sorted([f"{a}-lr{lr}-b12-steps2000-s0" for a in G.DECISIVE for lr in ("0.001", "0.003", "0.01")]
                          + [f"window8-slot8-lr0.003-b12-steps2000-s{s}" for s in G.SEEDS])
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
    d = dataclasses.replace(d, best_uncoupled="stickbreaking", best_coupled="window8-slot8", equal_compute_steps=None)
    order = [n.split("-pr-")[1].split("-lr")[0] for n, _ in _runs(d) if "T256" in n]
    # the lr checks first, then the seeds whose wall times fix stage 4, side by side, then the others
    assert order[:6] == ["window16-slot16"] * 3 + ["h-slot16"] * 3
    assert order[6:12] == ["window8-slot8", "stickbreaking"] * 3
    assert set(order[12:]) == {"window16-slot16", "h-slot16", "softmax-rope"}


@pytest.mark.parametrize("losses, steps, chosen", [
    ({"a": 1.80, "b": 1.79, "c": 1.70}, {"a": 1, "b": 1, "c": 5}, "c"),
    ({"a": 1.700, "b": 1.704}, {"a": 5, "b": 1}, "b"),  # tied within 0.005 nats: the faster
    ({"a": 1.700, "b": 1.706}, {"a": 5, "b": 1}, "a"),
])
def test_stage_2_choice_rule(losses, steps, chosen):
    found = {a: {"loss": {s: v for s in G.SEEDS}, "step_s": {s: steps[a] for s in G.SEEDS}}
             for a, v in losses.items()}
    assert R.choose_arm(found) == chosen
    found["a"]["loss"].pop(2)
    assert R.choose_arm(found) is None  # not until every arm has its seeds


def test_report_on_stage_1_runs(tmp_path):
    from test_report import shakespeare_val, write_run

    for a, loss in (("h-slot16", 1.9), ("window16-slot16", 1.8)):
        arm = {x.name: x for x in G.ARMS}[a]
        for lr in G.LEARNING_RATES:
            write_run(tmp_path, "shakespeare", 64, arm.mode, 0, variant=G.variant(a, lr),
                      val=shakespeare_val(2.7 ** (loss + (0.1 if lr != 3e-3 else 0))),
                      **G.overrides(arm, lr))
    res = Results(load_runs(tmp_path))
    assert priors.owns(res)
    fresh = priors.Decisions()  # the rule on these runs alone, whatever decisions.json holds now
    decided = R.decide_learning_rates(res, fresh)
    assert decided["h-slot16"] == (3e-3, 1e-2)  # best at the edge: the rule adds 1e-2
    with archives_missing("realsize"):
        lines = "\n".join(priors.report(res, studies.context(priors, tmp_path, tmp_path / "out", decisions=fresh)))
    assert "Stage 1" in lines and "window16-slot16" in lines and "**0.003**" in lines


def _planted(tmp_path):
    """Every stage's runs with planted losses and wall times: window16-slot16 20 millinats (+-2 by seed) below
    h-slot16, 3x its wall time; stickbreaking the best uncoupled arm; softmax-rope the best softmax."""
    import json

    from test_report import shakespeare_val, write_run

    base = {"softmax-rope": 1.75, "softmax-alibi": 1.80, "softmax-slot16": 1.76, "fox": 1.77, "stickbreaking": 1.70,
            "h-alibi": 1.81, "h-slot16": 1.764, "window16-slot16": 1.744, "window8-slot8": 1.75,
            "softmax": 1.78, "h": 1.84, "window16": 1.753}  # the last three: the real-size runs
    wall = {"window16-slot16": 3000.0, "window8-slot8": 900.0}
    d = priors.Decisions(best_lr={a.name: 3e-3 for a in G.ARMS}, softmax_position="rope",
                         best_uncoupled="stickbreaking", best_coupled="window16-slot16",
                         long_lr={"window16-slot16": 3e-3, "h-slot16": 1e-3},
                         equal_compute_steps=6000)
    arms = G.all_arms(d)

    def run(arm, lr, T, seed, loss, steps=None, **extra):
        path = write_run(tmp_path, "shakespeare", T, arms[arm].mode, seed, variant=G.variant(arm, lr, T, steps),
                         val=shakespeare_val(2.718281828459045 ** loss), **G.overrides(arms[arm], lr, T, steps))
        raw = json.loads(path.read_text())
        raw["wall_time_s"] = wall.get(arm, 1000.0) * (1 if T == 64 else 4) * raw["config"]["steps"] / 2000
        raw.update(extra)
        path.write_text(json.dumps(raw))

    jitter = {0: 0.0, 1: 0.002, 2: -0.001, 3: 0.001, 4: -0.002}
    for arm, loss in base.items():
        for seed in G.SEEDS:  # stage 2, with the decomposition on the coupled arms
            split = {"layers": [{"explained": [0.9, 0.5, None, 0.1], "field_only_error": [0.01] * 4,
                                 "coupling_effect": [0.1] * 4, "field_only_square": [0.001, 0.005, 0.0, 0.009],
                                 "coupling_square": [0.01, 0.01, 0.0, 0.01]}],
                     "loss": {"exact": loss + jitter[seed], "field only": loss + 0.005, "uncoupled": loss + 0.05}}
            run(arm, 3e-3, 64, seed, loss + (jitter[seed] if arm == "window16-slot16" else 0),
                **({"coattention": split} if arms[arm].coupled else {}))
    for arm in G.DECISIVE:  # stage 3's lr check: the middle wins for window16-slot16, 1e-3 for h-slot16
        for lr, extra in ((1e-3, 0.0), (3e-3, 0.02), (1e-2, 0.1)) if arm == "h-slot16" else \
                ((1e-3, 0.05), (3e-3, 0.0), (1e-2, 0.1)):
            run(arm, lr, 256, 0, base[arm] - 0.2 + extra)
        for seed in G.LONG_SEEDS[1:]:
            run(arm, d.long_lr[arm], 256, seed, base[arm] - 0.2 + jitter[seed] * (arm == "window16-slot16"))
    for arm in ("window8-slot8", "stickbreaking", "softmax-rope", "softmax", "h"):
        for seed in G.SEEDS:
            run(arm, 3e-3, 256, seed, base[arm] - 0.2)
    for seed in G.SEEDS:  # stage 4: stickbreaking for 6000 steps
        run("stickbreaking", 3e-3, 256, seed, base["stickbreaking"] - 0.25, steps=6000)
    return d


def test_later_stages_rules_and_report_on_planted_runs(tmp_path):
    d = _planted(tmp_path)
    res = Results(load_runs(tmp_path))
    undecided = dataclasses.replace(d, softmax_position=None, best_uncoupled=None, best_coupled=None)
    assert R.stage2_choices(R.stage2(res, undecided), undecided) == {
        "softmax_position": "rope", "best_uncoupled": "stickbreaking", "best_coupled": "window16-slot16"}
    assert R.decide_long_lr(res, d) == {"window16-slot16": (3e-3, None), "h-slot16": (1e-3, None)}  # no extension
    # 2000 steps x window16-slot16's 4 x 3000 s over stickbreaking's 4 x 1000 s
    assert R.decide_equal_compute_steps(res, d) == 6000
    (tmp_path / "out").mkdir()
    with archives_missing("realsize"):
        text = "\n".join(priors.report(res, studies.context(priors, tmp_path, tmp_path / "out", decisions=d)))
    for heading in ("## Stage 2", "## Stage 3: the decisive pair's lr", "## Stage 3: T = 256",
                    "## What the couplings add", "## The couplings: a per-slot field or co-attention?"):
        assert heading in text
    assert (tmp_path / "out" / "loss_T64.png").exists() and (tmp_path / "out" / "loss_T256.png").exists()
    # window16-slot16 against h-slot16 at T = 64: 20 millinats less the jitter: 20, 18, 21
    row = next(line for line in text.splitlines() if line.startswith("| window16-slot16 vs h-slot16 | T = 64"))
    assert "+19.67 [" in row and "(n = 3)" in row
    # stage 4: stickbreaking at 6000 steps against window16-slot16: 1.70 - 0.25 against 1.744 - 0.2 (+-jitter)
    row = next(line for line in text.splitlines() if "equal wall time" in line)
    assert "-94.33 [" in row and "(n = 3)" in row  # -94, -96, -93
    # the decomposition: explained by head, the missing head as a dash, the loss versions paired over seeds
    assert "| window16-slot16 | 64 | 0 | 0.500 | 0.90 0.50 - 0.10 |" in text  # pooled: 1 - 0.015 / 0.03


def test_the_recorded_decisions_are_the_rules_on_the_archived_runs():
    """decisions.json against the committed archive: every decided lr, stage-2 choice and stage 4's steps is what
    the rule gives."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "report"
    res = Results(load_runs(root / "priors" / "runs.jsonl.gz"))
    res = R._with_reused(res, studies.context(priors, root / "priors", root / "priors"))
    decided = R.decide_learning_rates(res, RECORDED)
    for arm, lr in RECORDED.best_lr.items():
        assert decided[arm] == (lr, None)
    arms = G.all_arms(RECORDED)
    for arm, lrs in RECORDED.extra_learning_rates.items():  # added because the grid's winner was at its edge
        losses = {lr: R.per_seed(res, arms[arm], lr)["loss"][0] for lr in G.LEARNING_RATES}
        assert lrs == (1e-2,) and lr_rule.choose_lr(losses, G.NEAR_TIE, G.NANOGPT_LR) == 3e-3
    choices = R.stage2_choices(R.stage2(res, RECORDED), RECORDED)
    for key in ("softmax_position", "best_uncoupled", "best_coupled"):
        if getattr(RECORDED, key) is not None:
            assert choices[key] == getattr(RECORDED, key)
    if RECORDED.equal_compute_steps is not None:  # stage 4's steps, from the stage-3 wall times
        assert R.decide_equal_compute_steps(res, RECORDED) == RECORDED.equal_compute_steps
