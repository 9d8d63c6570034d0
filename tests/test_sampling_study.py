"""The sampling study's dqa-boltzmann profile: its grids, and its report on planted results."""

import json
import math

import numpy as np
import pytest
from scipy import stats
from test_report import assert_prose_is_complete, shakespeare_val, table_after, write_run

from boltzmann_attention.experiments.results import Results, load_runs, unpack_archive, write_archive
from boltzmann_attention.experiments.studies import profile, sampling, study_of, write_report
from boltzmann_attention.experiments.studies.baselines import grids as G

GRADIENTS = ("ste", "covariance")


def test_boltzmann_profile_follows_the_design():
    """Both tasks, T = 4, 6, 8, 3 seeds; calibrated DQA with each gradient against exact-trained softmax and h+J,
    all under the strong baselines' recipe at the same length."""
    runs = [(name, cfg) for grid in profile("dqa-boltzmann") for name, cfg in grid.runs()]
    for _, cfg in runs:
        cfg.validate()
    assert len({name for name, _ in runs}) == len(runs) == 72
    assert all(c.init == "gpt2" and c.lr == 3e-3 and c.steps == sampling.BOLTZMANN_STEPS == 4000
               and c.fused_optimizer is False and c.eval_interval == 1000 for _, c in runs)
    exact = {(c.task, c.T, c.mode, c.seed) for _, c in runs if c.method == "exact"}
    assert exact == {(task, T, mode, s) for task in ("shakespeare", "brackets") for T in (4, 6, 8)
                     for mode in ("softmax", "h+J") for s in (0, 1, 2)}
    dqa = [(name, c) for name, c in runs if c.method != "exact"]
    assert len(dqa) == 36 and all(c.method == "dqa" and c.mode == "h+J" for _, c in dqa)
    for gradient in GRADIENTS:
        mine = [c for name, c in dqa if name.endswith(f"-sampling-boltzmann-{gradient}-s{c.seed}")]
        assert {(c.task, c.T, c.seed) for c in mine} == {(task, T, s) for task in ("shakespeare", "brackets")
                                                         for T in (4, 6, 8) for s in (0, 1, 2)}
        assert all(c.method_options == {"num_samples": 100, "gradient": gradient, "target_beta": 1.0} for c in mine)
    # the same recipe for the DQA runs and their references: the configs differ in the method only
    by_point = {(c.task, c.T, c.mode, c.seed): c.flat() for _, c in runs if c.method == "exact"}
    for _, c in dqa:
        d = c.flat()
        assert {k for k in d if d[k] != by_point[(c.task, c.T, c.mode, c.seed)][k]} == {"method", "method_options"}
    # the exact Shakespeare runs at T = 8 have the config of the baselines study's stage-1 gpt2 runs
    stage1 = {(c.mode, c.seed): c.flat() for grid in profile("baselines") for name, c in grid.runs()
              if grid.variant == G.variant("gpt2") and c.T == 8}
    for point, d in by_point.items():
        if point[:2] == ("shakespeare", 8):
            assert d == stage1[(point[2], point[3])]
    assert [c.method for _, c in runs[:36]] == ["exact"] * 36  # the cheap references first
    assert [c.T for _, c in dqa] == sorted(c.T for _, c in dqa)


# --------------------------------------------------------------------------------------- planted results

REF = {0: 5.00, 1: 5.02, 2: 5.04}  # exact-trained h+J perplexity per seed (both recipes)
# perplexity of the DQA-trained model as (1 + x / 100) * REF per seed: (through DQA, with exact marginals)
NEAR_ADIABATIC = ((3.9, 4.0, 4.2), (6.0, 6.2, 6.1))
BOLTZMANN = {"ste": ((0.3, -0.2, 0.1), (0.2, -0.1, 0.0)), "covariance": ((1.0, 1.1, 0.9), (0.1, 0.3, -0.2))}
EARLIER = {"init": "torch", "fused_optimizer": False}
NEW = sampling.boltzmann_recipe("h+J")


def _dqa_metrics(through, exact, seed):
    return shakespeare_val(REF[seed] * (1 + through[seed] / 100)), shakespeare_val(REF[seed] * (1 + exact[seed] / 100))


