"""The QPU path as a QPU user meets it, measured: how many windows fit on production-size QPU graphs (tiling), the
temperature calibration and chain breaks on the mock with this package's physics, the reads a marginal error
needs, and seconds per token against T for every path (CPU measured here, QPU from D-Wave's published timing);
written as report/qpu/ (README.md, qpu.png, qpu.json) by ``boltzmann-attention-bench qpu DIR``. One core.

The QPU's cost per call is D-Wave's timing model (``qpu_access_time``, what is charged):

    T = T_p + R (T_a + T_r + T_d),

T_p programming, R reads, T_a anneal, T_r readout and T_d delay per read, each from D-Wave's documentation
(:data:`TIMINGS`, with the source). A call of k tiled queries costs T / k per query, i.e. per token: one anneal
per query. Not included: the low-level overhead Delta (``qpu_access_overhead_time``, 10-20 ms per call on
Advantage systems, not charged), network latency and queueing.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from functools import partial
from importlib import metadata
from typing import NamedTuple

import torch

from ... import ising
from ...ising import annealing, qpu, window
from ..tables import md_table
from .common import interleaved, machine_stamp, stamp_line

OPERATION_AND_TIMING = ("D-Wave, \"Operation and Timing\" (QPU access time), https://docs.dwavesys.com/docs/latest/"
                        "c_qpu_timing.html; source: github.com/dwavesystems/dwave-ocean-sdk, "
                        "docs/quantum_research/qpu_operation_timing.rst at commit 1c658ff")
PER_QPU_PROPERTIES = ("D-Wave, \"Per-QPU Solver Properties and Schedules\", https://docs.dwavequantum.com/en/latest/"
                      "_sources/quantum_research/solver_properties_specific.rst.txt; source: github.com/dwavesystems/"
                      "dwave-ocean-sdk, docs/quantum_research/qpu_solver_properties_specific.rst at commit 10c6f65")


class QPUTiming(NamedTuple):
    """One QPU's published timing, microseconds: programming T_p, readout per read T_r (its range, from one qubit
    to the full QPU), delay per read T_d, anneal per read T_a, and the graph the report tiles for it."""

    name: str
    graph: str
    programming_us: float
    readout_us: tuple[float, float]
    delay_us: float
    anneal_us: float


# Programming time, readout range and delay per read: the QPUs' "Physical Properties" tables (PER_QPU_PROPERTIES).
# Anneal time 20 us: the SAPI timing example of OPERATION_AND_TIMING (qpu_anneal_time_per_sample 20.0).
TIMINGS = {
    "zephyr": QPUTiming("Advantage2_prototype2.6 (Z6; its timing with a production-size Z12 graph)",
                        "zephyr_graph(12, 4)", 18200.0, (17.0, 87.0), 20.5, 20.0),
    "pegasus": QPUTiming("Advantage_system7.1 (P16)", "pegasus_graph(16)", 17700.0, (17.0, 265.0), 20.6, 20.0),
}


def access_time_us(timing: QPUTiming, reads: int, readout_us: float) -> float:
    """D-Wave's QPU access time of one call: T_p + R (T_a + T_r + T_d), microseconds."""
    return timing.programming_us + reads * (timing.anneal_us + readout_us + timing.delay_us)


def seconds_per_query(timing: QPUTiming, reads: int, copies: int, readout_us: float) -> float:
    """One call's access time shared by its ``copies`` queries (one anneal each per read), seconds."""
    return access_time_us(timing, reads, readout_us) / copies * 1e-6


def reads_for_error(epsilon: float, variance: float = 1.0, bias: float = 0.0) -> float:
    """Reads R at which a marginal's rms error sqrt(variance / R + bias^2) is epsilon: variance / (epsilon^2 -
    bias^2) (variance = 1 - m^2 for independent reads, the binomial variance of a magnetisation); inf when the
    bias alone reaches epsilon."""
    return variance / (epsilon**2 - bias**2) if epsilon > bias else math.inf


def _graphs(quick: bool) -> dict:
    from dwave import graphs

    if quick:
        return {"zephyr": graphs.zephyr_graph(2, 4), "pegasus": graphs.pegasus_graph(3)}
    return {"zephyr": graphs.zephyr_graph(12, 4), "pegasus": graphs.pegasus_graph(16)}


