"""Training: the loss goes down, resume is bit-exact, errors come before training, DDP runs."""

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from boltzmann_attention.experiments.model import Model, ModelConfig
from boltzmann_attention.experiments.sweep import Grid, profile, run_name, sweep
from boltzmann_attention.experiments.train import TrainConfig, marginals_method, train

SMALL = dict(steps=40, batch_size=16, eval_interval=20, eval_windows=64, d_model=16, d_ff=32, warmup_steps=5)


@pytest.mark.parametrize("task,mode", [("shakespeare", "h+J"), ("brackets", "h+J"), ("shakespeare", "softmax"),
                                       ("brackets", "J"), ("shakespeare", "h+J+K")])
def test_a_few_steps_lower_the_loss(task, mode):
    torch.set_num_threads(1)
    result = train(TrainConfig(task=task, T=6, mode=mode, **SMALL), progress=False)
    first, last = result["history"][0], result["history"][-1]
    assert last["step"] == 40 and last["loss"] < first["loss"]
    initial = TrainConfig(task=task, T=6, mode=mode, **{**SMALL, "steps": 1, "eval_interval": 1})
    assert result["metrics"]["val"]["loss"] < train(initial, progress=False)["metrics"]["val"]["loss"]
    if "J" in mode:
        J = torch.tensor(result["couplings"])
        assert J.shape == (1, 6, 6) and J.abs().max() > 0  # the couplings learned something


def test_resume_equals_uninterrupted_run(tmp_path):
    torch.set_num_threads(1)
    cfg = TrainConfig(task="shakespeare", T=5, mode="h+J", **{**SMALL, "steps": 30, "eval_interval": 10})
    full = train(cfg, progress=False)
    ckpt = tmp_path / "run.pt"
    train(replace(cfg, steps=30), checkpoint=ckpt, checkpoint_interval=10, progress=False)
    # simulate a kill after step 10: rerun from the step-10 checkpoint written by a 10-step prefix
    ckpt.unlink()
    partial = tmp_path / "partial.pt"
    _train_until(cfg, partial, stop=10)
    resumed = train(cfg, checkpoint=partial, progress=False)
    assert resumed["steps_run"] == 20
    assert resumed["metrics"] == full["metrics"]
    assert resumed["history"] == full["history"]
    assert resumed["couplings"] == full["couplings"]


def _train_until(cfg, path, stop):
    """Run cfg but stop (as if killed) right after the checkpoint at `stop` steps."""
    import boltzmann_attention.experiments.train as T

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
    cfg = TrainConfig(task="shakespeare", T=5, **{**SMALL, "steps": 2})
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupted or unreadable"):
        train(cfg, checkpoint=bad, progress=False)
    other = tmp_path / "other.pt"
    _train_until(replace(cfg, steps=4), other, stop=2)
    with pytest.raises(ValueError, match="another config"):
        train(replace(cfg, mode="h", steps=4), checkpoint=other, progress=False)


@pytest.mark.parametrize("change,message", [
    (dict(task="copying"), "unknown task"),
    (dict(mode="K"), "unknown mode"),
    (dict(method="magic"), "unknown method"),
    (dict(T=30), "beyond method 'exact'"),
    (dict(mode="h+K", method="meanfield"), "needs method='exact'"),
    (dict(T=17, method="dqa"), "beyond method 'dqa'"),
])
def test_bad_configs_fail_before_training(change, message):
    with pytest.raises(ValueError, match=message):
        train(TrainConfig(**{**SMALL, **change}), progress=False)


def test_position_head_masks_later_positions():
    model = Model(ModelConfig(vocab_size=10, max_len=6, head="position", d_model=16, d_ff=0))
    scores = model(torch.randint(0, 10, (2, 6)))
    assert scores.shape == (2, 6, 6)
    later = torch.ones(6, 6, dtype=torch.bool).triu()
    later[0, 0] = False
    assert torch.isinf(scores[:, later]).all() and torch.isfinite(scores[:, ~later]).all()


def test_sweep_skips_finished_runs(tmp_path):
    grid = Grid(("brackets",), (4,), modes=("softmax", "h"), seeds=(0,), overrides={**SMALL, "steps": 3})
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


def test_sweep_reports_a_failed_run_and_finishes_the_others(tmp_path):
    grid = Grid(("brackets",), (4,), modes=("softmax", "h"), seeds=(0,), overrides={**SMALL, "steps": 2})
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
    cfg = TrainConfig(task="brackets", T=4, mode=mode, method=method, method_options=options,
                      **{**SMALL, "steps": 30, "eval_interval": 30, "coupling_init_std": 0.05})
    result = train(cfg, progress=False)
    initial = train(replace(cfg, steps=1, eval_interval=1), progress=False)
    assert result["metrics"]["val"]["loss"] < initial["metrics"]["val"]["loss"]
    assert torch.tensor(result["couplings"]).ne(torch.tensor(initial["couplings"])).any()
    # the same weights are also evaluated with exact marginals (brackets: val and test)
    assert set(result["metrics"]) == {"val", "test", "val_exact", "test_exact"}
    assert 0.0 <= result["metrics"]["test_exact"]["accuracy"] <= 1.0


def test_marginals_method_swaps_and_restores():
    """Inside marginals_method(model, 'exact') a DQA model computes what the same weights built with
    method='exact' compute; afterwards it samples again."""
    torch.manual_seed(0)
    cfg = TrainConfig(task="brackets", T=4, method="dqa", method_options={"num_samples": 8}, **SMALL)
    sampled = Model(cfg.model_config(vocab_size=12)).eval()
    exact = Model(replace(cfg, method="exact", method_options={}).model_config(vocab_size=12)).eval()
    exact.load_state_dict(sampled.state_dict())
    x = torch.randint(0, 12, (3, 4))
    with torch.no_grad():
        with marginals_method(sampled, "exact"):
            assert torch.allclose(sampled(x), exact(x), atol=1e-6)
        assert sampled.blocks[0].attn.method == "dqa" and sampled.blocks[0].attn.method_options == {"num_samples": 8}
    exact_result = train(replace(cfg, method="exact", method_options={}, steps=2, eval_interval=2), progress=False)
    assert "val_exact" not in exact_result["metrics"]
