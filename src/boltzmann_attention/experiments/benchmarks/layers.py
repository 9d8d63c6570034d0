"""Attention layers timed: each marginal method inside attention, and the long-window layers.

Methods inside attention (:func:`run_case`, :func:`default_cases`): forward+backward time and peak memory of
``boltzmann_attention`` with each method, one row per fresh process, so that its peak memory (growth of the
resident set during fwd+bwd, inputs excluded; the peak is reset before the steps) is its own. Ratios compare
rows of the same run. Baselines:

- ``naive``: enumeration as usually written: logits over all 2^T configurations for every query, a softmax,
  then a contraction with the spin table (causal prefixes get their own coupling energies).
- ``sdpa``: torch.nn.functional.scaled_dot_product_attention, the softmax attention it replaces.
- ``matmul``: a plain matmul of the split method's GEMM shape, (B*T, 2^(T/2)) @ (2^(T/2), 2^(T/2)).

Long windows (:func:`window_times`): ``BoltzmannAttention`` layers (projections included), causal, float32,
on the same x; a step is forward, sum of the output, backward. The layers run alternately in one process, so
the table's ratios to mode h are side by side: the coupled window, the Toeplitz mean field / TAP layers with
each solver setting of ``SOLVERS``, and (:func:`banded_layers`) the banded exact layer, optionally against
``ising/banded.py`` as it was at an earlier commit.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import queue as queue_module
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ... import BoltzmannAttention, boltzmann_attention, ising
from ...ising import toeplitz
from ...ising.enumeration import configurations, negative_energies
from ..train.memory import peak_rss_mib, reset_peak_rss, rss_mib
from .common import interleaved, medians, ratio_words, stamp_line, timed

HEAD_DIM = 64


# ------------------------------------------------------------------------- methods inside attention

@dataclass
class Case:
    method: str  # exact | banded | meanfield | tap | naive | sdpa | matmul
    T: int
    B: int
    causal: bool = True
    bandwidth: int | None = None  # couplings J_jk = 0 for |j-k| > bandwidth


@dataclass
class Result:
    case: Case
    seconds: float  # median fwd+bwd time
    peak_mb: float  # resident-set growth during the timed runs
    gflops: float | None = None  # 'matmul': its rate; non-causal 'exact': its two GEMMs' FLOPs / forward time


def naive_enumeration_attention(q, k, v, J, causal: bool):
    """Reference-style enumeration (the baseline the split method is measured against).

    q, k: (B, 1, T, E); J: (T, T). For causal attention, query i sees keys 0..i; absent spins are
    made free (zero field and couplings) and their marginals zeroed, as in ``ising.reference``.
    """
    T = q.shape[-2]
    spins = configurations(T, dtype=q.dtype)                       # (2^T, T)
    h = q @ k.transpose(-1, -2) / HEAD_DIM**0.5                    # (B, 1, T, T)
    if causal:
        keep = torch.ones(T, T, dtype=torch.bool).tril()           # row i: keys present for query i
        h = h * keep
        coupling_energy = negative_energies(torch.zeros(T, T, dtype=q.dtype), J * keep[:, :, None]
                                            * keep[:, None, :], None, spins)  # (T, 2^T): one per prefix
    else:
        coupling_energy = negative_energies(torch.zeros(T, dtype=q.dtype), J, None, spins)
    p = torch.softmax(h @ spins.T + coupling_energy, dim=-1)       # (B, 1, T, 2^T)
    weights = (p @ spins + 1) / 2
    if causal:
        weights = weights * keep
    return weights @ v


def _inputs(case: Case):
    g = torch.Generator().manual_seed(0)
    shape = (case.B, 1, case.T, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_() for _ in range(3))
    distance = (torch.arange(case.T)[:, None] - torch.arange(case.T)[None, :]).abs()
    band = case.bandwidth if case.bandwidth is not None else case.T
    J = 0.1 * torch.randn(case.T, case.T, generator=g) * ((distance > 0) & (distance <= band))
    J = ((J + J.T) / 2).requires_grad_()
    return q, k, v, J


def _step_function(case: Case):
    """(fwd+bwd closure, forward-only closure or None, FLOPs of the forward's GEMMs or None)."""
    if case.method == "matmul":
        half = 2 ** (case.T // 2)
        a, b = torch.randn(case.B * case.T, half), torch.randn(half, half)
        return (lambda: a @ b), None, 2 * a.shape[0] * half * half
    q, k, v, J = _inputs(case)
    if case.method == "sdpa":
        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
    elif case.method == "naive":
        def forward():
            return naive_enumeration_attention(q, k, v, J, case.causal)
    else:
        options = {"bandwidth": case.bandwidth} if case.method == "banded" else {}

        def forward():
            return boltzmann_attention(q, k, v, couplings=J[None], method=case.method, is_causal=case.causal,
                                       bias=-1.0, method_options=options)

    def step():
        forward().sum().backward()

    if case.method == "exact" and not case.causal:  # Z = u^T K v: two GEMMs of 2 * (B*T) * 2^T FLOPs each
        return step, forward, 2 * 2 * case.B * case.T * 2**case.T
    return step, None, None


def measure_case(case: Case, threads: int = 2) -> dict:
    """Time one case in this process with ``threads`` torch threads: {seconds, peak_mb, gflops}."""
    torch.set_num_threads(threads)
    step, forward, flops = _step_function(case)
    base = rss_mib() if reset_peak_rss() else peak_rss_mib()  # where the peak cannot be reset: its growth
    seconds = timed(step)
    peak = peak_rss_mib() - base
    gflops = None
    if flops is not None:
        with torch.no_grad():
            gflops = flops / timed(forward if forward else step) / 1e9
    return {"seconds": seconds, "peak_mb": peak, "gflops": gflops}


def _child(case, queue, threads):
    try:
        queue.put(("ok", measure_case(case, threads)))
    except BaseException as e:  # the parent raises it with the case named
        queue.put(("error", f"{type(e).__name__}: {e}"))


def run_case(case: Case, threads: int = 2, poll_s: float = 1.0) -> Result:
    """Measure one case in a fresh process (so peak memory is its own) with ``threads`` threads.

    RuntimeError naming the case when the child raises or dies without a result (killed, out of memory)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(case, queue, threads))
    proc.start()
    try:
        while True:
            try:
                status, out = queue.get(timeout=poll_s)
                break
            except queue_module.Empty:
                if not proc.is_alive():
                    try:  # it may have put its result just before exiting
                        status, out = queue.get(timeout=poll_s)
                        break
                    except queue_module.Empty:
                        raise RuntimeError(f"the benchmark process of {case} died without a result (exit code "
                                           f"{proc.exitcode})") from None
    finally:
        proc.join(timeout=10 * poll_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if status != "ok":
        raise RuntimeError(f"the benchmark of {case} failed: {out}")
    return Result(case=case, **out)


def default_cases(quick: bool) -> list[Case]:
    exact_T = [8, 12, 16] if quick else [8, 12, 16, 20]
    cases = []
    for T in exact_T:
        cases += [Case(m, T, 64) for m in ("exact", "naive", "sdpa")]
        cases += [Case("exact", T, 64, causal=False), Case("matmul", T, 64)]
    if not quick:
        cases = [c for c in cases if not (c.method == "naive" and c.T > 16)]  # 64*20*2^20 floats: ~5 GB
        cases += [Case("exact", 24, 8), Case("exact", 24, 8, causal=False), Case("sdpa", 24, 8),
                  Case("matmul", 24, 8)]
    long_T = [64, 256] if quick else [64, 256, 1024]
    for T in long_T:
        cases += [Case(m, T, 8, bandwidth=8) for m in ("banded", "meanfield", "tap")] + [Case("sdpa", T, 8)]
    return cases


def target_cases() -> list[Case]:
    """Only the rows that :func:`target_lines` needs (a few minutes instead of the full table)."""
    return [Case("exact", 16, 64), Case("naive", 16, 64), Case("sdpa", 16, 64), Case("exact", 20, 64),
            Case("exact", 24, 8), Case("sdpa", 24, 8)]


def smoke_cases() -> list[Case]:
    """One tiny case per kind of row (seconds): a smoke test of the command, not a measurement."""
    return [Case("exact", 4, 2), Case("naive", 4, 2), Case("sdpa", 4, 2), Case("exact", 4, 2, causal=False),
            Case("matmul", 4, 2), Case("banded", 8, 2, bandwidth=2)]


def format_table(results: list[Result], stamp: dict) -> str:
    """Markdown table; ratios are against rows of the same run with the same T, B and causality."""
    def find(method, case):
        return next((r for r in results if r.case.method == method and r.case.T == case.T
                     and r.case.B == case.B and r.case.causal == case.causal), None)

    lines = [stamp_line(stamp), "",
             "| method | T | B | causal | band | fwd+bwd ms | peak MB | vs naive | vs SDPA | GFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r.case
        naive, sdpa = find("naive", c), find("sdpa", c)
        speedup = ratio_words(naive.seconds, r.seconds) if naive and c.method == "exact" else ""
        slowdown = ratio_words(sdpa.seconds, r.seconds) if sdpa and c.method not in ("sdpa", "matmul") else ""
        gflops = f"{r.gflops:.0f}" if r.gflops else ""
        mm = find("matmul", Case("matmul", c.T, c.B))
        if c.method == "exact" and r.gflops and mm:
            gflops += f" ({100 * r.gflops / mm.gflops:.0f}% of matmul)"
        band = str(c.bandwidth) if c.bandwidth else ""
        causal = "yes" if c.causal else "no"
        ms = f"{1e3 * r.seconds:.1f}"
        if c.method == "matmul":
            causal, ms = "", f"{1e3 * r.seconds:.2f} (fwd)"
        lines.append(f"| {c.method} | {c.T} | {c.B} | {causal} | {band} | {ms} | {r.peak_mb:.0f} | {speedup} | "
                     f"{slowdown} | {gflops} |")
    return "\n".join(lines)


def target_lines(results: list[Result], steps: list[dict] | None) -> list[str]:
    """The speed targets of ``exact`` and of the training step, each as a ratio of rows measured in this run:
    '- description: measured -- met' (or MISSED); a target whose rows were not measured is left out."""
    def exact(T, B):
        return next((r.seconds for r in results if r.case.method == "exact" and r.case.causal
                     and r.case.T == T and r.case.B == B), None)

    naive16 = next((r.seconds for r in results if r.case.method == "naive" and r.case.T == 16), None)
    out = []

    def add(text, value, ok):
        out.append(f"- {text}: {value} -- {'met' if ok else 'MISSED'}")

    t16, t20, t24 = exact(16, 64), exact(20, 64), exact(24, 8)
    if t16 and naive16:
        add("exact causal h+J fwd+bwd, T = 16, B = 64: >= 200x faster than naive enumeration",
            f"{naive16 / t16:.0f}x ({1e3 * t16:.1f} ms vs {1e3 * naive16:.0f} ms)", naive16 / t16 >= 200)
    if t16 and t20:
        add("T = 20 within 5x of T = 16", f"{t20 / t16:.1f}x ({1e3 * t20:.1f} ms)", t20 / t16 <= 5)
    if t24:
        add("T = 24 (B = 8) under 0.3 s", f"{t24:.3f} s", t24 < 0.3)
    row = next((r for r in steps or [] if r["T"] == 12), None)
    if row and "h+J" in row:
        add("training step, T = 12: h+J within 1.5x of softmax", f"{row['h+J'] / row['softmax']:.2f}x",
            row["h+J"] / row["softmax"] <= 1.5)
    if row and "h" in row:
        add("training step, T = 12: h within 1.1x of softmax", f"{row['h'] / row['softmax']:.2f}x",
            row["h"] / row["softmax"] <= 1.1)
    return out


# ----------------------------------------------------------------------------------------- long windows

RANGE = 8
# the mean-field / TAP solver settings compared: label -> method_options
SOLVERS = {"damping 0.5": {"damping": 0.5}, "damping 0": {"damping": 0.0},
           "anderson": {"solver": "anderson", "damping": 0.0}}


def window_layers(T: int, W: int, d_model: int = 64) -> dict[str, BoltzmannAttention]:
    """Mode h, softmax, the coupled window (free and relative) and the Toeplitz mean field / TAP layers (range
    ``RANGE``, every solver of ``SOLVERS``): one head each, seed 0."""
    torch.manual_seed(0)
    return {
        "h (sigmoid, materialised)": BoltzmannAttention(d_model, 1, max_len=T, mode="h"),
        "softmax (SDPA)": BoltzmannAttention(d_model, 1, max_len=T, mode="softmax"),
        f"h+J window W={W} (exact)": BoltzmannAttention(d_model, 1, max_len=T, coupling="window",
                                                        coupling_window=W, coupling_init_std=0.1),
        f"h+J window W={W}, relative (exact)": BoltzmannAttention(
            d_model, 1, max_len=T, coupling="window", coupling_window=W, coupling_window_relative=True,
            coupling_init_std=0.1),
        **{f"h+J relative range {RANGE}, {method} ({label})": BoltzmannAttention(
            d_model, 1, max_len=T, coupling="relative", coupling_range=RANGE, method=method, coupling_init_std=0.1,
            method_options=options) for method in ("meanfield", "tap") for label, options in SOLVERS.items()},
    }


def banded_layers(T: int, baseline: str | None, d_model: int = 64, heads: int = 1) -> dict[str, BoltzmannAttention]:
    """Mode h and the banded exact layer (range ``RANGE``); with a baseline commit, the same layer (the same
    weights) with ising/banded.py of that commit as its method: :func:`old_banded`."""
    torch.manual_seed(0)
    banded = BoltzmannAttention(d_model, heads, max_len=T, coupling="relative", coupling_range=RANGE,
                                method="banded", coupling_init_std=0.1)
    rows = {"h (sigmoid, materialised)": BoltzmannAttention(d_model, heads, max_len=T, mode="h"),
            f"h+J relative range {RANGE}, banded (exact)": banded}
    if baseline is not None:
        old = BoltzmannAttention(d_model, heads, max_len=T, coupling="relative", coupling_range=RANGE,
                                 method=old_banded(baseline), coupling_init_std=0.1)
        old.load_state_dict(banded.state_dict())
        rows[f"h+J relative range {RANGE}, banded (exact) at {baseline}"] = old
    return rows


def old_banded(commit: str) -> ising.Method:
    """Method 'banded' as ising/banded.py was at ``commit``: a record of its functions, passed to the layer as
    its method (the registry is read-only, so nothing is swapped behind today's name)."""
    old = module_at(commit, "src/boltzmann_attention/ising/banded.py", "boltzmann_attention.ising._banded_old")
    today = ising.methods.REGISTRY["banded"]
    return replace(today, name=f"banded at {commit}", marginals=old.marginals, log_partition=old.log_partition,
                   options=ising.methods.keyword_options(old.marginals), check_options=lambda options: None,
                   compiled=None)


def module_at(commit: str, path: str, name: str):
    """The file ``path`` as it was at ``commit`` of the git repository of the current folder, imported as
    module ``name`` (inside its package). ValueError when git cannot show it."""
    shown = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True)
    if shown.returncode:
        raise ValueError(f"cannot read {path} at {commit}: {shown.stderr.strip()}")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(shown.stdout)
    spec = importlib.util.spec_from_file_location(name, f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        os.unlink(f.name)
    return module


def window_times(T: int, B: int, W: int, threads: int, repeats: int, baseline: str | None = None,
                 banded_only: bool = False, heads: int = 1, d_model: int = 64) -> dict[str, float]:
    """Median fwd+bwd seconds per layer of :func:`window_layers` (or, with ``banded_only``, of
    :func:`banded_layers`), one warm-up step each, then ``repeats`` interleaved rounds of one step."""
    torch.set_num_threads(threads)
    mods = banded_layers(T, baseline, d_model, heads) if banded_only else window_layers(T, W, d_model)
    x = torch.randn(B, T, d_model)

    def step(m):
        m.zero_grad(set_to_none=True)
        m(x)[0].sum().backward()

    return medians(interleaved({name: (lambda m=m: step(m)) for name, m in mods.items()}, rounds=repeats))


def window_table(rows: dict[int, dict[str, float]]) -> str:
    """{threads: {layer: seconds}} as a Markdown table: ms and the ratio to the first layer (mode h) per
    thread count."""
    threads = list(rows)
    lines = ["| layer | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}: ms | x h" for t in threads) + " |",
             "|---|" + "---:|---:|" * len(threads)]
    h = next(iter(rows[threads[0]]))
    for name in rows[threads[0]]:
        cells = " | ".join(f"{rows[t][name] * 1e3:.0f} | {rows[t][name] / rows[t][h]:.2f}" for t in threads)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def solver_iterations(T: int, B: int) -> list[str]:
    """Table rows: forward / backward iterations and residuals of the mean-field layers' solver on their
    layer's field (d_model 64, 1 thread)."""
    torch.set_num_threads(1)
    lines = []
    for name, layer in window_layers(T, 16).items():
        if "range" not in name:
            continue
        x = torch.randn(B, T, 64, generator=torch.Generator().manual_seed(1))
        q, k = layer._heads(layer.query(x)), layer._heads(layer.key(x))
        field = (q @ k.transpose(-1, -2) / 8 + layer.field_bias.view(-1, 1, 1)).detach().requires_grad_()
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        m, infos = toeplitz.causal_marginals(field, toeplitz.Toeplitz(layer.couplings.weight.detach()[:, None]),
                                             causal, tap="tap" in name, **layer.method_options)
        m.sum().backward()
        lines.append(f"| {name} | {max(i.iterations for i in infos)} | {max(i.max_residual for i in infos):.1e} | "
                     f"{max(i.backward_iterations for i in infos)} | "
                     f"{max(i.backward_max_residual for i in infos):.1e} |")
    return lines


def window_errors(T: int, stds=(0.05, 0.2, 0.3)) -> list[str]:
    """Table rows: max and mean |a - a_banded| over the causal weights of mean field / TAP with each solver,
    B = 1, h = q.k / 8 - 1, J_d = std * N(0, 1) for d <= ``RANGE`` (1 thread)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, T, 64, generator=g) for _ in range(3))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    lines = []
    for std in stds:
        profile = std * torch.randn(1, RANGE, generator=g)
        with torch.no_grad():
            _, exact = boltzmann_attention(q, k, v, couplings=toeplitz.Toeplitz(profile).dense(T), method="banded",
                                           is_causal=True, bias=-1.0, return_weights=True,
                                           method_options={"bandwidth": RANGE})
            for method in ("meanfield", "tap"):
                for label, solver in SOLVERS.items():
                    options = {**solver, "on_fail": "ignore"}
                    _, w = boltzmann_attention(q, k, v, couplings=toeplitz.Toeplitz(profile), method=method,
                                               is_causal=True, bias=-1.0, return_weights=True, method_options=options)
                    _, infos = toeplitz.causal_marginals(q @ k.transpose(-1, -2) / 8 - 1.0,
                                                         toeplitz.Toeplitz(profile[:, None]), causal,
                                                         tap=method == "tap", **options)
                    converged = sum(float(i.converged.float().sum()) for i in infos) / T
                    err = (w - exact).abs()[..., causal]
                    lines.append(f"| {std:g} | {method} | {label} | {max(i.iterations for i in infos)} | "
                                 f"{converged:.0%} | {float(err.max()):.1e} | {float(err.mean()):.1e} |")
    return lines
