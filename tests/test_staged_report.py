"""The stages' report of the conjunction and Match3 studies (``experiments/staged_report.py``): fake runs at each
study's own configs, with per-seed errors whose paired differences, Holm decisions and TOST verdicts are worked
out by hand; partial results; the decides-nothing clause; and Match3's error by class against a hand count."""

import importlib
import json
from dataclasses import asdict

import pytest
import torch

from boltzmann_attention.experiments.report import ReportContext
from boltzmann_attention.experiments.results import Results, load_runs
from boltzmann_attention.experiments.staged_report import STOPPED, WAITING, stages_section
from boltzmann_attention.experiments.tasks import match3
from boltzmann_attention.experiments.tasks.record import accuracy_metrics

STUDIES = ("conjunction", "match3")
SEEDS = (0, 1, 2, 3, 4)
NOISE = {0: 0.0, 1: 0.004, 2: -0.002, 3: 0.006, 4: -0.008}  # test error per seed, shared by every arm: paired
# other arm minus BEST_CONTENT, in points, per seed: mean 10, std sqrt(0.625); mean 0.2, std sqrt(0.15625);
# mean 3, std sqrt(10)
SPREAD = {"single": (0.0, 0.5, -0.5, 1.0, -1.0), "static": (0.0, 0.5, -0.5, 0.25, -0.25),
          "control": (0.0, 4.0, -4.0, 2.0, -2.0)}


def _study(name):
    return (importlib.import_module(f"boltzmann_attention.experiments.studies.{name}.grids"),
            importlib.import_module(f"boltzmann_attention.experiments.studies.{name}.report"))


def _write(root, G, arm, errors, *, val_error=None, val_loss=1.0, reach=None, uncoupled=None, lr=1e-3, setting=1):
    """Result JSONs of ``arm`` at ``setting`` (from 1) and ``lr`` for {seed: test error}: the validation error
    ``val_error`` (default the test error) and loss; ``reach`` {seed: the first evaluation step with validation
    error 0.04 (the others at 0.5), None: never}; the coupled arms' analysis with J = 0 test error ``uncoupled``."""
    s = G.SETTINGS[setting - 1]
    task = G.grid(arm, s, lr, tuple(errors))
    for name, cfg in task.runs():
        e = errors[cfg.seed]
        test = {"loss": 1.0, "error": e, "accuracy": 1 - e, "error_decoy": 0.6 * e, "error_other": 0.4 * e,
                "error_not_a_marker": 0.0, "error_yes": 1.5 * e, "error_no": 0.5 * e}
        val = {"loss": val_loss, "error": e if val_error is None else val_error}
        first = (reach or {}).get(cfg.seed)
        history = [{"step": st, "loss": 1.0, "error": 0.04 if first is not None and st >= first else 0.5}
                   for st in range(1000, s.steps + 1, 1000)]
        result = {"run": name, "variant": task.variant, "config": asdict(cfg), "seed": cfg.seed, "steps_run": s.steps,
                  "wall_time_s": 0.1 * s.steps, "metrics": {"val": val, "test": test}, "history": history,
                  "machine": "x86_64", "cpus": 2, "torch": "2.13.0", "python": "3.11", "commit": "abc"}
        if uncoupled is not None:
            pair = {"mean": [0.2, 0.4], "positive": [0.5, 0.7], "negative": [0.5, 0.3], "within_range": 1.0}
            result[task.analyses[0].name] = {
                "uncoupled": {"val": val, "test": {"loss": 1.0, "error": uncoupled[cfg.seed]}},
                "pair": [pair, {**pair, "mean": [-0.1, -0.3]}]}
        path = root / "runs" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))


def _decided(G):
    return G.Decisions(chosen=1, best_lr=dict.fromkeys(G.ARMS, 1e-3), best_single="h-rope",
                       best_content=G.CONTENT[0])


def _text(root, G, R, d):
    return "\n".join(stages_section(Results(load_runs(root)), d, R.staged(G.SETTINGS[d.chosen - 1])))


