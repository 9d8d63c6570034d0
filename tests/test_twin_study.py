"""The twin study: its grids follow the protocol's stages, its rules choose as written, the priors runs it
counts have exactly its configs."""

import dataclasses
import importlib
from pathlib import Path

import pytest
from conftest import archives_missing

from boltzmann_attention.experiments import studies
from boltzmann_attention.experiments.config import TrainConfig
from boltzmann_attention.experiments.results import load_runs
from boltzmann_attention.experiments.studies.twin import grids as G
from boltzmann_attention.experiments.sweep import Grid

PRIORS_ARCHIVE = Path(__file__).parents[1] / "report" / "priors" / "runs.jsonl.gz"


def _names(d):
    return [name for grid in G.twin_grids("learn-half-log-T", d) for name, _ in grid.runs()]


def test_the_profile_is_registered_and_its_configs_are_valid():
    grids = studies.profile("twin")
    assert grids
    for grid in grids:
        for _, cfg in grid.runs():
            cfg.validate()


def test_stage_a1_is_every_tuned_arm_at_every_multiplier_less_the_priors_runs_and_the_undecided_free_c_arms():
    names = _names(G.Decisions())
    short = sorted(n.split("-tw-")[1] for n in names if "T64" in n)
    assert short == sorted(
        [f"window{w}-slot{w}-jlr{c}-slr1-s0" for w in (16, 8) for c in ("0.25", "4")]
        + [f"h-slot16-slr{s}-s0" for s in (4, 16, 64)]
        + [f"h-pairs{w}-slr{p}-s0" for w in (16, 8) for p in ("0.25", "1", "4")])
    # before any decision, T = 256 has only the arms that need none: h-rope, and softmax-rope's and
    # stickbreaking's seeds 3-4 (0-2 are the priors study's)
    long = sorted(n.split("-exact-")[1] for n in names if "T256" in n)
    assert long == sorted([f"tw-h-rope-s{s}" for s in G.SEEDS]
                          + [f"pr-{a}-lr0.003-b12-steps2000-s{s}" for a in ("softmax-rope", "stickbreaking")
                             for s in (3, 4)])


def _flat(setting):
    return TrainConfig.build(T=setting.T, mode=G.ARMS[setting.arm].mode, **setting.overrides).flat()


def test_the_twins_differ_from_the_coupled_window_as_the_protocol_says():
    d = G.Decisions()
    window, pairs, direct = (_flat(G.with_multiplier(arm, m, d)) for arm, m in (
        ("window16-slot16", 1.0), ("h-pairs16", 1.0), ("h-slot16", 4.0)))
    assert {k for k in window if window[k] != pairs[k]} == {"mode", "coupling", "coupling_window",
                                                              "slot_bias_parametrization"}
    assert {k for k in window if window[k] != direct[k]} == {"mode", "coupling", "coupling_window",
                                                               "slot_bias_lr_multiplier"}
    assert pairs["slot_bias_parametrization"] == "pairs" and direct["slot_bias_lr_multiplier"] == 4.0


@pytest.mark.skipif(not PRIORS_ARCHIVE.exists(), reason="the priors archive is not in this checkout")
def test_the_priors_runs_it_counts_are_in_the_archive_with_exactly_its_configs():
    runs = {r.name: r for r in load_runs(PRIORS_ARCHIVE)}
    for (arm, T, steps), seeds in G.IN_PRIORS.items():
        g = G.Setting(arm, T, steps=steps).grid(G.SEEDS)
        for name, cfg in Grid(g.tasks, g.Ts, g.modes, g.methods, seeds, g.variant, g.overrides).runs():
            saved = TrainConfig.from_dict(runs[name].config).flat()
            assert saved == cfg.flat(), name
        assert not g.seeds or set(g.seeds).isdisjoint(seeds)  # not run again


@pytest.mark.parametrize("losses, expected", [
    ({1.0: 1.70, 4.0: 1.69, 16.0: 1.60, 64.0: 1.65}, 16.0),
    ({1.0: 1.700, 4.0: 1.695, 16.0: 1.6951}, 1.0),    # all within 0.01: the fewest steps from 1
    ({0.25: 1.60, 4.0: 1.60, 1.0: 1.70}, 0.25),       # tied and as far from 1: the smaller
    ({0.25: 1.60, 1.0: 1.605, 4.0: 1.70}, 1.0),
    ({}, None),
])
def test_the_multiplier_rule(losses, expected):
    assert G.choose_multiplier(losses) == expected


