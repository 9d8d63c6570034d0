"""Checkpoints and result files: checksummed, atomic, and never a way to run code from a file.

A checkpoint is a header line, the sha256 of the payload, then the payload (a ``torch.save`` file of tensors and
plain Python data only). Loading checks the sha256 first and then unpickles with ``weights_only=True``, so a
damaged file is refused and a crafted one cannot run code. Every file here is written atomically (temp file,
fsync, ``os.replace``): a killed process leaves the old file or the new one. :func:`default_checkpoint` is the
path next to a result file.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import re
import tempfile
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor

from ..config import TrainConfig

try:
    import fcntl
except ImportError:  # not POSIX: result writes take no lock
    fcntl = None

__all__ = ["CHECKPOINT_FORMAT", "check_output_folder", "check_output_path", "default_checkpoint", "load_checkpoint",
           "read_checkpoint", "result_lock", "save_checkpoint", "write_result"]

CHECKPOINT_FORMAT = 2


_MAGIC = b"boltzmann-attention checkpoint 2\n"  # then 64 hex digits of sha256(payload), a newline, the payload


def default_checkpoint(out: str | Path) -> Path:
    """The checkpoint path that goes with the result file ``out``: ``results/x.json`` -> ``results/x.ckpt.pt``."""
    return Path(out).with_suffix(".ckpt.pt")


def check_output_path(path: str | Path, what: str = "output") -> Path:
    """Create the folder of ``path`` if missing and check that a file can be written there (by writing and
    removing a temporary file); ValueError naming the path otherwise. Returns ``path`` as a Path."""
    path = Path(path)
    try:
        if not path.name or path.is_dir():
            raise ValueError(f"the {what} path {str(path)!r} is a folder; give a file path")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as e:
        raise ValueError(f"cannot write the {what} {str(path)[:200]}: {e.strerror or e} (the file and a temporary "
                         "file beside it, named after it, must be writable)") from None
    return path


def check_output_folder(path: str | Path, what: str = "output", create: bool = True) -> Path:
    """Create the folder ``path`` (and its parents) if missing; ValueError naming it when that cannot be done
    (a regular file in the way, no permission, a name too long). With ``create`` False nothing is written: only
    a file where the folder or one of its parents would be is an error. Returns ``path`` as a Path."""
    path = Path(path)
    if not create:
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            where = "it" if existing == path else str(existing)
            raise ValueError(f"cannot use {path} as the {what} folder: {where} is not a folder")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot use {path} as the {what} folder: {getattr(e, 'strerror', None) or e}") from None
    if not path.is_dir():
        raise ValueError(f"cannot use {path} as the {what} folder: it is not a folder")
    return path


def _frame(payload: bytes) -> bytes:
    """A checkpoint file's bytes: header line, sha256 of the payload, newline, payload."""
    return _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a killed process leaves either the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_checkpoint(path: Path, model, optimizer, scheduler, cfg: TrainConfig, step: int, history: list, *,
                    data_rng: Tensor, torch_rng: Tensor, elapsed: float = 0.0) -> None:
    """Write everything a resumed run needs, checksummed, atomically.

    data_rng, torch_rng: (world size, state bytes), every process's data generator and global RNG states
    (see :func:`_per_rank`); elapsed: training seconds so far.
    """
    state = {"format": CHECKPOINT_FORMAT, "config": asdict(cfg), "step": step, "history": history,
             "elapsed_s": float(elapsed), "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "data_rng": data_rng, "torch_rng": torch_rng}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    _atomic_write(Path(path), _frame(buffer.getvalue()))


def read_checkpoint(path: str | Path) -> dict:
    """The state saved by :func:`save_checkpoint`, after checking its sha256; never runs code from the file.

    ValueError (naming the file and saying to delete it to restart) for a file that is unreadable, not a
    checkpoint of this format, damaged, or holds anything but tensors and plain data.
    """
    path = Path(path)

    def refuse(why: str) -> ValueError:
        return ValueError(f"checkpoint {path} {why}; delete it to restart the run from step 0")

    not_ours = f"is corrupted or not a boltzmann-attention checkpoint (format {CHECKPOINT_FORMAT})"
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise refuse(f"is unreadable: {e.strerror or e}") from None
    if not raw.startswith(_MAGIC):
        if raw.startswith(b"PK"):  # a plain torch.save file, e.g. of checkpoint format 1
            raise refuse(f"{not_ours}: a plain torch file without a checksum, not loaded") from None
        raise refuse(not_ours)
    head = len(_MAGIC)
    digest, payload = raw[head:head + 64], raw[head + 65:]
    if raw[head + 64:head + 65] != b"\n" or hashlib.sha256(payload).hexdigest().encode() != digest:
        raise refuse("is corrupted: its content does not match its sha256 checksum (damaged or truncated)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise refuse(f"was refused: it holds objects other than tensors and plain data{what}, and loading it "
                     "could run code") from None
    except Exception as e:  # noqa: BLE001 - any other failure of a checksummed file is damage
        raise refuse(f"{not_ours}: {type(e).__name__}: {e}") from None
    keys = {"format", "config", "step", "history", "elapsed_s", "model", "optimizer", "scheduler", "data_rng",
            "torch_rng"}
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or not keys <= set(state):
        raise refuse(not_ours)
    return state


def load_checkpoint(path: Path, cfg: TrainConfig, model, optimizer, scheduler, generator, rank: int = 0,
                    world: int = 1) -> tuple[int, list, float]:
    """Restore a checkpoint written by :func:`save_checkpoint` for the same config and number of processes
    (process ``rank`` of ``world`` takes its own RNG states); returns (step, history, elapsed seconds)."""
    state = read_checkpoint(path)
    try:
        saved = TrainConfig.from_dict(state["config"]).flat()  # nested, or flat from before the nesting
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"checkpoint {path} holds an unreadable config ({e}); delete it to restart the run "
                         "from step 0") from None
    if saved != cfg.flat():
        diff = {k: (saved.get(k), v) for k, v in cfg.flat().items() if saved.get(k) != v}
        raise ValueError(f"checkpoint {path} was written for another config; differences (saved, now): {diff}")
    step, elapsed, data_rng, torch_rng = state["step"], state["elapsed_s"], state["data_rng"], state["torch_rng"]
    if (not isinstance(step, int) or not 0 <= step <= cfg.steps or not isinstance(elapsed, float)
            or not math.isfinite(elapsed) or elapsed < 0):
        raise ValueError(f"checkpoint {path} holds an invalid step {step!r} or time {elapsed!r}; delete it to "
                         "restart the run from step 0")
    history = state["history"]
    if not isinstance(history, list) or not all(isinstance(h, dict) and isinstance(h.get("step"), int)
                                                for h in history):
        raise ValueError(f"checkpoint {path} holds an invalid history ({type(history).__name__}, expected a list "
                         "of evaluations); delete it to restart the run from step 0")
    for rng in (data_rng, torch_rng):
        if not isinstance(rng, Tensor) or rng.dim() != 2 or len(rng) != world:
            saved = len(rng) if isinstance(rng, Tensor) and rng.dim() == 2 else "?"
            raise ValueError(f"checkpoint {path} was written by a run of {saved} process(es), this one has "
                             f"{world}: resume it with {saved}, or delete it to restart the run from step 0")
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(data_rng[rank].clone())
        torch.set_rng_state(torch_rng[rank].clone())
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"checkpoint {path} does not match the model: {e}") from None
    return step, history, float(elapsed)


@contextmanager
def result_lock(path: str | Path):
    """An exclusive lock on the result files of ``path``'s folder for the block (``fcntl.flock`` on ``.lock`` in
    it; processes and threads wait for each other), so that a check of the file there and the write that follows
    see no other writer in between. Where fcntl is missing (not POSIX), no lock."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(folder / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_result(result: dict, path: str | Path) -> None:
    """Write a results JSON atomically (a killed process leaves either the old file or the new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, json.dumps(result, indent=1).encode())