def _all_arms(root, G, base=0.10, single=10.0, static=0.2, control=3.0, scale=1.0):
    """Every arm at every seed: BEST_CONTENT at ``base`` + NOISE, the decisive others at the given mean
    difference in points plus their SPREAD (both times ``scale``), the rest 30 points above; BEST_CONTENT reaches
    4% validation error at step 3000 on every seed, h-rope at 5000 on seeds 0-3, never on 4."""
    content, other = G.CONTENT
    diff = {"h-rope": (single, SPREAD["single"]), G.STATIC: (static, SPREAD["static"]),
            G.CONTROL: (control, SPREAD["control"])}
    for arm in G.ARMS:
        mean, spread = diff.get(arm, (30.0 if arm != content else 0.0, (0.0,) * 5))
        errors = {s: base + scale * NOISE[s] + (mean + scale * spread[s]) / 100 for s in SEEDS}
        reach = {s: 3000 for s in SEEDS} if arm == content else {s: 5000 if s < 4 else None for s in SEEDS} \
            if arm == "h-rope" else None
        # the other content arm ties BEST_CONTENT's mean validation error over seeds 0-2, at a lower loss
        _write(root, G, arm, errors, val_error=(base if arm in (content, other) else None),
               val_loss=0.9 if arm == other else 1.0, reach=reach,
               uncoupled={s: e + 0.05 for s, e in errors.items()} if G.ARMS[arm].coupled else None)


@pytest.mark.parametrize("study", STUDIES)
def test_the_decision_by_hand(study, tmp_path):
    G, R = _study(study)
    _all_arms(tmp_path, G)
    content, other = G.CONTENT
    text = _text(tmp_path, G, R, _decided(G))
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert f"| {G.STATIC} | 0.001 | 1.0000 (n=1) | 100 |" in text  # stage 1 at one lr: 8000 steps in 800 s
    # stage 2, BEST_CONTENT: 10 + NOISE in %: mean 10, std sqrt(1.2 / 4) = 0.5477, half width t(0.975, 4) = 2.7764
    # x 0.5477 / sqrt(5) = 0.6801; decoy 0.6 of the error
    classes = "6.00 | 4.00 | 0.00" if study == "conjunction" else "15.00 | 5.00"
    assert f"| {content} | 0.001 | 0, 1, 2, 3, 4 | 10.00 [9.32, 10.68] | 0.55 | {classes} | " \
           "3000 / 3000 / 3000 / 3000 / 3000 | 100 |" in text
    assert "| h-rope | 0.001 | 0, 1, 2, 3, 4 | 20.00 [" in text and \
        "| 5000 / 5000 / 5000 / 5000 / not reached | 100 |" in rows["h-rope"]
    assert "BEST_SINGLE: h-rope." in text
    assert f"BEST_CONTENT: {other} (BEST_CONTENT in studies/{study}/decisions.json is {content}: update it)." in text
    # stage 3: mean 10, half width 2.7764 x sqrt(0.625 / 5) = 0.9816, p < 0.0001: Holm keeps it (0.05 / 3);
    # 0.2 ± 0.4908, p = 0.32: equivalent by TOST; 3 ± 3.926, p = 0.10 > 0.05 / 2: inconclusive
    single, static, control = (rows[f"{a} − {content}"] for a in ("h-rope", G.STATIC, G.CONTROL))
    assert "| +10.00 [+9.02, +10.98]** | 5 | 0.79 |" in single and single.endswith("| 1.000 | better |")
    assert "| +0.20 [-0.29, +0.69] | 5 | 0.40 |" in static and static.endswith("| equivalent within ±2 |")
    assert "| +3.00 [-0.93, +6.93] | 5 | 3.16 |" in control and control.endswith("| inconclusive |")
    assert f"- **Content couplings beat single scores** (h-rope − {content}): yes, better." in text
    assert f"- **Content beats position** ({G.STATIC} − {content}): no, equivalent within ±2." in text
    assert f"- **It is Ising inference** ({G.CONTROL} − {content}): no, inconclusive." in text
    assert "decides nothing" not in text
    # the coupled arms: J = 0 adds 5 points on every seed; layer 0's mean J 0.3, 60% positive; layer 1's -0.2
    assert f"| {content} | 5 | 10.00 | 15.00 | +5.00 [+5.00, +5.00]* |" in text
    assert f"| {content} | 0 | 0.3000 | 60.00 | 40.00 | 100.00 |" in text
    assert f"| {content} | 1 | -0.2000 | 60.00 | 40.00 | 100.00 |" in text
    assert "| h-rope | 5 |" not in text  # no analysis for an uncoupled arm


