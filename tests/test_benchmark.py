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