def tiling_rows(quick: bool = False) -> list[dict]:
    """Disjoint embeddings placed (``ising.qpu.disjoint_embeddings``, seed 0) of the window K_W (W = 4, 6, 8, 12,
    16) and of bands of T spins (width 4, T = 16, 64) on a production-size Zephyr and Pegasus graph."""
    shapes = [qpu.ProblemGraph("clique", w, None) for w in (4, 8)] if quick else \
        [qpu.ProblemGraph("clique", w, None) for w in (4, 6, 8, 12, 16)] + \
        [qpu.ProblemGraph("band", t, 4) for t in (16, 64)]
    rows = []
    for family, graph in _graphs(quick).items():
        for shape in shapes:
            start = time.perf_counter()
            placed = qpu.disjoint_embeddings(qpu._source_graph(shape), graph, seed=0)
            qubits = [sum(len(chain) for chain in e.values()) for e in placed]
            rows.append({"family": family, "graph": graph.graph["name"], "graph_qubits": graph.number_of_nodes(),
                         "kind": shape.kind, "n": shape.n, "width": shape.width, "copies": len(placed),
                         "qubits_used": sum(qubits), "qubits_per_copy": min(qubits) if qubits else None,
                         "longest_chain": max((len(c) for e in placed for c in e.values()), default=None),
                         "seconds": time.perf_counter() - start})
    return rows


def _mock(physics, quick: bool):
    from dwave.system.testing import MockDWaveSampler

    return MockDWaveSampler(topology_type="zephyr", topology_shape=[2 if quick else 4, 4], substitute_sampler=physics,
                            parameter_warnings=False)


def _physics(quick: bool) -> list[tuple[str, dict]]:
    """The stand-ins: exact Boltzmann draws and SQA at device beta 4, and DQA's 5 ns anneal (800 Trotter steps: the
    chains' couplers widen the energy spread that a step must resolve)."""
    if quick:
        return [("boltzmann", {"beta": 4.0})]
    return [("boltzmann", {"beta": 4.0}), ("sqa", {"beta": 4.0, "sweeps": 100, "trotter_slices": 8}),
            ("dqa", {"trotter_steps": 800})]


def _quantiles(x: torch.Tensor) -> dict:
    return {"median": float(x.median()), "min": float(x.min()), "max": float(x.max())}


def calibration_rows(quick: bool = False) -> list[dict]:
    """Per stand-in physics and chain rule: the calibrated energy scale (``QPUSampler.calibrate``, the DQA study's
    systems, n = 4, 6, 8, 1000 reads), then on held-out systems (seed 1) at that scale: beta_eff, the KL left at
    beta_eff and to exp(-E), the finite-sample part of those KLs, and the chain-break rate."""
    sizes, systems, reads = ((4,), 4, 200) if quick else ((4, 6, 8), 16, 1000)
    c = annealing.CALIBRATION_SYSTEMS
    held = [annealing.calibration_systems(n, systems, c["field_mean"], c["field_std"], c["coupling_std"], 1)
            for n in sizes]
    rows = []
    for kind, options in _physics(quick):
        for rule in ("range", "torque"):
            sampler = qpu.QPUSampler(_mock(qpu.SimulatedPhysics(kind, seed=0, **options), quick), num_reads=reads,
                                     chain_strength=rule)
            row = {"physics": kind, "options": options, "chain_rule": rule, "sizes": sizes, "systems": systems,
                   "reads": reads, "mock_graph": sampler.target.graph["name"]}
            start = time.perf_counter()
            try:
                cal = sampler.calibrate(sizes=sizes, num_systems=systems)
            except (RuntimeError, ValueError) as e:
                rows.append({**row, "error": str(e), "seconds": time.perf_counter() - start})
                continue
            first = len(sampler.calls)
            measured = sampler.measure(held, cal.energy_scale, reads)
            calls = sampler.calls[first:]
            breaks = sum(x.chain_break_rate * x.queries for x in calls) / sum(x.queries for x in calls)
            floor = (measured.states_seen.double() - 1) / (2 * reads)
            rows.append({**row, "energy_scale": cal.energy_scale, "history": cal.history,
                         "chain_strength": calls[-1].chain_strength, "beta": _quantiles(measured.beta),
                         "kl_at_beta": _quantiles(measured.kl_at_beta),
                         "kl_to_boltzmann": _quantiles(measured.kl_to_target), "kl_floor": _quantiles(floor),
                         "chain_break_rate": breaks,
                         "seconds": time.perf_counter() - start})
    return rows


