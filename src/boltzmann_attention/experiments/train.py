"""Training one model on one task: config, loop, evaluation, checkpoints, results.

Defaults (chosen so that the softmax baseline converges on both tasks at the paper's sizes; see the README):
AdamW, lr 3e-3, betas (0.9, 0.95), weight decay 0.1 on weight matrices only (never on J, K or the field
bias), 200 warm-up steps then cosine decay to 10% of lr, gradient clipping at 1.0, batch 64, 4000 steps.

Reproducibility: the seed fixes the initialisation (torch's global RNG) and the data order (a separate
torch.Generator). A checkpoint holds model, optimiser, scheduler, both RNG states, config and step, so a
resumed run equals an uninterrupted one bit for bit on CPU.

Distributed: under ``torchrun`` (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel over gloo;
each rank draws batch_size / world_size examples from its own generator; rank 0 evaluates and writes.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .. import ising
from ..attention import MODES, BoltzmannAttention, parameter_groups
from ..ising.annealing import MAX_SPINS as DQA_MAX_SPINS
from ..ising.exact import MAX_SPINS as EXACT_MAX_SPINS
from ..provenance import machine_info
from . import data as datasets
from .model import Model, ModelConfig, loss_fn

TASKS = ("shakespeare", "brackets")
CHECKPOINT_FORMAT = 1


@dataclass
class TrainConfig:
    task: str = "shakespeare"          # shakespeare | brackets
    T: int = 8                         # window length = number of spins per query
    mode: str = "h+J"
    method: str = "exact"
    seed: int = 0
    steps: int = 4000
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 200
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_interval: int = 1000
    eval_windows: int = 2048           # Shakespeare validation windows (fixed, deterministic)
    d_model: int = 64
    n_heads: int = 1
    n_layers: int = 1
    d_ff: int = 128                    # 0 removes the FFN
    coupling: str = "full"
    coupling_init_std: float = 0.0
    coupling_lr_multiplier: float = 1.0  # lr of J and K relative to lr
    field_bias_init: float | None = None  # None: -log(T) / 2
    learn_field_bias: bool = True
    num_fillers: int = 8               # brackets: filler vocabulary
    method_options: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ValueError for anything that would fail later, before any training."""
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of {TASKS}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {MODES}")
        if self.method not in ising.METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {sorted(ising.METHODS)}")
        if self.T < 2:
            raise ValueError("T must be at least 2")
        limit = {"exact": self.method_options.get("max_spins", EXACT_MAX_SPINS), "reference": 20,
                 "dqa": DQA_MAX_SPINS}.get(self.method)
        if self.mode not in ("softmax", "h") and limit is not None and self.T > limit:
            raise ValueError(f"T = {self.T} is beyond method {self.method!r}'s limit of {limit} spins; "
                             "use method='banded' (with coupling='relative'), 'meanfield' or 'tap'")
        if "K" in self.mode and self.method not in ("exact", "reference"):
            raise ValueError(f"mode {self.mode!r} (three-body couplings) needs method='exact'")
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("steps, batch_size and lr must be positive")

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(
            vocab_size=vocab_size, max_len=self.T, mode=self.mode, method=self.method, d_model=self.d_model,
            n_heads=self.n_heads, n_layers=self.n_layers, d_ff=self.d_ff,
            head="lm" if self.task == "shakespeare" else "position", coupling=self.coupling,
            coupling_init_std=self.coupling_init_std, field_bias_init=self.field_bias_init,
            learn_field_bias=self.learn_field_bias, method_options=self.method_options)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config fields: {sorted(unknown)}")
        return cls(**d)