@pytest.mark.parametrize("study", STUDIES)
def test_stage_one_applies_the_lr_rule(study, tmp_path):
    G, R = _study(study)
    losses = {"h-rope": (1.2, 1.0, 0.995),   # 3e-3 within the tie of 0.01: 1e-3, the closest to the reference
              G.STATIC: (1.2, 1.0, 0.8),     # the edge wins: the rule adds 1e-2
              "mta": (None, 1.0, 1.1)}       # 3e-4 diverged
    for arm, by_lr in losses.items():
        for lr, loss in zip(G.LEARNING_RATES, by_lr):
            if loss is not None:
                _write(tmp_path, G, arm, {0: 0.5}, val_loss=loss, lr=lr)
    d = G.Decisions(chosen=1, diverged={"mta": (3e-4,)}, best_lr={"h-rope": 3e-3})
    text = _text(tmp_path, G, R, d)
    assert "| h-rope | **0.001** | 1.0000 (n=1) | 100 |" in text and "| h-rope | 0.003 | 0.9950 (n=1) | 100 |" in text
    assert f"| {G.STATIC} | **0.003** | 0.8000 (n=1) | 100 |" in text
    assert "| mta | 0.0003 | diverged |  |" in text and "| mta | **0.001** | 1.0000 (n=1) | 100 |" in text
    assert f"{G.STATIC}: best at 0.003, the grid's edge, so the rule adds lr 0.01" in text
    assert f"Chosen: mta 0.001, h-rope 0.001 (BEST_LR in studies/{study}/decisions.json differs for mta, h-rope" in text
    assert "| softmax-rope | 0.0003 |" not in text  # no run, no row


def test_the_reports_wire_the_stages_after_the_calibration(tmp_path):
    for study in STUDIES:
        G, R = _study(study)
        _all_arms(tmp_path / study, G)
        res = Results(load_runs(tmp_path / study))
        chosen = R.report(res, ReportContext(tmp_path, tmp_path / "out", _decided(G), "# T\n"))
        assert chosen.index("## Calibration") < chosen.index("## Stage 1: learning rates") and WAITING not in chosen
        waiting = R.report(res, ReportContext(tmp_path, tmp_path / "out", G.Decisions(), "# T\n"))
        assert WAITING in waiting and "## Stage 1: learning rates" not in waiting


@pytest.mark.parametrize("study", STUDIES)
def test_a_calibration_that_runs_out_stops_the_study(study, tmp_path):
    G, R = _study(study)
    last = len(G.SETTINGS)
    for index in range(1, last + 1):
        for arm in G.CALIBRATION_ARMS:
            _write(tmp_path, G, arm, {G.TUNING_SEED: 0.5}, setting=index, val_error=0.06 if index == last else 0.5)

    def text(d):
        res = Results(load_runs(tmp_path))
        return "\n".join(R.report(res, ReportContext(tmp_path, tmp_path / "out", d, "# T\n")))

    stopped = text(G.Decisions(calibration_settings=last))  # 6% at the last setting: just above the 5% bar
    assert "No setting passes: the calibration has run out" in stopped and STOPPED in stopped and WAITING not in stopped
    before = text(G.Decisions(calibration_settings=last - 1))
    assert f"set CALIBRATION_SETTINGS to {last}" in before and WAITING in before and STOPPED not in before
    _write(tmp_path, G, G.CALIBRATION_ARMS[0], {G.TUNING_SEED: 0.5}, setting=last, val_error=0.05)  # at the bar
    passed = text(G.Decisions(calibration_settings=last))
    assert f"Setting {last} passes: set CHOSEN to {last}" in passed and STOPPED not in passed