def reads_rows(quick: bool = False, physics: tuple[str, dict] | None = None) -> dict:
    """The spread of sampled marginals against exact at R reads: held-out systems (seed 1, n = 8, 16 of them),
    QPUSampler on the mock at its calibrated scale, per stand-in physics. rms error over all marginals, and the
    binomial prediction sqrt(mean(1 - m^2) / R) from the exact marginals m; fitted rms^2 = a / R + b^2."""
    n, num, reads, calibration_reads = (4, 4, (100, 400), 200) if quick else (8, 16, (250, 1000, 4000), 1000)
    c = annealing.CALIBRATION_SYSTEMS
    h, J = annealing.calibration_systems(n, num, c["field_mean"], c["field_std"], c["coupling_std"], 1)
    exact = ising.marginals(h, J, method="reference")
    variance = float((1 - exact**2).mean())
    out = {"n": n, "systems": num, "mean_binomial_variance": variance, "physics": []}
    for kind, options in ([physics] if physics else _physics(quick)[:2]):
        sampler = qpu.QPUSampler(_mock(qpu.SimulatedPhysics(kind, seed=1, **options), quick),
                                 num_reads=calibration_reads)
        cal = sampler.calibrate(sizes=(n,), num_systems=num)
        rows = []
        for r in reads:
            spins = sampler._draw(h, J, None, r, None, cal.energy_scale)
            rms = float((spins.mean(1) - exact).square().mean().sqrt())
            rows.append({"reads": r, "rms_error": rms, "binomial": math.sqrt(variance / r)})
        a, b2 = _fit_rms(rows)
        out["physics"].append({"physics": kind, "options": options, "energy_scale": cal.energy_scale, "rows": rows,
                               "variance": a, "inflation": a / variance, "bias": math.sqrt(b2)})
    return out


def _fit_rms(rows: list[dict]) -> tuple[float, float]:
    """Least squares of rms^2 = a / R + b^2 over the rows (a, b^2 >= 0)."""
    x = torch.tensor([[1.0 / r["reads"], 1.0] for r in rows], dtype=torch.float64)
    y = torch.tensor([r["rms_error"] ** 2 for r in rows], dtype=torch.float64)
    a, b2 = torch.linalg.lstsq(x, y[:, None]).solution.flatten().tolist()
    if b2 < 0:  # no bias resolved: the variance alone
        a, b2 = float((x[:, 0] * y).sum() / (x[:, 0] ** 2).sum()), 0.0
    return max(a, 0.0), b2


