"""Training: the loss goes down, resume is bit-exact, errors come before training, DDP runs."""

import io
import json
import math
import os
import re
import socket
import subprocess
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from boltzmann_attention.experiments.model import Model, ModelConfig
from boltzmann_attention.experiments.studies import profile
from boltzmann_attention.experiments.sweep import Grid, run_name, sweep
from boltzmann_attention.experiments.train import (
    TrainConfig,
    default_checkpoint,
    marginals_method,
    model_config,
    read_checkpoint,
    train,
)
from boltzmann_attention.experiments.train import checkpoints as checkpoints_module
from boltzmann_attention.experiments.train import loop as train_module

SMALL = dict(steps=40, batch_size=16, eval_interval=20, eval_windows=64, d_model=16, d_ff=32, warmup_steps=5)
SHORT = {**SMALL, "warmup_steps": 0}  # for runs of a few steps (no warning that warm-up never ends)


@pytest.mark.parametrize("task,mode", [("shakespeare", "h+J"), ("brackets", "h+J"), ("shakespeare", "softmax"),
                                       ("brackets", "J"), ("shakespeare", "h+J+K")])
def test_a_few_steps_lower_the_loss(task, mode):
    torch.set_num_threads(1)
    result = train(TrainConfig.build(task=task, T=6, mode=mode, **SMALL), progress=False)
    first, last = result["history"][0], result["history"][-1]
    assert last["step"] == 40 and last["loss"] < first["loss"]
    initial = TrainConfig.build(task=task, T=6, mode=mode, **{**SHORT, "steps": 1, "eval_interval": 1})
    assert result["metrics"]["val"]["loss"] < train(initial, progress=False)["metrics"]["val"]["loss"]
    if "J" in mode:
        J = torch.tensor(result["layers"][0]["couplings"])
        assert J.shape == (1, 6, 6) and J.abs().max() > 0  # the couplings learned something


def test_resume_equals_uninterrupted_run(tmp_path):
    torch.set_num_threads(1)
    cfg = TrainConfig.build(task="shakespeare", T=5, mode="h+J", **{**SMALL, "steps": 30, "eval_interval": 10})
    full = train(cfg, progress=False)
    ckpt = tmp_path / "run.pt"
    train(cfg.replace(steps=30), checkpoint=ckpt, checkpoint_interval=10, progress=False)
    # simulate a kill after step 10: rerun from the step-10 checkpoint written by a 10-step prefix
    ckpt.unlink()
    partial = tmp_path / "partial.pt"
    _train_until(cfg, partial, stop=10)
    resumed = train(cfg, checkpoint=partial, progress=False)
    assert resumed["steps_run"] == 20
    assert resumed["metrics"] == full["metrics"]
    assert resumed["history"] == full["history"]
    assert resumed["layers"] == full["layers"]


def _train_until(cfg, path, stop):
    """Run cfg but stop (as if killed) right after the checkpoint at `stop` steps."""
    import boltzmann_attention.experiments.train.loop as T

    original = T.save_checkpoint

    class Killed(Exception):
        pass

    def save_then_die(*args, **kwargs):
        original(*args, **kwargs)
        raise Killed

    T.save_checkpoint = save_then_die
    try:
        with pytest.raises(Killed):
            train(cfg, checkpoint=path, checkpoint_interval=stop, progress=False)
    finally:
        T.save_checkpoint = original


def test_bad_checkpoints_raise_clear_errors(tmp_path):
    cfg = TrainConfig.build(task="shakespeare", T=5, **{**SHORT, "steps": 2})
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupted"):
        train(cfg, checkpoint=bad, progress=False)
    other = tmp_path / "other.pt"
    _train_until(cfg.replace(steps=4), other, stop=2)
    with pytest.raises(ValueError, match="another config"):
        train(cfg.replace(mode="h", steps=4), checkpoint=other, progress=False)
    with pytest.raises(ValueError, match=r"written by a run of 1 process\(es\), this one has 2"):
        checkpoints_module.load_checkpoint(other, cfg.replace(steps=4), None, None, None, None, rank=1, world=2)


class _Payload:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def test_crafted_checkpoint_cannot_run_code(tmp_path):
    """A pickle payload is refused, as a plain torch file and even framed with a valid checksum."""
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"format": 2, "payload": _Payload(marker)}, buffer)
    torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)  # the payload is live ...
    assert marker.exists()
    marker.unlink()
    cfg = TrainConfig.build(task="brackets", T=4, **{**SHORT, "steps": 2})
    framed = checkpoints_module._frame(buffer.getvalue())  # as an attacker who knows the format would write it
    for content, message in ((buffer.getvalue(), "plain torch file without a checksum, not loaded"),
                             (framed, r"refused: it holds objects other than tensors.*could run code")):
        crafted = tmp_path / "crafted.pt"
        crafted.write_bytes(content)
        with pytest.raises(ValueError, match=message):
            train(cfg, checkpoint=crafted, progress=False)
        assert not marker.exists()  # ... but never ran


