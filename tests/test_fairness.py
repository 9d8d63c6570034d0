"""The fair-baselines study: its grid, its statistics (against scipy) and its report on planted results."""

import math

import numpy as np
import pytest
import torch
from scipy import stats
from test_report import table_after, write_run

from boltzmann_attention.experiments import cli
from boltzmann_attention.experiments import sweep as experiments
from boltzmann_attention.experiments.recipes import FIELD_BIASES, field_bias
from boltzmann_attention.experiments.results import Results, load_runs
from boltzmann_attention.experiments.stats import holm, paired, points, relative
from boltzmann_attention.experiments.studies import fair, profile, study_of, write_report
from boltzmann_attention.experiments.tables import fmt_interval

SEEDS = (0, 1, 2, 3, 4)
OFFSETS = (-0.2, -0.1, 0.0, 0.1, 0.2)  # per-seed deviation of a planted improvement (percent)


# ----------------------------------------------------------------------------------------------------- grid

def test_field_bias_config_values():
    assert field_bias("fixed-0").config(12) == {"field_bias_init": 0.0, "learn_field_bias": False}
    assert field_bias("learn-0").config(12) == {"field_bias_init": 0.0, "learn_field_bias": True}
    assert field_bias("learn-half-log-T").config(12)["field_bias_init"] == pytest.approx(-0.5 * math.log(12))
    assert field_bias("fixed-log-T").config(8) == {"field_bias_init": pytest.approx(-math.log(8)),
                                                   "learn_field_bias": False}
    with pytest.raises(ValueError, match="unknown field bias 'learn-1'.*fixed-0"):
        field_bias("learn-1")


def test_the_default_field_bias_is_what_the_layer_does_without_one():
    """The variant the fair study chose (its decisions.json) is TrainConfig's and the layer's default: a grid at
    the default leaves the field-bias fields alone, so the two must agree."""
    from boltzmann_attention import BoltzmannAttention
    from boltzmann_attention.experiments.recipes import DEFAULT_FIELD_BIAS

    chosen = field_bias(DEFAULT_FIELD_BIAS).config(12)
    layer = BoltzmannAttention(16, 2, max_len=12, mode="h", causal=True)
    assert torch.allclose(layer.field_bias, torch.full_like(layer.field_bias, chosen["field_bias_init"]))
    assert layer.field_bias.requires_grad == chosen["learn_field_bias"]


def test_fair_profile_pairs_seeds_and_covers_every_variant():
    runs = [(name, cfg) for g in profile("fair", "learn-0") for name, cfg in g.runs()]
    names = [n for n, _ in runs]
    assert len(names) == len(set(names))
    for cfg in (c for _, c in runs):
        cfg.validate()
    by_point = {}
    for name, cfg in runs:
        by_point.setdefault(name.rsplit("-s", 1)[0], set()).add(cfg.seed)
    assert all(seeds == set(SEEDS) for seeds in by_point.values())  # every mode sees the same seeds
    for task in ("shakespeare", "brackets"):
        for bias in FIELD_BIASES:
            for mode in ("h", "h+J", "J"):
                assert f"{task}-T12-{mode}-exact-bias-{bias}" in by_point
    long = [c for n, c in runs if "-long" in n]
    assert {c.mode for c in long} == {"softmax", "h", "h+J"} and all(c.steps == 16000 for c in long)
    # convergence and J sensitivity use the requested field bias
    for name, cfg in runs:
        if "long-bias" in name or "jlr" in name or "jinit" in name:
            assert (cfg.field_bias_init, cfg.learn_field_bias) == (0.0, True)
    assert {c.coupling_lr_multiplier for n, c in runs if "jlr" in n} == {0.3, 3.0}


def test_paper_profiles_take_the_field_bias_flag():
    default = [c for g in profile("quick") for _, c in g.runs()]
    assert all(c.field_bias_init is None and c.learn_field_bias for c in default)
    faithful = [c for g in profile("quick", "fixed-0") for _, c in g.runs()]
    assert all(c.field_bias_init == 0.0 and not c.learn_field_bias for c in faithful if c.mode != "softmax")
    assert all(c.field_bias_init is None and c.learn_field_bias for c in faithful if c.mode == "softmax")  # none
    with pytest.raises(ValueError, match="unknown field bias"):
        profile("full", "none")


