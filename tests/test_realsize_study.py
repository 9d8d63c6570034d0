"""The real-size study: its grids follow the design, its rules, and its report on planted runs."""

import importlib
import json
from dataclasses import replace

import pytest
from test_report import shakespeare_val, table_after, write_run

from boltzmann_attention.experiments import lr_rule, studies
from boltzmann_attention.experiments.recipes import NANOGPT
from boltzmann_attention.experiments.results import Results, load_runs
from boltzmann_attention.experiments.studies import realsize, study_of, write_report
from boltzmann_attention.experiments.studies.realsize import grids as G
from boltzmann_attention.experiments.train import TrainConfig

R = importlib.import_module("boltzmann_attention.experiments.studies.realsize.report")  # the module, not report()

ARMS = [a.name for a in G.ARMS]
RECORDED = studies.load_decisions(realsize)


def decided(**changes) -> realsize.Decisions:
    """The study's recorded decisions with ``changes``."""
    return replace(RECORDED, **changes)


def _configs(best=None, extra=None):
    """The profile's runs under the given decisions (none by default, whatever decisions.json holds)."""
    d = decided(best_lr=best or {}, extra_learning_rates=extra or {})
    unique = {}
    for name, cfg in (run for g in G.realsize_grids("learn-half-log-T", d) for run in g.runs()):
        assert unique.setdefault(name, cfg) == cfg  # a name listed twice (a reused run) is the same config
        cfg.validate()
    return list(unique.items())


def _arm_of(cfg: TrainConfig) -> str:
    return next(a.name for a in G.ARMS if (a.mode, a.method) == (cfg.mode, cfg.method)
                and all(getattr(cfg, k) == v for k, v in a.options))


def test_stage_one_alone_until_the_learning_rates_are_decided():
    runs = _configs()
    assert len(runs) == len(ARMS) * len(G.LEARNING_RATES)
    seen = {(_arm_of(cfg), cfg.lr) for _, cfg in runs}
    assert seen == {(arm, lr) for arm in ARMS for lr in (3e-4, 1e-3, 3e-3)}
    for name, cfg in runs:
        # nanoGPT's CPU configuration, apart from the lr being searched
        assert {k: getattr(cfg, k) for k in NANOGPT if k != "lr"} == {k: v for k, v in NANOGPT.items() if k != "lr"}
        assert (cfg.task, cfg.T, cfg.seed, cfg.memory_probe_steps) == ("shakespeare", 64, 0, 3)
        assert name == f"shakespeare-T64-{cfg.mode}-{cfg.method}-rs-{_arm_of(cfg)}-lr{cfg.lr:g}-s0"
    by_arm = {_arm_of(cfg): cfg for _, cfg in runs}
    assert (by_arm["window16"].coupling, by_arm["window16"].coupling_window, by_arm["window16"].method) == (
        "window", 16, "exact")
    for arm, method in (("meanfield8", "meanfield"), ("banded8", "banded")):
        assert (by_arm[arm].coupling, by_arm[arm].coupling_range, by_arm[arm].method) == ("relative", 8, method)
    assert by_arm["h"].coupling_window is None and by_arm["softmax"].mode == "softmax"


def test_stages_two_and_three_follow_the_design():
    best = {"softmax": 1e-3, "h": 3e-3, "window16": 1e-3, "meanfield8": 3e-4, "banded8": 1e-3}
    stage_one = {name for name, _ in _configs()}
    runs = _configs(best)
    later = [(name, cfg) for name, cfg in runs if name not in stage_one]
    short = [(n, c) for n, c in later if c.T == 64]
    long = [(n, c) for n, c in later if c.T == 256]
    # stage 2: seeds 1 and 2 at the best lr (seed 0 is stage 1's run, the same name); seed by seed
    assert sorted((_arm_of(c), c.seed) for _, c in short) == sorted((a, s) for a in ARMS for s in (1, 2))
    assert all(c.lr == best[_arm_of(c)] for _, c in short)
    assert [c.seed for _, c in short] == sorted(c.seed for _, c in short)
    reused = [n for n, c in runs if c.T == 64 and c.seed == 0 and c.lr == best[_arm_of(c)]]
    assert len(reused) == len(ARMS) and set(reused) <= stage_one
    # stage 3: softmax, h and the fastest h+J arm at T = 256, three seeds, batch and steps as documented
    assert sorted((_arm_of(c), c.seed) for _, c in long) == sorted(
        (a, s) for a in ("softmax", "h", RECORDED.fastest) for s in (0, 1, 2))
    for name, cfg in long:
        assert (cfg.batch_size, cfg.steps, cfg.eval_windows, cfg.lr) == (
            G.LONG_BATCH, G.LONG_STEPS, G.LONG_EVAL_WINDOWS, best[_arm_of(cfg)])
        assert name.endswith(f"-b{G.LONG_BATCH}-steps{G.LONG_STEPS}-s{cfg.seed}")
    assert RECORDED.fastest in G.COUPLED and G.LONG_EVAL_WINDOWS * 256 == 2048 * 64
    # an arm without a decided lr has no later runs
    partial = _configs({"softmax": 1e-3})
    assert {_arm_of(c) for n, c in partial if n not in stage_one} == {"softmax"}