def test_bit_flip_in_checkpoint_tensor_data_is_refused(tmp_path):
    cfg = TrainConfig.build(task="brackets", T=4, **{**SHORT, "steps": 2})
    path = tmp_path / "run.pt"
    train(cfg.replace(steps=4), checkpoint=path, checkpoint_interval=2, progress=False)
    weight = read_checkpoint(path)["model"]["token_embedding.weight"]
    raw = bytearray(path.read_bytes())
    at = raw.find(weight.numpy().tobytes())
    assert at > 0
    raw[at + 5] ^= 0x10  # one bit inside the embedding's float data
    path.write_bytes(bytes(raw))
    header = len(checkpoints_module._MAGIC) + 65
    flipped = torch.load(io.BytesIO(bytes(raw[header:])), weights_only=True)["model"]["token_embedding.weight"]
    assert (flipped != weight).sum() == 1  # torch alone would load the changed weight
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*sha256 checksum.*delete it to restart"):
        train(cfg.replace(steps=4), checkpoint=path, progress=False)


@pytest.mark.parametrize("history", ["a string", [1, 2], [{"loss": 1.0}]])
def test_a_checksummed_checkpoint_with_a_bad_history_is_refused(tmp_path, history):
    """A checkpoint can be valid (checksum and all) and still hold a history no result can be made of."""
    cfg = TrainConfig.build(task="brackets", T=4, **{**SHORT, "steps": 2})
    path = tmp_path / "run.pt"
    train(cfg, checkpoint=path, checkpoint_interval=1, progress=False)
    state = read_checkpoint(path)
    state["history"] = history
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(checkpoints_module._frame(buffer.getvalue()))
    with pytest.raises(ValueError, match="invalid history.*delete it to restart"):
        train(cfg, checkpoint=path, progress=False)


def test_output_paths_are_checked_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "Task", _no_training)
    cfg = TrainConfig.build(task="brackets", T=4, **{**SHORT, "steps": 2})
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for bad, message in ((dict(checkpoint=blocker / "run.pt"), "cannot write the checkpoint"),
                         (dict(out=blocker / "sub" / "run.json"), "cannot write the result"),
                         (dict(checkpoint=tmp_path), "is a folder"),
                         (dict(out=tmp_path / "same", checkpoint=tmp_path / "same"), "different files")):
        with pytest.raises(ValueError, match=message):
            train(cfg, progress=False, **bad)
    # missing folders are created, and nothing is left in them; then training starts
    checkpoint, out = tmp_path / "new" / "deep" / "run.pt", tmp_path / "other" / "run.json"
    with pytest.raises(AssertionError, match="training started"):
        train(cfg, checkpoint=checkpoint, out=out, progress=False)
    assert checkpoint.parent.is_dir() and out.parent.is_dir()
    assert not any(checkpoint.parent.iterdir()) and not any(out.parent.iterdir())


def test_read_only_folder_fails_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "Task", _no_training)
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        try:
            (folder / "probe").write_text("")
        except PermissionError:
            pass
        else:
            pytest.skip("this user (root) can write to a read-only folder; the path-under-a-file test covers it")
        cfg = TrainConfig.build(task="brackets", T=4, **{**SHORT, "steps": 2})
        for where in ("out", "checkpoint"):
            with pytest.raises(ValueError, match="cannot write"):
                train(cfg, progress=False, **{where: folder / "run.x"})
    finally:
        folder.chmod(0o700)


def test_default_checkpoint_resumes_and_wall_time_sums_segments(tmp_path, monkeypatch):
    out = tmp_path / "run.json"
    checkpoint = default_checkpoint(out)
    assert checkpoint == tmp_path / "run.ckpt.pt"
    cfg = TrainConfig.build(task="brackets", T=4, **{**SMALL, "steps": 6, "eval_interval": 3, "warmup_steps": 2})
    ticks = iter(range(0, 10**6, 1000))  # a slow first segment: 1000 s between clock readings
    monkeypatch.setattr(train_module, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    _train_until(cfg, checkpoint, stop=3)
    assert read_checkpoint(checkpoint)["elapsed_s"] >= 1000.0
    monkeypatch.undo()
    result = train(cfg, checkpoint=checkpoint, out=out, progress=False)
    assert result["steps_run"] == 3
    assert 1000.0 < result["wall_time_s"] < 1000.0 + 60.0  # the first segment plus this one


def test_threads_are_set_for_the_run_and_restored():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cfg = TrainConfig.build(task="brackets", T=4, **{**SHORT, "steps": 2})
        assert train(cfg, threads=1, progress=False)["threads"] == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="threads must be an integer >= 1"):
            train(cfg, threads=0, progress=False)
    finally:
        torch.set_num_threads(before)
    from boltzmann_attention.experiments.sweep import threads_per_run

    cores = len(os.sched_getaffinity(0))
    with pytest.MonkeyPatch.context() as m:
        m.delenv("OMP_NUM_THREADS", raising=False)
        for runs in (1, 2, 3, 64):
            per_run = threads_per_run(runs)
            assert per_run >= 1 and (per_run * runs <= cores or per_run == 1)
        assert threads_per_run(1) == cores