def test_edge_extension_and_neighbours():
    assert G.edge_extension(64.0, (1.0, 4.0, 16.0, 64.0)) == 256.0
    assert G.edge_extension(0.25, (0.25, 1.0, 4.0)) == 0.0625
    assert G.edge_extension(1.0, (0.25, 1.0, 4.0)) is None
    assert G.neighbours(16.0) == (4.0, 16.0, 64.0)
    d = G.Decisions(extra_multipliers={"h-slot16": (256.0,)})
    assert G.multipliers("h-slot16", d) == (1.0, 4.0, 16.0, 64.0, 256.0)
    assert any("h-slot16-slr256-s0" in n for n in _names(d))


def test_later_stages_appear_only_once_decided():
    d = G.Decisions(multiplier={"window16-slot16": 1.0, "window8-slot8": 4.0, "h-slot16": 16.0, "h-pairs16": 1.0,
                                "h-pairs8": 0.25})
    names = _names(d)
    # A2: each window at its c with the slot bias at h-slot16's s; A3 only for the arms without a window
    assert sum("T64" in n and "slr16" in n and "window" in n for n in names) == 2
    assert "shakespeare-T64-h+J-exact-tw-window8-slot8-jlr4-slr16-s0" in names
    checks = sorted(n.split("-tw-")[1] for n in names if "T256" in n and "-tw-h-rope-" not in n and "-tw-" in n)
    assert checks == sorted([f"h-slot16-slr{s}-s0" for s in (4, 16, 64)] + [f"h-pairs16-slr{p}-s0" for p in
                                                                           ("0.25", "1", "4")]
                            + [f"h-pairs8-slr{p}-s0" for p in ("0.0625", "0.25", "1")])
    d = dataclasses.replace(d, window_slot_multiplier={"window16-slot16": 1.0, "window8-slot8": 16.0})
    names = _names(d)
    assert "shakespeare-T256-h+J-exact-pr-window16-slot16-lr0.003-b12-steps2000-s0" not in names  # the archive's
    assert "shakespeare-T256-h+J-exact-tw-window16-slot16-jlr4-slr1-s0" in names
    assert "shakespeare-T256-h+J-exact-tw-window8-slot8-jlr16-slr16-s0" in names
    assert not any("rope-jlr" in n or "rope-slot16" in n for n in names)  # stage C's borrowers wait for A3
    d = dataclasses.replace(d, long_multiplier={"window16-slot16": 1.0, "window8-slot8": 4.0, "h-slot16": 64.0,
                                                "h-pairs16": 1.0, "h-pairs8": 0.25})
    names = set(_names(d))
    for variant, seeds in (("pr-window16-slot16-lr0.003-b12-steps2000", ()), ("tw-h-slot16-slr64", G.SEEDS),
                           ("tw-window8-slot8-jlr4-slr16", G.SEEDS), ("tw-window16-rope-jlr1", G.SEEDS),
                           ("tw-window8-rope-jlr4", G.SEEDS), ("tw-h-rope-slot16-slr64", G.SEEDS),
                           ("tw-h-pairs8-slr0.25", G.SEEDS)):
        assert {s for s in G.SEEDS if any(n.endswith(f"-{variant}-s{s}") and "T256" in n for n in names)} == set(seeds)
    d = dataclasses.replace(d, equal_compute_arm="stickbreaking", equal_compute_steps=1574)
    assert not any("steps1574" in n for n in _names(d) if n.endswith(("-s0", "-s1", "-s2")))  # the archive's
    assert sum("stickbreaking-lr0.003-b12-steps1574" in n for n in _names(d)) == 2


def _results(*variants):
    import json
    from dataclasses import asdict

    from boltzmann_attention.experiments.results import Results, _load_run

    runs = []
    for v in variants:
        run = {"config": asdict(TrainConfig.build(T=4, mode="softmax")), "variant": v,
               "metrics": {"val": {"loss": 1.0, "ppl": 2.7, "loss_last": 1.0, "ppl_last": 2.7}}}
        runs.append(_load_run(Path(f"{v}.json"), json.dumps(run)))
    return Results(runs)


