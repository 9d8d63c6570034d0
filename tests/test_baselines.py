"""The strong-baselines study: its grids and its report on planted results."""

import math
from dataclasses import replace

import pytest
from conftest import archives_missing
from test_report import shakespeare_val, write_run

from boltzmann_attention.experiments import studies
from boltzmann_attention.experiments.recipes import NANOGPT
from boltzmann_attention.experiments.results import Results, load_runs
from boltzmann_attention.experiments.studies import baselines, study_of, write_report
from boltzmann_attention.experiments.studies.baselines import grids as G

FB = "learn-half-log-T"  # the default field bias
RECORDED = studies.load_decisions(baselines)
D = replace(RECORDED, extra_learning_rates={})  # the planted runs have no lr beyond the grid


def test_grids_follow_the_study_design():
    d = replace(RECORDED, extra_learning_rates={"J": (3e-2,)})
    runs = [cfg for grid in G.baselines_grids(FB, d) for _, cfg in grid.runs()]
    for cfg in runs:
        cfg.validate()
    init = [c for c in runs if c.lr == 3e-3 and c.T in (8, 12) and c.steps == 4000]
    assert len(init) == 2 * 2 * 4 * 5 and {c.init for c in init} == {"torch", "gpt2"}
    lr = [c for c in runs if c.lr in (1e-3, 1e-2) and c.T in (8, 12) and c.steps == 4000]
    assert len(lr) == 2 * 2 * 4 * 3 and {c.init for c in lr} == {d.chosen_init}
    extra = [c for c in runs if c.lr == 3e-2]
    assert {(c.mode, c.T) for c in extra} == {("J", 8), ("J", 12)} and len(extra) == 2 * 3
    nano = [c for c in runs if c.T == 64]
    assert len(nano) == 3 and all(c.mode == "softmax" and c.n_layers == 4 and c.n_heads == 4 and c.d_model == 128
                                  and c.batch_size == 12 and c.steps == 2000 and c.lr == 1e-3 and c.beta2 == 0.99
                                  and c.init == "gpt2" for c in nano)
    best = {"softmax": 1e-3, "h": 3e-3, "J": 1e-2, "h+J": 3e-2}
    d = replace(d, best_lr=best)
    runs = [c for grid in G.baselines_grids(FB, d) for _, c in grid.runs()]
    assert all(c.fused_optimizer is False for c in runs)
    ladder = [c for c in runs if c.steps == 64000]
    assert {(c.mode, c.lr, c.T) for c in ladder} == {(m, lr, 12) for m, lr in best.items()} and len(ladder) == 12
    long = [c for c in runs if c.steps > 4000]
    assert all(c.eval_interval == c.steps // 16 and c.lr == best[c.mode] for c in long)  # complete schedules
    grid = {(c.T, c.mode, c.seed) for c in long if c.steps == G.GRID_STEPS}
    assert grid == ({(T, m, s) for T in range(4, 15, 2) for m in best for s in range(5)}
                    | {(T, m, s) for T in (16, 20, 24) for m in ("softmax", "h", "h+J") for s in range(3)})
    assert [c.T for c in long][-9:] == [24] * 9  # stage 7 runs last
    names = [name for grid in G.baselines_grids(FB, d) for name, c in grid.runs()
             if c.steps == G.GRID_STEPS]
    stage6 = 3 * 3 * 5 + 3 * 2 * 5  # three other field biases x (h, h+J, J); three J settings x (h+J, J)
    assert len(names) == len(set(names)) + 4 * 3  # stage 5 at T = 12 reuses stage 3's runs
    fair = [c for c in long if c.T == 12 and c.steps == G.GRID_STEPS and c.seed == 0]
    assert len(fair) == 2 * 4 + stage6 // 5  # stage 3 and stage 5 list the same four runs, then stage 6
    assert {(c.learn_field_bias, c.field_bias_init) for c in fair if c.mode == "h"} == \
        {(True, None), (False, 0.0), (True, 0.0), (False, -math.log(12))}
    assert {(c.coupling_lr_multiplier, c.coupling_init_std) for c in fair if c.mode == "J"} == \
        {(1.0, 0.0), (0.3, 0.0), (3.0, 0.0), (1.0, 0.1)}


def _plant(root):
    """softmax 1% better with gpt2 at both T; the other modes level; lr 1e-2 best for h only."""
    for T in (8, 12):
        for mode in G.MODES:
            for seed in range(5):
                base = 7.0 + 0.01 * seed + (0.2 if mode == "J" else 0.0)
                for init in ("torch", "gpt2"):
                    ppl = base * (0.99 if init == "gpt2" and mode == "softmax" else 1.0)
                    write_run(root, "shakespeare", T, mode, seed, variant=G.variant(init),
                              val=shakespeare_val(ppl), init=init)
            for lr in (1e-3, 1e-2):
                for seed in range(3):
                    ppl = 7.0 + 0.01 * seed + (-0.1 if (mode == "h" and lr == 1e-2) else 0.05)
                    write_run(root, "shakespeare", T, mode, seed, variant=G.variant("gpt2", lr),
                              val=shakespeare_val(ppl), init="gpt2", lr=lr)
    for seed in range(3):
        write_run(root, "shakespeare", 64, "softmax", seed, variant=G.NANOGPT_VARIANT,
                  val={"loss": 1.87 + 0.01 * seed, "ppl": math.exp(1.87), "loss_last": 1.8, "ppl_last": 6.0},
                  **NANOGPT)


def test_report_on_planted_runs(tmp_path):
    _plant(tmp_path)
    assert study_of(Results(load_runs(tmp_path))) is baselines
    with archives_missing("full"):
        text = write_report(tmp_path, tmp_path / "rep", D).read_text()
    assert "1.8800 ± 0.0100 (n=3) against nanoGPT's published ~1.88 (+0.0%)" in text
    assert "so **gpt2**." in text
    row = next(line for line in text.splitlines() if line.startswith("| 12 | softmax |"))
    assert "+1.00 [+1.00, +1.00]" in row  # gpt2 vs torch, paired: exactly the planted 1%
    assert "| h | **0.01** |" in text and "| softmax | **0.003** |" in text
    assert "Best: softmax 0.003, h 0.01, J 0.001, h+J 0.003" in text  # J: 7.2 at 3e-3, 7.05 at 1e-3


@pytest.mark.parametrize("variant", ["base", "fair"])
def test_other_studies_runs_are_not_claimed(tmp_path, variant):
    write_run(tmp_path, "shakespeare", 8, "softmax", 0, variant=variant, val=shakespeare_val(7.0))
    assert study_of(Results(load_runs(tmp_path))) is not baselines


def _plant_ladder(root, gap_64000):
    """Stage 3: softmax at 7.0 - steps/1e5; h 1% worse at 16000 and ``gap_64000`` % worse at 64000."""
    for steps, gap in ((16000, 1.0), (64000, gap_64000)):
        for mode, lr in D.best_lr.items():
            for seed in range(3):
                ppl = (7.0 - steps / 1e5 + 0.01 * seed) * (1 + {"h": gap, "J": 3.0, "h+J": 0.5}.get(mode, 0) / 100)
                ppl += 0.001 * seed * (mode == "h")  # a spread, so that the intervals have a width
                write_run(root, "shakespeare", 12, mode, seed, variant=G.variant("gpt2", lr, steps),
                          val=shakespeare_val(ppl), init="gpt2", lr=lr, steps=steps)


@pytest.mark.parametrize("gap_64000, settled", [(1.0, True), (-1.0, False)])
def test_training_length_rule(tmp_path, gap_64000, settled):
    _plant_ladder(tmp_path, gap_64000)
    with archives_missing("full"):
        text = write_report(tmp_path, tmp_path / "rep", D).read_text()
    assert "16000 steps: softmax < h+J < h < J" in text
    assert ("**has settled**" in text) is settled and ("**has not settled**" in text) is not settled
    if not settled:
        assert "64000 steps: h < softmax < h+J < J" in text and "The orderings are different" in text


def test_grid_section_reads_the_paper_tables(tmp_path):
    """Stage 5's runs (each mode's variant names its own lr) are read as one grid, with the claims of the
    earlier recipe beside them when report/full's archive sits next to the report."""
    for T in (4, 6, 8, 10):
        for mode, lr in D.best_lr.items():
            for seed in range(3):
                ppl = 7.0 - 0.05 * T + 0.01 * seed - (0.01 * T if mode == "h+J" else 0.0)
                J = [[[0.1 * (abs(j - k) == 1) for k in range(T)] for j in range(T)]]
                write_run(tmp_path, "shakespeare", T, mode, seed,
                          variant=G.variant("gpt2", lr, G.GRID_STEPS), val=shakespeare_val(ppl),
                          couplings=J if mode in ("J", "h+J") else None, init="gpt2", lr=lr,
                          steps=G.GRID_STEPS)
    earlier = tmp_path / "report" / "full"
    for seed in range(3):
        write_run(earlier, "shakespeare", 8, "softmax", seed, val=shakespeare_val(7.0))
        write_run(earlier, "shakespeare", 8, "h+J", seed, val=shakespeare_val(7.1 + 0.01 * seed))
    from boltzmann_attention.experiments.results import write_archive

    write_archive(load_runs(earlier), earlier)
    text = write_report(tmp_path, tmp_path / "report" / "baselines", D).read_text()
    assert "## 5. The paper's grid under the strong recipe" in text
    row = next(line for line in text.splitlines() if line.startswith("| 10 | 6.510 ± 0.010 (n=3)"))
    assert "+1.54 ± 0.00" in row  # h+J: 0.1 lower than softmax
    assert "#### shakespeare, J (variant `base`)" in text
    then_now = [line for line in text.splitlines() if line.startswith("| h+J ahead of softmax")][-1].split("|")
    assert then_now[2].strip().startswith("does not agree") and then_now[3].strip().startswith("partly agrees")


def test_fair_section_pairs_each_setting(tmp_path):
    """Stage 6: the J settings compare h+J with stage 5's h; a bias setting with its own h; every setting is
    also paired with the same mode at stage 5's default; both metrics get their tables."""
    steps = G.GRID_STEPS
    for seed in range(3):
        for mode, lr in D.best_lr.items():
            write_run(tmp_path, "shakespeare", 12, mode, seed, variant=G.variant("gpt2", lr, steps),
                      val=shakespeare_val(7.0 + 0.01 * seed), init="gpt2", lr=lr, steps=steps)
        for mode in ("h", "h+J"):
            write_run(tmp_path, "shakespeare", 12, mode, seed,
                      variant=G.variant("gpt2", D.best_lr[mode], steps) + "-bias-fixed-0",
                      val=shakespeare_val((7.7 if mode == "h" else 7.0) + 0.01 * seed), init="gpt2",
                      lr=D.best_lr[mode], steps=steps, learn_field_bias=False, field_bias_init=0.0)
        last_as_default = shakespeare_val(7.0 + 0.01 * seed)["ppl_last"]  # jlr3: better over all positions only
        write_run(tmp_path, "shakespeare", 12, "h+J", seed,
                  variant=G.variant("gpt2", D.best_lr["h+J"], steps) + "-jlr3",
                  val={**shakespeare_val(6.93 + 0.01 * seed), "ppl_last": last_as_default}, init="gpt2",
                  steps=steps, coupling_lr_multiplier=3.0)
    with archives_missing("full"):
        text = write_report(tmp_path, tmp_path / "rep", D).read_text()
    section = text[text.index("## 6. The fair study"):]
    tables = [[line.split("|") for line in block.splitlines() if line.startswith(("| bias-", "| jlr"))]
              for block in section.split("\n\n") if "| setting |" in block]
    assert len(tables) == 4  # per metric: against softmax and h, against the default setting
    (soft_all, default_all, soft_last, default_last) = ({r[1].strip(): r for r in t} for t in tables)
    assert soft_all["bias-fixed-0"][-2].strip().startswith("+9.0")   # h+J 7.0 against its own h at 7.7
    assert soft_all["jlr3"][-2].strip().startswith("+1.0")           # 6.93 against stage 5's h at 7.0
    assert soft_all["bias-learn-half-log-T (stage 5)"][-2].strip().startswith("+0.00")
    assert default_all["bias-fixed-0"][2].strip().startswith("-9.99")  # h 7.7 against the default's 7.0
    assert default_all["jlr3"][3].strip().startswith("+1.0")           # h+J 6.93 against 7.0
    assert default_all["jlr3"][2].strip() == ""                        # h has no jlr3 run
    assert soft_last["jlr3"][-2].strip().startswith("+0.00")           # the last position read from ppl_last
    assert default_last["jlr3"][3].strip().startswith("+0.00")
    assert "stage 5" not in "".join(default_all)                     # the default is not paired with itself