@pytest.mark.parametrize("change,message", [
    (dict(task="copying"), "unknown task"),
    (dict(mode="K"), "unknown mode"),
    (dict(method="magic"), "unknown method"),
    (dict(coupling="diagonal"), "unknown coupling"),
    (dict(T=30), "beyond the limit of method 'exact', 24 spins per query"),
    (dict(mode="h+K", method="tap"), "three-body couplings, which method 'tap' does not take"),
    (dict(T=17, method="dqa"), "beyond the limit of method 'dqa', 16 spins per query"),
    (dict(grad_clip=-1.0), "grad_clip must be a number"),
    (dict(grad_clip=math.nan), "grad_clip"),
    (dict(lr=math.inf), "lr must be a finite number > 0"),
    (dict(lr=0.0), "lr must be"),
    (dict(lr=20.0), r"lr \* weight_decay must be < 1"),
    (dict(lr=1e3, weight_decay=0.0, coupling_lr_multiplier=1e36), "overflows float32"),
    (dict(weight_decay=-5.0), "weight_decay must be a finite number >= 0"),
    (dict(eval_interval=0), "eval_interval must be an integer >= 1"),
    (dict(n_heads=0), "n_heads must be an integer >= 1"),
    (dict(field_bias_init=math.nan), "field_bias_init must be a finite number"),
    (dict(field_bias_init=-math.inf), "field_bias_init"),
    (dict(steps=0), "steps must be"),
    (dict(steps=2.5), "steps must be an integer"),
    (dict(batch_size=True), "batch_size must be an integer"),
    (dict(warmup_steps=-1), "warmup_steps must be an integer >= 0"),
    (dict(min_lr_ratio=1.5), r"min_lr_ratio must be a finite number >= 0 and <= 1"),
    (dict(d_model=15, n_heads=2), "divisible by n_heads"),
    (dict(d_ff=-1), "d_ff must be an integer >= 0"),
    (dict(n_layers=0), "n_layers"),
    (dict(coupling_init_std=math.inf), "coupling_init_std"),
    (dict(coupling_lr_multiplier=0.0), "coupling_lr_multiplier must be a finite number > 0"),
    (dict(num_fillers=0), "num_fillers"),
    (dict(eval_windows=0), "eval_windows"),
    (dict(seed=-1), "seed must be an integer in"),
    (dict(T="8"), "T must be an integer"),
    (dict(learn_field_bias="yes"), "learn_field_bias must be true or false"),
    (dict(method_options=["bandwidth"]), "method_options must be a dict"),
    (dict(method_options={"bogus": 1}), r"unknown option\(s\) \['bogus'\] for method 'exact'; known options: \['max"),
    (dict(method="banded", method_options={"band": 3}), r"\['band'\].*known options: \['bandwidth', 'chunk_size'"),
    (dict(method_options={"max_spins": "24"}), "max_spins must be an integer"),
    (dict(method="dqa", method_options={"target_beta": 1.0, "energy_scale": 0.5}),
     "energy_scale or target_beta, not both"),
    (dict(task="brackets", train_sequences=0), "train_sequences must be an integer >= 1"),
    (dict(task="brackets", min_fill=-0.5), "min_fill must be a finite number >= 0 and <= 1"),
    (dict(task="brackets", max_fill=math.nan), "max_fill must be"),
    (dict(task="brackets", min_fill=0.9, max_fill=0.1), r"min_fill \(0.9\) must not exceed max_fill \(0.1\)"),
    (dict(task="brackets", T=8, min_fill=0.6, max_fill=0.7), "no word length at T = 8"),
    (dict(task="brackets", open_probability=2.0), "open_probability must be"),
    (dict(task="brackets", deduplicate="no"), "deduplicate must be true or false"),
    (dict(task="shakespeare", deduplicate=True), "deduplicate is an option of task 'brackets' only"),
    (dict(task="shakespeare", train_sequences=5, min_fill=0.5), "train_sequences, min_fill are options of task"),
    # the attention's options by the layer's own rules and words (boltzmann_attention.validation)
    (dict(coupling="window"), "coupling='window' and coupling_window=W go together"),
    (dict(coupling_window=4), "coupling='window' and coupling_window=W go together"),
    (dict(coupling="relative", coupling_window_relative=True), "coupling_window_relative applies to coupling='wi"),
    (dict(coupling="window", coupling_window=0), "coupling_window must be an integer >= 1"),
    (dict(coupling="window", coupling_window=True), "coupling_window must be an integer"),
    (dict(coupling="window", coupling_window=4, method="meanfield"),
     "by method 'exact' and 'configurations' only, got 'meanf"),
    (dict(coupling="window", coupling_window=4, method="banded"), "by method 'exact' and 'configurations' only"),
    (dict(coupling="window", coupling_window=4, mode="h"), r"mode 'h' does not use coupling, coupling_window"),
    (dict(coupling="window", coupling_window=4, mode="h+J+K"), "no three-body terms"),
    (dict(coupling="window", coupling_window=25, T=64), "coupling_window 25 is too large .* W <= 24"),
    (dict(coupling="window", coupling_window=9, method_options={"max_spins": 8}), r"W <= 8 \(option max_spins\)"),
    (dict(coupling="window", coupling_window=4, method_options={"window_path": "fast"}), "window_path must be one of"),
    (dict(method_options={"window_path": "split"}), r"unknown option\(s\) \['window_path'\] for method 'exact'"),
    (dict(coupling_range=3), r"coupling_range applies to coupling='relative', 'keys' or 'query' only \(got "
                             r"coupling='full'\)"),
    (dict(coupling="relative", coupling_range=-1), "coupling_range must be an integer >= 0"),
    (dict(coupling="relative", method="banded", T=20), r"range w = 19 \(T - 1, the default\).*max_bandwidth 16"),
    (dict(coupling="relative", method="banded", T=64, coupling_range=9, method_options={"max_bandwidth": 8}),
     "set coupling_range <= 8"),
    (dict(memory_probe_steps=-1), "memory_probe_steps must be an integer >= 0"),
])
def test_bad_configs_fail_before_training(change, message, monkeypatch):
    monkeypatch.setattr(train_module, "Task", _no_training)
    with pytest.raises(ValueError, match=message):
        train(TrainConfig.build(**{**SMALL, **change}), progress=False)