@pytest.mark.parametrize("losses, chosen", [
    ({3e-4: 1.95, 1e-3: 1.90, 3e-3: 1.85}, 3e-3),              # a clear winner
    ({3e-4: 1.95, 1e-3: 1.859, 3e-3: 1.85}, 1e-3),             # within 0.01 nats: towards nanoGPT's 1e-3
    ({3e-4: 1.851, 1e-3: 1.90, 3e-3: 1.85}, 3e-4),             # tied at equal distance from 1e-3: the smaller
    ({3e-4: 1.95, 1e-3: 1.90, 3e-3: 1.85, 1e-2: 1.855}, 3e-3),  # an added lr takes part
    ({}, None),
])
def test_the_lr_rule(losses, chosen):
    assert lr_rule.choose_lr(losses, G.NEAR_TIE, G.NANOGPT_LR) == chosen


def test_an_lr_at_the_edge_extends_the_grid():
    def extension(arm, lr, d):
        return lr_rule.edge_extension(lr, G.arm_learning_rates(arm, d))

    d = decided(extra_learning_rates={})  # not the recorded decisions
    assert extension("h", 3e-3, d) == 1e-2
    assert extension("h", 3e-4, d) == 1e-4
    assert extension("h", 1e-3, d) is None
    d = decided(extra_learning_rates={"h": (1e-2,)})
    assert extension("h", 3e-3, d) is None and extension("h", 1e-2, d) == 3e-2
    assert G.arm_learning_rates("h", d) == (3e-4, 1e-3, 3e-3, 1e-2)
    assert extension("softmax", 3e-3, d) == 1e-2  # another arm keeps the grid


# --------------------------------------------------------------------------------------------- planted runs

STEP_S = {"softmax": 0.08, "h": 0.09, "window16": 0.30, "meanfield8": 0.5, "banded8": 1.4}
PEAK = {"softmax": 460.0, "h": 480.0, "window16": 520.0, "meanfield8": 600.0, "banded8": 900.0}
STAGE1 = {  # seed 0's validation loss per arm and lr
    "softmax": {3e-4: 1.99, 1e-3: 1.88, 3e-3: 1.875},  # tied with 1e-3: 1e-3 wins
    "h": {3e-4: 1.98, 1e-3: 1.90, 3e-3: 1.86},         # 3e-3: at the edge, adds 1e-2
    "window16": {3e-4: 1.97, 1e-3: 1.85, 3e-3: 1.87},
    "meanfield8": {3e-4: 1.96, 1e-3: 1.86, 3e-3: 1.90},
}  # banded8: no runs yet
# stage 2: loss = BASE[arm] + OFFSET[seed]; window16 beats h by 30 mnats, meanfield8 is level, banded8 worse
BASE = {"softmax": 1.880, "h": 1.885, "window16": 1.855, "meanfield8": 1.885, "banded8": 1.905}
OFFSET = {0: -0.004, 1: 0.0, 2: 0.004}
LEVEL = {0: 0.002, 1: -0.003, 2: 0.001}  # meanfield8's own noise against h: no measurable difference
BEST = {"softmax": 1e-3, "h": 3e-3, "window16": 1e-3, "meanfield8": 1e-3, "banded8": 1e-3}


def _plant(root, arm, lr, seed, loss, T=64, steps=2000, step_s=None, peak=None):
    a = G.BY_NAME[arm]
    cfg = G.overrides(a, lr, T)
    path = write_run(root, "shakespeare", T, a.mode, seed, variant=G.variant(arm, lr, T), method=a.method,
                     val=shakespeare_val(2.718281828459045 ** loss), **cfg)
    result = json.loads(path.read_text())
    result["wall_time_s"] = (step_s or STEP_S[arm]) * steps
    result["memory"] = {"peak_rss_mib": peak or PEAK[arm], "rss_before_steps_mib": 380.0,
                        "steps_mib": (peak or PEAK[arm]) - 380.0, "steps": 3}
    path.write_text(json.dumps(result))


def _stage_two_loss(arm, seed):
    return BASE[arm] + OFFSET[seed] + (LEVEL[seed] if arm == "meanfield8" else 0.0)


