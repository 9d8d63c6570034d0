"""Method ``chain``'s forms side by side: the sequential recursion, the chunked scan (option ``chunk_length``)
and, on the CPU, the compiled kernel (option ``kernel="cpp"``), forward+backward of the marginals of causal
attention fields with couplings in band form that differ per query (what couplings from content give the solver),
interleaved round by round in one process (half of the rounds in each order). The ratios to the sequential
recursion (below 1: faster) are what a choice between them is read from, per device.
"""

from __future__ import annotations

import os

import torch

from ...ising import chain
from .common import both_orders


def scan_step(B: int, H: int, T: int, w: int, chunk_length: int | None, device="cpu", seed: int = 0,
              kernel: str = "torch"):
    """A function that runs one forward+backward of the chain's marginals for fields (B, H, T, T), a band
    (B, H, T, T, w) and the causal mask, with ``chunk_length`` and ``kernel``, on fixed random inputs."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, H, T, T, generator=g).to(device).requires_grad_()
    band = (0.3 * torch.randn(B, H, T, T, w, generator=g)).to(device).requires_grad_()
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()

    def step():
        m = chain.band_marginals(h, chain.Band(band), causal, chunk_length=chunk_length, kernel=kernel)
        m.sum().backward()
    return step


def scan_rows(chunks=(4, 8, 16), B: int = 8, H: int = 2, T: int = 52, w: int = 4, rounds: int = 3, device="cpu",
              sync=None) -> list[dict]:
    """One row per chunk length: median seconds of the sequential recursion, the chunked scan and (on the CPU) the
    compiled kernel over ``rounds`` interleaved rounds (after one warm-up call each; half of the rounds in the
    opposite order), and the ratios to the sequential recursion. sync: called after each step
    (``torch.cuda.synchronize`` on a GPU)."""
    rows = []
    cpu = torch.device(device).type == "cpu"
    for c in chunks:
        forms = {"sequential": scan_step(B, H, T, w, None, device), "chunked": scan_step(B, H, T, w, c, device)}
        if cpu:
            forms["cpp"] = scan_step(B, H, T, w, None, device, kernel="cpp")
        times = both_orders(forms, rounds, sync)
        sequential = times["sequential"]
        row = {"chunk_length": c, "T": T, "w": w, "sequential_s": sequential, "chunked_s": times["chunked"],
               "ratio": times["chunked"] / sequential, "load": os.getloadavg()[0]}
        if cpu:
            row.update(cpp_s=times["cpp"], cpp_ratio=times["cpp"] / sequential)
        rows.append(row)
    return rows


def scan_table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| T | w | chunk length | sequential ms | chunked ms | chunked / sequential | cpp kernel ms | "
             "cpp / sequential | load |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cpp = (f"{1e3 * r['cpp_s']:.1f} | {r['cpp_ratio']:.2f}" if "cpp_s" in r else "not run (CPU only) | ")
        lines.append(f"| {r['T']} | {r['w']} | {r['chunk_length']} | {1e3 * r['sequential_s']:.1f} | "
                     f"{1e3 * r['chunked_s']:.1f} | {r['ratio']:.2f} | {cpp} | {r['load']:.1f} |")
    return "\n".join(lines)