def _plant_earlier(root):
    """The sampling study's runs: DQA at energy scale 1 (near-adiabatic), PyTorch's init."""
    for seed in REF:
        write_run(root, "shakespeare", 4, "softmax", seed, variant="sampling", val=shakespeare_val(5.2), **EARLIER)
        write_run(root, "shakespeare", 4, "h+J", seed, variant="sampling", val=shakespeare_val(REF[seed]), **EARLIER)
        val, val_exact = _dqa_metrics(*NEAR_ADIABATIC, seed)
        write_run(root, "shakespeare", 4, "h+J", seed, variant="sampling", method="dqa", val=val,
                  extra_metrics={"val_exact": val_exact}, method_options=sampling.DQA_OPTIONS, **EARLIER)
        acc = {"loss": 0.1, "accuracy": 1.0}
        for mode in ("softmax", "h+J"):
            write_run(root, "brackets", 4, mode, seed, variant="sampling", val=acc, test=acc, **EARLIER)
        dqa_acc = {"loss": 0.2, "accuracy": (0.99, 0.96, 0.99)[seed]}
        write_run(root, "brackets", 4, "h+J", seed, variant="sampling", method="dqa", val=dqa_acc, test=dqa_acc,
                  extra_metrics={"test_exact": {"loss": 0.5, "accuracy": 0.9}}, method_options=sampling.DQA_OPTIONS,
                  **EARLIER)


def _plant_new(root):
    for seed in REF:
        write_run(root, "shakespeare", 4, "softmax", seed, variant=sampling.BOLTZMANN, val=shakespeare_val(5.1),
                  **sampling.boltzmann_recipe("softmax"))
        write_run(root, "shakespeare", 4, "h+J", seed, variant=sampling.BOLTZMANN, val=shakespeare_val(REF[seed]),
                  **NEW)
        for gradient, (through, exact) in BOLTZMANN.items():
            val, val_exact = _dqa_metrics(through, exact, seed)
            write_run(root, "shakespeare", 4, "h+J", seed, variant=f"{sampling.BOLTZMANN}-{gradient}", method="dqa",
                      val=val, extra_metrics={"val_exact": val_exact},
                      **{**NEW, "method_options": {**sampling.BOLTZMANN_DQA, "gradient": gradient}})


def _interval(percent):
    """mean [low, high] of per-seed values, the 95% Student t interval (the table's format, marks aside)."""
    d = np.asarray(percent, dtype=float)
    half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return f"{d.mean():+.2f} [{d.mean() - half:+.2f}, {d.mean() + half:+.2f}]"


def _relative(a, b):  # per seed (a - b) / a * 100: positive when b has the lower perplexity
    return [(a[s] - b[s]) / a[s] * 100 for s in sorted(a)]


@pytest.fixture(scope="module")
def report_text(tmp_path_factory):
    """The earlier runs committed as an archive, unpacked into the folder the new profile sweeps into."""
    root = tmp_path_factory.mktemp("sampling")
    _plant_earlier(root / "earlier")
    write_archive(load_runs(root / "earlier"), root / "earlier")
    written = unpack_archive(root / "earlier" / "runs.jsonl.gz", root / "results")
    assert len(written) == len(load_runs(root / "earlier"))
    assert unpack_archive(root / "earlier" / "runs.jsonl.gz", root / "results") == []  # already there
    _plant_new(root / "results")
    assert study_of(Results(load_runs(root / "results"))) is sampling
    return write_report(root / "results", root / "report").read_text()


def test_regime_table_pairs_each_setting_with_its_exact_reference(report_text):
    lines = [line for line in report_text.splitlines() if line.startswith("| shakespeare | 4 | h+J |")]
    text = "\n".join(lines)
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 13:  # the regime table
            rows[(cells[3], cells[4], cells[5])] = cells
    near = rows[("near-adiabatic (energy scale 1)", "ste", "init torch, lr 0.003, 4000 steps")]
    ste = rows[("Boltzmann (target_beta 1)", "ste", "init gpt2, lr 0.003, 4000 steps")]
    cov = rows[("Boltzmann (target_beta 1)", "covariance", "init gpt2, lr 0.003, 4000 steps")]
    assert len(rows) == 3, text

    def ppl(x):
        return {s: REF[s] * (1 + x[s] / 100) for s in REF}

    for row, (through, exact) in ((near, NEAR_ADIABATIC), (ste, BOLTZMANN["ste"]), (cov, BOLTZMANN["covariance"])):
        assert row[9].startswith(_interval(_relative(REF, ppl(through)))), row
        assert row[10].startswith(_interval(_relative(REF, ppl(exact)))), row
        assert row[11].startswith(_interval(_relative(ppl(exact), ppl(through)))), row
    # significance marks: the near-adiabatic gap (about -4%, spread 0.15) is significant, the level one is not
    p = stats.ttest_rel(list(REF.values()), list(ppl(NEAR_ADIABATIC[0]).values())).pvalue
    assert p < 0.05 and near[9].endswith("*")
    assert not ste[9].endswith("*")
    assert near[6] == "5.020 ± 0.020 (n=3)"


