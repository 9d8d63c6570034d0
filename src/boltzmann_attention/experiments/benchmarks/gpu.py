"""The GPU check, one command: the CUDA tests, then forward+backward times of the layers against SDPA (flash).

``boltzmann-attention-bench gpu`` on a machine with a CUDA device, in under 8 minutes:

1. runs the test cases that take a ``device`` (and the CUDA sync checks) on CUDA: ``pytest -k cuda`` over
   :data:`TEST_FILES`, in a subprocess with a time limit;
2. times one forward+backward (sum of the output) of each layer of :func:`layers` at each length T (default
   1024, 2048, 4096, 8192), causal, under bfloat16 autocast (the layers compute their fields and marginals in
   float32, as always), against the same projections around ``F.scaled_dot_product_attention`` with the flash
   kernel in bfloat16: median of a few calls after a warm-up, each followed by ``torch.cuda.synchronize``;
3. writes ``report/benchmark/gpu.md`` (and ``gpu.json``): device, versions, commit, the tests' summary, and
   each cell as milliseconds, peak memory and the ratio to the SDPA row of its T.

Guards, per cell: an out-of-memory error is recorded as ``OOM`` (and the layer's longer T are skipped); a layer
whose cell at 2T (4 times a call at T, the fields being T x T, for the warm-up and each repeat) would pass
``cell_s`` is not run there; once the total budget is spent the remaining cells are marked ``not run (budget)``.
With the defaults: tests 120 s at most, timings 290 s plus the last cell (30 s): under 8 minutes with CUDA's
start. The window rows are both of the coupled window's paths
at W = 8 and 16 (``window_path`` named): their ratio is the measurement that ``ising.window.choose_path`` lacks on
CUDA. The content-coupling rows are method chain's two forms, the sequential recursion and the chunked scan
(``chunk_length`` = CHAIN_CHUNK): their ratio is what a choice between them on CUDA would be read from.

``--dry-run``: the same steps on the CPU at tiny sizes in seconds (the tests only collected, not run), into a
temporary folder: what CI runs to keep this command working.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import BoltzmannAttention
from ...ising import window as window_ising
from ...provenance import git_commit

ROOT = Path(__file__).resolve().parents[4]
TEST_FILES = ("tests/test_window.py", "tests/test_exact.py", "tests/test_exact_edge_cases.py", "tests/test_banded.py",
              "tests/test_content_couplings.py", "tests/test_meanfield.py", "tests/test_attention.py",
              "tests/test_host_sync.py")
BASELINE = "SDPA flash"
CHAIN_CHUNK = 32  # the chunked scan's chunk length in the GPU check: about sqrt(T) at T = 1024


@dataclass
class Settings:
    sizes: tuple = (1024, 2048, 4096, 8192)
    batch: int = 2
    d_model: int = 512
    heads: int = 8
    repeats: int = 3
    cell_s: float = 30.0       # a layer is not run at 2T when its cell there (4 x a call's time at T, times the
                               # warm-up and repeats) would pass this
    budget_s: float = 290.0    # no cell starts once this much has passed since the timings started
    tests_s: float = 120.0     # the pytest subprocess's limit
    device: str = "cuda"
    dry_run: bool = False
    out: Path = field(default_factory=lambda: ROOT / "report" / "benchmark")
    commit: str | None = None


def dry_settings(out: Path | None = None) -> Settings:
    """Tiny sizes on the CPU, seconds: checks the command and the report, measures nothing."""
    return Settings(sizes=(16, 32), batch=1, d_model=32, heads=2, repeats=1, cell_s=30.0, budget_s=60.0, tests_s=120.0,
                    device="cpu", dry_run=True, out=out or Path(tempfile.mkdtemp(prefix="gpu-dry-run-")))


class FlashAttention(nn.Module):
    """The baseline: BoltzmannAttention's projections around causal SDPA, on the flash kernel on CUDA."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.query, self.key, self.value, self.out = (nn.Linear(embed_dim, embed_dim) for _ in range(4))

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = (f(x).view(B, L, self.num_heads, D // self.num_heads).transpose(1, 2)
                   for f in (self.query, self.key, self.value))
        if x.device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # the dry run: the CPU's default backend
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(B, L, D)), None


