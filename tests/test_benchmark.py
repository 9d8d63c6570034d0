"""The benchmark command and its parts: ratio wording, the stamp, tables from rows of one run, arguments and
output paths checked before anything is measured, a dead measuring process reported instead of waited on,
and a tiny run of every subcommand (smallest sizes: a check that it works, not a measurement)."""

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from boltzmann_attention import ising
from boltzmann_attention.experiments.benchmarks import approximations, cli, common, dqa, layers, training
from boltzmann_attention.experiments.benchmarks.layers import Case, Result

ROOT = Path(__file__).resolve().parents[1]
STAMP = {"cpu": "Test CPU", "threads": 1, "torch": "9.9.9", "python": "3.0", "commit": "abc1234",
         "date": "2026-01-01 00:00 UTC", "load": 0.5, "cores": 2}


@pytest.fixture
def deadline():
    """Fail (instead of hanging) when the test takes longer than the given seconds."""
    def expire(signum, frame):
        raise TimeoutError("the benchmark hung")

    previous = signal.signal(signal.SIGALRM, expire)
    yield signal.alarm
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _bench(capsys, *argv) -> str:
    cli.main(list(argv))
    return capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ reporting

def test_a_case_peak_is_its_own_growth_not_an_earlier_high_water_mark():
    """A case started by a large process still reads the memory it needs (Linux carries the parent's size over
    fork and exec into ru_maxrss): naive enumeration at T = 12, B = 64 holds logits of B * T * 2^T float32
    (12.6 MB) at once."""
    from boltzmann_attention.experiments.train.memory import reset_peak_rss

    if not reset_peak_rss():
        pytest.skip("the peak resident set cannot be reset here (Linux only)")
    held = torch.ones(400 * 2**20 // 4)  # this process: 400 MB more, resident while the case runs
    assert layers.run_case(Case("naive", 12, 64), threads=1).peak_mb > 12.6
    del held


def test_ratio_words_never_say_faster_for_a_slowdown():
    assert common.ratio_words(1.0, 1.4) == "1.4x slower"
    assert common.ratio_words(1.4, 1.0) == "1.4x faster"
    assert common.ratio_words(600.0, 2.0) == "300x faster"


def test_stamp_names_machine_threads_torch_and_commit():
    import torch

    from boltzmann_attention.provenance import machine_info

    stamp = common.machine_stamp(3)
    assert (stamp["threads"], stamp["torch"], stamp["commit"]) == (3, torch.__version__, machine_info()["commit"])
    assert common.stamp_line(STAMP) == ("Machine: Test CPU, 1 threads, load average 0.5 on 2 cores at the start; "
                                        "torch 9.9.9; python 3.0; commit abc1234; 2026-01-01 00:00 UTC")


def test_interleaved_runs_candidates_in_turn():
    calls = []
    times = common.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2,
                               warmup=1, calls=2)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 2
    assert list(times) == ["a", "b"] and all(len(t) == 2 and min(t) >= 0 for t in times.values())
    with pytest.raises(ValueError, match="rounds >= 1"):
        common.interleaved({"a": lambda: None}, rounds=0)


def test_format_table_ratios_are_against_rows_of_the_same_shape():
    results = [Result(Case("exact", 16, 64), 0.004, 10), Result(Case("naive", 16, 64), 1.0, 800),
               Result(Case("sdpa", 16, 64), 0.001, 5), Result(Case("exact", 20, 64), 0.03, 20),
               Result(Case("exact", 16, 64, causal=False), 0.005, 10, gflops=50.0),
               Result(Case("matmul", 16, 64), 0.0001, 1, gflops=100.0)]
    lines = layers.format_table(results, STAMP).splitlines()
    assert lines[0] == common.stamp_line(STAMP)
    assert lines[4] == "| exact | 16 | 64 | yes |  | 4.0 | 10 | 250x faster | 4x slower |  |"
    assert lines[7] == "| exact | 20 | 64 | yes |  | 30.0 | 20 |  |  |  |"  # no naive or SDPA row at T = 20
    assert lines[8].endswith("| 50 (50% of matmul) |") and "| no |" in lines[8]
    assert lines[9].startswith("| matmul | 16 | 64 |  |  | 0.10 (fwd) |")