def test_reproduce_writes_a_non_default_bias_apart(monkeypatch, tmp_path):
    seen = {}

    def fake_sweep(grids, out, jobs, **executor):
        seen["out"], seen["grids"] = out, grids
        return []

    monkeypatch.setattr(experiments, "sweep", fake_sweep)
    monkeypatch.setattr(cli, "_write_report", lambda results, out: out)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["reproduce", "--profile", "quick", "--field-bias", "fixed-0"]) == 0
    assert str(seen["out"]) == "results/quick-bias-fixed-0"
    assert all(g.field_bias == FIELD_BIASES["fixed-0"] for g in seen["grids"])


# ----------------------------------------------------------------------------------------------- statistics

def test_paired_interval_and_p_value_match_scipy():
    rng = np.random.default_rng(0)
    a = dict(enumerate(rng.normal(7.0, 0.1, 6)))
    b = {s: v - 0.05 + rng.normal(0, 0.03) for s, v in a.items()}
    b[99] = 1.0  # unpaired seed: ignored
    c = paired(a, b, lambda x, y: x - y)
    x, y = np.array([a[s] for s in range(6)]), np.array([b[s] for s in range(6)])
    ref = stats.ttest_rel(x, y)
    ci = ref.confidence_interval(0.95)
    assert c.n == 6
    assert c.mean == pytest.approx(float(np.mean(x - y)))
    assert (c.low, c.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert c.p == pytest.approx(ref.pvalue)


def test_paired_edge_cases():
    assert paired({0: 1.0}, {1: 2.0}, relative) is None  # no common seed
    one = paired({0: 2.0}, {0: 1.0}, relative)
    assert one.n == 1 and one.p is None and one.mean == pytest.approx(50.0) and fmt_interval(one) == "+50.00 (n=1)"
    exact = paired({0: 1.0, 1: 1.0}, {0: 0.5, 1: 0.5}, points)
    assert exact.p == 0.0 and exact.low == exact.high == pytest.approx(-50.0)
    assert relative(10.0, 9.0) == pytest.approx(10.0) and points(0.9, 0.95) == pytest.approx(5.0)


def test_holm_by_hand():
    # m = 4: 0.005 < 0.05/4, 0.01 < 0.05/3, 0.03 > 0.05/2 stops; 0.04 is not reached
    assert holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm([0.001, None, 0.2]) == [True, False, False]
    assert holm([]) == []


# ------------------------------------------------------------------------------------------ planted report

# Planted relative improvement over softmax (percent, positive = better) per (mode, bias) on Shakespeare.
PLANTED = {("h", b): 1.0 for b in FIELD_BIASES} | {("h+J", b): 2.0 for b in FIELD_BIASES} | {
    ("J", b): -3.0 for b in FIELD_BIASES}
PLANTED[("h", "fixed-log-T")] = -5.0          # h clearly worse than softmax under one bias
PLANTED[("h+J", "learn-0")] = 1.0             # h+J level with h under learn-0 (J adds nothing)
PLANTED_ACC = {"softmax": 0.95, "h": 0.94, "h+J": 0.96, "J": 0.80}


def softmax_ppl(seed):
    return 7.0 + 0.05 * seed


def planted_ppl(rel, seed, offset=True):
    return softmax_ppl(seed) * (1 - (rel + (OFFSETS[seed] if offset else 0.0)) / 100)


def shakespeare_val(ppl):
    return {"loss": math.log(ppl), "ppl": ppl, "loss_last": math.log(0.9 * ppl), "ppl_last": 0.9 * ppl}


def build_fair_results(root):
    for seed in SEEDS:
        write_run(root, "shakespeare", 12, "softmax", seed, variant="fair", val=shakespeare_val(softmax_ppl(seed)))
        acc = {"loss": 0.3, "accuracy": PLANTED_ACC["softmax"]}
        write_run(root, "brackets", 12, "softmax", seed, variant="fair", val=acc, test=acc)
        for (mode, bias), rel in PLANTED.items():
            # h and h+J share the per-seed offset, so h+J vs h is exact wherever both plants are equal
            cfg = field_bias(bias).config(12)
            write_run(root, "shakespeare", 12, mode, seed, variant=f"bias-{bias}",
                      val=shakespeare_val(planted_ppl(rel, seed)), **cfg)
            acc = {"loss": 0.3, "accuracy": PLANTED_ACC[mode] + 0.001 * OFFSETS[seed]}
            write_run(root, "brackets", 12, mode, seed, variant=f"bias-{bias}", val=acc, test=acc, **cfg)
        write_run(root, "shakespeare", 12, "softmax", seed, variant="long", steps=16000,
                  val=shakespeare_val(softmax_ppl(seed) - 0.5))
        for mode, rel in (("h", 1.0), ("h+J", 3.0)):
            write_run(root, "shakespeare", 12, mode, seed, variant="long-bias-learn-0", steps=16000,
                      val=shakespeare_val(planted_ppl(rel, seed) - 0.5), **field_bias("learn-0").config(12))
        write_run(root, "shakespeare", 12, "h+J", seed, variant="jlr3-bias-learn-0", coupling_lr_multiplier=3.0,
                  val=shakespeare_val(planted_ppl(2.5, seed)), **field_bias("learn-0").config(12))
        # brackets without the FFN: its own softmax (90%); h+J 95%, h 85%, J 70% under every bias
        acc = {"loss": 0.4, "accuracy": 0.90}
        write_run(root, "brackets", 12, "softmax", seed, variant="noffn-fair", val=acc, test=acc, d_ff=0)
        for mode, a in (("h", 0.85), ("h+J", 0.95), ("J", 0.70)):
            for bias in FIELD_BIASES:
                acc = {"loss": 0.5 - a / 10 + 0.001 * seed, "accuracy": a + 0.001 * OFFSETS[seed]}
                write_run(root, "brackets", 12, mode, seed, variant=f"noffn-bias-{bias}", val=acc, test=acc, d_ff=0,
                          **field_bias(bias).config(12))
        acc = {"loss": 0.3, "accuracy": 0.97}
        write_run(root, "brackets", 12, "h+J", seed, variant="noffn-jinit0.1-bias-learn-0", val=acc, test=acc,
                  d_ff=0, coupling_init_std=0.1, **field_bias("learn-0").config(12))


@pytest.fixture(scope="module")
def fair_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("fair")
    build_fair_results(root)
    assert study_of(Results(load_runs(root))) is fair
    path = write_report(root, root / "report")
    return path.read_text()


def table_starting(text, prefix):
    """The first table after the first line that starts with ``prefix``."""
    heading = next(line for line in text.splitlines() if line.startswith(prefix))
    return table_after(text, heading)


def _cell(text, prefix, row, column):
    return table_starting(text, prefix)[row][column]


def test_bias_tables_hold_the_planted_differences(fair_report):
    heading = "Against softmax (%, positive = better; 95% CI; best variants:"
    # softmax's PPL and the planted ones give the per-seed improvement rel + offset exactly
    sd = float(np.std(OFFSETS, ddof=1))
    half = stats.t.ppf(0.975, 4) * sd / math.sqrt(5)
    assert _cell(fair_report, heading, "learn-0", "h") == f"+1.00 [{1 - half:+.2f}, {1 + half:+.2f}]**"
    assert _cell(fair_report, heading, "fixed-log-T", "h") == f"-5.00 [{-5 - half:+.2f}, {-5 + half:+.2f}]**"
    assert _cell(fair_report, heading, "fixed-0", "J").startswith("-3.00 [")


def test_what_j_adds(fair_report):
    table = table_after(fair_report, "What J adds: h+J against h with the same field bias (%, positive = better; "
                                     "95% CI):")
    # equal plants: the per-seed difference is zero up to rounding, so no mark
    assert table["learn-0"]["h+J vs h"].startswith(("+0.00 [", "-0.00 [")) and "*" not in table["learn-0"]["h+J vs h"]
    fixed = table["fixed-0"]["h+J vs h"]
    expected = np.mean([(planted_ppl(1.0, s) - planted_ppl(2.0, s)) / planted_ppl(1.0, s) * 100 for s in SEEDS])
    assert fixed.startswith(f"{expected:+.2f} [") and fixed.endswith("**")


def test_conclusions_state_each_claim(fair_report):
    conclusions = fair_report.split("## Conclusions, claim by claim")[1]
    shakespeare = conclusions.split("**brackets")[0]
    assert "- field bias `fixed-log-T`:\n  - h (sigmoid) is worse than softmax: significantly worse" in shakespeare
    assert "- field bias `learn-0`:\n  - h (sigmoid) is worse than softmax: significantly better" in shakespeare
    assert "the claim is contradicted" in shakespeare and "the claim holds" in shakespeare
    learn0 = shakespeare.split("- field bias `learn-0`:")[1].split("- field bias")[0]
    assert "the couplings add to sigmoid attention (h+J better than h): no significant difference" in learn0
    assert "Best-tuned: softmax 7.100 ± 0.079" in shakespeare
    long = conclusions.split("4x longer training (16000 steps, `long-bias-learn-0`)**")[1]
    # planted: h about +1% and h+J about +3% better than softmax (all three 0.5 lower in PPL than at 4000 steps)
    assert "- h+J is better than softmax: significantly better" in long
    assert "- h (sigmoid) is worse than softmax: significantly better (+1.08 [" in long and "contradicted" in long
    brackets = conclusions.split("**brackets, T = 12, test accuracy**")[1]
    assert "J alone is worse than softmax: significantly worse" in brackets


def test_learned_bias_convergence_and_sensitivity(fair_report):
    assert "Learned field bias at the end of training" in fair_report
    learned = table_starting(fair_report, "Learned field bias at the end of training")
    assert learned["learn-0 (starts at +0.00)"]["h+J"] == "-1.00 ± 0.00"  # write_run's field_bias
    conv = fair_report.split("## Convergence: 4x longer training")[1].split("## Sensitivity")[0]
    rows = table_after(conv, "**perplexity, all positions**")
    assert set(rows) == {"4000", "16000"}
    assert rows["16000"]["softmax"] == f"{np.mean([softmax_ppl(s) - 0.5 for s in SEEDS]):.3f} ± 0.079"
    assert "convergence.png" in conv
    sens = fair_report.split("## Sensitivity of J")[1].split("## Conclusions")[0]
    rows = table_after(sens, "**shakespeare, h+J, field bias learn-0: perplexity, all positions**")
    assert set(rows) == {"lr 1x, J = 0 at init", "lr 3x"}
    assert rows["lr 3x"]["vs softmax (%)"].startswith("+2.50 [")


def test_brackets_without_the_ffn_pair_with_their_own_softmax(fair_report):
    section = fair_report.split("### brackets without the FFN, T = 12: field-bias variants")[1]
    versus = table_starting(section, "Against softmax (pts, positive = better; 95% CI;")
    assert versus["fixed-0"]["h+J"].startswith("+5.00 [") and versus["learn-0"]["J"].startswith("-20.00 [")
    loss = table_starting(section, "**test cross-entropy (millinats)**")
    assert loss["softmax (no field)"]["h"] == "400.000 ± 0.000"
    # loss difference in millinats: softmax 0.4 minus h+J's 0.5 - 0.095 + 0.001 s, mean over seeds 0..4
    loss_vs = table_starting(section, "Against softmax (mnat, positive = better;")
    assert loss_vs["fixed-0"]["h+J"].startswith(f"{(0.4 - (0.405 + 0.002)) * 1000:+.2f} [")
    sens = fair_report.split("## Sensitivity of J")[1]
    rows = table_starting(sens, "**brackets without the FFN, h+J, field bias learn-0: test accuracy**")
    cell = rows["J ~ N(0, 0.1²) at init"]["vs reference (pts)"]
    assert cell.startswith("+2.00 [+1.9") and cell.endswith("]**")
    assert "**brackets without the FFN, T = 12, test accuracy**" in fair_report.split("## Conclusions")[1]


def test_cli_report_picks_the_fair_report(tmp_path):
    build_fair_results(tmp_path)
    assert cli.main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "README.md").read_text().startswith("# Fair baselines")
    assert (tmp_path / "rep" / "convergence.png").stat().st_size < 200_000


