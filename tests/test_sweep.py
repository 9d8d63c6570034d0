"""The sweep: a result counts as finished only when it is whole, and concurrent runs share the cores."""

import json
import math
import os

import pytest

from boltzmann_attention.experiments import sweep as sweep_module
from boltzmann_attention.experiments.sweep import Grid, run_name, sweep, threads_per_run

TINY = dict(steps=3, batch_size=8, eval_interval=3, eval_windows=16, d_model=8, d_ff=16, warmup_steps=1)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A sweep of two tiny runs, done once; each test works on a copy."""
    out = tmp_path_factory.mktemp("sweep")
    grid = Grid(("brackets",), (4,), modes=("softmax", "h"), seeds=(0,), overrides=TINY)
    assert len(sweep([grid], out)) == 2
    return grid, {p.name: p.read_text() for p in (out / "runs").glob("*.json")}


def _copy(finished, tmp_path):
    grid, files = finished
    (tmp_path / "runs").mkdir()
    for name, text in files.items():
        (tmp_path / "runs" / name).write_text(text)
    return grid, [run_name(cfg) for _, cfg in grid.runs()]


def test_a_rerun_says_how_many_runs_it_skipped(finished, tmp_path, capsys):
    grid, names = _copy(finished, tmp_path)
    capsys.readouterr()
    assert sweep([grid], tmp_path) == []
    assert capsys.readouterr().out.splitlines() == [f"skipped 2 finished runs in {tmp_path / 'runs'}"]
    assert sweep([grid], tmp_path, dry_run=True) == []


@pytest.mark.parametrize("breakage", ["truncated", "nan", "no metrics"])
def test_a_broken_result_is_run_again_and_kept_aside(finished, tmp_path, capsys, breakage):
    grid, names = _copy(finished, tmp_path)
    path = tmp_path / "runs" / f"{names[1]}.json"
    text = path.read_text()
    if breakage == "truncated":
        broken = text[: len(text) // 2]
    else:
        d = json.loads(text)
        if breakage == "nan":
            d["metrics"]["test"]["accuracy"] = math.nan
        else:
            del d["metrics"]
        broken = json.dumps(d)
    path.write_text(broken)
    capsys.readouterr()
    assert sweep([grid], tmp_path, dry_run=True) == [names[1]]  # a dry run renames nothing
    assert path.read_text() == broken
    assert sweep([grid], tmp_path) == [names[1]]
    out = capsys.readouterr().out
    assert "skipped 1 finished run in" in out and f"re-running {names[1]}: its result is broken (" in out
    assert (tmp_path / "runs" / f"{names[1]}.json.broken").read_text() == broken  # nothing deleted
    assert json.loads(path.read_text())["metrics"]["test"]["accuracy"] >= 0  # a whole result again
    path.write_text(broken)
    sweep([grid], tmp_path)
    assert (tmp_path / "runs" / f"{names[1]}.json.broken-2").read_text() == broken


def test_threads_never_oversubscribe_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(sweep_module, "available_cores", lambda: 2)
    assert [threads_per_run(jobs) for jobs in (1, 2, 3)] == [2, 1, 1]
    monkeypatch.setattr(sweep_module, "available_cores", lambda: 16)
    assert [threads_per_run(jobs) for jobs in (1, 2, 3, 16)] == [16, 8, 5, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a cap set by the user, e.g. for two sweeps side by side
    assert threads_per_run(1) == 2 and threads_per_run(16) == 1
    assert threads_per_run(4, threads=3) == 3
    with pytest.raises(ValueError, match="threads must be at least 1"):
        threads_per_run(1, threads=0)


def test_parallel_children_get_their_thread_count_before_torch_starts(monkeypatch, tmp_path):
    """The pool's children inherit OMP_NUM_THREADS = cores // jobs, and the parent's environment is restored."""
    seen = {}

    class FakePool:
        def __init__(self, jobs, initializer=None):
            seen["jobs"], seen["env"] = jobs, {k: os.environ.get(k) for k in sweep_module.THREAD_VARIABLES}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def imap_unordered(self, fn, tasks):
            seen["threads"] = {t[5] for t in tasks}
            return [(t[0], None) for t in tasks]

    class FakeContext:
        Pool = FakePool

    monkeypatch.setattr(sweep_module.mp, "get_context", lambda method: FakeContext)
    monkeypatch.setattr(sweep_module, "available_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")
    grid = Grid(("brackets",), (4,), modes=("softmax", "h"), seeds=(0,), overrides=TINY)
    assert len(sweep([grid], tmp_path, jobs=2)) == 2
    assert seen["jobs"] == 2 and seen["threads"] == {1}
    assert seen["env"] == {k: "1" for k in sweep_module.THREAD_VARIABLES}
    assert "OMP_NUM_THREADS" not in os.environ and os.environ["MKL_NUM_THREADS"] == "7"


def test_a_finished_run_keeps_its_trained_model_and_it_gives_the_recorded_loss(tmp_path):
    from boltzmann_attention.experiments.train import load_final

    grid = Grid(("shakespeare",), (8,), modes=("h",), seeds=(0,), overrides=TINY)
    (name,) = [run_name(cfg) for _, cfg in grid.runs()]
    assert sweep([grid], tmp_path) == [name]
    assert not (tmp_path / "checkpoints" / f"{name}.pt").exists()
    task, model = load_final(tmp_path / "final" / f"{name}.pt")
    recorded = json.loads((tmp_path / "runs" / f"{name}.json").read_text())["metrics"]["val"]
    assert task.evaluate(model) == pytest.approx(recorded, rel=1e-6)


def _training_workers(parent, out) -> list[int]:
    """The pids of a two-job sweep's workers, once both are training (each has written a checkpoint)."""
    import subprocess
    import time

    deadline = time.monotonic() + 120
    while len(list((out / "checkpoints").glob("*.pt"))) < 2:
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.2)
    return [int(p) for p in subprocess.run(["pgrep", "-P", str(parent.pid), "-f", "spawn_main"],
                                           capture_output=True, text=True).stdout.split()]