def test_targets_are_ratios_of_the_same_run():
    results = [Result(Case("exact", 16, 64), 0.004, 0), Result(Case("naive", 16, 64), 1.0, 0),
               Result(Case("exact", 20, 64), 0.030, 0), Result(Case("exact", 24, 8), 0.31, 0)]
    steps = [{"T": 12, "softmax": 0.010, "h": 0.0105, "h+J": 0.016}]
    lines = layers.target_lines(results, steps)
    assert lines[0].startswith("- exact causal") and "250x" in lines[0] and lines[0].endswith("met")
    assert "7.5x" in lines[1] and lines[1].endswith("MISSED")
    assert "0.310 s" in lines[2] and lines[2].endswith("MISSED")
    assert "1.60x" in lines[3] and lines[3].endswith("MISSED")
    assert "1.05x" in lines[4] and lines[4].endswith("met")
    assert layers.target_lines(results[:1], None) == []


def test_training_step_rows_and_table():
    rows = training.training_step_rows(sizes=(4,), rounds=1, batch=4)
    assert set(rows[0]) == {"T", "softmax", "h", "h+J"} and all(rows[0][m] > 0 for m in training.STEP_MODES)
    table = training.training_step_table(rows).splitlines()
    assert table[0] == "| T | softmax ms | h ms | h+J ms | h vs softmax | h+J vs softmax |"
    assert table[2].startswith("| 4 | ")


def test_accuracy_rows_calibrated_dqa_row():
    """The sampler accuracy table has a calibrated-DQA row (target_beta=1.0); ``methods`` filters."""
    rows = approximations.accuracy_rows(sizes=(4,), queries=2, methods=("dqa",), threads=1)
    assert [r["options"] for r in rows][-1] == "num_samples=1000, target_beta=1.0"
    assert all(r["method"] == "dqa" and 0 <= r["mean_error"] <= r["max_error"] <= 2 for r in rows)
    assert approximations._short_options(rows[-1]["options"]) == "beta 1"