def test_claims_per_setting(report_text):
    claims = table_after(report_text, "### Claim by claim")
    through = claims[sampling.REGIME_CLAIMS[0]]
    near = "near-adiabatic (energy scale 1), ste, init torch, lr 0.003, 4000 steps"
    ste = "Boltzmann (target_beta 1), ste, init gpt2, lr 0.003, 4000 steps"
    cov = "Boltzmann (target_beta 1), covariance, init gpt2, lr 0.003, 4000 steps"
    # near-adiabatic: Shakespeare about 4% behind (significant); brackets 2 points behind, p = 0.18 (level)
    assert through[near].startswith("partly agrees: 1 of 2 comparisons agree")
    assert through[near].endswith("; not level: shakespeare T = 4 (-4.03 %)")  # the mean of -(3.9, 4.0, 4.2)
    assert through[ste].startswith("agrees: 1 of 1 comparisons agree") and "not level" not in through[ste]
    assert through[cov].startswith("does not agree: 0 of 1")
    assert through[cov].endswith("; not level: shakespeare T = 4 (-1.00 %)")
    exact = claims[sampling.REGIME_CLAIMS[1]]
    assert exact[cov].startswith("agrees") and exact[near].startswith("does not agree: 0 of 2")


def test_gradients_compared_on_the_same_grid_point(report_text):
    table = table_after(report_text, "### Straight-through against covariance gradients")
    row = table["shakespeare"]

    def ppl(x):
        return {s: REF[s] * (1 + x[s] / 100) for s in REF}

    expected = _relative(ppl(BOLTZMANN["covariance"][0]), ppl(BOLTZMANN["ste"][0]))
    assert row["DQA regime"] == "Boltzmann (target_beta 1)"
    assert row["through DQA"].startswith(_interval(expected))
    assert row["with exact marginals"].startswith(
        _interval(_relative(ppl(BOLTZMANN["covariance"][1]), ppl(BOLTZMANN["ste"][1]))))


def test_report_keeps_one_variant_per_regime(report_text):
    """The gradients' variants are read as methods of one variant beside their references; the earlier
    sampler table keeps its rows."""
    assert "(variant `sampling-boltzmann`)" in report_text
    assert "sampling-boltzmann-ste`)" not in report_text and "sampling-boltzmann-covariance`)" not in report_text
    assert "h+J [dqa-ste] PPL" in report_text and "h+J [dqa-covariance] PPL" in report_text
    samplers = [line for line in report_text.split("## Trained through samplers")[1].split("###")[0].splitlines()
                if line.startswith("| shakespeare | 4 | h+J |")]
    assert {line.split("|")[4].strip() for line in samplers} == {"dqa", "dqa-ste", "dqa-covariance"}
    assert_prose_is_complete(report_text)


def test_dqa_regime_labels():
    assert sampling.dqa_regime({"gradient": "ste", "num_samples": 100}) == "near-adiabatic (energy scale 1)"
    assert sampling.dqa_regime({"target_beta": 1.0}) == "Boltzmann (target_beta 1)"
    assert sampling.dqa_regime({"energy_scale": 0.0345}) == "energy scale 0.0345"
    assert sampling.dqa_regime({"trotter_steps": 800}) == "near-adiabatic (energy scale 1), trotter_steps 800"
    assert sampling.dqa_regime({"trotter_steps": 200}) == "near-adiabatic (energy scale 1)"  # the default


def test_unpack_archive_never_overwrites(tmp_path):
    write_run(tmp_path / "a", "shakespeare", 4, "softmax", 0, variant="sampling", val=shakespeare_val(5.0))
    write_archive(load_runs(tmp_path / "a"), tmp_path / "a")
    path = write_run(tmp_path / "b", "shakespeare", 4, "softmax", 0, variant="sampling", val=shakespeare_val(6.0))
    with pytest.raises(ValueError, match="already holds another result"):
        unpack_archive(tmp_path / "a" / "runs.jsonl.gz", tmp_path / "b")
    assert json.loads(path.read_text())["metrics"]["val"]["ppl"] == 6.0