def _all_end(workers: list[int]) -> None:
    import time

    deadline = time.monotonic() + 30
    while any(_alive(p) for p in workers):
        assert time.monotonic() < deadline, "the workers ran on after their sweep ended"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_killed_sweep_stops_its_workers(tmp_path):
    """SIGTERM to a sweep of two parallel runs ends the workers too, not only the parent."""
    import signal
    import subprocess
    import sys

    grid = f"Grid(('shakespeare',), (4,), modes=('softmax', 'h'), seeds=(0,), overrides={dict(TINY, steps=10**6)!r})"
    script = (f"from boltzmann_attention.experiments.sweep import Grid, sweep\n"
              f"sweep([{grid}], {str(tmp_path)!r}, jobs=2)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        workers = _training_workers(parent, tmp_path)
        assert len(workers) == 2
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) != 0
        _all_end(workers)
    finally:
        parent.kill()


@pytest.mark.slow
def test_ctrl_c_stops_a_parallel_sweep_in_one_line(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) ends the command with exit 130 and
    one line saying how to resume, with no traceback from the parent or its workers, and no worker left."""
    import os
    import signal
    import subprocess
    import sys

    command = [sys.executable, "-m", "boltzmann_attention.experiments.cli", "sweep", "--T", "4", "--modes", "softmax",
               "h", "--seeds", "0", "--jobs", "2", "--out", str(tmp_path)]
    command += ["--set", *[f"{k}={json.dumps(v)}" for k, v in dict(TINY, steps=10**6).items()]]
    log = tmp_path / "stderr.txt"  # a file, not a pipe: the workers hold their copy of stderr until they end
    with open(log, "w") as err:
        # a terminal's job: SIGINT at its default (a shell's background job inherits it ignored, as this test may)
        parent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        workers = _training_workers(parent, tmp_path)
        os.killpg(parent.pid, signal.SIGINT)
        assert parent.wait(timeout=120) == 130
        _all_end(workers)
        text = log.read_text()
        assert "Traceback" not in text and text.strip().splitlines()[-1].startswith("interrupted (the same command")
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_finished_result_of_another_config_stops_the_sweep_before_any_run(tmp_path):
    grid = Grid(("brackets",), (4,), modes=("h",), seeds=(0,), overrides=TINY)
    sweep([grid], tmp_path)
    other = Grid(("brackets",), (4,), modes=("h",), seeds=(0,), overrides={**TINY, "d_ff": 32})
    with pytest.raises(ValueError, match=r"holds a run of another config .*'d_ff': \(16, 32\)"):
        sweep([other], tmp_path, dry_run=True)


def _trained(files: dict) -> dict:
    """{name: what a run trained and measured}: its config, metrics and history (timings and machine aside)."""
    return {name: {k: json.loads(text)[k] for k in ("config", "metrics", "history", "run", "variant")}
            for name, text in files.items()}


@pytest.mark.slow
def test_the_submitit_executor_writes_the_results_the_process_pool_does(finished, tmp_path, capsys):
    """The same tiny sweep as submitit jobs (its local executor: each job a subprocess) gives the same result
    files, resumes the same way and refuses options it cannot pass on."""
    pytest.importorskip("submitit")
    grid, files = finished
    local = {"cluster": "local", "timeout_min": 5}
    threads = threads_per_run(1)  # the pool's: another thread count rounds differently
    assert sorted(sweep([grid], tmp_path, executor="submitit", executor_options=local, threads=threads)) == sorted(
        run_name(cfg) for _, cfg in grid.runs())
    got = {p.name: p.read_text() for p in (tmp_path / "runs").glob("*.json")}
    assert _trained(got) == _trained(files)
    assert "through submitit (local; logs in" in capsys.readouterr().out
    assert sweep([grid], tmp_path, executor="submitit", executor_options={"cluster": "local"}) == []  # resumed
    with pytest.raises(ValueError, match="executor_options apply to executor 'submitit' only") as refused:
        sweep([grid], tmp_path / "other", executor_options={"cluster": "local"})
    assert "--threads" not in str(refused.value)  # sweep and reproduce take no --threads: the hint names --jobs
    with pytest.raises(ValueError, match="unknown executor 'ray'"):
        sweep([grid], tmp_path / "other", executor="ray")


@pytest.mark.slow
def test_a_run_that_fails_inside_a_submitit_job_is_reported_like_a_local_one(tmp_path):
    pytest.importorskip("submitit")
    (tmp_path / "checkpoints").mkdir()
    grid = Grid(("brackets",), (4,), modes=("h",), seeds=(0,), overrides=TINY)
    (tmp_path / "checkpoints" / f"{run_name(grid.runs()[0][1])}.pt").write_text("not a checkpoint")
    with pytest.raises(RuntimeError, match="1 of 1 run failed"):
        sweep([grid], tmp_path, executor="submitit", executor_options={"cluster": "local"})


def test_two_sweeps_of_different_configs_never_replace_each_others_result(tmp_path, monkeypatch):
    """Both find the run's place free when they start; the other one writes its result while this one trains.
    The first result stays, the second is kept beside it, and the second sweep fails naming both."""
    mine = Grid(("brackets",), (4,), modes=("h",), seeds=(0,), overrides=TINY)
    other = Grid(("brackets",), (4,), modes=("h",), seeds=(0,), overrides={**TINY, "d_ff": 32})
    name = run_name(mine.runs()[0][1])
    real_train = sweep_module.train

    def interleaved(cfg, **kwargs):
        monkeypatch.setattr(sweep_module, "train", real_train)
        assert sweep([other], tmp_path) == [name]  # the other sweep, start to end, while this run trains
        return real_train(cfg, **kwargs)

    monkeypatch.setattr(sweep_module, "train", interleaved)
    with pytest.raises(RuntimeError, match=rf"1 of 1 run failed:\n{name}: ValueError: .*holds a run of another "
                                           rf"config .*'d_ff': \(32, 16\).* kept as .*{name}.json.conflict"):
        sweep([mine], tmp_path)
    path = tmp_path / "runs" / f"{name}.json"
    assert json.loads(path.read_text())["config"]["arch"]["d_ff"] == 32
    assert json.loads((tmp_path / "runs" / f"{name}.json.conflict").read_text())["config"]["arch"]["d_ff"] == 16


def test_a_result_write_waits_for_the_folder_lock_and_then_sees_the_other_result(tmp_path):
    """The check and the write are one step under the folder's lock: a writer that comes while another holds it
    waits, then finds that writer's result and keeps its own beside it."""
    import threading

    from boltzmann_attention.experiments.train import TrainConfig, result_lock

    mine = TrainConfig.build(task="brackets", T=4, **TINY)
    other = mine.replace(d_ff=32)
    path = tmp_path / "runs" / "run.json"
    errors = []

    def write():
        try:
            sweep_module.write_own_result({"config": {}, "mine": True}, path, mine)
        except ValueError as e:
            errors.append(str(e))

    with result_lock(path):
        writer = threading.Thread(target=write)
        writer.start()
        writer.join(timeout=1.0)
        assert writer.is_alive()  # waiting for the lock
        sweep_module.write_result({"config": sweep_module.asdict(other), "metrics": {
            "val": {"loss": 1.0}, "test": {"accuracy": 0.5}}}, path)
    writer.join(timeout=30)
    assert not writer.is_alive() and len(errors) == 1 and "holds a run of another config" in errors[0]
    assert "mine" not in json.loads(path.read_text())
    assert json.loads((tmp_path / "runs" / "run.json.conflict").read_text())["mine"] is True


