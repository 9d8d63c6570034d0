"""The bracket-headroom study: its calibration grid, its rule for choosing the setting, and its report."""

import pytest
from test_report import brackets_metrics, write_run

from boltzmann_attention.experiments.results import Results, load_runs
from boltzmann_attention.experiments.studies import brackets, profile, study_of, write_report


def test_calibration_grid_follows_the_design():
    runs = [cfg for grid in profile("brackets-calibration") for _, cfg in grid.runs()]
    for cfg in runs:
        cfg.validate()
    assert len(runs) == len(brackets.SETTINGS) * 3 == 14 * 3
    assert {(c.task, c.T, c.mode, c.d_ff, c.lr, c.init, c.steps, c.batch_size) for c in runs} == {
        ("brackets", 16, "softmax", 128, 3e-3, "gpt2", 4000, 64)}
    easy = [c for c in runs if (c.train_sequences, c.min_fill, c.max_fill, c.open_probability, c.deduplicate)
            == (20000, 0.0, 1.0, 0.5, False)]
    assert len(easy) == 3  # the old task is one setting
    assert sum(c.deduplicate for c in runs) == len(runs) - 3
    names = [name for grid in profile("brackets-calibration") for name, _ in grid.runs()]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("means, chosen", [
    ({"easy": 0.995, "dedup": 0.99, "deep": 0.93, "deep-long": 0.88, "deeper-long": 0.7}, "deep-long"),
    ({"easy": 0.995, "deep": 0.92, "deep-long": 0.88}, "deep"),  # both 2 points from 90: the earlier
    ({"easy": 0.995, "deep": 0.91, "deep-long": 0.895}, "deep-long"),
    ({"easy": 0.995, "deep": 0.96, "deep-long": 0.80}, None),   # nothing in [85, 95]
    ({"deep": 0.95, "deep-long": 0.85}, "deep"),                # the band's edges count, tie: the earlier
])
def test_the_rule(means, chosen):
    assert brackets.choose(means) == chosen


def _plant(root, accuracy):
    for s in brackets.SETTINGS:
        for seed in brackets.CALIBRATION_SEEDS:
            acc = accuracy[s.name] + 0.01 * (seed - 1)
            metrics = {**brackets_metrics(acc), "accuracy_sequence": acc - 0.2}
            write_run(root, "brackets", 16, "softmax", seed, variant=s.variant, val=metrics, test=metrics,
                      lr=3e-3, **s.overrides)


ACCURACY = {"easy": 0.985, "dedup": 0.98, "deep": 0.96, "deep-long": 0.93, "deeper-long": 0.89,
            "deep-long-5k": 0.84, "deep-long-2k": 0.70, "deep-long-1000": 0.6, "deep-long-500": 0.5,
            "deep-long-400": 0.45, "deep-long-350": 0.44, "deep-long-300": 0.43, "deep-long-250": 0.4,
            "deep-long-125": 0.3}


def test_report_on_planted_runs(tmp_path):
    _plant(tmp_path, ACCURACY)
    assert study_of(Results(load_runs(tmp_path))) is brackets
    text = write_report(tmp_path, tmp_path / "rep").read_text()
    assert "**Chosen: deeper-long** (89.00%)" in text
    row = next(line for line in text.splitlines() if line.startswith("| 3. deep-long |"))
    assert "| 93.00 ± 1.00 (n=3) | 73.00 ± 1.00 (n=3) | 92.00, 93.00, 94.00 |" in row
    easy = next(line for line in text.splitlines() if line.startswith("| 0. easy |"))
    assert "| 44% | 2.54 |" in easy and "| 10.0% |" in easy  # the old generator at T = 16
    assert (tmp_path / "rep" / "calibration.png").exists()
    assert "TODO" not in text


def test_report_says_when_no_setting_fits_and_when_runs_are_missing(tmp_path):
    _plant(tmp_path, {**ACCURACY, "deep-long": 0.955, "deeper-long": 0.97, "deep-long-5k": 0.80})
    text = write_report(tmp_path, tmp_path / "rep").read_text()
    assert "**No setting lies in the band**" in text and "deep-long (95.50%), deep-long-5k (80.00%)" in text
    (tmp_path / "runs" / "brackets-T16-softmax-exact-cal-deep-s2.json").unlink()
    text = write_report(tmp_path, tmp_path / "rep").read_text()
    assert "Not applied yet: deep has not finished all 3 seeds" in text


def test_other_studies_runs_are_not_claimed(tmp_path):
    write_run(tmp_path, "brackets", 16, "softmax", 0, variant="base", val=brackets_metrics(0.9),
              test=brackets_metrics(0.9))
    assert study_of(Results(load_runs(tmp_path))) is not brackets