def test_the_study_owns_its_runs_with_the_priors_configs_it_reruns():
    assert studies.study_of(_results("tw-h-rope", "pr-stickbreaking-lr0.003-b12-steps2000")).__name__.endswith("twin")
    assert studies.study_of(_results("pr-stickbreaking-lr0.003-b12-steps2000")).__name__.endswith("priors")
    assert not studies.study_of(_results("tw-h-rope", "base")).__name__.endswith("twin")


def _write(root, losses):
    """A seed-0 result JSON per setting with its validation loss ({Setting: loss})."""
    _write_seeds(root, {setting: {G.TUNING_SEED: loss} for setting, loss in losses.items()})


def test_the_rules_decide_from_the_runs_and_the_report_shows_them(tmp_path):
    from boltzmann_attention.experiments.report import ReportContext
    from boltzmann_attention.experiments.results import Results
    R = importlib.import_module("boltzmann_attention.experiments.studies.twin.report")  # the module, not report()

    d = G.Decisions()
    # A1: h-slot16 best at 64 (the edge: add 256), h-pairs16 best at 4 but within the tie of 1 (so 1), the
    # others level everywhere (so 1)
    chosen = {("h-slot16", 1.0): 1.76, ("h-slot16", 4.0): 1.74, ("h-slot16", 16.0): 1.72, ("h-slot16", 64.0): 1.70,
              ("h-pairs16", 4.0): 1.695, ("h-pairs16", 1.0): 1.70, ("h-pairs16", 0.25): 1.80}
    _write(tmp_path, {G.with_multiplier(a, m, d): chosen.get((a, m), 1.75) for a in G.TUNED
                      for m in G.multipliers(a, d)})
    res = Results(load_runs(tmp_path))
    a1 = R.decide_a1(res, d)
    assert a1["h-slot16"] == (64.0, 256.0) and a1["h-pairs16"] == (1.0, None)
    assert a1["window16-slot16"] == (1.0, None) and a1["h-pairs8"] == (1.0, None)
    assert R.decide_a3(res, d) == {} and R.decide_a2(res, d) == {}
    text = "\n".join(R.report(res, ReportContext(tmp_path, tmp_path / "out", d, "# T\n\nThe rules.\n")))
    assert "## Stage A1" in text and "| h-slot16 | **64** | slot x64 | 1.7000 |" in text
    assert "h-slot16: best at 64, the grid's edge: the rule adds 256" in text
    # h-slot16 decided at 16: A2 runs each window with its slot bias at 16; the rule picks 16 only beyond the tie
    d = G.Decisions(multiplier={"window16-slot16": 4.0, "window8-slot8": 1.0, "h-slot16": 16.0})
    _write(tmp_path, {G.Setting("window16-slot16", coupling=4.0): 1.74, G.Setting("window8-slot8"): 1.73,
                      G.Setting("window16-slot16", coupling=4.0, slot_bias=16.0): 1.72,
                      G.Setting("window8-slot8", slot_bias=16.0): 1.725})
    assert R.decide_a2(Results(load_runs(tmp_path)), d) == {"window16-slot16": 16.0, "window8-slot8": 1.0}
    d = G.Decisions(multiplier={a: 1.0 for a in G.TUNED})
    assert R.decide_a2(res, d) == {w: 1.0 for w in G.WINDOWS}  # h-slot16 at 1: no A2 runs


def test_the_verdicts_follow_the_protocol():
    from boltzmann_attention.experiments.stats import paired
    verdict = importlib.import_module("boltzmann_attention.experiments.studies.twin.report").verdict

    def c(*diffs):
        return paired({s: x for s, x in enumerate(diffs)}, {s: 0.0 for s in range(len(diffs))}, lambda a, b: a - b)

    assert verdict(c(60, 50, 70, 65, 55)) == "better"
    assert verdict(c(-60, -50, -70, -65, -55)) == "worse"
    assert verdict(c(1, -2, 3, 0, -1)) == "equivalent within ±15"
    assert verdict(c(5, 6, 5, 6, 5)).startswith("equivalent within ±15 (the coupled arm ahead")
    assert verdict(c(30, -40, 10, 50, -20)) == "inconclusive"
    assert verdict(c(10)) == "too few pairs"


