"""Method ``chain``'s two forms side by side: the sequential recursion and the chunked scan (option
``chunk_length``), forward+backward of the marginals of causal attention fields with couplings in band form that
differ per query (what couplings from content give the solver), interleaved round by round in one process (half
of the rounds in each order). The ratio chunked / sequential (below 1: the chunked scan is faster) is what a
choice between them is read from, per device.
"""

from __future__ import annotations

import os

import torch

from ...ising import chain
from .common import both_orders


def scan_step(B: int, H: int, T: int, w: int, chunk_length: int | None, device="cpu", seed: int = 0):
    """A function that runs one forward+backward of the chain's marginals for fields (B, H, T, T), a band
    (B, H, T, T, w) and the causal mask, with ``chunk_length``, on fixed random inputs."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, H, T, T, generator=g).to(device).requires_grad_()
    band = (0.3 * torch.randn(B, H, T, T, w, generator=g)).to(device).requires_grad_()
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()

    def step():
        m = chain.band_marginals(h, chain.Band(band), causal, chunk_length=chunk_length)
        m.sum().backward()
    return step


def scan_rows(chunks=(4, 8, 16), B: int = 8, H: int = 2, T: int = 52, w: int = 4, rounds: int = 3, device="cpu",
              sync=None) -> list[dict]:
    """One row per chunk length: median seconds of the sequential recursion and of the chunked scan over ``rounds``
    interleaved rounds (after one warm-up call each; half of the rounds in the opposite order) and their ratio.
    sync: called after each step (``torch.cuda.synchronize`` on a GPU)."""
    rows = []
    for c in chunks:
        times = both_orders({"sequential": scan_step(B, H, T, w, None, device),
                             "chunked": scan_step(B, H, T, w, c, device)}, rounds, sync)
        sequential, chunked = times["sequential"], times["chunked"]
        rows.append({"chunk_length": c, "T": T, "w": w, "sequential_s": sequential, "chunked_s": chunked,
                     "ratio": chunked / sequential, "load": os.getloadavg()[0]})
    return rows


def scan_table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| T | w | chunk length | sequential ms | chunked ms | chunked / sequential | load |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['T']} | {r['w']} | {r['chunk_length']} | {1e3 * r['sequential_s']:.1f} | "
                     f"{1e3 * r['chunked_s']:.1f} | {r['ratio']:.2f} | {r['load']:.1f} |")
    return "\n".join(lines)
