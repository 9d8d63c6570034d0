"""The coupled window's two exact paths side by side: the split enumeration and the configurations path (softmax
attention over the window's 2^W configurations, :mod:`boltzmann_attention.ising.configurations`).

For each W, forward+backward of the causal window attention (``coupled_window.window_attention`` from q, k, v and
J: the band of the field, the window marginals, the band times v, the sigmoid part before the window) and of the
window marginals alone (the (B, H, T, W) band of fields, the first W - 1 rows with their absent slots), each with
``window_path`` 'split' and 'configurations', interleaved round by round in one process (half of the rounds in
each order), so that the machine's load hits both alike. The ratio configurations / split (below 1: the
configurations path is faster) is what ``ising.window.choose_path``'s rule is read from.
"""

from __future__ import annotations

import os

import torch

from ...coupled_window import window_attention
from ...ising import window as window_ising
from .common import both_orders

PATHS = ("split", "configurations")


def _window_inputs(B: int, H: int, T: int, W: int, E: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, E, generator=g).to(device) for _ in range(3))
    A = 0.3 * torch.randn(H, W, W, generator=g)
    J = (A.triu(1) + A.triu(1).mT).to(device)
    return q, k, v, J


def window_step(B: int, H: int, T: int, W: int, path: str, device="cpu", E: int = 16, part: str = "attention"):
    """A function that runs one forward+backward of the window attention (``part='attention'``) or of the window
    marginals alone (``'marginals'``) with ``window_path=path``, on fixed random inputs."""
    q, k, v, J = _window_inputs(B, H, T, W, E, device)
    q.requires_grad_(), k.requires_grad_(), J.requires_grad_()
    scale = E ** -0.5
    if part == "marginals":
        index = torch.arange(T, device=device)[:, None] - torch.arange(W, device=device)
        present = index >= 0
        h = torch.randn(B, H, T, W, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
        partial = min(T, W - 1)
        key = f"window_paths benchmark: T={T} W={W}"

        def step():
            m = torch.cat([window_ising.marginals(h[..., :partial, :], J[:, None], present[:partial], key, path),
                           window_ising.marginals(h[..., partial:, :], J[:, None], None, None, path)], dim=-2)
            m.sum().backward()
        return step

    def step():
        field = q @ k.transpose(-1, -2) * scale - 1.0
        out, _ = window_attention(field, v, J, W, None, scores=(q, k, scale, -1.0), window_path=path)
        out.sum().backward()
    return step


def path_rows(windows=tuple(range(4, 17, 2)), B: int = 12, H: int = 4, T: int = 256, rounds: int = 3,
              device="cpu", parts=("attention", "marginals"), sync=None) -> list[dict]:
    """One row per (part, W): median seconds of each path over ``rounds`` interleaved rounds (after one warm-up
    call each; half of the rounds in the opposite order), their ratio, and the path ``choose_path`` takes there.
    sync: called after each step (``torch.cuda.synchronize`` on a GPU)."""
    rows = []
    for part in parts:
        for W in windows:
            times = both_orders({p: window_step(B, H, T, W, p, device, part=part) for p in PATHS}, rounds, sync)
            split, conf = (times[p] for p in PATHS)
            rows.append({"part": part, "W": W, "split_s": split, "configurations_s": conf, "ratio": conf / split,
                         "chosen": window_ising.choose_path(W, torch.device(device)),
                         "load": os.getloadavg()[0]})
    return rows


def path_table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| part | W | split ms | configurations ms | configurations / split | load | rule's path |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['part']} | {r['W']} | {1e3 * r['split_s']:.1f} | {1e3 * r['configurations_s']:.1f} | "
                     f"{r['ratio']:.2f} | {r['load']:.1f} | {r['chosen']} |")
    return "\n".join(lines)