def test_the_registry_writes_the_twin_report_for_its_runs(tmp_path):
    d = G.Decisions()
    _write(tmp_path / "results", {G.with_multiplier("h-pairs8", m, d): 1.7 + m / 10 for m in (0.25, 1.0, 4.0)})
    with archives_missing("priors"):
        readme = studies.write_report(tmp_path / "results", tmp_path / "report" / "twin").read_text()
    assert "Co-attention or learning speed" not in readme.splitlines()[0]  # the header, then the protocol's text
    assert "## Stage A1" in readme and "| h-pairs8 | **0.25** | slot x0.25 | 1.7250 |" in readme
    assert "h-pairs8: best at 0.25, the grid's edge: the rule adds 0.0625" in readme


TWIN_ARCHIVE = PRIORS_ARCHIVE.parents[1] / "twin" / "runs.jsonl.gz"


@pytest.mark.skipif(not (PRIORS_ARCHIVE.exists() and TWIN_ARCHIVE.exists()), reason="the archives are not here")
def test_the_recorded_decisions_are_the_rules_output_on_the_archived_runs():
    from boltzmann_attention.experiments.results import Results
    from boltzmann_attention.experiments.studies import twin

    R = importlib.import_module("boltzmann_attention.experiments.studies.twin.report")
    d = studies.load_decisions(twin)
    res = Results(load_runs(TWIN_ARCHIVE) + load_runs(PRIORS_ARCHIVE))
    decided = R.decide_a1(res, d)
    assert {arm: m for arm, (m, extra) in decided.items() if extra is None} == dict(d.multiplier)
    assert {arm: (extra,) for arm, (_, extra) in decided.items() if extra is not None} == dict(d.extra_multipliers)
    for arm, m in R.decide_a2(res, d).items():
        assert d.window_slot_multiplier.get(arm, m) == m
    for arm, m in R.decide_a3(res, d).items():
        assert d.long_multiplier.get(arm, m) == m


def _write_seeds(root, losses, wall_time_s=100.0, evaluations=None):
    """Result JSONs of every seed for {Setting: {seed: loss}}, each run taking ``wall_time_s``; ``evaluations``
    (step -> offset) adds earlier evaluations at the final loss plus the offset."""
    import json
    import math
    from dataclasses import asdict

    for setting, by_seed in losses.items():
        grid = Grid(("shakespeare",), (setting.T,), (G.ARMS[setting.arm].mode,), ("exact",), tuple(by_seed),
                    setting.variant, setting.overrides)
        for name, cfg in grid.runs():
            loss = by_seed[cfg.seed]
            val = {"loss": loss, "ppl": math.exp(loss), "loss_last": loss, "ppl_last": math.exp(loss)}
            result = {"run": name, "variant": grid.variant, "config": asdict(cfg), "seed": cfg.seed,
                      "steps_run": cfg.steps, "wall_time_s": wall_time_s, "metrics": {"val": val},
                      "history": [*({"step": st, "train_loss": 1.0, "loss": loss + off}
                                    for st, off in (evaluations or {}).items()),
                                  {"step": cfg.steps, "train_loss": 1.0, **val}], "machine": "x86_64", "cpus": 2,
                      "torch": "2.13.0", "python": "3.11", "commit": "abc"}
            path = root / "runs" / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))


_LONG_DECISIONS = G.Decisions(long_multiplier={"window16-slot16": 1.0, "window8-slot8": 1.0, "h-slot16": 4.0,
                                               "h-pairs16": 1.0, "h-pairs8": 1.0},
                              window_slot_multiplier={"window16-slot16": 1.0, "window8-slot8": 1.0})
_NOISE = {0: 0.0, 1: 0.004, 2: -0.003, 3: 0.002, 4: -0.001}  # per seed, shared by the arms: paired
_MEAN = {"window16-slot16": 1.540, "window8-slot8": 1.545, "h-slot16": 1.600, "h-pairs16": 1.541, "h-pairs8": 1.546,
         "window16-rope": 1.530, "window8-rope": 1.535, "h-rope": 1.560, "h-rope-slot16": 1.531, "softmax-rope": 1.547,
         "stickbreaking": 1.529}