def _no_training(*args, **kwargs):
    raise AssertionError("training started")


def test_a_config_names_the_windows_path():
    """window_path goes through the config to the layer (the method's record does not take it); method
    'configurations' takes the window too."""
    from boltzmann_attention import BoltzmannAttention

    for options in (dict(method_options={"window_path": "configurations"}), dict(method="configurations")):
        cfg = TrainConfig.build(**{**SMALL, "mode": "h+J", "coupling": "window", "coupling_window": 3, **options})
        cfg.validate()
        layers = [m for m in Model(model_config(cfg, 12)).modules() if isinstance(m, BoltzmannAttention)]
        assert layers and all(m.window_path == "configurations" for m in layers)


@pytest.mark.parametrize("method", ["tap", "gibbs", "pt"])
def test_unknown_option_of_a_forwarding_method_is_a_value_error(method):
    """These methods take **options, so the name is checked by the library at the first step: a ValueError."""
    cfg = TrainConfig.build(task="brackets", T=4, method=method, method_options={"bogus": 1}, **{**SHORT, "steps": 2})
    with pytest.raises(ValueError, match="bogus"):
        train(cfg, progress=False)


def test_grad_clip_inf_disables_clipping_and_good_configs_pass():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainConfig.build(grad_clip=math.inf).validate()
        TrainConfig.build(d_ff=0, warmup_steps=0, min_lr_ratio=1.0, weight_decay=0.0, field_bias_init=-1.5,
                          coupling="relative", coupling_range=3, method="banded").validate()
        TrainConfig.build(steps=11, warmup_steps=10).validate()
        # the window is exact at any T (its limit is on W), banded needs only the range within its limit
        TrainConfig.build(T=64, coupling="window", coupling_window=16).validate()
        TrainConfig.build(T=64, coupling="window", coupling_window=24, mode="J",
                          coupling_window_relative=True).validate()
        TrainConfig.build(T=64, coupling="relative", coupling_range=8, method="banded").validate()
        TrainConfig.build(T=64, coupling="relative", coupling_range=8, method="meanfield").validate()
    with pytest.raises(ValueError, match="mode 'h' does not use method, coupling"):  # mode h has no J: refused
        TrainConfig.build(T=64, mode="h", coupling="relative", method="banded").validate()


@pytest.mark.parametrize("mode", ["h+J", "softmax"])
def test_divergence_is_a_clear_error_not_nan_metrics(mode):
    """A learning rate that blows the weights up stops the run, instead of NaN metrics or a library error."""
    cfg = TrainConfig.build(task="brackets", T=4, mode=mode, lr=1e10, weight_decay=0.0, **{**SHORT, "steps": 3})
    with pytest.raises(ValueError, match=r"training diverged at step [12] of 3: .*lower lr \(now 1e\+10\)"):
        train(cfg, progress=False)


