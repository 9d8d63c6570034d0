"""The training loop: one model on one task, evaluated, checkpointed, and its result with the analyses asked for.

Defaults (chosen so that the softmax baseline converges on both tasks at the paper's sizes; see the README):
AdamW, lr 3e-3, betas (0.9, 0.95), weight decay 0.1 on weight matrices only (never on J, K or the field
bias), 200 warm-up steps then cosine decay to 10% of lr, gradient clipping at 1.0, batch 64, 4000 steps.

Reproducibility: the seed fixes the initialisation (torch's global RNG) and the data order (a separate
torch.Generator). A checkpoint (:mod:`.checkpoints`) holds model, optimiser, scheduler, both RNG states, config,
step and the training time so far, so a resumed run equals an uninterrupted one bit for bit on CPU (with the
same number of threads) and its ``wall_time_s`` is the sum over its segments.

Analyses: ``train(cfg, analyses=...)`` runs each :class:`Analysis` on the trained model and stores what it
returns under its name in the result. The loop knows no study: a study names the analyses its runs need in its
grids (the priors study: the co-attention measurement of :mod:`..coattention`).

Threads: ``train(threads=n)`` runs with n torch threads (restored afterwards); the default keeps torch's
current setting (all cores unless set). Concurrent runs on one machine must share the cores: give each
``threads=sweep.threads_per_run(concurrent_runs)`` (cores // runs), since more threads than cores make torch's
OpenMP threads spin against each other (two runs with two threads each on 2 cores ran ~20x slower).

Distributed: under ``torchrun`` (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel over gloo;
each rank draws batch_size / world_size examples from its own generator; rank 0 evaluates and writes. A
checkpoint holds every rank's RNG states, so a run resumes with the number of processes that wrote it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ... import ising
from ...attention import BoltzmannAttention, parameter_groups
from ...couplings import ContentCouplings
from ...ising.meanfield import ConvergenceWarning
from ...positions import SlotBias
from ...provenance import machine_info
from .. import tasks
from ..config import TrainConfig, _integer
from ..model import Model, ModelConfig, loss_fn
from .checkpoints import check_output_path, load_checkpoint, read_checkpoint, save_checkpoint
from .memory import memory_probe, peak_rss_mib, rss_mib

__all__ = ["Analysis", "Task", "build_optimizer", "learned_priors", "load_final", "model_config", "setup_run",
           "train", "train_step"]


def _always(_) -> bool:
    return True


@dataclass(frozen=True)
class Analysis:
    """A measurement of the trained model that a study asks of its runs.

    ``applies(cfg)``: whether runs of this config get it; ``run(model, task)`` returns a JSON-serialisable dict,
    stored in the result under ``name``; ``current(recorded)``: whether a recorded value is of this version of
    the analysis (a sweep measures a finished run again, from its kept model, when it is not). Module-level
    functions only: a sweep sends the analyses to its worker processes.
    """

    name: str
    run: Callable
    applies: Callable[[TrainConfig], bool] = _always
    current: Callable[[dict], bool] = _always


RESULT_KEYS = ("config", "seed", "steps_run", "wall_time_s", "threads", "metrics", "history", "memory", "data",
               "convergence", "layers", "run", "variant")  # what an analysis may not be called


class Task:
    """The data and metrics of one task (:mod:`..tasks`), behind one interface for the training loop."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.record = tasks.get(cfg.data.task)
        self.data = self.record.build(cfg)
        self.vocab_size = self.data.vocab_size
        self.val = self.data.val

    def batch(self, batch_size: int, generator: torch.Generator):
        return self.data.batch(batch_size, generator)

    @torch.no_grad()
    def evaluate(self, model, split: str = "val", batch_size: int = 256) -> dict:
        """The task's metrics of ``model`` on ``split`` ('val' or 'test')."""
        x, y = self.val if split == "val" else self.data.test
        return self.record.evaluate(model, x, y, batch_size)


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.optim.warmup_steps:
        return (step + 1) / cfg.optim.warmup_steps
    progress = (step - cfg.optim.warmup_steps) / max(1, cfg.steps - cfg.optim.warmup_steps)
    return cfg.optim.min_lr_ratio + (1 - cfg.optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: Model, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over :func:`parameter_groups`, with the couplings (J, K) and the slot biases (their pair tables
    included) in groups of their own at lr x coupling_lr_multiplier and lr x slot_bias_lr_multiplier."""
    groups = parameter_groups(model, cfg.optim.weight_decay)
    slot_biases = {id(p) for m in model.modules() if isinstance(m, SlotBias) for p in m.parameters()}
    scaled = (([p for name, p in model.named_parameters() if ("couplings" in name or "three_body" in name)
                and id(p) not in slot_biases], cfg.optim.coupling_lr_multiplier),
              ([p for p in model.parameters() if id(p) in slot_biases], cfg.optim.slot_bias_lr_multiplier))
    for params, multiplier in scaled:
        if params and multiplier != 1.0:
            ids = {id(p) for p in params}
            for g in groups:
                g["params"] = [p for p in g["params"] if id(p) not in ids]
            groups.append({"params": params, "weight_decay": 0.0, "lr_multiplier": multiplier})
    for g in groups:
        g["lr"] = cfg.optim.lr * g.get("lr_multiplier", 1.0)
    # fused AdamW: one kernel over all parameters instead of a dozen ops per tensor (the paper's model has
    # ~20 small tensors, so the optimiser step was mostly per-op overhead); CPU and CUDA support it. It rounds
    # differently from the per-tensor loop, so a study keeps one of the two for all its runs.
    fused = cfg.optim.fused_optimizer and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                                        for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=cfg.optim.lr, betas=(0.9, cfg.optim.beta2), fused=fused or None)


def train(cfg: TrainConfig, *, checkpoint: str | Path | None = None, checkpoint_interval: int = 500,
          progress: bool = True, out: str | Path | None = None, threads: int | None = None,
          analyses: tuple[Analysis, ...] = ()) -> dict | None:
    """Train one model and return its results (config, metrics, history, learned couplings, timing).

    metrics: 'val' (and 'test' when the task has one) with the configured method. A model trained through a sampled
    method (``ising.SAMPLED_METHODS``) is also evaluated with exact marginals, 'val_exact' (and
    'test_exact'), when T is within the exact method's limit.

    Under DDP only rank 0 returns the results; the other ranks return None.

    With ``checkpoint``, the run resumes from that file if it exists and saves it every
    ``checkpoint_interval`` steps and at the end (:func:`default_checkpoint` gives the path next to a
    result file). ``out``: the result path the caller will write (with :func:`write_result`); like the
    checkpoint's, its folder is created and checked to be writable before training. ``threads``: torch
    threads for this run (restored afterwards; default: leave torch's setting; see :func:`.sweep.threads_per_run`).
    ``wall_time_s`` is the training time summed over every segment of a resumed run. ``analyses``: each
    :class:`Analysis` runs on the trained model (in eval mode), its result stored under its name.

    Raises ValueError before training for a bad config or output path, and during training when the run
    diverges (a non-finite loss, or weights the marginals reject, after a step that worked).
    """
    cfg.validate()
    _integer("checkpoint_interval", checkpoint_interval, 1)
    check_analyses(analyses)
    checkpoint = check_output_path(checkpoint, "checkpoint") if checkpoint else None
    if out is not None:
        out = check_output_path(out, "result")
        if checkpoint is not None and out.resolve() == checkpoint.resolve():
            raise ValueError(f"the checkpoint and the result must be different files, both are {out}")
    if threads is not None:
        _integer("threads", threads, 1)
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(cfg, checkpoint, checkpoint_interval, progress, tuple(analyses))
    finally:
        torch.set_num_threads(saved_threads)


def check_analyses(analyses) -> None:
    """ValueError unless ``analyses`` is a sequence of :class:`Analysis` with distinct names that are not the
    result's own keys."""
    if not isinstance(analyses, (tuple, list)) or not all(isinstance(a, Analysis) for a in analyses):
        raise ValueError(f"analyses must be a tuple of train.Analysis, got {analyses!r}")
    names = [a.name for a in analyses]
    clash = sorted({n for n in names if n in RESULT_KEYS or names.count(n) > 1})
    if clash:
        raise ValueError(f"analysis names {clash} are taken (by another analysis, or by the result's keys "
                         f"{RESULT_KEYS})")


def _train(cfg: TrainConfig, checkpoint: Path | None, checkpoint_interval: int, progress: bool,
           analyses: tuple[Analysis, ...]) -> dict | None:
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank, world = 0, 1
    if distributed:
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if cfg.batch_size % world:
            raise ValueError(f"batch_size {cfg.batch_size} is not divisible by the world size {world}")
    memory = memory_probe(cfg) if cfg.measure.memory_probe_steps and rank == 0 else None
    task, model, optimizer, scheduler, generator = setup_run(cfg, rank)
    start, history, elapsed = 0, [], 0.0
    if checkpoint and checkpoint.exists():
        start, history, elapsed = load_checkpoint(checkpoint, cfg, model, optimizer, scheduler, generator, rank,
                                                  world)
    net = DistributedDataParallel(model) if distributed else model

    t0 = time.perf_counter()
    bar = _progress_bar(cfg, start, enabled=progress and rank == 0)
    stepped = False  # has this segment made an optimiser step (then a failure means divergence)
    unconverged = Unconverged(enabled=cfg.attention.method in ising.ITERATIVE_METHODS)
    for step in range(start, cfg.steps):
        x, y = task.batch(cfg.batch_size // world, generator)
        try:
            with unconverged.watch("steps"):
                loss = train_step(net, model, optimizer, x, y, cfg)
            stepped = True
            scheduler.step()
            done = step + 1
            if rank == 0 and (done % cfg.measure.eval_interval == 0 or done == cfg.steps):
                model.eval()
                with unconverged.watch("evaluations"):
                    metrics = task.evaluate(model)
                model.train()
                if not math.isfinite(metrics["loss"]):
                    raise ValueError(f"the validation loss is {metrics['loss']}")
                history.append({"step": done, "train_loss": loss.item(), **metrics})
        except ValueError as e:  # after a step that worked: the weights blew up (e.g. "h contains NaN or inf")
            if not stepped:
                raise
            raise _diverged(cfg, step, model, str(e)) from None
        except TypeError as e:  # a method that forwards its options (validate cannot see their names)
            if stepped or "unexpected keyword argument" not in str(e):
                raise
            raise ValueError(f"method_options {cfg.attention.method_options} has an option that method "
                             f"{cfg.attention.method!r} does not take: {e}") from None
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", **({"val": _headline(history[-1])} if history else {}))
        if checkpoint and (done % checkpoint_interval == 0 or done == cfg.steps):
            data_rng = _per_rank(generator.get_state(), world)  # collective: every process takes part
            torch_rng = _per_rank(torch.get_rng_state(), world)
            if rank == 0:
                save_checkpoint(checkpoint, model, optimizer, scheduler, cfg, done, history, data_rng=data_rng,
                                torch_rng=torch_rng, elapsed=elapsed + time.perf_counter() - t0)
    if bar is not None:
        bar.close()
    wall = elapsed + time.perf_counter() - t0

    model.eval()
    with unconverged.watch("evaluations"):
        final = task.evaluate(model)
    result = {"config": asdict(cfg), "seed": cfg.seed, "steps_run": cfg.steps - start, "wall_time_s": wall,
              "threads": torch.get_num_threads(), "metrics": {"val": final}, "history": history,
              **machine_info()}
    if memory is not None:
        result["memory"] = memory
    if "test" in task.record.splits:
        with unconverged.watch("evaluations"):
            result["metrics"]["test"] = task.evaluate(model, "test")
    if extra := task.record.extra(task.data):
        result["data"] = extra
    if unconverged.found():
        result["convergence"] = unconverged.summary()
    if cfg.attention.method in ising.SAMPLED_METHODS and cfg.data.T <= ising.methods.REGISTRY["exact"].max_spins:
        # the same weights with exact marginals: what training through the sampler learned, apart from the
        # sampler's own behaviour (noise, and a non-Boltzmann distribution for dqa/sqa) at evaluation
        with marginals_method(model, "exact"):
            result["metrics"]["val_exact"] = task.evaluate(model)
            if "test" in task.record.splits:
                result["metrics"]["test_exact"] = task.evaluate(model, "test")
    layers = [learned_priors(block.attn, cfg.data.T) for block in model.blocks]
    if any(layers):
        result["layers"] = layers  # every layer's couplings, field and slot biases
    for analysis in analyses:
        if analysis.applies(cfg):
            result[analysis.name] = analysis.run(model, task)
    if distributed:
        dist.barrier()
    return result if rank == 0 else None


def learned_priors(attn: BoltzmannAttention, T: int) -> dict:
    """The layer's learned couplings ((H, T, T), or (H, W, W) by slot for the window), field bias (H,), slot
    bias (H, W) and, for the pairs parametrisation, its pair table P (H, W, W) (``slot_bias_pairs``), as lists
    of each float32 value's shortest decimal (it reads back to the same float32, in half the characters of its
    float64 digits); only those it has. Couplings computed from content depend on the input: none are recorded
    (an analysis measures them on data)."""
    out = {}
    if attn.couplings is not None and not isinstance(attn.couplings, ContentCouplings):
        out["couplings"] = float32_list(attn.couplings(T))
    if attn.field_bias is not None:
        out["field_bias"] = float32_list(attn.field_bias)
    if attn.slot_bias is not None:
        out["slot_bias"] = float32_list(attn.slot_bias.weight)
        if attn.slot_bias.pairs is not None:
            out["slot_bias_pairs"] = float32_list(attn.slot_bias.pairs())
    return out


def float32_list(t: Tensor) -> list:
    """A tensor's values as nested lists of the shortest decimals that read back to the same float32s (float64
    values as they are: Python writes those shortest already; narrower dtypes widen to float32 exactly)."""
    if t.dtype == torch.float64:
        return t.detach().cpu().tolist()
    values = t.detach().float().cpu().numpy()
    shortest = np.array([float(str(x)) for x in values.reshape(-1)], dtype=object)  # str of a float32: shortest
    return shortest.reshape(values.shape).tolist()


class Unconverged:
    """Counts the training steps and the validation evaluations in which an iterative solver (mean field,
    TAP) warned that it did not converge, instead of one warning per solve (thousands in a run): the counts
    and the first and last messages go into the result ('convergence'), and one warning at the end says so.
    An evaluation that did not converge is the approximation's loss, not the fixed point's. Other warnings
    are passed on as they were. The counts cover this segment of a resumed run. Only the iterative methods
    warn so; for the others (``enabled`` False) ``watch`` does nothing, keeping the training step free of it."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.unconverged = {"steps": 0, "evaluations": 0}
        self.total = {"steps": 0, "evaluations": 0}
        self.first = self.last = None

    @contextmanager
    def watch(self, kind: str):
        """Watch one training step (``kind`` 'steps') or one evaluation ('evaluations')."""
        if not self.enabled:
            yield
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            yield
        found = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
        for w in caught:
            if not issubclass(w.category, ConvergenceWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        self.total[kind] += 1
        if found:
            self.unconverged[kind] += 1
            self.first = self.first or str(found[0].message)
            self.last = str(found[-1].message)

    def found(self) -> bool:
        return any(self.unconverged.values())

    def summary(self) -> dict:
        u, n = self.unconverged, self.total
        warnings.warn(f"the marginals did not converge in {u['steps']} of {n['steps']} training steps and "
                      f"{u['evaluations']} of {n['evaluations']} evaluations (first: {self.first}); the counts are "
                      "in the result's 'convergence'", ConvergenceWarning, stacklevel=3)
        return {"unconverged_steps": u["steps"], "steps": n["steps"], "unconverged_evaluations": u["evaluations"],
                "evaluations": n["evaluations"], "first": self.first, "last": self.last}


def model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    """The model of ``cfg`` for a vocabulary: its context length T, architecture, attention, and the task's head."""
    return ModelConfig(vocab_size=vocab_size, max_len=cfg.data.T, arch=cfg.arch, attention=cfg.attention,
                       head=tasks.get(cfg.data.task).head)


def load_final(path: str | Path) -> tuple[Task, Model]:
    """The task and the trained model of a checkpoint (a sweep keeps each finished run's as
    ``<out>/final/<name>.pt``), in eval mode."""
    state = read_checkpoint(path)
    cfg = TrainConfig.from_dict(state["config"])
    task = Task(cfg)
    model = Model(model_config(cfg, task.vocab_size))
    model.load_state_dict(state["model"])
    return task, model.eval()


def setup_run(cfg: TrainConfig, rank: int = 0):
    """The task, the model (initialised from cfg.seed), its optimiser and schedule, and the data generator
    of process ``rank``."""
    task = Task(cfg)
    torch.manual_seed(cfg.seed)
    model = Model(model_config(cfg, task.vocab_size))
    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg))
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + 1 + rank)
    return task, model, optimizer, scheduler, generator