def test_a_result_whose_config_does_not_parse_is_named(finished, tmp_path):
    grid, names = _copy(finished, tmp_path)
    path = tmp_path / "runs" / f"{names[0]}.json"
    d = json.loads(path.read_text())
    d["config"]["optim"]["learning_rate"] = 0.1  # an edited file: a field no config has
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=rf"^{path}: its config does not parse \(unknown config fields: "
                                         r"\['learning_rate'\]\); nothing is replaced"):
        sweep([grid], tmp_path, dry_run=True)


@pytest.mark.parametrize("options, message", [
    ({"cpus_per_task": "four"}, r"executor option cpus_per_task must be an integer >= 1, got 'four'"),
    ({"cpus_per_task": 0}, r"executor option cpus_per_task must be an integer >= 1, got 0"),
    ({"cpus_per_task": -2}, r"executor option cpus_per_task must be an integer >= 1, got -2"),
    ({"cluster": "local", "bogus": 1}, r"^executor_options \{'bogus': 1\}: Parameter 'bogus' need"),
    ({"cluster": "local", "timeout_min": "x"}, r"^executor_options \{'timeout_min': 'x'\}: Parameter \"timeout_min"),
    ({"cluster": "nowhere"}, r"^executor option cluster='nowhere': AutoExecutor doesn't know"),
    ({"cluster": "slurm"}, r"^executor option cluster='slurm': Could not detect \"srun\""),
])
def test_executor_options_are_refused_before_any_run_naming_the_option(tmp_path, options, message):
    pytest.importorskip("submitit")
    if options.get("cluster") == "slurm" and __import__("shutil").which("srun"):
        pytest.skip("on a Slurm cluster")
    grid = Grid(("brackets",), (4,), modes=("h",), seeds=(0,), overrides=TINY)
    with pytest.raises(ValueError, match=message):
        sweep([grid], tmp_path, executor="submitit", executor_options=options)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("jobs, threads, message", [(0, None, "jobs must be an integer >= 1, got 0"),
                                                    (-2, None, "jobs must be an integer >= 1, got -2"),
                                                    (1, 0, "threads must be an integer >= 1, got 0")])