def test_warmup_that_never_ends_warns():
    with pytest.warns(UserWarning, match=r"warmup_steps \(10\) >= steps \(10\)"):
        TrainConfig.build(steps=10, warmup_steps=10).validate()


def test_position_head_masks_later_positions():
    model = Model(ModelConfig.build(vocab_size=10, max_len=6, head="position", d_model=16, d_ff=0))
    scores = model(torch.randint(0, 10, (2, 6)))
    assert scores.shape == (2, 6, 6)
    later = torch.ones(6, 6, dtype=torch.bool).triu()
    later[0, 0] = False
    assert torch.isinf(scores[:, later]).all() and torch.isfinite(scores[:, ~later]).all()


def test_sweep_skips_finished_runs(tmp_path):
    grid = Grid(("brackets",), (4,), modes=("softmax", "h"), seeds=(0,), overrides={**SHORT, "steps": 3})
    names = sweep([grid], tmp_path)
    assert sorted(names) == sorted(run_name(cfg) for _, cfg in grid.runs())
    saved = json.loads((tmp_path / "runs" / f"{names[0]}.json").read_text())
    assert saved["run"] == names[0] and saved["config"]["steps"] == 3 and "commit" in saved
    assert sweep([grid], tmp_path) == []  # nothing left to do
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_profiles_validate():
    for name in ("quick", "full"):
        for grid in profile(name):
            for _, cfg in grid.runs():
                cfg.validate()
    with pytest.raises(ValueError, match="unknown profile"):
        profile("huge")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_two_processes(tmp_path):
    """torchrun-style launch of 2 gloo processes; rank 0 writes the result."""
    out = tmp_path / "ddp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), "-m", "boltzmann_attention.experiments.cli", "train", "--task", "brackets", "--T", "5",
           "--steps", "6", "--batch-size", "8", "--eval-interval", "3", "--d-model", "16", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["steps_run"] == 6 and result["history"][-1]["step"] == 6


_DDP_RESUME = """
import json, sys
import torch.distributed as dist
import boltzmann_attention.experiments.train.loop as T

cfg = T.TrainConfig.build(task="brackets", T=5, steps=4, batch_size=8, eval_interval=2, d_model=16, d_ff=32,
                    warmup_steps=1)
full = T.train(cfg, progress=False)


class Killed(Exception):
    pass


save, per_rank, calls = T.save_checkpoint, T._per_rank, []


def save_then_die(*args, **kwargs):  # rank 0: write the step-2 checkpoint, then die
    save(*args, **kwargs)
    raise Killed


def gather_then_die(state, world):  # rank 1: die once both RNG states are gathered
    calls.append(1)
    if len(calls) == 2 and dist.get_rank() == 1:
        per_rank(state, world)
        raise Killed
    return per_rank(state, world)


T.save_checkpoint, T._per_rank = save_then_die, gather_then_die
try:
    T.train(cfg, checkpoint=sys.argv[1], checkpoint_interval=2, progress=False)
except Killed:
    pass
T.save_checkpoint, T._per_rank = save, per_rank
dist.barrier()  # the checkpoint is written before anyone resumes
resumed = T.train(cfg, checkpoint=sys.argv[1], progress=False)
if dist.get_rank() == 0:
    keys = ("metrics", "history", "layers")
    json.dump({"steps_run": resumed["steps_run"], "equal": [full[k] == resumed[k] for k in keys]},
              open(sys.argv[2], "w"))
"""


@pytest.mark.slow
def test_ddp_resume_equals_uninterrupted_run(tmp_path):
    """Each process resumes its own data order: a killed 2-process run resumes bit for bit."""
    script, out = tmp_path / "resume.py", tmp_path / "out.json"
    script.write_text(_DDP_RESUME)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), str(script), str(tmp_path / "run.pt"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text()) == {"steps_run": 2, "equal": [True, True, True]}


def test_sweep_reports_a_failed_run_and_finishes_the_others(tmp_path):
    grid = Grid(("brackets",), (4,), modes=("softmax", "h"), seeds=(0,), overrides={**SHORT, "steps": 2})
    bad = tmp_path / "checkpoints" / f"{run_name(grid.runs()[0][1])}.pt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="(?s)1 of 2 runs failed.*corrupted"):
        sweep([grid], tmp_path)
    assert (tmp_path / "runs" / f"{run_name(grid.runs()[1][1])}.json").exists()