def layers(T: int, s: Settings) -> dict:
    """name -> a function making the layer for length T (made when its cell runs)."""
    def layer(**options):
        return lambda: BoltzmannAttention(s.d_model, s.heads, max_len=T, **options)

    out = {BASELINE: lambda: FlashAttention(s.d_model, s.heads),
           "softmax": layer(mode="softmax"),
           "h": layer(mode="h")}
    for W in (8, 16):
        for path in window_ising.PATHS:
            out[f"window W={W} {path}"] = layer(coupling="window", coupling_window=W, coupling_init_std=0.1,
                                                method_options={"window_path": path})
    for r in (4, 8):
        out[f"relative range {r} (banded)"] = layer(coupling="relative", coupling_range=r, method="banded",
                                                    coupling_init_std=0.1)
    out["keys range 4 (chain)"] = layer(coupling="keys", coupling_range=4, method="chain", coupling_init_std=0.1)
    out[f"keys range 4 (chain, chunks of {CHAIN_CHUNK})"] = layer(
        coupling="keys", coupling_range=4, method="chain", coupling_init_std=0.1,
        method_options={"chunk_length": CHAIN_CHUNK})
    return out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def time_cell(make, T: int, s: Settings) -> dict:
    """One layer at one T: {'ms', 'peak_gb'} or {'error'}. A fresh layer and input; fwd+bwd under bf16 autocast."""
    device = s.device
    try:
        torch.manual_seed(0)
        module = make().to(device)
        x = torch.randn(s.batch, T, s.d_model, device=device)

        def step():
            with torch.autocast(device, dtype=torch.bfloat16):
                out = module(x)[0]
            out.float().sum().backward()
            _sync(device)

        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        step()  # warm-up: caches, plans, kernels chosen
        times = []
        for _ in range(s.repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
        return {"ms": 1e3 * statistics.median(times), "peak_gb": peak}
    except Exception as error:  # noqa: BLE001 - a cell's failure is its result (OOM above all), not the run's end
        if _is_oom(error):
            return {"error": "OOM"}
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"}
    finally:
        module = x = None  # noqa: F841 - release before the next cell
        if device == "cuda":
            torch.cuda.empty_cache()


def timing_rows(s: Settings, log=print) -> dict:
    """{layer: {T: cell}} for every layer and T, with the guards of the module docstring."""
    start = time.perf_counter()
    rows: dict = {}
    stopped: dict = {}  # layer -> why its longer T are not run
    for T in s.sizes:
        for name, make in layers(T, s).items():
            cells = rows.setdefault(name, {})
            if time.perf_counter() - start > s.budget_s:
                cells[T] = {"error": "not run (budget)"}
                continue
            if name in stopped:
                cells[T] = {"error": stopped[name]}
                continue
            cells[T] = cell = time_cell(make, T, s)
            log(f"  T={T:<6d} {name:34s} " + (f"{cell['ms']:10.1f} ms" if "ms" in cell else cell["error"]), flush=True)
            if "error" in cell:
                stopped[name] = f"not run ({cell['error'][:40]} at T={T})"
            elif 4e-3 * cell["ms"] * (1 + s.repeats) > s.cell_s:  # 2T: 4x the time, for the warm-up and repeats
                stopped[name] = f"not run ({cell['ms'] / 1e3:.1f} s at T={T})"
    return rows


def run_tests(s: Settings) -> dict:
    """The CUDA test cases (``-k cuda``) of TEST_FILES in a subprocess; in a dry run only collected."""
    files = [f for f in TEST_FILES if (ROOT / f).exists()]
    if not files:
        return {"command": "", "summary": "not run: no tests folder beside the package (an installed copy)",
                "returncode": None, "tail": ""}
    command = [sys.executable, "-m", "pytest", *files, "-k", "cuda", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
    if s.dry_run:
        command.append("--collect-only")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    shown = " ".join(["python", *command[1:]])
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=s.tests_s, env=env)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-2000:]
        return {"command": shown, "summary": f"stopped after {s.tests_s:.0f} s", "returncode": None,
                "tail": tail.decode() if isinstance(tail, bytes) else tail}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    counts = [int(line.rsplit(":", 1)[1]) for line in lines if s.dry_run and line.rsplit(":", 1)[-1].strip().isdigit()]
    if counts:  # --collect-only -q prints 'file: count' per file
        summary = f"{sum(counts)} CUDA test cases collected in {len(counts)} files (not run: dry run)"
    else:
        summary = lines[-1].strip("= ") if lines else f"no output (exit status {done.returncode})"
    return {"command": shown, "summary": summary, "returncode": done.returncode,
            "tail": "" if done.returncode == 0 else "\n".join(lines[-30:])}