def _plant_all(root, long=True):
    for arm, by_lr in STAGE1.items():
        for lr, loss in by_lr.items():
            _plant(root, arm, lr, 0, loss if lr != BEST[arm] else _stage_two_loss(arm, 0))
    for arm in ARMS:
        for seed in (0, 1, 2):
            if seed or arm not in STAGE1:  # seed 0 of a stage-1 arm is its stage-1 run at the best lr
                _plant(root, arm, BEST[arm], seed, _stage_two_loss(arm, seed))
    if long:
        for arm in G.long_arms(RECORDED):
            for seed in (0, 1, 2):
                _plant(root, arm, BEST[arm], seed, _stage_two_loss(arm, seed) - 0.2, T=256,
                       step_s=4 * STEP_S[arm], peak=2 * PEAK[arm])


def test_the_recorded_extensions_add_their_runs():
    """The recorded EXTRA_LEARNING_RATES (stage 1's edge extensions) each add one run at seed 0."""
    extra = dict(RECORDED.extra_learning_rates)
    names = {name for name, _ in _configs(extra=extra)}
    for arm, lrs in extra.items():
        a = G.BY_NAME[arm]
        for lr in lrs:
            assert f"shakespeare-T64-{a.mode}-{a.method}-rs-{arm}-lr{lr:g}-s0" in names
    assert len(names) == len(ARMS) * len(G.LEARNING_RATES) + sum(map(len, extra.values()))


def test_stage_one_report_applies_the_rule(tmp_path):
    d = decided(extra_learning_rates={}, best_lr={})
    for arm, by_lr in STAGE1.items():
        for lr, loss in by_lr.items():
            _plant(tmp_path, arm, lr, 0, loss)
    _plant(tmp_path, "softmax", 1e-3, 1, 1.5, step_s=1.0)  # a stage-2 seed: in neither column of stage 1
    text = write_report(tmp_path, tmp_path / "report", d).read_text()
    table = table_after(text, "## Stage 1: each arm's learning rate")
    assert len(table) == len(ARMS) - 1  # table_after keys rows by their first cell: one row per arm here
    lines = text.splitlines()
    row = {(r.split("|")[1].strip(), r.split("|")[2].strip()): r for r in lines if r.startswith("| ")}
    assert "**0.001**" in row[("softmax", "**0.001**")] and ("softmax", "0.003") in row
    assert ("h", "**0.003**") in row and ("window16", "**0.001**") in row
    assert row[("meanfield8", "**0.001**")].split("|")[3].strip() == "1.8600 (n=1)"
    assert row[("softmax", "**0.001**")].split("|")[4].strip() == "80"  # ms per step
    assert "Not decided yet (runs missing): banded8." in text
    assert "h: best at 0.003, the grid's edge, so the rule adds lr 0.01" in text
    assert "Chosen: softmax 0.001, window16 0.001, meanfield8 0.001 (BEST_LR in studies/realsize/decisions.json " \
           "differs for softmax, window16, meanfield8: update it)." in text
    assert "## Stage 2" not in text  # BEST_LR is empty
    diverged = replace(d, diverged={"banded8": (3e-4, 1e-3, 3e-3)})
    text = write_report(tmp_path, tmp_path / "report", diverged).read_text()
    assert "banded8: every lr diverged." in text and "| banded8 | 0.001 | diverged |" in text