@pytest.mark.parametrize("mode,method,options", [
    ("h+J", "gibbs", {"num_samples": 64, "warmup": 20, "gradient": "covariance"}),
    ("J", "gibbs", {"num_samples": 64, "warmup": 20, "gradient": "nudged"}),  # gradient-free training of J
    ("h+J", "dqa", {"num_samples": 32, "trotter_steps": 20, "gradient": "ste"}),
])
def test_sampled_methods_train_end_to_end(mode, method, options):
    """Sample-based marginals drive training: the loss goes down and J moves (seeded, so deterministic)."""
    torch.set_num_threads(1)
    cfg = TrainConfig.build(task="brackets", T=4, mode=mode, method=method, method_options=options,
                      **{**SMALL, "steps": 30, "eval_interval": 30, "coupling_init_std": 0.05})
    result = train(cfg, progress=False)
    initial = train(cfg.replace(steps=1, eval_interval=1, warmup_steps=0), progress=False)
    assert result["metrics"]["val"]["loss"] < initial["metrics"]["val"]["loss"]
    assert torch.tensor(result["layers"][0]["couplings"]).ne(torch.tensor(initial["layers"][0]["couplings"])).any()
    # the same weights are also evaluated with exact marginals (brackets: val and test)
    assert set(result["metrics"]) == {"val", "test", "val_exact", "test_exact"}
    assert 0.0 <= result["metrics"]["test_exact"]["accuracy"] <= 1.0


def test_marginals_method_swaps_and_restores():
    """Inside marginals_method(model, 'exact') a DQA model computes what the same weights built with
    method='exact' compute; afterwards it samples again."""
    torch.manual_seed(0)
    cfg = TrainConfig.build(task="brackets", T=4, method="dqa", method_options={"num_samples": 8}, **SMALL)
    sampled = Model(model_config(cfg, vocab_size=12)).eval()
    exact = Model(model_config(cfg.replace(method="exact", method_options={}), vocab_size=12)).eval()
    exact.load_state_dict(sampled.state_dict())
    x = torch.randint(0, 12, (3, 4))
    with torch.no_grad():
        with marginals_method(sampled, "exact"):
            assert torch.allclose(sampled(x), exact(x), atol=1e-6)
        assert sampled.blocks[0].attn.method == "dqa" and sampled.blocks[0].attn.method_options == {"num_samples": 8}
    exact_result = train(cfg.replace(method="exact", method_options={}, steps=2, eval_interval=2, warmup_steps=0),
                         progress=False)
    assert "val_exact" not in exact_result["metrics"]


def test_bracket_options_reach_the_data():
    cfg = TrainConfig.build(task="brackets", T=10, train_sequences=700, min_fill=0.6, open_probability=0.9,
                      deduplicate=True, **SHORT)
    data = train_module.Task(cfg).data
    assert data.sizes == (700, 2000, 2000)
    assert data.options == {"min_fill": 0.6, "max_fill": 1.0, "open_probability": 0.9} and data.deduplicate
    assert ((data.train[0] == 1).sum(1) >= 3).all()  # p / 5 >= 0.6
    train_rows = {tuple(r) for r in data.train[0].tolist()}
    assert not any(tuple(r) in train_rows for r in data.val[0].tolist() + data.test[0].tolist())


def test_bracket_evaluation_counts_closing_brackets_and_whole_sequences():
    """Accuracy over closing brackets and over sequences against a plain loop, for a model that is right on
    a known set of brackets."""
    cfg = TrainConfig.build(task="brackets", T=8, **SHORT)
    task = train_module.Task(cfg)
    tokens, labels = task.val
    wrong = torch.Generator().manual_seed(0)
    flip = (torch.rand(labels.shape, generator=wrong) < 0.1) & (labels >= 0)  # the brackets the model gets wrong

    done = [0]  # rows seen so far: evaluate goes through the split in order

    def model(x):
        rows = slice(done[0], done[0] + len(x))
        assert torch.equal(x, tokens[rows])
        done[0] += len(x)
        target = labels[rows].clamp(min=0)
        target = torch.where(flip[rows], (target + 1) % 8, target)
        return torch.nn.functional.one_hot(target, 8).float()

    metrics = task.evaluate(model, batch_size=300)
    closing = right = whole = 0
    for lab_row, flip_row in zip(labels.tolist(), flip.tolist()):
        all_right = True
        for lab, f in zip(lab_row, flip_row):
            if lab >= 0:
                closing += 1
                right += not f
                all_right &= not f
        whole += all_right
    assert metrics["accuracy"] == right / closing and metrics["accuracy_sequence"] == whole / len(labels)
    assert 0.3 < metrics["accuracy_sequence"] < metrics["accuracy"] < 1


OLD_FIELDS = {  # fields added after results were recorded, and what the runs without them used
    "bracket options": {"train_sequences": 20000, "min_fill": 0.0, "max_fill": 1.0, "open_probability": 0.5,
                        "deduplicate": False},
    "coupling options": {"coupling_range": None, "coupling_window": None, "coupling_window_relative": False,
                         "memory_probe_steps": 0},
}