@pytest.mark.parametrize("study", STUDIES)
def test_partial_results_render_what_is_missing(study, tmp_path):
    G, R = _study(study)
    content = G.CONTENT[0]
    _write(tmp_path, G, "softmax-rope", {0: 0.5})                  # stage 1 on seed 0, one lr
    _write(tmp_path, G, content, {0: 0.1, 1: 0.2}, uncoupled={0: 0.3, 1: 0.3})
    d = G.Decisions(chosen=1, best_lr={content: 1e-3, "h-rope": 1e-3, G.CONTROL: 1e-3})
    text = _text(tmp_path, G, R, d)
    assert "Not decided yet (runs missing): softmax-rope," in text
    assert "| softmax-rope | not decided yet |" in text and "| h-rope | 0.001 | not run yet |" in text
    assert f"| {content} | 0.001 | 0, 1 | 15.00 [" in text
    assert "BEST_SINGLE (among softmax-rope, stickbreaking, h-rope): not decided yet" in text
    assert "Waits for BEST_SINGLE and BEST_CONTENT" in text
    assert f"| {G.CONTROL} | 0.001 | not run yet |" in text and f"| {G.CONTROL} | not run yet |" in text
    assert f"| {G.STATIC} | not decided yet |" in text
    assert f"| {content} | 2 | 15.00 | 30.00 |" in text and f"| {G.CONTENT[1]} | not decided yet |" in text
    d = G.Decisions(chosen=1, best_lr={content: 1e-3, "h-rope": 1e-3}, best_single="h-rope", best_content=content)
    text = _text(tmp_path, G, R, d)
    assert f"| h-rope − {content} | not run yet (0 of 5 seeds) |" in text
    assert "The decision waits for stage 3's runs." in text
    assert "yes," not in text and "no," not in text


@pytest.mark.parametrize("study", STUDIES)
def test_all_solved_decides_nothing_and_compares_the_steps(study, tmp_path):
    G, R = _study(study)
    _all_arms(tmp_path, G, base=0.003, single=0.5, static=0.2, control=0.3, scale=0.1)  # means <= 0.8%
    content = G.CONTENT[0]
    text = _text(tmp_path, G, R, _decided(G))
    assert "**The comparison decides nothing**: all four reach at most 1% mean test error" in text
    assert "- **Content couplings beat single scores**" not in text
    # h-rope reaches 5% at step 5000 on seeds 0-3 (never on 4), BEST_CONTENT at 3000: +2000 on 4 pairs
    assert f"| h-rope − {content} | +2000.00 [+2000.00, +2000.00]** | 4 |" in text
    # +0.5 ± 0.05 points: significant after Holm, and equivalent within the margin
    assert f"| h-rope − {content} | +0.50 [+0.40, +0.60]** | 5 | 0.08 | 0.000 | equivalent within ±2 ({content} " \
           "ahead, significant after Holm) |" in text
    assert f"| {G.STATIC} − {content} | no seed where both reach 5% | 0 |" in text


def test_all_unsolved_is_each_protocols_threshold(tmp_path):
    """45% mean test error for all four: above Match3's 40%, below the conjunction study's 50%."""
    for study in STUDIES:
        G, R = _study(study)
        _all_arms(tmp_path / study, G, base=0.45, single=0.5, static=0.2, control=0.3)
        text = _text(tmp_path / study, G, R, _decided(G))
        nothing = "**The comparison decides nothing**: all four stay above 40% mean test error"
        assert (nothing in text) == (study == "match3")
        assert ("- **Content beats position**" in text) == (study == "conjunction")


class _Parity(torch.nn.Module):
    """Answers YES where the first residue is even, NO elsewhere, with logits that give a known loss."""

    def __init__(self, modulus):
        super().__init__()
        self.modulus = modulus

    def forward(self, x):
        out = torch.zeros(*x.shape, self.modulus + 2)
        yes = x[:, 0] % 2 == 0
        out[:, :, self.modulus + 1] = torch.where(yes, 2.0, 0.0)[:, None]
        out[:, :, self.modulus] = torch.where(yes, 0.0, 1.0)[:, None]
        return out


def test_match3_errors_by_class_against_a_hand_count():
    data = match3.Match3Data(8, 30)
    model = _Parity(30)
    x, y = data.test
    got = match3.evaluate(model, x, y, 128)
    counts = {True: [0, 0], False: [0, 0]}  # by class (positive?): [wrong, all]
    for row, target in zip(x.tolist(), y[:, -1].tolist()):
        positive = target == 31
        counts[positive][0] += (row[0] % 2 == 0) != positive
        counts[positive][1] += 1
    assert counts[True][1] == counts[False][1] == 1000
    assert got["error_yes"] == counts[True][0] / 1000 and got["error_no"] == counts[False][0] / 1000
    assert 0 < got["error_yes"] < 1 and 0 < got["error_no"] < 1  # both counts can fail
    before = accuracy_metrics(model, x, y, 128)  # the metrics that were there keep their values
    assert (got["loss"], got["accuracy"], got["error"]) == (before["loss"], before["accuracy"], 1 - before["accuracy"])
