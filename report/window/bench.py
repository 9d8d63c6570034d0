"""Issue 14 §1-2: the coupled window and Toeplitz mean field / TAP against mode h, module level, fwd+bwd.

    PYTHONPATH=src python report/window/bench.py [--threads 1 2] [--repeats 5] [--T 1024] [--B 8] [--W 16]
                                                 [--no-accuracy]

Every row is a BoltzmannAttention layer (projections included), causal, one head, d_model 64, float32, on
the same x; a step is forward, sum of the output, backward. The layers run alternately in one process
(warm-up step first, then `repeats` rounds of one step each), so the load of other processes hits all
rows alike; the table gives the median step time and its ratio to mode h at the same thread count.
Mean field and TAP (relative couplings, range 8) run with each solver setting of `SOLVERS` (damped at the
default 0.5 and undamped; Anderson). Then their forward / backward iteration counts and residuals, and the
error of the weights against method 'banded' (exact) at the same J, weak to strong.

    PYTHONPATH=src python report/window/bench.py --banded [--banded-baseline COMMIT] --threads 1 --repeats 2
                                                 [--heads 1] [--d-model 64]

Issue 14 §3 only: mode h against the banded exact layer (relative couplings, range 8), and, with
``--banded-baseline``, against ising/banded.py as it was at COMMIT (loaded into a temporary module and
swapped in for its row), all alternating in one process. ``--T 64 --B 12 --heads 4 --d-model 128`` is one
layer of the real-size study's model.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from boltzmann_attention import BoltzmannAttention, boltzmann_attention, ising
from boltzmann_attention.ising import toeplitz
from boltzmann_attention.provenance import machine_info

RANGE = 8
# the mean-field / TAP solver settings compared: label -> method_options
SOLVERS = {"damping 0.5": {"damping": 0.5}, "damping 0": {"damping": 0.0},
           "anderson": {"solver": "anderson", "damping": 0.0}}


def layers(T: int, W: int, d_model: int = 64) -> dict[str, BoltzmannAttention]:
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


def banded_layers(T: int, baseline: str | None, d_model: int = 64,
                  heads: int = 1) -> dict[str, tuple[BoltzmannAttention, tuple]]:
    """Mode h and the banded exact layer (range 8); with a baseline commit, the same layer run through
    ising/banded.py of that commit. Values: (layer, the (marginals, log_partition) pair its row uses)."""
    torch.manual_seed(0)
    current = ising.METHODS["banded"]
    banded = BoltzmannAttention(d_model, heads, max_len=T, coupling="relative", coupling_range=RANGE,
                                method="banded", coupling_init_std=0.1)
    rows = {"h (sigmoid, materialised)": (BoltzmannAttention(d_model, heads, max_len=T, mode="h"), current),
            f"h+J relative range {RANGE}, banded (exact)": (banded, current)}
    if baseline is not None:
        old = _module_at(baseline, "src/boltzmann_attention/ising/banded.py", "boltzmann_attention.ising._banded_old")
        rows[f"h+J relative range {RANGE}, banded (exact) at {baseline}"] = (banded, (old.marginals, old.log_partition))
    return rows


def _module_at(commit: str, path: str, name: str):
    """The file ``path`` as it was at ``commit``, imported as module ``name`` (inside its package)."""
    source = subprocess.run(["git", "show", f"{commit}:{path}"], check=True, capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        os.unlink(f.name)
    return module


def measure(T: int, B: int, W: int, threads: int, repeats: int, baseline: str | None = None,
            banded_only: bool = False, heads: int = 1, d_model: int = 64) -> dict[str, float]:
    torch.set_num_threads(threads)
    if banded_only:
        mods = banded_layers(T, baseline, d_model, heads)
    else:
        mods = {name: (m, ising.METHODS["banded"]) for name, m in layers(T, W).items()}
    x = torch.randn(B, T, d_model)
    current = ising.METHODS["banded"]

    def step(m, method):
        ising.METHODS["banded"] = method
        try:
            m.zero_grad(set_to_none=True)
            m(x)[0].sum().backward()
        finally:
            ising.METHODS["banded"] = current

    for m in mods.values():
        step(*m)
    times: dict[str, list[float]] = {name: [] for name in mods}
    for _ in range(repeats):
        for name, m in mods.items():
            start = time.perf_counter()
            step(*m)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def iterations(T: int, B: int) -> list[str]:
    """Forward / backward iterations and residuals of the mean-field rows' solver on their layer's field."""
    torch.set_num_threads(1)
    lines = []
    for name, layer in layers(T, 16).items():
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


def accuracy(T: int, stds=(0.05, 0.2, 0.3)) -> list[str]:
    """max and mean |a - a_banded| over the causal weights, B = 1, h = q.k / 8 - 1, J_d = std * N(0, 1)."""
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--W", type=int, default=16)
    p.add_argument("--banded", action="store_true", help="only mode h and the banded exact layer (issue 14 §3)")
    p.add_argument("--banded-baseline", metavar="COMMIT", help="with --banded: also banded.py at COMMIT")
    p.add_argument("--heads", type=int, default=1, help="with --banded: heads of both layers")
    p.add_argument("--d-model", type=int, default=64, help="with --banded: model width of both layers")
    p.add_argument("--no-accuracy", action="store_true", help="skip the error table against banded exact")
    a = p.parse_args()
    if not a.banded and (a.heads, a.d_model) != (1, 64):
        p.error("--heads and --d-model apply to --banded only")
    info = machine_info()
    load = os.getloadavg()[0]
    rows = {t: measure(a.T, a.B, a.W, t, a.repeats, a.banded_baseline, a.banded, a.heads, a.d_model)
            for t in a.threads}
    print(f"T = {a.T}, B = {a.B}, d_model {a.d_model}, {a.heads} head{'s' if a.heads > 1 else ''}, causal, "
          f"float32, fwd+bwd, median of {a.repeats} "
          f"alternating rounds; {info['processor']}, {info['cpus']} CPUs, torch {info['torch']}, "
          f"commit {info['commit']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{load:.1f} before, {os.getloadavg()[0]:.1f} after (other processes share the cores)\n")
    print("| layer | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}: ms | x h" for t in a.threads) + " |")
    print("|---|" + "---:|---:|" * len(a.threads))
    h = next(iter(rows[a.threads[0]]))
    for name in rows[a.threads[0]]:
        cells = " | ".join(f"{rows[t][name] * 1e3:.0f} | {rows[t][name] / rows[t][h]:.2f}" for t in a.threads)
        print(f"| {name} | {cells} |")
    if a.banded:
        return
    print(f"\nMean field / TAP solver on the layer's field (B = {a.B}, 1 thread): tol 1e-6, max over the causal "
          "row chunks\n")
    print("| layer | forward iterations | residual | backward iterations | residual |\n|---|---:|---:|---:|---:|")
    print("\n".join(iterations(a.T, a.B)))
    if a.no_accuracy:
        return
    print(f"\nWeights against method 'banded' (exact) at the same J, T = {a.T}, B = 1, h = q.k / 8 - 1 "
          f"(q, k ~ N(0, 1)), J_d = std N(0, 1) for d <= {RANGE}; iterations (max 500) and the share of "
          f"queries that reached tol 1e-6\n")
    print("| coupling std | method | solver | iterations | converged | max error | mean error |\n"
          "|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(accuracy(a.T)))


if __name__ == "__main__":
    main()