def test_stages_b_to_d_are_reported_with_their_verdicts(tmp_path):
    from boltzmann_attention.experiments.report import ReportContext
    from boltzmann_attention.experiments.results import Results

    R = importlib.import_module("boltzmann_attention.experiments.studies.twin.report")
    d, noise, mean = _LONG_DECISIONS, _NOISE, _MEAN
    settings = {name: G.long_setting(name, d) for name in mean}
    _write_seeds(tmp_path, {s: {seed: mean[n] + e + (0.001 * seed if n == "h-pairs16" else 0.0)
                                for seed, e in noise.items()} for n, s in settings.items()})
    res = Results(load_runs(tmp_path))
    assert R.decide_best(res, d) == {"best_coupled": "window16-rope", "best_uncoupled": "stickbreaking"}
    d = dataclasses.replace(d, best_coupled="window16-rope", best_uncoupled="stickbreaking",
                            equal_compute_arm="stickbreaking", equal_compute_steps=1600)
    _write_seeds(tmp_path, {G.Setting("stickbreaking", G.LONG_T, steps=1600): {s: 1.538 + e for s, e in noise.items()}},
                 wall_time_s=120.0, evaluations={800: 0.030, 1200: 0.010, 1400: 0.004})
    res = Results(load_runs(tmp_path))
    text = "\n".join(R.report(res, ReportContext(tmp_path, tmp_path / "out", d, "# T\n\nThe rules.\n")))
    decided = text.split("## Questions 1-2 with the twins at x16")[0]  # the twins at x16: their own test
    rows = {line.split(" | ")[0].strip("| "): line for line in decided.splitlines() if " vs " in line}
    assert "better" in rows["window16-slot16 vs h-slot16"] and "+60.00" in rows["window16-slot16 vs h-slot16"]
    assert "equivalent within ±15" in rows["window16-slot16 vs h-pairs16"]
    assert "equivalent within ±15 (the coupled arm ahead" in rows["window16-rope vs h-rope-slot16"]  # +1, no spread
    assert "better" in rows["window16-rope vs h-rope"]
    equal_time = next(line for line in text.splitlines() if "equal wall time" in line)
    assert "stickbreaking: 1600 steps" in equal_time and "+8.00" in equal_time  # 1.538 against 1.530
    assert "equivalent within ±15 (the coupled arm ahead" in equal_time
    # the recorded times: window16-rope 100 s per 2000 steps, stickbreaking 120 s per 1600 (0.075 s per step),
    # so equal recorded time is 1333 of its steps, between its evaluations at 1200 and 1400
    recorded = next(line for line in text.splitlines() if line.startswith("The protocol's ratio"))
    assert "a ratio of 0.67, so equal recorded time is 1333 stickbreaking steps" in recorded
    assert "at step 1200 +18.00 [+18.00, +18.00]*; at step 1400 +12.00 [+12.00, +12.00]*." in recorded  # 1.548, 1.542
    assert "### 3. The best coupled arm against the best uncoupled arm" in text
    assert "| stickbreaking | - | 1.5294 ± 0.0027 (n=5) |" in text


def test_stage_e_runs_the_slot_twins_at_x16_and_reuses_the_a3_run():
    assert G.stage_e(G.Decisions(multiplier={"h-slot16": 4.0})) == []  # it checks LONG_MULTIPLIER: not before
    d = G.Decisions(multiplier={"h-slot16": 4.0}, long_multiplier={"h-slot16": 4.0})
    e = G.stage_e(d)
    assert [(s.arm, s.T, s.slot_bias, s.coupling, s.steps) for s in e] == [
        ("h-slot16", 256, 16.0, 1.0, None), ("h-rope-slot16", 256, 16.0, 1.0, None)]
    grids = G.twin_grids("learn-half-log-T", d)
    assert [(g.variant, g.seeds) for g in grids[-2:]] == [("tw-h-slot16-slr16", G.SEEDS),
                                                          ("tw-h-rope-slot16-slr16", G.SEEDS)]  # after B-D
    # the rope twin differs from stage C's only in the multiplier
    x4, x16 = _flat(G.long_setting("h-rope-slot16", d)), _flat(e[1])
    assert {k for k in x16 if x16[k] != x4[k]} == {"slot_bias_lr_multiplier"} and x16["slot_bias_lr_multiplier"] == 16
    # stage A3's seed-0 run of h-slot16 at x16 is stage E's: the same name and config, so the sweep runs it once
    name = "shakespeare-T256-h-exact-tw-h-slot16-slr16-s0"
    a3 = dict(G.with_multiplier("h-slot16", 16.0, d, G.LONG_T).grid((0,)).runs())
    assert 16.0 in G.neighbours(4.0) and list(a3) == [name] and a3[name] == dict(e[0].grid(G.SEEDS).runs())[name]
    assert _names(d).count(name) == 2
    if TWIN_ARCHIVE.exists():
        saved = next(r for r in load_runs(TWIN_ARCHIVE) if r.name == name)
        assert TrainConfig.from_dict(saved.config).flat() == a3[name].flat()