def test_variants_against_the_default(fair_report):
    table = table_starting(fair_report, "Each variant against the default `learn-half-log-T`, same mode (%")
    assert set(table) == {"fixed-0", "learn-0", "fixed-log-T"}
    # planted: h is +1 under learn-half-log-T and -5 under fixed-log-T, on the same per-seed offsets
    expected = np.mean([(planted_ppl(1.0, s) - planted_ppl(-5.0, s)) / planted_ppl(1.0, s) * 100 for s in SEEDS])
    assert table["fixed-log-T"]["h"].startswith(f"{expected:+.2f} [")


def test_the_shared_recipe_is_what_the_studies_decided():
    """recipes.py states the fair and baselines studies' decisions as constants; the studies own them in their
    decisions.json, and the two must not drift apart."""
    import json
    from pathlib import Path

    from boltzmann_attention.experiments import recipes, studies

    folder = Path(studies.__file__).parent
    fair = json.loads((folder / "fair" / "decisions.json").read_text())
    baselines = json.loads((folder / "baselines" / "decisions.json").read_text())
    assert recipes.DEFAULT_FIELD_BIAS == fair["CHOSEN_FIELD_BIAS"]
    assert recipes.CHOSEN_INIT == baselines["CHOSEN_INIT"] and recipes.BEST_LR == baselines["BEST_LR"]