def train_step(net, model: Model, optimizer, x: Tensor, y: Tensor, cfg: TrainConfig) -> Tensor:
    """One optimiser step on the batch (x, y) (``net``: the model, or its DDP wrapper); returns the loss."""
    loss = loss_fn(net(x), y)
    if not torch.isfinite(loss):
        raise ValueError(f"the training loss is {loss.item()}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
    optimizer.step()
    return loss


def _probe_main() -> None:
    """The memory probe's process: reads {"config", "threads"} from stdin, prints the measurement as JSON."""
    request = json.loads(sys.stdin.read())
    torch.set_num_threads(request["threads"])
    cfg = TrainConfig.from_dict(request["config"])
    task, model, optimizer, _, generator = setup_run(cfg)
    before = rss_mib()
    for _ in range(cfg.measure.memory_probe_steps):
        train_step(model, model, optimizer, *task.batch(cfg.batch_size, generator), cfg)
    peak = peak_rss_mib()
    print(json.dumps({"peak_rss_mib": peak, "rss_before_steps_mib": before,
                      "steps_mib": None if before is None else peak - before, "steps": cfg.measure.memory_probe_steps,
                      "batch_size": cfg.batch_size, "threads": torch.get_num_threads(),
                      "how": "a fresh Python process: data, model and optimiser built as in a run, then the "
                             "training steps (no evaluation); peak = the process's VmHWM"}))


def _diverged(cfg: TrainConfig, step: int, model: Model, what: str) -> ValueError:
    largest = max(float(p.detach().abs().max()) for p in model.parameters())
    return ValueError(f"training diverged at step {step + 1} of {cfg.steps}: {what} (largest weight magnitude "
                      f"{largest:.3g}); lower lr (now {cfg.optim.lr:g}) or coupling_lr_multiplier "
                      f"(now {cfg.optim.coupling_lr_multiplier:g}), or clip gradients "
                      f"(grad_clip now {cfg.optim.grad_clip:g})")


def _per_rank(state: Tensor, world: int) -> Tensor:
    """Every process's copy of an RNG state, (world, bytes); under DDP an all-gather over the processes."""
    if world == 1:
        return state[None].clone()
    parts = [torch.empty_like(state) for _ in range(world)]
    dist.all_gather(parts, state)
    return torch.stack(parts)


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
    from ..progress import progress

    return progress(total=cfg.steps, initial=start, desc=f"{cfg.data.task} T={cfg.data.T} {cfg.attention.mode}",
                    unit="step", leave=False, dynamic_ncols=True)