@pytest.mark.parametrize("added", OLD_FIELDS)
def test_results_and_checkpoints_from_before_a_field_read_as_what_they_used(tmp_path, added):
    from boltzmann_attention.experiments.results import load_runs

    cfg = TrainConfig.build(task="brackets", T=4, **{**SHORT, "steps": 2})
    result = train(cfg, progress=False, checkpoint=tmp_path / "c.pt")
    assert set(result["data"]) == {"val_in_train", "test_in_train"} and result["data"]["val_in_train"] == 1.0
    new_fields = tuple(OLD_FIELDS[added])

    def old(saved: dict) -> dict:
        """The config as such a run wrote it: flat (before the nesting), without the fields added since."""
        return {k: v for k, v in TrainConfig.from_dict(saved).flat().items() if k not in new_fields}

    assert "data" in result["config"] and "T" not in result["config"]  # written nested now
    result["config"] = old(result["config"])
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "old.json").write_text(json.dumps(result))
    (run,) = load_runs(tmp_path)
    assert {k: run.config[k] for k in new_fields} == OLD_FIELDS[added]
    state = read_checkpoint(tmp_path / "c.pt")
    state["config"] = old(state["config"])
    buffer = io.BytesIO()
    torch.save(state, buffer)
    (tmp_path / "old.pt").write_bytes(checkpoints_module._frame(buffer.getvalue()))
    resumed = train(cfg, progress=False, checkpoint=tmp_path / "old.pt")  # resumes: the old data's defaults
    assert resumed["steps_run"] == 0 and resumed["metrics"] == result["metrics"]
    with pytest.raises(ValueError, match="another config.*deduplicate"):
        train(cfg.replace(deduplicate=True, T=6), progress=False, checkpoint=tmp_path / "old.pt")