def stamp(s: Settings) -> dict:
    """Device, versions, commit and time."""
    if s.device == "cuda":
        device = f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
    else:
        device = f"CPU ({platform.machine()}, {os.cpu_count()} cores), dry run"
    return {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "commit": s.commit or git_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "path_rule": {W: window_ising.choose_path(W, s.device) for W in (8, 16)}}


def _cell_text(cell: dict, base: dict | None) -> str:
    if "ms" not in cell:
        return cell["error"]
    ratio = f" ({cell['ms'] / base['ms']:.2f}x)" if base and "ms" in base else ""
    peak = f", {cell['peak_gb']:.1f} GB" if not math.isnan(cell["peak_gb"]) else ""
    return f"{cell['ms']:.1f} ms{ratio}{peak}"


def report(s: Settings, st: dict, tests: dict, rows: dict) -> str:
    """The markdown report."""
    sizes = list(s.sizes)
    flag = " --dry-run" if s.dry_run else ""
    lines = [f"# GPU check{' (dry run: tiny sizes on the CPU, not a measurement)' if s.dry_run else ''}", "",
             f"Device: {st['device']}; torch {st['torch']}, CUDA {st['cuda']}, python {st['python']}; commit "
             f"{st['commit']}; {st['date']}. Written by `boltzmann-attention-bench gpu{flag}`.",
             "", "## CUDA tests", "", f"`{tests['command']}`: {tests['summary']}", ""]
    if tests["tail"]:
        lines += ["```", tests["tail"], "```", ""]
    lines += ["## Forward+backward against SDPA (flash)", "",
              f"B = {s.batch}, d_model {s.d_model}, {s.heads} heads, causal, bf16 autocast (the Boltzmann layers "
              f"compute in float32); median of {s.repeats} after a warm-up; ms (ratio to {BASELINE} at the same "
              f"T), peak GPU memory. The window rows run each path by name; ising.window.choose_path takes here: "
              + ", ".join(f"W = {W}: {p}" for W, p in st["path_rule"].items()) + ".", "",
              "| layer | " + " | ".join(f"T = {T}" for T in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for name, cells in rows.items():
        lines.append(f"| {name} | " + " | ".join(_cell_text(cells.get(T, {"error": "-"}), rows[BASELINE].get(T))
                                                   for T in sizes) + " |")
    ratios = []
    for W in (8, 16):
        split, conf = rows.get(f"window W={W} split", {}), rows.get(f"window W={W} configurations", {})
        pairs = [f"T = {T}: {conf[T]['ms'] / split[T]['ms']:.2f}" for T in sizes
                 if "ms" in split.get(T, {}) and "ms" in conf.get(T, {})]
        ratios.append(f"W = {W}: " + (", ".join(pairs) if pairs else "no pair measured"))
    chain_rows = [rows.get(name, {}) for name in ("keys range 4 (chain)",
                                                  f"keys range 4 (chain, chunks of {CHAIN_CHUNK})")]
    chain_pairs = [f"T = {T}: {chain_rows[1][T]['ms'] / chain_rows[0][T]['ms']:.2f}" for T in sizes
                   if all("ms" in r.get(T, {}) for r in chain_rows)]
    lines += ["", "Window paths, configurations / split (below 1: the configurations path is faster): "
              + "; ".join(ratios) + ".", "",
              "Method chain, chunked scan / sequential recursion (below 1: the chunked scan is faster): "
              + (", ".join(chain_pairs) if chain_pairs else "no pair measured") + ".", ""]
    return "\n".join(lines)


def run(s: Settings, log=print) -> Path:
    """The whole check; returns the report's path."""
    if s.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("the GPU check needs a CUDA device (torch.cuda.is_available() is False); "
                         "use --dry-run to check the command on the CPU")
    s.out.mkdir(parents=True, exist_ok=True)
    st = stamp(s)
    log(f"{st['device']}; torch {st['torch']}; commit {st['commit']}", flush=True)
    log("CUDA tests" + (" (collected only: dry run)" if s.dry_run else "") + " ...", flush=True)
    tests = run_tests(s)
    log(f"  {tests['summary']}", flush=True)
    log("timings ...", flush=True)
    rows = timing_rows(s, log)
    path = s.out / "gpu.md"
    path.write_text(report(s, st, tests, rows))
    (s.out / "gpu.json").write_text(json.dumps({"stamp": st, "settings": {k: str(v) for k, v in vars(s).items()},
                                                "tests": tests, "rows": {k: {str(T): c for T, c in v.items()}
                                                                         for k, v in rows.items()}}, indent=1))
    log(f"wrote {path}", flush=True)
    return path
