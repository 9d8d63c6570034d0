"""The benchmark's reporting: ratio wording, targets from rows of one run, the up-front matplotlib check."""

import sys

import pytest

from boltzmann_attention import benchmark
from boltzmann_attention.benchmark import Case, Result


def test_ratio_words_never_say_faster_for_a_slowdown():
    assert benchmark.ratio_words(1.0, 1.4) == "1.4x slower"
    assert benchmark.ratio_words(1.4, 1.0) == "1.4x faster"
    assert benchmark.ratio_words(600.0, 2.0) == "300x faster"


def test_targets_are_ratios_of_the_same_run():
    results = [Result(Case("exact", 16, 64), 0.004, 0), Result(Case("naive", 16, 64), 1.0, 0),
               Result(Case("exact", 20, 64), 0.030, 0), Result(Case("exact", 24, 8), 0.31, 0)]
    steps = [{"T": 12, "softmax": 0.010, "h": 0.0105, "h+J": 0.016}]
    lines = benchmark.target_lines(results, steps)
    assert lines[0].startswith("- exact causal") and "250x" in lines[0] and lines[0].endswith("met")
    assert "7.5x" in lines[1] and lines[1].endswith("MISSED")
    assert "0.310 s" in lines[2] and lines[2].endswith("MISSED")
    assert "1.60x" in lines[3] and lines[3].endswith("MISSED")
    assert "1.05x" in lines[4] and lines[4].endswith("met")


def test_training_step_rows_and_table():
    rows = benchmark.training_step_rows(sizes=(4,), rounds=1, batch=4)
    assert set(rows[0]) == {"T", "softmax", "h", "h+J"} and all(rows[0][m] > 0 for m in benchmark.STEP_MODES)
    table = benchmark.training_step_table(rows).splitlines()
    assert table[0] == "| T | softmax ms | h ms | h+J ms | h vs softmax | h+J vs softmax |"
    assert table[2].startswith("| 4 | ")


def test_plot_without_matplotlib_fails_before_any_work(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(benchmark, "accuracy_rows", lambda *a, **k: pytest.fail("ran before the check"))
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["--accuracy", "--plot", "out.png"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == '--plot needs matplotlib: pip install -e ".[experiments]"'


def test_accuracy_rows_calibrated_dqa_row():
    """The sampler accuracy table has a calibrated-DQA row (target_beta=1.0); ``methods`` filters."""
    from boltzmann_attention import benchmark

    rows = benchmark.accuracy_rows(sizes=(4,), queries=2, methods=("dqa",), threads=1)
    assert [r["options"] for r in rows][-1] == "num_samples=1000, target_beta=1.0"
    assert all(r["method"] == "dqa" and 0 <= r["mean_error"] <= r["max_error"] <= 2 for r in rows)
    assert benchmark._short_options(rows[-1]["options"]) == "beta 1"


def test_dqa_calibration_report_from_rows(tmp_path):
    """Markdown tables and plot of the calibration report from (made-up) rows of the right shape."""
    from boltzmann_attention import benchmark

    pytest.importorskip("matplotlib")
    q = {"median": 1.0, "min": 0.9, "max": 1.1}
    point = {"beta": q, "kl_at_beta": q, "kl_to_boltzmann": q}
    data = {"calibration_systems": {"sizes": [4], "num_systems": 2, "field_mean": -1.3, "field_std": 0.4,
                                    "coupling_std": 0.25, "seed": 0},
            "sweep": [{"anneal_time_ns": 5.0, "energy_scale": c, **point} for c in (0.01, 0.1)],
            "times": [{"schedule": "linear", "anneal_time_ns": 5.0, "trotter_steps": 200, "energy_scale": 0.03,
                       **point, "beta_fields_only": q, "beta_couplings_only": q},
                      {"schedule": "linear", "anneal_time_ns": 50.0, "trotter_steps": 2000, "error": "edge"}],
            "default_energy_scale": 0.03,
            "sizes": [{"n": 4, "systems": 2, **point, "kl_at_scale_1": q, "own_energy_scale": 0.04, "own": point},
                      {"n": 16, "systems": 2, **point, "kl_at_scale_1": q}],
            "scales": [{"scaled": "fields", "factor": 2.0, "field_mean": -2.6, "field_std": 0.8, "coupling_std": 0.25,
                        **point, "own_energy_scale": 0.02, "own": point}],
            "accuracy": {"training-like": [{"n": 4, "method": "dqa", "options": "target_beta=1.0", "seconds": 0.1,
                                            "max_error": 0.1, "mean_error": 0.05}]},
            "noise_free": [{"distribution": "training-like", "n": 4, "energy_scale": e, "max_error": 0.2,
                            "mean_error": 0.1} for e in (1.0, 0.03)],
            "two_scales": [{"coupling_factor": 1.25, "kl_to_boltzmann": q}], "seconds": 1.0}
    text = benchmark.dqa_calibration_markdown(data, benchmark.machine_stamp(1), "calibration.png")
    assert "| linear | 5 | 200 | 0.03 | 0.15 | 1 [0.9, 1.1] |" in text
    assert "not bracketed: edge" in text and "| 16 | 2 | 1 [0.9, 1.1] |" in text
    assert "| 1.25 | 1 [0.9, 1.1] |" in text and "| training-like | 4 | 0.03 | 0.2 | 0.1 |" in text
    assert "mean |error| against exact 0.1 calibrated" in text
    benchmark.plot_dqa_calibration(data, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 1000