def test_stage_two_and_three_report_pair_each_arm(tmp_path):
    import statistics

    d = decided(best_lr=BEST, extra_learning_rates={"h": (1e-2,)})
    _plant_all(tmp_path)
    _plant(tmp_path, "h", 1e-2, 0, 1.95)
    path = tmp_path / "runs" / "shakespeare-T64-h+J-meanfield-rs-meanfield8-lr0.001-s1.json"
    result = json.loads(path.read_text())
    result["convergence"] = {"unconverged_steps": 120, "steps": 2000, "unconverged_evaluations": 2,
                             "evaluations": 9, "first": "x", "last": "y"}
    path.write_text(json.dumps(result))
    text = write_report(tmp_path, tmp_path / "report", d).read_text()
    assert ("- meanfield8: the marginals did not converge in 120 training steps and 2 evaluations, summed over 1 "
            "of its 3 runs") in text
    assert text.count("Convergence of the iterative solver") == 1  # stage 3 has no mean-field arm
    table = table_after(text, "## Stage 2: T = 64, batch 12, 2000 steps")
    assert list(table) == ARMS
    for arm in ARMS:
        values = [_stage_two_loss(arm, s) for s in (0, 1, 2)]
        assert table[arm]["validation loss"] == (f"{statistics.mean(values):.4f} ± "
                                                 f"{statistics.stdev(values):.4f} (n=3)")
        assert table[arm]["ms per step"] == f"{1000 * STEP_S[arm]:.0f}"
        assert table[arm]["x softmax"] == f"{STEP_S[arm] / STEP_S['softmax']:.1f}"
        assert table[arm]["peak RSS (MiB)"] == f"{PEAK[arm]:.0f}"
        assert table[arm]["steps' memory (MiB)"] == f"{PEAK[arm] - 380:.0f}"
    # window16 - softmax: 25 mnats lower loss at every seed (no spread); vs h: 30 mnats
    assert table["window16"]["vs softmax, Δ mnats"].startswith("+25.00 [+25.00, +25.00]")
    assert table["window16"]["what J adds: vs h, Δ mnats"].startswith("+30.00 [+30.00, +30.00]")
    assert table["banded8"]["what J adds: vs h, Δ mnats"].startswith("-20.00 [-20.00, -20.00]")
    assert table["h"]["what J adds: vs h, Δ mnats"] == "" and table["softmax"]["vs softmax, Δ mnats"] == ""
    assert "Softmax: 1.8800 against nanoGPT's published ~1.88 for this configuration (" in text
    assert "- window16 against h: **J helps**: +30.00 [+30.00, +30.00]* millinats" in text
    assert "- meanfield8 against h: **no measurable difference** (the interval contains 0)" in text
    assert "- banded8 against h: **J hurts**" in text
    long = table_after(text, "## Stage 3: T = 256, batch 12, 2000 steps, 512 validation windows")
    assert list(long) == ["softmax", "h", d.fastest]
    assert long["h"]["ms per step"] == f"{4000 * STEP_S['h']:.0f}" and long["h"]["peak RSS (MiB)"] == "960"
    assert long[d.fastest]["what J adds: vs h, Δ mnats"].startswith("+30.00")
    # stage 1's extra lr for h is in its table; the report is this study's
    assert "| h | 0.01 | 1.9500 (n=1) |" in text
    assert text.count("What the couplings add") == 2
    for T in (64, 256):
        png = tmp_path / "report" / f"loss_T{T}.png"
        assert png.stat().st_size > 10_000 and f"]({png.name})" in text


def test_a_resumed_run_counts_its_whole_wall_time_over_all_its_steps(tmp_path):
    """wall_time_s sums every segment of a resumed run; steps_run counts only the last one."""
    _plant(tmp_path, "h", 1e-3, 0, 1.9, step_s=0.05)
    path = next((tmp_path / "runs").glob("*.json"))
    result = json.loads(path.read_text())
    result["steps_run"] = 500  # resumed at step 1500
    path.write_text(json.dumps(result))
    found = R.per_seed(Results(load_runs(tmp_path)), "h", 1e-3)
    assert found["step_s"] == {0: pytest.approx(0.05)} and found["peak_mib"] == {0: PEAK["h"]}
    text = write_report(tmp_path, tmp_path / "report").read_text()
    assert "- 1 run resumed from a checkpoint; their wall time sums every segment" in text


def test_other_studies_runs_are_not_claimed(tmp_path):
    _plant(tmp_path, "softmax", 1e-3, 0, 1.9)
    res = Results(load_runs(tmp_path))
    assert realsize.owns(res) and study_of(res) is realsize
    write_run(tmp_path, "shakespeare", 64, "softmax", 0, variant="nanogpt", val=shakespeare_val(6.5))
    assert not realsize.owns(Results(load_runs(tmp_path)))


def test_step_times_are_measured_side_by_side():
    tiny = dict(T=8, batch_size=4, d_model=8, d_ff=8, warmup_steps=0, steps=5, eval_windows=4, fused_optimizer=False)
    configs = {"softmax": TrainConfig.build(mode="softmax", **tiny), "h": TrainConfig.build(mode="h", **tiny)}
    from boltzmann_attention.experiments.benchmarks.training import time_steps, timing_table

    times = time_steps(configs, steps=2, rounds=3, warmup=1)
    assert list(times) == ["softmax", "h"] and all(len(v) == 3 and min(v) > 0 for v in times.values())
    lines = timing_table({"softmax": [0.1, 0.2, 0.3], "h": [0.4, 0.5, 0.9]}).splitlines()
    assert lines[0].split() == ["softmax", "200.0", "(100.0-300.0)", "1.0"]
    assert lines[1].split() == ["h", "500.0", "(400.0-900.0)", "2.5"]


def test_the_arms_configs_are_nanogpts_with_their_couplings():
    cfg = G.config(G.BY_NAME["banded8"], T=256, batch_size=3)
    assert (cfg.T, cfg.batch_size, cfg.steps, cfg.eval_windows, cfg.method, cfg.coupling_range) == (
        256, 3, G.LONG_STEPS, 512, "banded", 8)
    cfg.validate()
    assert G.config(G.BY_NAME["softmax"]).lr == NANOGPT["lr"] == G.NANOGPT_LR