def test_jobs_and_threads_are_checked_before_any_run(tmp_path, jobs, threads, message):
    grid = Grid(("brackets",), (4,), modes=("h",), seeds=(0,), overrides=TINY)
    with pytest.raises(ValueError, match=message):
        sweep([grid], tmp_path, jobs=jobs, threads=threads)


def test_the_debug_executor_leaves_the_callers_thread_count(tmp_path):
    """submitit's debug executor runs the jobs in this process: a run's thread count must not stay."""
    pytest.importorskip("submitit")
    import torch

    grid = Grid(("brackets",), (4,), modes=("h",), seeds=(0,), overrides=TINY)
    before = torch.get_num_threads()
    threads = 2 if before == 1 else 1
    try:
        assert len(sweep([grid], tmp_path, executor="submitit", executor_options={"cluster": "debug"},
                         threads=threads)) == 1
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


def test_unpacking_an_archive_checks_each_file_again_when_it_writes(finished, tmp_path, monkeypatch):
    """Another writer that puts a result in place after the unpacking's first look (here: as the unpacking takes
    the folder's lock) is not overwritten."""
    from contextlib import contextmanager

    from boltzmann_attention.experiments import results

    (tmp_path / "done").mkdir()
    grid, names = _copy(finished, tmp_path / "done")
    archive = results.write_archive(results.load_runs(tmp_path / "done"), tmp_path)
    lock = results.result_lock

    @contextmanager
    def raced(path):
        with lock(path):
            if not path.exists():
                path.write_text(json.dumps({"another": "result"}))
            yield

    monkeypatch.setattr(results, "result_lock", raced)
    with pytest.raises(ValueError, match=r"already holds another result than .*; it was not replaced"):
        results.unpack_archive(archive, tmp_path / "new")
    (kept,) = (tmp_path / "new" / "runs").glob("*.json")  # the first run's place, which the other writer took
    assert kept.stem in names and json.loads(kept.read_text()) == {"another": "result"}