def test_a_family_with_a_comparison_not_run_yet_is_corrected_for_all_of_its_comparisons():
    from boltzmann_attention.experiments.stats import paired
    R = importlib.import_module("boltzmann_attention.experiments.studies.twin.report")
    c = paired(dict(enumerate([10.0, 30.0, 5.0, 40.0, 15.0])), dict.fromkeys(range(5), 0.0), lambda a, b: a - b)
    assert 0.05 / 2 < c.p < 0.05
    assert R._holm([["a vs b", "not run yet (0 of 5 seeds)"], ["a vs c", c]]) == [False, False]  # p against 0.05/2
    assert R._holm([["a vs c", c]]) == [True]


def test_questions_1_2_with_the_twins_at_x16(tmp_path):
    from boltzmann_attention.experiments.report import ReportContext
    from boltzmann_attention.experiments.results import Results

    R = importlib.import_module("boltzmann_attention.experiments.studies.twin.report")
    d, noise, mean = _LONG_DECISIONS, _NOISE, _MEAN
    _write_seeds(tmp_path, {G.long_setting(n, d): {s: m + e for s, e in noise.items()} for n, m in mean.items()})
    x16 = {s.arm: s for s in G.stage_e(d)}
    _write_seeds(tmp_path, {x16["h-slot16"]: {s: 1.538 + noise[s] for s in (0, 1, 2)}})

    def sections():
        text = "\n".join(R.report(Results(load_runs(tmp_path)), ReportContext(tmp_path, tmp_path / "o", d, "# T\n")))
        decided, rest = text.split("## Questions 1-2 with the twins at x16")
        return decided, rest.split("\n## ")[0]

    decided, at_x16 = sections()
    assert "| window16-slot16 vs h-slot16 | not run yet (3 of 5 seeds) |" in at_x16
    assert "| window8-rope vs h-rope-slot16 | not run yet (0 of 5 seeds) |" in at_x16
    assert "h-slot16 1.5383 ± 0.0035 (n=3) at x16, 1.6004 ± 0.0027 (n=5) at x4" in at_x16
    assert "h-rope-slot16 no runs at x16" in at_x16 and "changes a verdict" not in at_x16
    row = next(line for line in decided.splitlines() if line.startswith("| window8-slot8 vs h-pairs8 |"))
    assert row in at_x16  # a comparison without an x16 twin: the same row in both
    # every seed in: h-slot16 at x16 1.538, 2 and 7 millinats below the windows (x4: 60 and 55 above them);
    # h-rope-slot16 at x16 1.570, 40 and 35 above the rope windows (x4: 1 above and 4 below)
    _write_seeds(tmp_path, {x16["h-slot16"]: {s: 1.538 + e for s, e in noise.items()},
                            x16["h-rope-slot16"]: {s: 1.570 + e for s, e in noise.items()}})
    decided, at_x16 = sections()
    assert "| window16-slot16 vs h-slot16 | +60.00 [+60.00, +60.00]** |" in decided  # x4's table unchanged
    assert "| window16-slot16 vs h-slot16 | -2.00 [-2.00, -2.00]** |" in at_x16
    assert "| window8-rope vs h-rope-slot16 | +35.00 [+35.00, +35.00]** |" in at_x16
    changes = [line for line in at_x16.splitlines() if line.startswith("- ")]
    ahead = "equivalent within ±15 (the {} arm ahead, p < 0.05), significant after Holm"
    assert changes == [
        f"- window16-slot16 vs h-slot16: at x4 better, significant after Holm; at x16 {ahead.format('uncoupled')}",
        f"- window8-slot8 vs h-slot16: at x4 better, significant after Holm; at x16 {ahead.format('uncoupled')}",
        f"- window16-rope vs h-rope-slot16: at x4 {ahead.format('coupled')}; at x16 better, significant after Holm",
        f"- window8-rope vs h-rope-slot16: at x4 {ahead.format('uncoupled')}; at x16 better, significant after Holm"]