def test_dqa_calibration_report_from_rows(tmp_path):
    """Markdown tables and plot of the calibration report from (made-up) rows of the right shape."""
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
    text = dqa.dqa_calibration_markdown(data, STAMP, "calibration.png")
    assert "Generated by `boltzmann-attention-bench dqa-calibration report/dqa_calibration`" in text
    assert common.stamp_line(STAMP) in text
    assert "| linear | 5 | 200 | 0.03 | 0.15 | 1 [0.9, 1.1] |" in text
    assert "not bracketed: edge" in text and "| 16 | 2 | 1 [0.9, 1.1] |" in text
    assert "| 1.25 | 1 [0.9, 1.1] |" in text and "| training-like | 4 | 0.03 | 0.2 | 0.1 |" in text
    assert "mean |error| against exact 0.1 calibrated" in text
    dqa.plot_dqa_calibration(data, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 1000


# ------------------------------------------------------------------------------ arguments, checked up front

BAD_VALUES = [("methods", "--threads", "0"), ("methods", "--threads", "-1"), ("approximations", "--threads", "0"),
              ("window", "--threads", "1", "0"), ("window", "--repeats", "0"), ("window", "--T", "0"),
              ("window", "--B", "0"), ("window", "--W", "0"), ("banded", "--heads", "0"),
              ("banded", "--d-model", "0"), ("banded", "--repeats", "two"),
              ("steps", "--sizes", "4", "0"), ("steps", "--batch", "0"), ("steps", "--rounds", "0"),
              ("steps", "--profile", "quick", "--steps", "0"), ("steps", "--warmup", "-2"),
              ("grid-throughput", "--before", ".", "--steps", "0"),
              ("grid-throughput", "--before", ".", "--rounds", "0")]


@pytest.mark.parametrize("argv", BAD_VALUES, ids=" ".join)
def test_bad_values_are_refused_before_any_work(argv, monkeypatch, capsys):
    for name in COMMAND_FUNCTIONS:
        monkeypatch.setitem(cli.COMMANDS, name, lambda args: pytest.fail("ran before the check"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    flag = [a for a in argv if a.startswith("--")][-1]  # the flag of the bad value, which comes last
    assert re.search(rf"argument {re.escape(flag)}\b.*(must be >= 1|expected an integer >= 1)", err), err


@pytest.mark.parametrize("error, status", [(ValueError("the --json file x.json: not writable\nmore"), 2),
                                           (RuntimeError("a measured process died\nits output: ..."), 1),
                                           (OSError(28, "No space left on device", "x.json"), 1)])
def test_an_error_while_measuring_is_one_line_not_a_traceback(error, status, monkeypatch, capsys):
    def fail(args):
        raise error

    monkeypatch.setitem(cli.COMMANDS, "methods", fail)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["methods", "--quick"])
    assert exit_info.value.code == status
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    assert str(error).splitlines()[0].split(":")[0] in err


COMMAND_FUNCTIONS = ("methods", "steps", "approximations", "window", "banded", "window-paths", "chain-scan", "gpu",
                     "relative-steps", "grid-throughput", "dqa-calibration", "qpu")


@pytest.mark.slow
def test_threads_zero_exits_at_once_in_a_fresh_process():
    """The installed command with --threads 0 exits with a usage error (it used to wait forever on a dead child)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "boltzmann_attention.experiments.benchmarks", "methods", "--quick",
                           "--threads", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "argument --threads: must be >= 1, got 0" in done.stderr


def test_grid_throughput_refuses_a_folder_that_is_no_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["grid-throughput", "--before", str(tmp_path)])
    assert f"--before {tmp_path}: not a checkout of this project" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["grid-throughput", "--before", str(ROOT), "--profile", "nope"])
    assert "--profile 'nope': choose one of" in capsys.readouterr().err


def test_help_states_every_default_once_and_cites_no_issue():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict)).choices
    assert set(subparsers) == set(COMMAND_FUNCTIONS) == set(cli.COMMANDS)
    for name, sub in subparsers.items():
        text = sub.format_help()
        assert not re.search(r"issue|§|#\d", text, flags=re.I), (name, text)
        for action in sub._actions:
            if action.dest == "help":
                continue
            if action.required:
                assert action.help.endswith("(required)") and "default" not in action.help, (name, action.dest)
            else:
                stated = re.findall(r"\(default: (?:%\(default\)s|[^)]*)\)", action.help)
                rest = action.help.replace(stated[0], "") if stated else action.help
                assert len(stated) == 1 and "default" not in rest.lower(), (name, action.dest)
    assert not re.search(r"issue|§|#\d", parser.format_help(), flags=re.I)


# ------------------------------------------------------------------------------ measuring processes

class _DiesOnArrival:
    """Unpickling it in the measuring process ends that process at once with exit code 3."""

    def __reduce__(self):
        return os._exit, (3,)

    def __repr__(self):
        return "Case(dies on arrival)"


@pytest.mark.slow
def test_a_child_that_dies_is_reported_not_waited_on(deadline):
    deadline(120)
    with pytest.raises(RuntimeError, match=r"Case\(dies on arrival\) died without a result \(exit code 3\)"):
        layers.run_case(_DiesOnArrival(), poll_s=0.2)


@pytest.mark.slow
def test_a_child_that_fails_is_reported_with_its_case(deadline):
    deadline(120)
    with pytest.raises(RuntimeError, match=r"the benchmark of Case\(method='exact', T=4.*failed: .*threads"):
        layers.run_case(Case("exact", 4, 2), threads=0, poll_s=0.2)


# ------------------------------------------------------------------------------------- output paths

def test_outputs_into_a_missing_folder_are_created_before_measuring(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    rows = [{"n": 4, "method": "exact", "options": "defaults", "seconds": 0.01, "max_error": 0.0, "mean_error": 0.0}]
    seen = []

    def accuracy_rows(**kwargs):
        seen.append(((tmp_path / "a").is_dir(), (tmp_path / "b" / "c").is_dir()))
        return rows

    monkeypatch.setattr(approximations, "accuracy_rows", accuracy_rows)
    out = _bench(capsys, "approximations", "--only", "accuracy", "--json", str(tmp_path / "a" / "r.json"),
                 "--plot", str(tmp_path / "b" / "c" / "p.png"))
    assert seen == [(True, True)]  # both folders existed before the measurement ran
    assert json.loads((tmp_path / "a" / "r.json").read_text())["accuracy"] == rows
    assert (tmp_path / "b" / "c" / "p.png").stat().st_size > 1000
    assert out.startswith("Machine: ") and "| 4 | exact | defaults |" in out


@pytest.mark.parametrize("argv", [("methods", "--json", "{file}/r.json"),
                                  ("approximations", "--json", "{file}/sub/r.json"),
                                  ("approximations", "--plot", "{file}/p.png"),
                                  ("window", "--json", "{file}/w.json"),
                                  ("steps", "--json", "{file}/s.json"),
                                  ("banded", "--json", "{dir}"),
                                  ("dqa-calibration", "{file}/report"),
                                  ("qpu", "{file}/report")], ids=" ".join)
def test_an_output_path_that_cannot_be_written_is_an_error_up_front(argv, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "plain").write_text("a regular file")
    for name in COMMAND_FUNCTIONS:
        monkeypatch.setitem(cli.COMMANDS, name, lambda args: pytest.fail("ran before the check"))
    argv = [a.format(file=tmp_path / "plain", dir=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert ("cannot write" in err and str(tmp_path / "plain") in err) or f"{str(tmp_path)!r} is a folder" in err, err


def test_qpu_without_the_extra_fails_before_any_work_naming_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "dwave.system", None)  # import dwave.system -> ImportError
    monkeypatch.setitem(cli.COMMANDS, "qpu", lambda args: pytest.fail("ran before the check"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["qpu", str(tmp_path / "report")])
    assert exit_info.value.code == 2 and '".[qpu]"' in capsys.readouterr().err


def test_plot_without_matplotlib_fails_before_any_work(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(approximations, "accuracy_rows", lambda *a, **k: pytest.fail("ran before the check"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["approximations", "--plot", str(tmp_path / "out.png")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == cli.NO_MATPLOTLIB


# ----------------------------------------------------------------------- every subcommand, smallest sizes

def _table_rows(out: str, header: str) -> list[str]:
    """The body rows of the Markdown table under ``header`` in ``out``."""
    lines = out.splitlines()
    rows = []
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


@pytest.mark.slow
def test_methods_smoke_run(capsys, tmp_path, deadline):
    deadline(300)
    out = _bench(capsys, "methods", "--smoke", "--threads", "1", "--json", str(tmp_path / "m.json"))
    assert common.stamp_line(json.loads((tmp_path / "m.json").read_text())["machine"]).split(";")[1:4] == \
        [f" torch {common.machine_stamp()['torch']}", f" python {common.machine_stamp()['python']}",
         f" commit {common.machine_stamp()['commit']}"]
    rows = _table_rows(out, "| method | T | B | causal | band | fwd+bwd ms | peak MB | vs naive | vs SDPA | GFLOP/s |")
    assert [r.split("|")[1].strip() for r in rows[:6]] == ["exact", "naive", "sdpa", "exact", "matmul", "banded"]
    assert re.search(r"^\| exact \| 4 \| 2 \| yes \|  \| [\d.]+ \| -?\d+ \| [\d.]+x (faster|slower) \| [\d.]+x "
                     r"(faster|slower) \|", rows[0], flags=re.M)
    assert "| T | softmax ms | h ms | h+J ms | h vs softmax | h+J vs softmax |" in out
    assert out.splitlines()[-1] == "(no target's rows were measured)"


def test_steps_smoke_run_of_the_papers_model(capsys, tmp_path):
    out = _bench(capsys, "steps", "--sizes", "4", "--batch", "2", "--rounds", "1", "--warmup", "1", "--json",
                 str(tmp_path / "s.json"))
    assert out.startswith("Machine: ") and "(batch 2), median of 1 interleaved rounds" in out
    rows = _table_rows(out, "| T | softmax ms | h ms | h+J ms | h vs softmax | h+J vs softmax |")
    assert len(rows) == 1 and rows[0].startswith("| 4 | ")
    assert [r["T"] for r in json.loads((tmp_path / "s.json").read_text())["steps"]] == [4]


def test_relative_steps_smoke_run_states_each_ratio_against_its_target(capsys, tmp_path):
    out = _bench(capsys, "relative-steps", "--sizes", "72", "--ranges", "4", "3", "--batch", "2", "--layers", "1",
                 "--steps", "1", "--rounds", "1", "--json", str(tmp_path / "r.json"))
    assert out.startswith("Machine: ") and "(1 layer, 2 heads, d_model 64, batch 2, RoPE)" in out
    rows = _table_rows(out, "| T | h-rope ms | relative 4 ms | relative 4 / h-rope (target) | relative 3 ms | "
                            "relative 3 / h-rope (target) |")
    saved = json.loads((tmp_path / "r.json").read_text())["relative_steps"][0]
    ratio = saved["relative 4"] / saved["h-rope"]
    verdict = "met" if ratio <= 2.5 else "missed"
    assert rows == [f"| 72 | {1e3 * saved['h-rope']:.1f} | {1e3 * saved['relative 4']:.1f} | {ratio:.2f}x "
                    f"({verdict}: <= 2.5x) | {1e3 * saved['relative 3']:.1f} | "
                    f"{saved['relative 3'] / saved['h-rope']:.2f}x |"]  # range 3 has no target


def test_the_relative_breakdown_finds_the_banded_solve_in_the_coupled_step_only(capsys, tmp_path):
    out = _bench(capsys, "relative-steps", "--sizes", "72", "--ranges", "4", "--batch", "2", "--layers", "1",
                 "--steps", "1", "--rounds", "1", "--breakdown", "--json", str(tmp_path / "r.json"))
    rows = {r["name"]: r for r in json.loads((tmp_path / "r.json").read_text())["breakdown"]["72"]}
    plain, coupled = rows["h-rope"], rows["relative 4"]
    assert plain["banded_forward_ms"] == plain["banded_backward_ms"] == 0 and plain["banded_ops"] == 0
    assert coupled["banded_forward_ms"] > 0 and coupled["banded_backward_ms"] > 0 and coupled["banded_ops"] > 0
    for r in rows.values():
        assert r["rest_ms"] == pytest.approx(r["step_ms"] - r["banded_forward_ms"] - r["banded_backward_ms"])
    assert f"| 72 | relative 4 | {coupled['step_ms']:.1f} | {coupled['banded_forward_ms']:.1f} |" in out


def test_steps_smoke_run_of_a_profile(capsys):
    out = _bench(capsys, "steps", "--profile", "quick", "--match", "T4-h", "--steps", "1", "--rounds", "2",
                 "--warmup", "1")
    lines = out.splitlines()
    assert lines[0].startswith("Machine: ") and "Profile quick: 2 step configurations" in lines[1]
    assert "the ratio to shakespeare-T4-h+J-exact-base" in lines[1]  # no softmax among them: the first
    names = [line.split()[0] for line in lines[3:]]
    assert names == ["shakespeare-T4-h+J-exact-base", "shakespeare-T4-h-exact-base"]
    assert lines[3].split()[-1] == "1.0" and re.fullmatch(r"[\d.]+", lines[4].split()[-1])


def test_steps_refuses_match_without_profile_and_an_unknown_profile(capsys):
    with pytest.raises(SystemExit):
        cli.main(["steps", "--match", "x"])
    assert "--match and --decisions apply with --profile only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["steps", "--profile", "match3", "--decisions", "{"])
    assert "--decisions: decisions '{' are not JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["steps", "--profile", "nope"])
    assert "--profile 'nope': choose one of" in capsys.readouterr().err


def test_profile_step_configs_under_replaced_decisions():
    """A calibrated study's decisions replaced: CHOSEN adds every arm at that setting (lrs do not change a step's
    cost, so one configuration per arm); while calibrating, only the calibration arms run. A key that is not
    a decision, or a study without decisions, is refused by name."""
    from boltzmann_attention.experiments.studies.match3 import grids

    chosen = training.profile_step_configs("match3", "T12-d64-steps32000", '{"CHOSEN": 2, "PROBE": false}')
    assert len(chosen) == len(grids.ARMS) and all(f"-m3-{arm}-T12-" in " ".join(chosen) for arm in grids.ARMS)
    probe = training.profile_step_configs("match3", "T8-d64-steps32000",
                                          '{"CHOSEN": null, "CALIBRATION_SETTINGS": 6, "PROBE": true}')
    assert [name.split("-m3-")[1].split("-T8-")[0] for name in probe] == [*grids.CALIBRATION_ARMS, *grids.PROBE_ARMS]
    calibrating = training.profile_step_configs("match3", None,
                                                '{"CHOSEN": null, "CALIBRATION_SETTINGS": 1, "PROBE": false}')
    assert [name.split("-m3-")[1].split("-T12-")[0] for name in calibrating] == list(grids.CALIBRATION_ARMS)
    with pytest.raises(ValueError, match=r"unknown decisions \['NOPE'\].*CHOSEN"):
        training.profile_step_configs("match3", None, '{"NOPE": 1}')
    with pytest.raises(ValueError, match="has no decisions to replace"):
        training.profile_step_configs("quick", None, '{"CHOSEN": 1}')


def test_profile_step_configs_one_per_step_configuration():
    configs = training.profile_step_configs("quick")
    assert len(configs) == len(training.grid_configurations("quick")[0]) == 12
    assert all(not re.search(r"-s\d+$", name) for name in configs)
    assert set(training.profile_step_configs("quick", "brackets")) == {n for n in configs if "brackets" in n}


@pytest.mark.slow
def test_approximations_smoke_run(capsys):
    out = _bench(capsys, "approximations", "--smoke", "--threads", "1")
    assert out.startswith("Machine: ")
    assert "| 4 | exact | defaults |" in out and "| 4 | sqa | num_samples=1024 |" in out
    assert "| method | n = 6 | n = 12 |" in out and re.search(r"^\| sqa \| [\d.]+ ms \| [\d.]+ ms \|$", out, re.M)


def test_window_smoke_run(capsys, tmp_path):
    out = _bench(capsys, "window", "--T", "16", "--B", "1", "--W", "4", "--threads", "1", "--repeats", "1",
                 "--json", str(tmp_path / "w.json"))
    assert out.startswith("Machine: ")
    rows = _table_rows(out, "| layer | 1 thread: ms | x h |")
    assert rows[0].startswith("| h (sigmoid, materialised) |") and rows[0].endswith("| 1.00 |")
    assert any(r.startswith("| h+J window W=4 (exact) |") for r in rows)
    assert sum("range 8, tap (anderson)" in line for line in out.splitlines()) == 2  # timing and iterations
    assert re.search(r"^\| 0\.3 \| tap \| anderson \| \d+ \| \d+% \|", out, re.M)
    saved = json.loads((tmp_path / "w.json").read_text())
    assert saved["settings"]["T"] == 16 and set(saved["seconds"]["1"]) == {r.split(" | ")[0][2:] for r in rows}


def test_banded_smoke_run_against_a_baseline_commit(capsys, monkeypatch):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    monkeypatch.chdir(ROOT)
    out = _bench(capsys, "banded", "--T", "12", "--B", "1", "--threads", "1", "--repeats", "1", "--baseline", "HEAD",
                 "--heads", "2", "--d-model", "16")
    assert "d_model 16, 2 heads" in out
    rows = _table_rows(out, "| layer | 1 thread: ms | x h |")
    banded = "h+J relative range 8, banded (exact)"
    assert [r.split(" | ")[0][2:] for r in rows] == ["h (sigmoid, materialised)", banded, f"{banded} at HEAD"]
    assert "Mean field / TAP solver" not in out


def test_the_banded_baseline_row_times_the_old_module(monkeypatch):
    """The row 'at COMMIT' runs the functions of the module git shows for that commit, and only that row does;
    the layer is the same (the same weights) as today's row."""
    calls = {"old": 0}
    today = ising.banded

    def old_marginals(h, J, K, mask, **options):
        calls["old"] += 1
        return today.marginals(h, J, K, mask, **options)

    stub = types.SimpleNamespace(marginals=old_marginals, log_partition=today.log_partition)
    stub.marginals.__signature__ = inspect.signature(today.marginals)
    monkeypatch.setattr(layers, "module_at", lambda commit, path, name: stub)
    rows = layers.banded_layers(10, "OLD", d_model=16, heads=2)
    x = torch.randn(2, 10, 16)
    names = list(rows)
    assert calls["old"] == 0
    new_out = rows[names[1]](x)[0]
    assert calls["old"] == 0
    old_out = rows[names[2]](x)[0]
    assert calls["old"] == 1 and names[2].endswith("at OLD")
    torch.testing.assert_close(old_out, new_out, rtol=0, atol=0)
    seconds = layers.window_times(10, 1, 4, threads=1, repeats=2, baseline="OLD", banded_only=True, heads=2,
                                  d_model=16)
    assert set(seconds) == set(names) and calls["old"] == 1 + 3  # one warm-up and two rounds, that row only


def test_banded_baseline_that_git_cannot_show_is_a_clear_error(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match="cannot read src/boltzmann_attention/ising/banded.py at no-such-commit"):
        layers.banded_layers(8, "no-such-commit")


@pytest.mark.slow
def test_dqa_calibration_smoke_run(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "new" / "report"
    assert _bench(capsys, "dqa-calibration", str(out_dir), "--quick").strip() == f"wrote {out_dir / 'README.md'}"
    text = (out_dir / "README.md").read_text()
    assert "\nMachine: " in text and "![beta_eff and KL against energy scale and anneal time](calibration.png)" in text
    data = json.loads((out_dir / "calibration.json").read_text())
    assert [r["n"] for r in data["sizes"]] == [4, 8] and 0 < data["default_energy_scale"] < 1
    assert (out_dir / "calibration.png").stat().st_size > 1000


@pytest.mark.slow
def test_grid_throughput_smoke_run(capsys, deadline):
    deadline(300)
    out = _bench(capsys, "grid-throughput", "--before", str(ROOT), "--after", str(ROOT), "--profile", "quick",
                 "--steps", "1", "--rounds", "1")
    assert out.startswith("Machine: ") and "profile quick, 12 runs in 12 configurations" in out
    rows = _table_rows(out, "| task | T | mode | method | couplings | d_ff | before ms | after ms | after / before |")
    row = r"\| \w+ \| \d+ \| [\w+]+ \| exact \| full \| 128 \| [\d.]+ \| [\d.]+ \| [\d.]+x \|"
    assert len(rows) == 12 and all(re.fullmatch(row, r) for r in rows)
    assert "Median step ratio over configurations: " in out


@pytest.mark.slow
def test_grid_throughput_names_the_tree_that_failed(tmp_path):
    """A tree whose package cannot be imported from it fails by name, and is not replaced by an installed copy."""
    (tmp_path / "src" / "boltzmann_attention").mkdir(parents=True)  # no __init__.py: not the package
    config = [{"task": "shakespeare", "T": 4, "mode": "h"}]
    with pytest.raises(RuntimeError, match=rf"the before tree \({re.escape(str(tmp_path))}\) failed \(exit code 1\): "
                                           "boltzmann_attention was imported from"):
        training.grid_step_times(config, {"before": tmp_path}, 1, 1)
    (tmp_path / "src" / "boltzmann_attention" / "__init__.py").write_text("")  # the package, without experiments
    with pytest.raises(RuntimeError, match="failed \\(exit code 1\\): ModuleNotFoundError"):
        training.grid_step_times(config, {"before": tmp_path}, 1, 1)


def test_grid_configurations_split_by_step_cost_only():
    """Runs that differ in couplings are timed apart; runs that differ in lr, seed or length share a timing."""
    from boltzmann_attention.experiments.train import TrainConfig

    base = TrainConfig.build(T=64, mode="h+J", method="exact", coupling="window", coupling_window=16)
    assert training.step_key(base) == training.step_key(base.replace(lr=1e-2, seed=2, steps=9))
    relative = TrainConfig.build(T=64, mode="h+J", method="banded", coupling="relative", coupling_range=8)
    assert training.step_key(base) != training.step_key(base.replace(coupling_window=8))
    assert training._couplings(training.step_key(base)) == "window 16"
    assert training._couplings(training.step_key(relative)) == "relative 8"
    configs, runs = training.grid_configurations("realsize")
    assert len({training._couplings(c) for c in configs}) >= 3 and len(runs) > len(configs)
    assert all(0 <= i < len(configs) and steps > 0 for i, steps in runs)


@pytest.mark.slow
def test_grid_tree_without_a_needed_field_is_refused_by_name(monkeypatch):
    """A field the tree's TrainConfig lacks is dropped where it holds the default and refused otherwise."""
    from boltzmann_attention.experiments.train import TrainConfig

    config = {**training.step_key(TrainConfig.build(T=4, batch_size=2, d_model=8, d_ff=8)), "no_such_field": 3}
    with pytest.raises(RuntimeError, match=r"has no field for \{'no_such_field': 3\}"):
        training.grid_step_times([config], {"after": ROOT}, 1, 1)
    defaults = training._defaults()
    monkeypatch.setattr(training, "_defaults", lambda: {**defaults, "no_such_field": 3})
    times = training.grid_step_times([config], {"after": ROOT}, 1, 1)
    assert len(times["after"]) == 1 and times["after"][0] > 0


def test_time_steps_rounds_are_interleaved(monkeypatch):
    from boltzmann_attention.experiments.train import TrainConfig

    order = []
    monkeypatch.setattr(training, "train_step", lambda net, *a: order.append(id(net)))
    tiny = dict(T=4, batch_size=2, d_model=8, d_ff=8, warmup_steps=0, steps=5, eval_windows=4)
    configs = {"a": TrainConfig.build(mode="h", **tiny), "b": TrainConfig.build(mode="softmax", **tiny)}
    times = training.time_steps(configs, steps=2, rounds=2, warmup=1)
    a, b = order[0], order[1]
    assert order == [a, b] + [a, a, b, b] * 2 and [len(t) for t in times.values()] == [2, 2]


# ------------------------------------------------------------------------------------ the coupled window's paths

def test_window_paths_rows_time_both_paths_and_name_the_rules_choice(capsys):
    """The path benchmark at tiny sizes: a row per part and W, both paths timed, their ratio, the rule's path."""
    from boltzmann_attention.experiments.benchmarks import window_paths
    from boltzmann_attention.ising import window

    out = _bench(capsys, "window-paths", "--W", "2", "3", "--B", "1", "--H", "1", "--T", "6", "--rounds", "2")
    rows = [line for line in out.splitlines() if line.startswith("| attention") or line.startswith("| marginals")]
    assert [line.split(" | ")[:2] for line in rows] == [["| attention", "2"], ["| attention", "3"],
                                                       ["| marginals", "2"], ["| marginals", "3"]]
    assert all(line.endswith(f"| {window.choose_path(int(line.split(' | ')[1]), 'cpu')} |") for line in rows)
    row = {"part": "attention", "W": 8, "split_s": 0.1, "configurations_s": 0.25, "ratio": 2.5, "load": 1.0,
           "chosen": "split"}
    assert window_paths.path_table([row]).splitlines()[2] == "| attention | 8 | 100.0 | 250.0 | 2.50 | 1.0 | split |"



def test_chain_scan_rows_time_both_forms_per_chunk_length(capsys):
    from boltzmann_attention.experiments.benchmarks import chain_scan

    out = _bench(capsys, "chain-scan", "--chunks", "2", "5", "--B", "1", "--H", "1", "--T", "7", "--w", "2",
                 "--rounds", "2")
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| 7 |")]
    assert [r[:3] for r in rows] == [["| 7", "2", "2"], ["| 7", "2", "5"]]
    assert all(abs(float(r[4]) / float(r[3]) - float(r[5])) < 0.05 * float(r[5]) + 0.01 for r in rows)
    row = {"chunk_length": 8, "T": 52, "w": 4, "sequential_s": 0.1, "chunked_s": 0.25, "ratio": 2.5, "load": 1.0}
    assert chain_scan.scan_table([row]).splitlines()[2] == "| 52 | 4 | 8 | 100.0 | 250.0 | 2.50 | 1.0 |"

# ------------------------------------------------------------------------------------------------ the GPU check

def test_gpu_check_guards_each_cell(monkeypatch):
    """Out of memory: recorded, the layer's longer T skipped; a layer whose cell at 2T would take over cell_s (4 x a
    call at T, for the warm-up and each repeat) is not run there; past the budget every remaining cell is marked,
    none run."""
    from boltzmann_attention.experiments.benchmarks import gpu

    ran = []
    results = {"fast": lambda T: {"ms": 1.0, "peak_gb": 0.1}, "oom": lambda T: {"error": "OOM"},
               "slow": lambda T: {"ms": 5000.0 * T / 16, "peak_gb": 0.1}}
    monkeypatch.setattr(gpu, "layers", lambda T, s: {gpu.BASELINE: "fast", "oom": "oom", "slow": "slow"})

    def cell(make, T, s):
        ran.append((make, T))
        return results[make](T)

    monkeypatch.setattr(gpu, "time_cell", cell)
    s = gpu.dry_settings()
    s.sizes, s.cell_s, s.repeats = (16, 32, 64), 30.0 * 4, 3  # a cell of 4 calls
    rows = gpu.timing_rows(s, log=lambda *a, **k: None)
    assert rows["oom"] == {16: {"error": "OOM"}, 32: {"error": "not run (OOM at T=16)"},
                           64: {"error": "not run (OOM at T=16)"}}
    assert rows["slow"][16]["ms"] == 5000.0 and rows["slow"][32]["ms"] == 10000.0  # 4 x 10 s > 30 s: not at 64
    assert rows["slow"][64] == {"error": "not run (10.0 s at T=32)"}
    assert ("slow", 64) not in ran and [T for m, T in ran if m == "fast"] == [16, 32, 64]
    s.budget_s = -1.0
    rows = gpu.timing_rows(s, log=lambda *a, **k: None)
    assert all(cell == {"error": "not run (budget)"} for cells in rows.values() for cell in cells.values())


@pytest.mark.slow
def test_gpu_check_dry_run_writes_the_report(tmp_path, capsys):
    """`gpu --dry-run`: every layer timed at the tiny sizes on the CPU, the CUDA tests collected (not run), and the
    report with its stamp, the tests' line, the table (ratios to the SDPA row) and the window paths' ratios."""
    from boltzmann_attention.experiments.benchmarks import gpu

    out = _bench(capsys, "gpu", "--dry-run", "--out", str(tmp_path))
    assert f"wrote {tmp_path / 'gpu.md'}" in out
    text = (tmp_path / "gpu.md").read_text()
    assert text.startswith("# GPU check (dry run: tiny sizes on the CPU, not a measurement)")
    assert re.search(r"`python -m pytest tests/test_window\.py .* -k cuda .*--collect-only`: \d+ CUDA test cases "
                     r"collected in 8 files \(not run: dry run\)", text)
    table = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| layer")]
    names = list(gpu.layers(16, gpu.dry_settings(tmp_path)))
    assert [line.split(" | ")[0][2:] for line in table] == names
    for line in table:
        assert re.fullmatch(r"\| .+ \| [\d.]+ ms \([\d.]+x\) \| [\d.]+ ms \([\d.]+x\) \|", line), line
    assert "Window paths, configurations / split" in text and "W = 16: T = 16:" in text
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert set(data["rows"]) == set(names) and data["stamp"]["torch"] == torch.__version__


def test_gpu_check_refuses_a_machine_without_cuda(monkeypatch):
    from boltzmann_attention.experiments.benchmarks import gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="needs a CUDA device .* use --dry-run"):
        gpu.run(gpu.Settings())