class Task:
    """The data and metrics of one task, behind one interface for the training loop."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        if cfg.task == "shakespeare":
            self.data = datasets.ShakespeareData()
            self.vocab_size = self.data.vocab.size
            self.val = self.data.val_windows(cfg.T, max_windows=cfg.eval_windows)
        else:
            self.data = datasets.BracketData(cfg.T, seed=cfg.seed, num_fillers=cfg.num_fillers)
            self.vocab_size = self.data.vocab_size
            self.val = self.data.val

    def batch(self, batch_size: int, generator: torch.Generator):
        if self.cfg.task == "shakespeare":
            return self.data.train_batch(batch_size, self.cfg.T, generator)
        return self.data.train_batch(batch_size, generator)

    @torch.no_grad()
    def evaluate(self, model, split: str = "val", batch_size: int = 256) -> dict:
        """Shakespeare: loss and perplexity over all positions and at the last position only.
        Brackets: loss and accuracy of the position head over closing brackets."""
        x, y = self.val if split == "val" else self.data.test
        nll_sum = nll_last = correct = count = 0.0
        for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
            out = model(xb)
            nll = torch.nn.functional.cross_entropy(out.transpose(1, 2), yb, ignore_index=-100, reduction="none")
            labelled = yb != -100
            nll_sum += float(nll[labelled].sum())
            count += int(labelled.sum())
            if self.cfg.task == "shakespeare":
                nll_last += float(nll[:, -1].sum())
            else:
                correct += int(((out.argmax(-1) == yb) & labelled).sum())
        loss = nll_sum / count
        if self.cfg.task == "shakespeare":
            return {"loss": loss, "ppl": math.exp(loss), "loss_last": nll_last / len(x),
                    "ppl_last": math.exp(nll_last / len(x))}
        return {"loss": loss, "accuracy": correct / count}


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: Model, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = parameter_groups(model, cfg.weight_decay)
    couplings = [p for name, p in model.named_parameters() if ("couplings" in name or "three_body" in name)]
    if couplings and cfg.coupling_lr_multiplier != 1.0:
        ids = {id(p) for p in couplings}
        for g in groups:
            g["params"] = [p for p in g["params"] if id(p) not in ids]
        groups.append({"params": couplings, "weight_decay": 0.0, "lr_multiplier": cfg.coupling_lr_multiplier})
    for g in groups:
        g["lr"] = cfg.lr * g.get("lr_multiplier", 1.0)
    # fused AdamW: one kernel over all parameters instead of a dozen ops per tensor (the paper's model has
    # ~20 small tensors, so the optimiser step was mostly per-op overhead); CPU and CUDA support it
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused or None)


def save_checkpoint(path: Path, model, optimizer, scheduler, generator, cfg: TrainConfig, step: int,
                    history: list) -> None:
    state = {"format": CHECKPOINT_FORMAT, "config": asdict(cfg), "step": step, "history": history,
             "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "data_rng": generator.get_state(), "torch_rng": torch.get_rng_state()}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a killed run never leaves a half-written checkpoint


def load_checkpoint(path: Path, cfg: TrainConfig, model, optimizer, scheduler, generator) -> tuple[int, list]:
    """Restore a checkpoint written by :func:`save_checkpoint` for the same config; returns (step, history)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or not a torch file
        raise ValueError(f"checkpoint {path} is corrupted or unreadable: {e}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path} is not a boltzmann-attention checkpoint of format {CHECKPOINT_FORMAT}")
    if state["config"] != asdict(cfg):
        diff = {k: (state["config"].get(k), v) for k, v in asdict(cfg).items() if state["config"].get(k) != v}
        raise ValueError(f"checkpoint {path} was written for another config; differences (saved, now): {diff}")
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise ValueError(f"checkpoint {path} does not match the model: {e}") from None
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["data_rng"])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], state["history"]