def test_the_coupled_window_trains_and_its_slot_couplings_are_recorded(tmp_path):
    """T = 30 is beyond exact's 24 spins, which the window (W = 4) does not need; J (H, W, W) is learned, saved
    in the result by slot and read back; the resolved config says which window it was."""
    from boltzmann_attention.experiments.results import load_runs
    from boltzmann_attention.experiments.train import load_final

    torch.set_num_threads(1)
    cfg = TrainConfig.build(T=30, n_heads=2, n_layers=2, coupling="window", coupling_window=4, slot_bias=3,
                            **{**SHORT, "steps": 3, "lr": 1e-2})
    result = train(cfg, progress=False, checkpoint=tmp_path / "w.pt")
    _, model = load_final(tmp_path / "w.pt")
    J = torch.tensor(result["layers"][0]["couplings"])
    assert J.shape == (2, 4, 4) and J.abs().max() > 0 and torch.equal(J, J.transpose(-1, -2))
    assert torch.all(J.diagonal(dim1=-2, dim2=-1) == 0)
    assert (result["config"]["attention"]["coupling"], result["config"]["attention"]["coupling_window"]) == (
        "window", 4)
    # every layer's couplings, field and slot biases are kept, as decimals that read back to the same float32s
    assert len(result["layers"]) == 2 and "couplings" not in result and "field_bias" not in result
    for block, layer in zip(model.blocks, result["layers"]):
        assert torch.equal(torch.tensor(layer["couplings"], dtype=torch.float32), block.attn.couplings(30))
        assert torch.equal(torch.tensor(layer["slot_bias"], dtype=torch.float32), block.attn.slot_bias.weight)
        assert all(len(repr(x)) <= 16 for x in layer["couplings"][0][1])  # not float64's 17 digits
    assert all(torch.tensor(layer["slot_bias"]).shape == (2, 3) and len(layer["field_bias"]) == 2
               for layer in result["layers"])
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "w.json").write_text(json.dumps(result))
    (run,) = load_runs(tmp_path)  # layer 0's, at float32's exact values
    assert np.array_equal(run.couplings, model.blocks[0].attn.couplings(30).detach().double().numpy())
    bad = {**result, "couplings": torch.zeros(2, 30, 30).tolist()}  # positional J for a window run: refused
    (tmp_path / "runs" / "w.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"expected \(H, 4, 4\)"):
        load_runs(tmp_path)


def test_relative_coupling_range_reaches_the_layer():
    """coupling_range sets J's range (and banded's bandwidth), instead of the default T - 1."""
    for method in ("banded", "meanfield"):
        cfg = TrainConfig.build(T=20, coupling="relative", coupling_range=3, method=method)
        model = Model(model_config(cfg, 65))
        attn = model.blocks[0].attn
        assert attn.couplings.weight.shape == (1, 3)
        assert attn.method_options.get("bandwidth") == (3 if method == "banded" else None)


@pytest.mark.slow
def test_the_memory_probe_measures_a_fresh_process(tmp_path):
    """The probe's peak is its own process's: not raised by this (test) process's size, as ru_maxrss carried
    over fork and exec would be; and a larger batch takes more memory in its steps."""
    from boltzmann_attention.experiments.train import memory_probe
    from boltzmann_attention.experiments.train.memory import rss_mib

    if rss_mib() is None:
        pytest.skip("needs /proc (Linux)")
    common = dict(T=64, mode="h", n_heads=4, d_model=32, d_ff=0, memory_probe_steps=2)
    ballast = torch.ones(2**27)  # 512 MiB in this process, touched
    mine = rss_mib()
    small = memory_probe(TrainConfig.build(**common, batch_size=2), threads=1)
    del ballast
    large = memory_probe(TrainConfig.build(**common, batch_size=512), threads=1)
    assert small["steps"] == 2 and small["batch_size"] == 2 and small["threads"] == 1
    assert 0 < small["rss_before_steps_mib"] <= small["peak_rss_mib"] < mine - 256
    assert small["steps_mib"] == small["peak_rss_mib"] - small["rss_before_steps_mib"]
    # (512, 4, 64, 64) float32 attention weights are 32 MiB a tensor, several kept for the backward
    assert large["steps_mib"] > small["steps_mib"] + 64
    with pytest.raises(ValueError, match="memory_probe_steps must be an integer >= 1"):
        memory_probe(TrainConfig.build(**{**common, "memory_probe_steps": 0}))


def test_a_run_with_the_memory_probe_records_it(monkeypatch):
    seen = []
    monkeypatch.setattr(train_module, "memory_probe", lambda cfg: seen.append(cfg) or {"peak_rss_mib": 1.0})
    cfg = TrainConfig.build(task="brackets", T=4, memory_probe_steps=3, **{**SHORT, "steps": 2})
    assert train(cfg, progress=False)["memory"] == {"peak_rss_mib": 1.0} and seen == [cfg]
    assert "memory" not in train(cfg.replace(memory_probe_steps=0), progress=False)


def test_unconverged_mean_field_is_counted_per_step_and_warned_once():
    """Strong relative couplings (|J| sums past 1) keep the naive mean field from converging in every step and
    evaluation (one during training, one at the end): the result counts them and one warning says so, instead
    of one per solve."""
    from boltzmann_attention.ising.meanfield import ConvergenceWarning

    cfg = TrainConfig.build(T=12, method="meanfield", coupling="relative", coupling_range=4, coupling_init_std=2.0,
                      method_options={"max_iter": 5}, **{**SHORT, "steps": 3, "eval_interval": 3})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(cfg, progress=False)
    mine = [w for w in caught if issubclass(w.category, ConvergenceWarning) and "training steps" in str(w.message)]
    assert len(mine) == 1 and "did not converge in 3 of 3 training steps and 2 of 2 evaluations" in str(
        mine[0].message)
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning) and w not in mine]  # none per solve
    assert {k: result["convergence"][k] for k in ("unconverged_steps", "steps", "unconverged_evaluations",
                                                  "evaluations")} == {"unconverged_steps": 3, "steps": 3,
                                                                      "unconverged_evaluations": 2, "evaluations": 2}
    assert "did not converge" in result["convergence"]["first"]
    weak = train(cfg.replace(coupling_init_std=0.0, method_options={}), progress=False)
    assert "convergence" not in weak


def test_only_the_iterative_methods_are_watched_for_convergence():
    """The watch is on for exactly the methods with an ``on_fail`` option (mean field, TAP); off, it records
    nothing and lets a ConvergenceWarning through as Python would."""
    from boltzmann_attention import ising
    from boltzmann_attention.experiments.train import Unconverged
    from boltzmann_attention.ising.meanfield import ConvergenceWarning

    assert ising.ITERATIVE_METHODS == {"meanfield", "tap"}
    off = Unconverged(enabled=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with off.watch("steps"):
            warnings.warn("did not converge", ConvergenceWarning, stacklevel=2)
    assert [w.category for w in caught] == [ConvergenceWarning] and not off.found()
    on = Unconverged()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with on.watch("steps"):
            warnings.warn("did not converge", ConvergenceWarning, stacklevel=2)
    assert not caught and on.found()


def test_recorded_values_read_back_exactly_in_their_dtype():
    """float32 as its shortest decimals (fewer characters than float64's), float64 untouched, bfloat16 exactly."""
    from boltzmann_attention.experiments.train import float32_list

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g)
    assert torch.equal(torch.tensor(float32_list(x), dtype=torch.float32), x)
    assert len(str(float32_list(x))) < len(str(x.double().tolist()))
    wide = torch.randn(5, dtype=torch.float64, generator=g)
    assert torch.equal(torch.tensor(float32_list(wide), dtype=torch.float64), wide)
    narrow = x.bfloat16()
    assert torch.equal(torch.tensor(float32_list(narrow)).bfloat16(), narrow)
