"""The memory a run takes, measured in a fresh process (:func:`memory_probe`), and this process's sizes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from ..config import TrainConfig, _integer

__all__ = ["memory_probe"]

# the probe's process: builds the run and steps it (the loop's _probe_main), then prints its sizes
_PROBE = "from boltzmann_attention.experiments.train.loop import _probe_main; _probe_main()"


def memory_probe(cfg: TrainConfig, threads: int | None = None) -> dict:
    """The memory that training ``cfg`` takes, measured in a fresh Python process.

    The process builds the data, model and optimiser of ``cfg`` as a run does, then makes
    ``cfg.measure.memory_probe_steps`` training steps (at cfg.batch_size; no evaluation). Returned: its peak resident
    set size (the high-water mark of that process alone, see :func:`peak_rss_mib`), its RSS before the
    first step (Linux: /proc/self/status; else None), their
    difference (the steps' working memory: activations, gradients, optimiser state), in MiB, and how it
    was measured. A fresh process per probe is what makes the peak belong to this config: a sweep's worker
    runs many runs, and its high-water mark is that of the largest so far. ``threads``: torch threads of
    the process (default: this process's). ValueError with the process's last output if it fails.
    """
    cfg.validate()
    _integer("memory_probe_steps", cfg.measure.memory_probe_steps, 1)
    root = str(Path(__file__).resolve().parents[3])  # the folder holding the boltzmann_attention package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    request = json.dumps({"config": asdict(cfg), "threads": threads or torch.get_num_threads()})
    done = subprocess.run([sys.executable, "-c", _PROBE], input=request, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise ValueError(f"the memory probe of {cfg.measure.memory_probe_steps} steps failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _status_mib(field: str) -> float | None:
    """A size from /proc/self/status (Linux), in MiB; None where it is missing."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else None


def rss_mib() -> float | None:
    """This process's resident set size now (Linux), in MiB; None elsewhere."""
    return _status_mib("VmRSS")


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set size (VmHWM) to its current size (Linux: ``/proc/self/clear_refs``);
    False where it cannot, and the peak then keeps what came before."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_mib() -> float:
    """This process's peak resident set size, in MiB: VmHWM on Linux, the high-water mark of this program's
    address space. Not ru_maxrss: Linux carries that over fork and exec, so a child started by a large
    process reports at least the parent's size (measured: a probe started by a process that had trained
    a model read 501 MiB by ru_maxrss against 464 MiB by VmHWM). Elsewhere ru_maxrss (KiB on most systems,
    bytes on macOS), with that caveat."""
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024