def train(cfg: TrainConfig, *, checkpoint: str | Path | None = None, checkpoint_interval: int = 500,
          progress: bool = True) -> dict | None:
    """Train one model and return its results (config, metrics, history, learned couplings, timing).

    metrics: 'val' (and 'test' for brackets) with the configured method. A model trained through a sampled
    method (``ising.SAMPLED_METHODS``) is also evaluated with exact marginals, 'val_exact' (and
    'test_exact'), when T is within the exact method's limit.

    Under DDP only rank 0 returns the results; the other ranks return None.

    With ``checkpoint``, the run resumes from that file if it exists and saves it every
    ``checkpoint_interval`` steps and at the end.
    """
    cfg.validate()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank, world = 0, 1
    if distributed:
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if cfg.batch_size % world:
            raise ValueError(f"batch_size {cfg.batch_size} is not divisible by the world size {world}")
    task = Task(cfg)
    torch.manual_seed(cfg.seed)
    model = Model(cfg.model_config(task.vocab_size))
    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg))
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + 1 + rank)
    start, history = 0, []
    checkpoint = Path(checkpoint) if checkpoint else None
    if checkpoint and checkpoint.exists():
        start, history = load_checkpoint(checkpoint, cfg, model, optimizer, scheduler, generator)
    net = DistributedDataParallel(model) if distributed else model

    t0 = time.perf_counter()
    bar = _progress_bar(cfg, start, enabled=progress and rank == 0)
    for step in range(start, cfg.steps):
        x, y = task.batch(cfg.batch_size // world, generator)
        loss = loss_fn(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        done = step + 1
        if rank == 0 and (done % cfg.eval_interval == 0 or done == cfg.steps):
            model.eval()
            history.append({"step": done, "train_loss": loss.item(), **task.evaluate(model)})
            model.train()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", **({"val": _headline(history[-1])} if history else {}))
        if rank == 0 and checkpoint and (done % checkpoint_interval == 0 or done == cfg.steps):
            save_checkpoint(checkpoint, model, optimizer, scheduler, generator, cfg, done, history)
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t0

    model.eval()
    result = {"config": asdict(cfg), "seed": cfg.seed, "steps_run": cfg.steps - start, "wall_time_s": wall,
              "metrics": {"val": task.evaluate(model)}, "history": history, **machine_info()}
    if cfg.task == "brackets":
        result["metrics"]["test"] = task.evaluate(model, "test")
    if cfg.method in ising.SAMPLED_METHODS and cfg.T <= EXACT_MAX_SPINS:
        # the same weights with exact marginals: what training through the sampler learned, apart from the
        # sampler's own behaviour (noise, and a non-Boltzmann distribution for dqa/sqa) at evaluation
        with marginals_method(model, "exact"):
            result["metrics"]["val_exact"] = task.evaluate(model)
            if cfg.task == "brackets":
                result["metrics"]["test_exact"] = task.evaluate(model, "test")
    attn = model.blocks[0].attn
    if attn.couplings is not None:
        result["couplings"] = attn.couplings(cfg.T).detach().tolist()  # (H, T, T), first layer
    if attn.field_bias is not None:
        result["field_bias"] = attn.field_bias.detach().tolist()
    if distributed:
        dist.barrier()
    return result if rank == 0 else None


@contextmanager
def marginals_method(model: Model, method: str, options: dict | None = None):
    """Temporarily compute every Boltzmann attention layer's marginals with ``method`` (and ``options``)."""
    layers = [m for m in model.modules() if isinstance(m, BoltzmannAttention)]
    saved = [(m.method, m.method_options) for m in layers]
    try:
        for m in layers:
            m.method, m.method_options = method, dict(options or {})
        yield model
    finally:
        for m, (method_, options_) in zip(layers, saved):
            m.method, m.method_options = method_, options_


def _headline(metrics: dict) -> str:
    return f"{metrics['ppl']:.3f}" if "ppl" in metrics else f"{100 * metrics['accuracy']:.1f}%"


def _progress_bar(cfg: TrainConfig, start: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=start, desc=f"{cfg.task} T={cfg.T} {cfg.mode}", unit="step",
                leave=False, dynamic_ncols=True)


def write_result(result: dict, path: str | Path) -> None:
    """Write a results JSON atomically (a killed process leaves either the old file or the new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, path)