def cpu_rows(quick: bool = False) -> list[dict]:
    """Seconds per token (one query) of the CPU paths, measured side by side (``interleaved``, median of the rounds),
    one thread, float64, no gradient. Fields h ~ N(-1.3, 0.4^2) (the calibration's); couplings: the window's
    J ~ N(0, 0.25^2) (W x W), the band's J ~ N(0, 0.25^2) for 0 < |j - k| <= 4, dense K_T for mean field
    J ~ N(0, 0.25^2 8 / T) (0.25 at T = 8, kept convergent as T grows). Per token: one call's time over its
    queries, batched as a layer batches them (one J shared by the queries of a head): the window max(T, 256)
    queries of W slots; exact enumeration (T <= 24) 256 queries, banded 64 and mean field max(4, min(64, 16384 /
    T)) queries that see all T keys (the last query's cost; a causal query sees i keys)."""
    torch.set_num_threads(1)
    sizes = (16, 64) if quick else (16, 64, 256, 1024, 4096)
    g = torch.Generator().manual_seed(0)
    rows = []
    for T in sizes:
        calls = _cpu_calls(T, g)
        with torch.no_grad():
            times = interleaved({name: call for name, (call, _) in calls.items()}, rounds=2 if quick else 3)
        for name, seconds in times.items():
            median = sorted(seconds)[len(seconds) // 2]
            rows.append({"path": name, "T": T, "seconds_per_token": median / calls[name][1]})
    return rows


def _cpu_calls(T: int, g: torch.Generator) -> dict:
    """{path: (call, tokens per call)} of :func:`cpu_rows` at T."""
    def field(queries: int, n: int) -> torch.Tensor:
        return -1.3 + 0.4 * torch.randn(queries, n, dtype=torch.float64, generator=g)

    def symmetric(n: int, std: float) -> torch.Tensor:
        w = std * torch.randn(n, n, dtype=torch.float64, generator=g)
        return w.triu(1) + w.triu(1).T

    calls = {}
    if T <= 24:
        calls["exact K_T"] = (partial(ising.marginals, field(256, T), symmetric(T, 0.25), method="exact"), 256)
    for W in (8, 16):
        queries = max(T, 256)  # T queries of a sequence, several sequences where T is short
        calls[f"window W={W}"] = (partial(window.marginals, field(queries, W), symmetric(W, 0.25)), queries)
    band = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs() <= 4
    calls["banded w=4"] = (partial(ising.marginals, field(64, T), symmetric(T, 0.25) * band, method="banded",
                                   bandwidth=4), 64)
    queries = max(4, min(64, 16384 // T))  # an (T, T) product per query and iteration: fewer at large T
    calls["meanfield K_T"] = (partial(ising.marginals, field(queries, T), symmetric(T, 0.25 * math.sqrt(8 / T)),
                                      method="meanfield"), queries)
    return calls


def cost_rows(tiling: list[dict], reads: float, cpu: list[dict], sizes: tuple[int, ...]) -> list[dict]:
    """Seconds per token of every path at each T: the CPU rows as measured, and the QPU paths from the timing
    model with ``reads`` reads and the measured copies per call (readout at the top of the published range for a
    tiled call, at the bottom for one query alone). A QPU window costs the same at every T; a dense K_T or a band
    of T keys exists only where its shape was placed."""
    rows = [dict(r, kind="cpu") for r in cpu]
    placed = {(r["family"], r["kind"], r["n"], r["width"]): r["copies"] for r in tiling}
    for family, timing in TIMINGS.items():
        for W in (8, 16):
            copies = placed.get((family, "clique", W, None))
            if copies:
                for T in sizes:
                    rows.append({"path": f"QPU window W={W} ({family}, {copies} per call)", "T": T, "kind": "qpu",
                                 "seconds_per_token": seconds_per_query(timing, math.ceil(reads), copies,
                                                                        timing.readout_us[1])})
        if family == "zephyr" and placed.get((family, "clique", 8, None)):
            for T in sizes:
                rows.append({"path": "QPU window W=8, one query per call (zephyr)", "T": T, "kind": "qpu",
                             "seconds_per_token": seconds_per_query(timing, math.ceil(reads), 1,
                                                                    timing.readout_us[0])})
        for T in sizes:
            for kind, width, label in (("clique", None, "dense K_T"), ("band", 4, "band w=4 over T keys")):
                copies = placed.get((family, kind, T, width))
                if copies:
                    rows.append({"path": f"QPU {label} ({family})", "T": T, "kind": "qpu",
                                 "seconds_per_token": seconds_per_query(timing, math.ceil(reads), copies,
                                                                        timing.readout_us[1]), "copies": copies})
    return rows


def qpu_rows(quick: bool = False, epsilon: float = 0.01) -> dict:
    """Every measurement of report/qpu/."""
    start = time.perf_counter()
    out = {"epsilon": epsilon, "timings": {k: t._asdict() for k, t in TIMINGS.items()},
           "sources": [OPERATION_AND_TIMING, PER_QPU_PROPERTIES], "versions": _versions()}
    out["tiling"] = tiling_rows(quick)
    out["calibration"] = calibration_rows(quick)
    out["reads"] = reads_rows(quick)
    variance = out["reads"]["mean_binomial_variance"]
    out["reads_needed"] = {"binomial_worst": reads_for_error(epsilon), "binomial": reads_for_error(epsilon, variance)}
    for p in out["reads"]["physics"]:
        out["reads_needed"][p["physics"]] = reads_for_error(epsilon, p["variance"], p["bias"])
    out["cpu"] = cpu_rows(quick)
    sizes = tuple(sorted({r["T"] for r in out["cpu"]}))
    out["cost"] = cost_rows(out["tiling"], out["reads_needed"]["binomial"], out["cpu"], sizes)
    out["seconds"] = time.perf_counter() - start
    return out


def _versions() -> dict:
    names = ("dwave-system", "minorminer", "dwave-graphs", "dimod")
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _q(d: dict, digits: int = 3) -> str:
    return f"{d['median']:.{digits}g} [{d['min']:.{digits}g}, {d['max']:.{digits}g}]"


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{1e3 * s:.3g} ms"
    return f"{1e6 * s:.3g} µs"


PAIRS = (("window W=8", "QPU window W=8 ("), ("window W=16", "QPU window W=16 ("), ("exact K_T", "QPU dense K_T"),
         ("banded w=4", "QPU band w=4"))  # the same problem on the CPU and on the QPU (the cheaper QPU graph)


def wins(data: dict) -> list[dict]:
    """Per T and problem (:data:`PAIRS`): the CPU path and the cheaper tiled QPU path, seconds per token, and
    QPU / CPU."""
    out = []
    for T in sorted({r["T"] for r in data["cost"]}):
        for cpu_path, prefix in PAIRS:
            cpu = [r for r in data["cost"] if r["T"] == T and r["path"] == cpu_path]
            qpu_ = [r for r in data["cost"] if r["T"] == T and r["path"].startswith(prefix)]
            if cpu and qpu_:
                c, q = cpu[0], min(qpu_, key=lambda r: r["seconds_per_token"])
                out.append({"T": T, "cpu": c["path"], "cpu_s": c["seconds_per_token"], "qpu": q["path"],
                            "qpu_s": q["seconds_per_token"], "ratio": q["seconds_per_token"] / c["seconds_per_token"]})
    return out


def finding(data: dict) -> str:
    """The report's answer, every number read off the tables."""
    w = wins(data)
    if not w:
        return "No T has the same problem timed on the CPU and on the QPU."
    closest = min(w, key=lambda x: x["ratio"])
    sizes = sorted({x["T"] for x in w})
    text = (f"At eps = {data['epsilon']:g} (R = {math.ceil(data['reads_needed']['binomial'])} reads, the binomial "
            f"variance of these fields), the QPU costs {min(x['ratio'] for x in w):.3g}x to "
            f"{max(x['ratio'] for x in w):.3g}x the CPU per token on the same problem at T = {sizes[0]}..{sizes[-1]} "
            f"(closest: {closest['qpu']} against {closest['cpu']} at T = {closest['T']}); ")
    better = [x for x in w if x["ratio"] < 1]
    text += ("a QPU wins nowhere here." if not better else
             "the QPU is cheaper for " + ", ".join(f"{x['cpu']} at T = {x['T']}" for x in better) + ".")
    sqa = next((p for p in data["reads"]["physics"] if p["physics"] == "sqa"), None)
    if sqa:
        text += (f" With SQA standing in for the physics, the calibrated path's marginals keep a bias of "
                 f"{sqa['bias']:.2g} (n = {data['reads']['n']}), so eps = {data['epsilon']:g} is "
                 + ("out of reach at any R." if sqa["bias"] >= data["epsilon"]
                    else f"reached at R = {math.ceil(data['reads_needed']['sqa'])}."))
    return text


def qpu_markdown(data: dict, stamp: dict, plot: str | None) -> str:
    """report/qpu/README.md from :func:`qpu_rows`."""
    eps = data["epsilon"]
    lines = ["# The QPU path: tiling, temperature, reads and cost per token", "",
             "Generated by `boltzmann-attention-bench qpu report/qpu`; do not edit by hand.", "",
             stamp_line(stamp) + f"; {data['seconds']:.0f} s on one core; "
             + ", ".join(f"{k} {v}" for k, v in data["versions"].items()) + ".", "",
             "**What is measured and what is not.** `dwave.system.testing.MockDWaveSampler` has a QPU's topology and "
             "properties but samples classically, so every temperature, KL and chain-break rate below is that of "
             "this package's physics standing in for the device (`ising.qpu.SimulatedPhysics`: exact Boltzmann "
             "draws or simulated quantum annealing at a device beta of 4, or the 5 ns simulated diabatic anneal), "
             "not QPU physics. The tiling counts are embeddings actually placed on the graphs. The QPU's times are "
             "D-Wave's published timing parameters, not measurements; the CPU's are measured here.", "",
             "## Finding", "", finding(data), ""]
    if plot:
        lines += [f"![seconds per token against T]({plot})", ""]
    lines += ["## Seconds per token against T", "",
              f"QPU: D-Wave's QPU access time T = T_p + R (T_a + T_r + T_d) of one call shared by its k tiled queries, "
              f"R = {math.ceil(data['reads_needed']['binomial'])} reads (below), T_r at the top of the published "
              "readout range for a tiled call (the bottom for one query alone). CPU: measured side by side, one "
              "thread, one call's time over its queries, batched as a layer batches them (`cpu_rows`: exact "
              "enumeration needs T <= 24; banded and mean field solve queries that see all T keys; a window solves W "
              "slots at any T).", ""]
    sizes = sorted({r["T"] for r in data["cost"]})
    paths = list(dict.fromkeys(r["path"] for r in data["cost"]))
    cell = {(r["path"], r["T"]): r["seconds_per_token"] for r in data["cost"]}
    lines += [md_table(["path"] + [f"T = {T}" for T in sizes],
                       [[p] + [_seconds(cell[p, T]) if (p, T) in cell else "" for T in sizes] for p in paths]), ""]
    lines += ["The same problem on both (the QPU on its cheaper graph):", "",
              md_table(["T", "CPU", "per token", "QPU", "per token", "QPU / CPU"],
                       [[str(x["T"]), x["cpu"], _seconds(x["cpu_s"]), x["qpu"], _seconds(x["qpu_s"]),
                         f"{x['ratio']:.3g}"] for x in wins(data)]), ""]
    lines += ["## D-Wave's timing parameters", "",
              md_table(["QPU", "graph tiled", "programming T_p", "readout T_r per read", "delay T_d per read",
                        "anneal T_a"],
                       [[t["name"], t["graph"], f"{t['programming_us']:g} µs",
                         f"{t['readout_us'][0]:g} to {t['readout_us'][1]:g} µs", f"{t['delay_us']:g} µs",
                         f"{t['anneal_us']:g} µs"] for t in data["timings"].values()]), "",
              "Sources:", ""] + [f"- {s}" for s in data["sources"]] + [
              "", "The formula and the 10-20 ms overhead Delta (`qpu_access_overhead_time`, not charged, not included "
              "here) are from the first; programming time, readout range and delay per read from the QPUs' "
              "\"Physical Properties\" tables in the second; the anneal time is the 20 µs of the first's SAPI timing "
              "example. The readout time grows with the number of qubits read (\"25 µs per read\" for small problems, "
              "\"150 µs\" for large ones on Advantage, per the first).", ""]
    lines += ["## Tiling: windows per QPU call", "",
              "Disjoint embeddings placed by `ising.qpu.disjoint_embeddings` (seed 0): a copy embedded in the "
              "smallest sub-lattice that holds it, moved over the graph by the sublattice mappings, then minorminer on "
              "the qubits left. Each count is embeddings placed and checked, a lower bound on what fits.", "",
              md_table(["graph", "shape", "copies per call", "qubits used", "of", "fewest qubits per copy",
                        "longest chain", "seconds"],
                       [[r["graph"], f"K_{r['n']}" if r["kind"] == "clique" else f"band T = {r['n']}, w = {r['width']}",
                         str(r["copies"]), str(r["qubits_used"]), str(r["graph_qubits"]), str(r["qubits_per_copy"]),
                         str(r["longest_chain"]), f"{r['seconds']:.1f}"] for r in data["tiling"]]), ""]
    first = data["calibration"][0]
    lines += ["## Temperature: calibrated to beta_eff = 1 on the mock", "",
              "`QPUSampler.calibrate`: the DQA study's systems (h ~ N(-1.3, 0.4^2), J ~ N(0, 0.25^2), n = "
              f"{', '.join(map(str, first['sizes']))}; {first['systems']} systems each, seed 0), {first['reads']} "
              "reads each, "
              "energy scale moved by target / median beta_eff until within 5%; beta_eff by KL against exp(-E) over "
              f"all 2^n states (`annealing.fit_beta`), on a MockDWaveSampler with a {first['mock_graph']} graph. Then "
              "on held-out systems (seed 1) at that scale: beta_eff, the KL left at beta_eff and to exp(-E) (nats, "
              "from the reads' histograms; 'finite-sample part' is (states seen - 1) / (2 reads), about the KL a "
              "perfect sampler would show), and the chain-break rate. Chain rule 'range': chains at the device's "
              "strongest ferromagnetic coupling (-j_range[0] = 1); 'torque': uniform torque compensation (prefactor "
              "1.414) of the scaled problem. Cells: median [min, max] over the systems.", ""]
    rows = []
    for r in data["calibration"]:
        options = ", ".join(f"{k}={v}" for k, v in r["options"].items())
        if "error" in r:
            rows.append([r["physics"], options, r["chain_rule"], "failed: " + r["error"], "", "", "", "", "", ""])
            continue
        rows.append([r["physics"], options, r["chain_rule"], f"{r['energy_scale']:.4g}", f"{r['chain_strength']:.3g}",
                     _q(r["beta"]), _q(r["kl_at_beta"]), _q(r["kl_to_boltzmann"]), _q(r["kl_floor"]),
                     f"{r['chain_break_rate']:.2g}"])
    lines += [md_table(["physics", "options", "chain rule", "energy scale c", "chain strength", "beta_eff",
                        "KL at beta_eff", "KL to exp(-E)", "finite-sample part", "chain-break rate"], rows), ""]
    reads = data["reads"]
    lines += ["## Reads for a marginal error", "",
              f"The spread of sampled marginals against exact: {reads['systems']} held-out systems of n = "
              f"{reads['n']} (seed 1), the calibrated QPUSampler on the mock, rms error over all marginals at R reads, "
              f"against the binomial sqrt(mean(1 - m^2) / R) of independent reads (mean(1 - m^2) = "
              f"{reads['mean_binomial_variance']:.3g} from the exact m). Fitted rms^2 = a / R + b^2: a / mean(1 - m^2) "
              "is the variance inflation, b the bias left after the calibration.", ""]
    rows = []
    for p in reads["physics"]:
        for r in p["rows"]:
            rows.append([p["physics"], str(r["reads"]), f"{r['rms_error']:.3g}", f"{r['binomial']:.3g}",
                         f"{p['inflation']:.3g}", f"{p['bias']:.2g}"])
    lines += [md_table(["physics", "reads R", "rms error", "binomial", "inflation", "bias b"], rows), ""]
    needed = data["reads_needed"]
    lines += [f"Reads for rms error eps = {eps:g}: worst case (m = 0) {math.ceil(needed['binomial_worst'])}; at "
              f"these fields {math.ceil(needed['binomial'])} (the cost table's R); "
              + "; ".join(f"{p['physics']} as measured: "
                          + (f"{math.ceil(needed[p['physics']])}" if math.isfinite(needed[p["physics"]])
                             else "unreachable (bias >= eps)") for p in reads["physics"]) + ".", ""]
    return "\n".join(lines)


def plot_qpu(data: dict, path: str) -> None:
    """Seconds per token against T, log-log: CPU paths solid, QPU paths dashed."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.2, 4.2), dpi=72)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    colors = colormaps["tab20"]
    for k, p in enumerate(dict.fromkeys(r["path"] for r in data["cost"])):
        pts = sorted((r["T"], r["seconds_per_token"], r["kind"]) for r in data["cost"] if r["path"] == p)
        ax.plot([x[0] for x in pts], [x[1] for x in pts], marker="o", ms=3, color=colors(k % 20),
                ls="--" if pts[0][2] == "qpu" else "-", label=p)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T (tokens)")
    ax.set_ylabel("seconds per token")
    ax.set_title(f"CPU measured (solid), QPU from D-Wave's timing (dashed), eps = {data['epsilon']:g}", fontsize=8)
    ax.legend(fontsize=5, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path)


def write_qpu_report(out_dir: str, quick: bool = False) -> None:
    """Measure (:func:`qpu_rows`) and write README.md, qpu.png and qpu.json."""
    os.makedirs(out_dir, exist_ok=True)
    stamp = machine_stamp(1)
    data = qpu_rows(quick)
    with open(os.path.join(out_dir, "qpu.json"), "w") as f:
        json.dump(_finite({"machine": stamp, **data}), f, separators=(",", ":"))
    plot = None
    try:
        plot_qpu(data, os.path.join(out_dir, "qpu.png"))
        plot = "qpu.png"
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(qpu_markdown(data, stamp, plot) + "\n")


def _finite(x):
    """``x`` with every non-finite float as None (JSON has no infinity)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x
