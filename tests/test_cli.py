"""The boltzmann-attention command: help, errors before training, where it writes, missing extras."""

import importlib.util
import json
from pathlib import Path

import pytest

from boltzmann_attention.experiments import cli

TINY = ["--task", "brackets", "--T", "4", "--steps", "3", "--batch-size", "8", "--eval-interval", "3",
        "--d-model", "16", "--d-ff", "16", "--warmup-steps", "1"]


@pytest.mark.parametrize("command", [[], ["train"], ["sweep"], ["report"], ["reproduce"], ["explore"]])
def test_help_of_every_command(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "boltzmann-attention" in out and "``" not in out


def test_train_help_shows_choices_defaults_and_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("{shakespeare,brackets,blocks,match3}", "{softmax,h,J,h+J,h+K,h+J+K,h+J-step,fox,stickbreaking,mta}",
                 "{torch,gpt2}", "{full,relative,window,keys,query}", "--learn-field-bias {true,false}",
                 "peak learning rate (AdamW) (default: 0.003)", "(default: -log(T) / 2)", "exact,gibbs"):
        assert text in out, text


@pytest.mark.parametrize("flag, value", [("--grad-clip", "-1"), ("--lr", "inf"), ("--field-bias-init", "nan"),
                                         ("--n-heads", "0"), ("--eval-interval", "0"), ("--weight-decay", "-5")])
def test_bad_values_are_refused_before_training(flag, value, capsys):
    assert cli.main(["train", flag, value, "--steps", "1"]) == 2
    assert f"{flag[2:].replace('-', '_')} must be" in capsys.readouterr().err


def test_a_misspelled_option_shows_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--stepz", "3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "boltzmann-attention train" in err and "unrecognized arguments: --stepz 3" in err


@pytest.mark.parametrize("value, message", [("{bad", "not valid JSON"), ("[1]", "expected a JSON object")])
def test_method_options_errors_name_the_option(value, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--method-options", value])
    err = capsys.readouterr().err
    assert "--method-options" in err and message in err and "loads" not in err


def test_invalid_choice_is_refused_before_training(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--mode", "K"])
    assert e.value.code == 2
    assert "invalid choice: 'K'" in capsys.readouterr().err


def test_train_says_where_it_writes_and_cleans_its_default_checkpoint(tmp_path, capsys):
    out = tmp_path / "sub" / "run.json"
    assert cli.main(["train", *TINY, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"results -> {out}" in err and f"checkpoint -> {tmp_path / 'sub' / 'run.ckpt.pt'}" in err
    assert json.loads(out.read_text())["config"]["steps"] == 3
    assert not (tmp_path / "sub" / "run.ckpt.pt").exists()  # removed once the result is written


def test_unwritable_out_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert cli.main(["train", *TINY, "--out", str(blocker / "run.json")]) == 2
    assert str(blocker) in capsys.readouterr().err


def test_sweep_set_errors_name_the_field(tmp_path, capsys):
    assert cli.main(["sweep", "--out", str(tmp_path), "--set", "stepz=3"]) == 2
    assert "--set 'stepz=3'" in capsys.readouterr().err
    assert cli.main(["sweep", "--out", str(tmp_path), "--set", "init=gpt2"]) == 2
    assert "must be JSON" in capsys.readouterr().err


def test_a_missing_extra_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "rep")])
    assert "needs matplotlib" in str(e.value)
    assert 'pip install "boltzmann-attention[experiments]"' in str(e.value)  # a wheel user can run it too
    assert not (tmp_path / "rep").exists()  # nothing written before the check


def test_training_runs_without_tqdm(tmp_path, monkeypatch, capsys):
    """A base install has no tqdm: the progress display falls back to plain lines."""
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name == "tqdm" or name.startswith("tqdm."):
            raise ImportError("No module named 'tqdm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    assert cli.main(["train", *TINY, "--out", str(tmp_path / "run.json")]) == 0
    assert "brackets T=4 h+J: 3/3 steps" in capsys.readouterr().err


def test_reproduce_keeps_the_old_recipe_one_flag_away(tmp_path, monkeypatch):
    from boltzmann_attention.experiments import sweep as sweep_module

    seen = {}

    def fake_sweep(grids, out, jobs=1, **executor):
        seen["inits"] = {cfg.init for g in grids for _, cfg in g.runs()}
        seen["out"] = str(out)
        return []

    monkeypatch.setattr(sweep_module, "sweep", fake_sweep)
    monkeypatch.setattr(cli, "_write_report", lambda results, out: out)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["reproduce", "--profile", "quick", "--init", "torch"]) == 0
    assert seen == {"inits": {"torch"}, "out": "results/quick-init-torch"}
    assert cli.main(["reproduce", "--profile", "quick"]) == 0
    assert seen["inits"] == {"gpt2"}
    assert cli.main(["reproduce", "--profile", "baselines", "--init", "torch"]) == 2


def test_reproduce_resumes_from_a_report_archive(tmp_path, monkeypatch, capsys):
    """--resume-from unpacks the archive's runs into the results folder before the sweep, which finds them
    finished; a different result already there stops it before any run."""
    from boltzmann_attention.experiments import sweep as sweep_module

    archive = Path(__file__).resolve().parents[1] / "report" / "twin" / "runs.jsonl.gz"
    if not archive.exists():
        pytest.skip("no committed twin report")
    seen = {}

    def fake_sweep(grids, out, jobs=1, **executor):
        seen["runs"] = sorted(p.name for p in (out / "runs").glob("*.json"))
        return []

    monkeypatch.setattr(sweep_module, "sweep", fake_sweep)
    monkeypatch.setattr(cli, "_write_report", lambda results, out: out)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["reproduce", "--profile", "twin", "--no-estimate", "--resume-from", str(archive)]) == 0
    from boltzmann_attention.experiments.results import load_runs
    assert seen["runs"] == sorted(f"{r.raw['run']}.json" for r in load_runs(archive))
    assert f"unpacked {len(seen['runs'])} runs" in capsys.readouterr().out
    first = tmp_path / "results" / "twin" / "runs" / seen["runs"][0]
    first.write_text(first.read_text().replace('"seed"', '"seed_"', 1))
    seen.clear()
    assert cli.main(["reproduce", "--profile", "twin", "--no-estimate", "--resume-from", str(archive)]) == 2
    assert "already holds another result" in capsys.readouterr().err and seen == {}


def test_results_recorded_before_a_field_existed_read_as_what_they_used(tmp_path):
    """Old results have no 'init' (they used PyTorch's defaults): reports must not take them for gpt2."""
    import json as json_module

    from test_report import shakespeare_val, write_run

    from boltzmann_attention.experiments.results import load_runs

    path = write_run(tmp_path, "shakespeare", 8, "softmax", 0, val=shakespeare_val(7.0))
    from boltzmann_attention.experiments.config import TrainConfig

    result = json_module.loads(path.read_text())
    flat = TrainConfig.from_dict(result["config"]).flat()  # as results were written before the nesting
    result["config"] = {k: v for k, v in flat.items() if k not in ("init", "beta2", "fused_optimizer")}
    path.write_text(json_module.dumps(result))
    (run,) = load_runs(tmp_path)
    assert (run.config["init"], run.config["beta2"], run.config["fused_optimizer"]) == ("torch", 0.95, False)


def test_bracket_difficulty_options_reach_the_config():
    parser, _ = cli.build_parser()
    args = parser.parse_args(["train", "--task", "brackets", "--train-sequences", "500", "--min-fill", "0.5",
                              "--max-fill", "0.75", "--open-probability", "0.8", "--deduplicate", "true"])
    assert (args.train_sequences, args.min_fill, args.max_fill, args.open_probability, args.deduplicate) == (
        500, 0.5, 0.75, 0.8, True)
    assert cli._sweep_overrides(["deduplicate=true", "min_fill=0.5", "train_sequences=2000"]) == {
        "deduplicate": True, "min_fill": 0.5, "train_sequences": 2000}


def test_coupling_options_reach_the_config():
    parser, _ = cli.build_parser()
    args = parser.parse_args(["train", "--coupling", "window", "--coupling-window", "16", "--coupling-window-relative",
                              "true", "--memory-probe-steps", "5"])
    assert (args.coupling, args.coupling_window, args.coupling_window_relative, args.coupling_range,
            args.memory_probe_steps) == ("window", 16, True, None, 5)
    args = parser.parse_args(["train", "--coupling", "relative", "--coupling-range", "8"])
    assert (args.coupling_range, args.coupling_window) == (8, None)
    assert parser.parse_args(["train", "--coupling-range", "none"]).coupling_range is None


def test_bad_bracket_option_is_refused_before_training(capsys):
    assert cli.main(["train", "--task", "brackets", "--open-probability", "1.5", "--steps", "1"]) == 2
    assert "open_probability must be" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["train", "--out", "", "--steps", "1"],
    ["train", "--out", "x" * 300 + ".json", "--steps", "1"],
    ["sweep", "--out", "{file}/results", "--seeds", "0", "--set", "steps=1"],
    ["report", "--results", "{tmp}", "--out", "{file}/report"],
    ["reproduce", "--profile", "quick", "--out", "{file}/results"],
    ["reproduce", "--profile", "quick", "--out", "{tmp}/results", "--report", "{file}/report"],
])
def test_an_unusable_output_path_is_one_line_before_any_run(tmp_path, command, capsys, monkeypatch):
    from boltzmann_attention.experiments import sweep
    from boltzmann_attention.experiments.train import loop

    monkeypatch.setattr(loop, "_train", lambda *a: pytest.fail("training started"))
    monkeypatch.setattr(sweep, "sweep", lambda *a, **k: pytest.fail("the sweep started"))
    (tmp_path / "file").write_text("a regular file")
    monkeypatch.chdir(tmp_path)
    argv = [a.format(file=tmp_path / "file", tmp=tmp_path) for a in command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "folder" in err or "cannot write" in err


def test_train_writes_where_report_reads(tmp_path, capsys, monkeypatch):
    """train's default result file is in results/runs/, where report looks by default."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--task", "brackets", "--T", "4", "--steps", "2", "--warmup-steps", "0",
                     "--eval-interval", "2", "--d-model", "8", "--d-ff", "8", "--batch-size", "4"]) == 0
    assert len(list((tmp_path / "results" / "runs").glob("*.json"))) == 1
    assert cli.main(["report"]) == 0
    assert (tmp_path / "report" / "results" / "README.md").exists()


def test_a_warning_of_the_config_is_said_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning) as caught:
        cli.main(["train", "--task", "brackets", "--T", "4", "--steps", "2", "--d-model", "8", "--d-ff", "8",
                  "--batch-size", "4", "--eval-interval", "2"])
    assert sum("never reaches lr" in str(w.message) for w in caught) == 1


def test_reproduce_says_what_its_runs_will_cost_before_it_starts(tmp_path, capsys, monkeypatch):
    from boltzmann_attention.experiments import studies
    from boltzmann_attention.experiments import sweep as sweep_module

    monkeypatch.chdir(tmp_path)
    tiny = dict(steps=3, batch_size=2, d_model=8, d_ff=8, warmup_steps=0, eval_interval=3)
    grids = [sweep_module.Grid(("brackets",), (4,), ("softmax", "h"), seeds=(0, 1), overrides=tiny)]
    message = cli._estimate(grids, tmp_path, jobs=2)
    assert message.startswith("4 runs to do: under a minute of one core, under a minute with 2 jobs, ")
    assert "of their 2 step configurations" in message
    monkeypatch.setattr(studies, "profile", lambda name, field_bias: grids)
    monkeypatch.setattr(sweep_module, "sweep", lambda grids, out, jobs=1, dry_run=False, **executor: [])
    monkeypatch.setattr(cli, "_write_report", lambda results, out: out)
    monkeypatch.setattr(cli, "_estimate", lambda grids, out, jobs, finished=(): "ESTIMATE")
    assert cli.main(["reproduce", "--profile", "fair", "--out", str(tmp_path / "r")]) == 0
    assert "ESTIMATE" in capsys.readouterr().out
    assert cli.main(["reproduce", "--profile", "fair", "--out", str(tmp_path / "r"), "--no-estimate"]) == 0
    assert "ESTIMATE" not in capsys.readouterr().out
    monkeypatch.setattr(sweep_module, "sweep", lambda *a, **k: pytest.fail("the sweep started"))
    assert cli.main(["reproduce", "--profile", "quick", "--out", str(tmp_path / "q"), "--estimate-only"]) == 0
    assert capsys.readouterr().out.strip() == "ESTIMATE"  # the quick profile too, when asked; then it stops
    assert cli.main(["reproduce", "--profile", "fair", "--estimate-only", "--no-estimate"]) == 2
    assert not (tmp_path / "q").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize("step_s, one_core, two_jobs", [
    (0.5, "under a minute", "under a minute"),
    (100.0, "about 20 min", "about 10 min"),  # 4 runs x 3 steps x 100 s = 1200 s
    (300.0, "about 1.0 h", "about 30 min"),
    (1000.0, "about 3.3 h", "about 1.7 h")])
def test_an_estimate_under_an_hour_is_in_minutes(tmp_path, monkeypatch, step_s, one_core, two_jobs):
    from boltzmann_attention.experiments import sweep as sweep_module
    from boltzmann_attention.experiments.benchmarks import training

    monkeypatch.setattr(training, "time_steps", lambda configs, **_: {name: [step_s] for name in configs})
    grids = [sweep_module.Grid(("brackets",), (4,), ("softmax", "h"), seeds=(0, 1),
                               overrides=dict(steps=3, warmup_steps=0))]
    message = cli._estimate(grids, tmp_path, jobs=2)
    assert message.startswith(f"4 runs to do: {one_core} of one core, {two_jobs} with 2 jobs, ")
    one = cli._estimate(grids, tmp_path, jobs=1, finished={name for name, _ in grids[0].runs()[1:]})
    assert one.startswith("1 run to do: ") and "with 1 job, " in one and "their 1 step configuration " in one


def test_estimate_only_writes_nothing_and_counts_an_archive_to_resume_from(tmp_path, monkeypatch, capsys):
    """No results or report folder is created, and --resume-from's archive is read, not unpacked: its runs are
    left out of the estimate."""
    from test_report import brackets_metrics, write_run

    from boltzmann_attention.experiments import studies
    from boltzmann_attention.experiments import sweep as sweep_module
    from boltzmann_attention.experiments.results import load_runs, write_archive

    monkeypatch.chdir(tmp_path)
    grids = [sweep_module.Grid(("brackets",), (4,), ("softmax",), seeds=(0, 1),
                               overrides=dict(steps=3, warmup_steps=0))]
    monkeypatch.setattr(studies, "profile", lambda name, field_bias: grids)
    seen = {}
    monkeypatch.setattr(cli, "_estimate", lambda grids, out, jobs, finished=(): seen.update(finished=finished) or "E")
    write_run(tmp_path / "old", "brackets", 4, "softmax", 0, val=brackets_metrics(0.9))
    archive = write_archive(load_runs(tmp_path / "old"), tmp_path / "old")
    before = sorted(tmp_path.rglob("*"))
    assert cli.main(["reproduce", "--profile", "fair", "--estimate-only"]) == 0
    assert cli.main(["reproduce", "--profile", "fair", "--estimate-only", "--resume-from", str(archive)]) == 0
    assert sorted(tmp_path.rglob("*")) == before  # no results/ or report/ folder, nothing unpacked
    assert seen["finished"] == {r.raw["run"] for r in load_runs(archive)} and seen["finished"]
    (tmp_path / "results").write_text("a file where the results folder goes")
    assert cli.main(["reproduce", "--profile", "fair", "--estimate-only"]) == 2
    assert "results is not a folder" in capsys.readouterr().err


def test_run_counts_agree_with_their_number(tmp_path, monkeypatch, capsys):
    from boltzmann_attention.experiments import sweep as sweep_module
    from boltzmann_attention.experiments.progress import progress

    monkeypatch.setattr(sweep_module, "sweep", lambda grids, out, jobs=1, **executor: ["one"])
    assert cli.main(["sweep", "--tasks", "brackets", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"1 run done -> {tmp_path}/runs"
    monkeypatch.setattr(sweep_module, "sweep", lambda grids, out, jobs=1, **executor: ["one", "two"])
    assert cli.main(["sweep", "--tasks", "brackets", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"2 runs done -> {tmp_path}/runs"
    for _ in progress([0], desc="sweep", unit="run"):
        pass
    assert capsys.readouterr().err.strip() == "sweep: 1/1 run"


def test_train_takes_its_checkpoint_interval(tmp_path, monkeypatch):
    from boltzmann_attention.experiments.train import loop

    seen = {}
    monkeypatch.setattr(loop, "_train", lambda cfg, checkpoint, interval, progress, analyses: seen.update(
        interval=interval))
    assert cli.main(["train", "--steps", "3", "--warmup-steps", "0", "--checkpoint-interval", "7", "--out",
                     str(tmp_path / "r.json")]) == 0
    assert seen == {"interval": 7}
    assert cli.main(["train", "--checkpoint-interval", "0", "--out", str(tmp_path / "r.json")]) == 2


def test_report_help_names_each_default_once(capsys):
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: report/<name of the results folder>)" in out and "(default: None)" not in out


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(capsys):
    from boltzmann_attention.experiments.progress import progress

    bar = progress(total=20, desc="run", unit="step")
    for _ in range(20):
        bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err and err.splitlines()[0] == "run: 1/20 steps" and err.splitlines()[-1] == "run: 20/20 steps"


def test_a_result_of_another_config_is_never_replaced(tmp_path, monkeypatch, capsys):
    """A full h+J run and a window h+J run sent to one file: the second stops before training, the file stays."""
    monkeypatch.chdir(tmp_path)
    tiny = ["--T", "6", "--mode", "h+J", "--steps", "2", "--warmup-steps", "0", "--eval-interval", "2",
            "--d-model", "8", "--d-ff", "8", "--batch-size", "4", "--out", "results/runs/one.json"]
    assert cli.main(["train", *tiny]) == 0
    (path,) = (tmp_path / "results" / "runs").glob("*.json")
    first = path.read_text()
    assert cli.main(["train", *tiny, "--coupling", "window", "--coupling-window", "4"]) == 2
    err = capsys.readouterr().err
    assert "holds a run of another config" in err and "'coupling': ('full', 'window')" in err
    assert path.read_text() == first
    assert cli.main(["train", *tiny]) == 0  # the same config again: a rerun of it


def test_two_runs_whose_readable_names_agree_get_two_files_and_two_labels(tmp_path, capsys, monkeypatch):
    """A full h+J run and a window h+J run at the same T, seed and variant: neither replaces the other, and the
    report shows each under a label that says how they differ."""
    monkeypatch.chdir(tmp_path)
    tiny = ["--task", "brackets", "--T", "6", "--mode", "h+J", "--steps", "2", "--warmup-steps", "0",
            "--eval-interval", "2", "--d-model", "8", "--d-ff", "8", "--batch-size", "4"]
    assert cli.main(["train", *tiny]) == 0
    assert cli.main(["train", *tiny, "--coupling", "window", "--coupling-window", "4"]) == 0
    files = sorted((tmp_path / "results" / "runs").glob("*.json"))
    assert len(files) == 2 and all(f.name.startswith("brackets-T6-h+J-exact-base-s0-") for f in files)
    assert cli.main(["report"]) == 0
    readme = (tmp_path / "report" / "results" / "README.md").read_text()
    for label in ("base [coupling=full, coupling_window=None]", "base [coupling=window, coupling_window=4]"):
        assert label in readme
    capsys.readouterr()


def test_executor_options_take_plain_words_and_need_the_submitit_executor(tmp_path, monkeypatch):
    from boltzmann_attention.experiments import sweep as sweep_module

    seen = {}
    monkeypatch.setattr(sweep_module, "sweep", lambda grids, out, jobs=1, **executor: seen.update(executor) or [])
    argv = ["sweep", "--tasks", "brackets", "--T", "4", "--out", str(tmp_path), "--executor", "submitit",
            "--executor-option", "cluster=slurm", "timeout_min=600", 'slurm_partition="cpu"']
    assert cli.main(argv) == 0
    assert seen == {"executor": "submitit",
                    "executor_options": {"cluster": "slurm", "timeout_min": 600, "slurm_partition": "cpu"}}
    monkeypatch.undo()
    assert cli.main(["sweep", "--tasks", "brackets", "--T", "4", "--out", str(tmp_path / "x"), "--executor-option",
                     "cluster=local"]) == 2
    assert cli.main(["sweep", "--set", "steps=two"]) == 2  # config overrides stay strict JSON


def _failing_sweep(tmp_path) -> list[str]:
    """A sweep of one run whose checkpoint is not one: the run fails, at its start."""
    from boltzmann_attention.experiments.sweep import Grid, run_name

    grid = Grid(("brackets",), (4,), modes=("h",), seeds=(0,))
    (tmp_path / "checkpoints").mkdir(parents=True)
    (tmp_path / "checkpoints" / f"{run_name(grid.runs()[0][1])}.pt").write_text("not a checkpoint")
    return ["sweep", "--tasks", "brackets", "--T", "4", "--modes", "h", "--seeds", "0", "--out", str(tmp_path)]


SWEEP = ["sweep", "--tasks", "brackets", "--T", "4", "--modes", "h", "--seeds", "0", "--executor", "submitit"]
CLI_ERRORS = {  # argv (OUT: the test's folder), exit status, what the line names
    "a failed run": (None, 1, r"^error: RuntimeError: 1 of 1 run failed: brackets-T4-h-exact-base-s0: ValueError: "
                              r"checkpoint .*brackets-T4-h-exact-base-s0.pt is corrupted"),
    "an unknown executor option": ([*SWEEP, "--executor-option", "cluster=local", "bogus=1"], 2,
                                   r"^error: executor_options \{'bogus': 1\}: Parameter 'bogus'"),
    "a mistyped executor option": ([*SWEEP, "--executor-option", "cluster=local", "timeout_min=x"], 2,
                                   r"^error: executor_options \{'timeout_min': 'x'\}: Parameter \"timeout_min\""),
    "slurm off a cluster": ([*SWEEP, "--executor-option", "cluster=slurm"], 2,
                            r"^error: executor option cluster='slurm': Could not detect \"srun\""),
    "cpus_per_task a word": ([*SWEEP, "--executor-option", "cpus_per_task=four"], 2,
                             r"^error: executor option cpus_per_task must be an integer >= 1, got 'four'$"),
    "cpus_per_task 0": ([*SWEEP, "--executor-option", "cpus_per_task=0"], 2,
                        r"^error: executor option cpus_per_task must be an integer >= 1, got 0$"),
    "sweep --jobs 0": (["sweep", "--jobs", "0"], 2, r"^error: --jobs must be an integer >= 1 .*, got 0$"),
    "reproduce --jobs 0": (["reproduce", "--jobs", "0"], 2, r"^error: --jobs must be an integer >= 1 .*, got 0$"),
    "reproduce --jobs -2": (["reproduce", "--jobs", "-2"], 2, r"^error: --jobs must be an integer >= 1 .*, got -2$"),
}


@pytest.mark.parametrize("case", sorted(CLI_ERRORS))
def test_every_error_is_one_line_naming_the_option_or_file(case, tmp_path, capsys, monkeypatch):
    import re
    import shutil

    pytest.importorskip("submitit")
    if case == "slurm off a cluster" and shutil.which("srun"):
        pytest.skip("on a Slurm cluster")
    monkeypatch.chdir(tmp_path)
    argv, status, line = CLI_ERRORS[case]
    argv = _failing_sweep(tmp_path / "out") if argv is None else [*argv, "--out", str(tmp_path / "out")]
    assert cli.main(argv) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()  # a sweep's progress lines, then the error, whole on the last line
    assert [x for x in lines if x.startswith("error")] == lines[-1:] and re.search(line, lines[-1]), err
    if case != "a failed run":
        assert not (tmp_path / "out" / "runs").exists()  # refused before any run


def test_train_never_replaces_a_result_of_another_config_written_while_it_trained(tmp_path, capsys, monkeypatch):
    """Two trainings into one file: the other config's result, written while this one trained, stays; this one is
    kept beside it and the command fails in one line naming both."""
    from boltzmann_attention.experiments import train as train_module

    out = tmp_path / "run.json"
    real = train_module.train

    def interleaved(cfg, **kwargs):
        monkeypatch.setattr(train_module, "train", real)
        assert cli.main(["train", *TINY, "--d-ff", "32", "--out", str(out)]) == 0
        return real(cfg, **kwargs)

    monkeypatch.setattr(train_module, "train", interleaved)
    capsys.readouterr()
    assert cli.main(["train", *TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "holds a run of another config" in err[-1] and f"kept as {out}.conflict" in err[-1]
    assert json.loads(out.read_text())["config"]["arch"]["d_ff"] == 32
    assert json.loads(Path(f"{out}.conflict").read_text())["config"]["arch"]["d_ff"] == 16


def test_blocks_on_the_defaults_names_the_T_and_the_couplings_it_needs(tmp_path, capsys):
    """The defaults (T = 8, full couplings solved exactly) cannot hold a find-the-block sequence: the error says which
    T it needs and, since full couplings stop at 24 keys, which couplings; the run it describes trains."""
    assert cli.main(["train", "--task", "blocks", "--steps", "1", "--out", str(tmp_path / "a.json")]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the line that says where the run would write
    assert err.startswith("error: ") and "needs T >= 67, got T = 8" in err and "coupling='window'" in err, err
    assert not (tmp_path / "a.json").exists()
    # a mode without couplings needs the T alone
    assert cli.main(["train", "--task", "blocks", "--mode", "softmax", "--steps", "1"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "needs T >= 67" in err and "coupling" not in err, err
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert "blocks needs T >= 67 at its default sizes" in " ".join(capsys.readouterr().out.split())
    out = tmp_path / "b.json"
    assert cli.main(["train", "--task", "blocks", "--T", "67", "--coupling", "window", "--coupling-window", "4",
                     "--steps", "1", "--warmup-steps", "0", "--batch-size", "2", "--d-model", "8", "--d-ff", "0",
                     "--out", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["test"]["error"] >= 0
