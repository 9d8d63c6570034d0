"""Does J help in a real-size model? (issue 14, section 4). Profile ``realsize`` and its report.

nanoGPT's CPU configuration on Tiny Shakespeare (the strong-baselines study's `NANOGPT` overrides, with which
softmax reproduced nanoGPT's validation loss, 1.877 ± 0.004 against ~1.88): 4 layers, 4 heads, d_model 128,
d_ff 512, T = 64, batch 12, 2000 iterations, 100 warm-up steps then cosine decay to 10%, AdamW betas
(0.9, 0.99), weight decay 0.1, no dropout, nanoGPT's init, unfused AdamW. Five attention variants ("arms"),
the same model otherwise:

    softmax     SDPA
    h           sigmoid attention over the whole context (the field bias learned, from -log(T) / 2)
    window16    h+J, the coupled window: the last W = 16 keys of each query coupled by a free slot-indexed
                J (H, 16, 16) per layer, earlier keys independent; method exact
    meanfield8  h+J, relative couplings J_jk = f(|j - k|) up to distance 8, naive mean field (Toeplitz
                solver, default options: damping 0.5, tol 1e-6, at most 500 iterations)
    banded8     h+J, the same relative couplings (range 8), exact by the banded transfer matrix

meanfield8 and banded8 are one model solved two ways (approximately, exactly). J starts at 0 in every arm,
so every h+J arm starts as h. Every run also measures its memory: before training, 3 training steps of its
config in a fresh Python process whose peak resident set size (VmHWM) the result records
(``TrainConfig.memory_probe_steps``; :func:`..train.memory_probe`). A mean-field run records in how many
training steps and evaluations the solver did not converge (its 'convergence'), and the report says it.

Stages, each decided by a rule written here before any of its runs:

1. Learning rate, per arm: every lr of `LEARNING_RATES` (3e-4, 1e-3, 3e-3: half a decade either side of
   nanoGPT's 1e-3) at T = 64, seed 0 (one seed: a second would double this stage, see the cost below).
   Rule: the lr with the lowest validation loss (nats per character over the 2048 fixed validation windows);
   lrs within `NEAR_TIE` = 0.01 nats of the lowest count as tied, and of those the one the fewest
   half-decade steps from nanoGPT's 1e-3 wins (3e-4 and 3e-3 are one step away), then the smaller. 0.01
   nats is about 1.7 standard deviations of the difference of two single runs (softmax's seed-to-seed std
   in the nanoGPT check: 0.004). A winner at the edge of the arm's lrs (the smallest or largest, counting
   lrs already added) adds the next lr half a decade beyond it (1e-4 below, 1e-2 above) in
   `EXTRA_LEARNING_RATES`, until the winner is inside; a run that diverges (the sweep names it; its lr
   goes into `DIVERGED`) loses at that lr. The winners go into `BEST_LR`.
2. Seeds 0, 1, 2 at each arm's `BEST_LR`, T = 64 (seed 0 is stage 1's run at that lr). Paired over seeds:
   each arm's validation loss against softmax, and each h+J arm's against h (what J adds), with 95% t
   intervals. Listed only once an arm's lr is in `BEST_LR`, so until stage 1 is run and decided the profile
   is stage 1 alone.
3. T = 256 (nanoGPT's GPU block size) for softmax, h and the fastest h+J arm (below), seeds 0, 1, 2, each at
   its stage-1 lr (not tuned again at T = 256: a second lr grid would cost more than this stage), batch
   `LONG_BATCH`, `LONG_STEPS` steps, the validation set 512 windows of 256 (the same 131k characters of
   validation text as 2048 windows of 64), the rest as at T = 64.

The fastest h+J arm, by speed alone (fixed before any loss was seen): the h+J arm with the lowest step time
at T = 256, measured side by side with the others, each at the slower of two coupling scales (J = 0, as at
the start, and J ~ N(0, 0.3^2), near the mean |J| of 0.35-0.41 that h+J learned in the paper's model,
report/baselines), because mean field's iterations grow with |J| (at J ~ N(0, 0.3^2) with range 8 it does
not converge in its 500 iterations) while the exact methods cost the same at any J (window16 at T = 64:
305 ms at J = 0, 311 ms at J ~ N(0, 0.3^2); at T = 256 it was timed at J = 0 only). By the measurement
below: **window16** (`FASTEST`), 352 ms at batch 3 against mean field's 1901 ms (322 ms at J = 0, where it
is the faster of the two) and banded8's 4976 ms.

Step times, measured at 13:12-13:18 UTC on 2026-12-01 with ``benchmarks.training.time_steps`` (one process, one thread,
OMP_NUM_THREADS=1, nice 5, all arms of a table side by side, interleaved: 2 warm-up steps then 3 rounds of 10
steps per arm at T = 64; 1 warm-up step then 2 rounds of 4 steps at T = 256) on the 2-core machine **while a
training sweep ran on it at a higher priority** (load average about 3): the absolute times are inflated,
perhaps 2x; the ratios to softmax, measured under the same load, are the better guide. Median of the rounds
(their range), ms per training step (forward, backward, AdamW):

    T = 64, batch 12               ms per step           x softmax
    softmax                          77.7 (57.8-82.9)        1.0
    h                                85.5 (73.2-90.1)        1.1
    window16                        304.7 (285.7-323.6)      3.9
    window16, J ~ N(0, 0.3^2)       311.1 (286.7-379.6)      4.0
    meanfield8                      153.4 (133.5-193.0)      2.0
    meanfield8, J ~ N(0, 0.3^2)     727.2 (671.4-767.0)      9.4   (not converged in 500 iterations)
    banded8                        1440.3 (1377.4-1715.1)   18.5

    T = 256                        batch 3                    batch 12
    softmax                         101.5 (98.2-104.7)  1.0     333.0 (317.7-348.2)   3.3
    h                               126.1 (123.1-129.0) 1.2     439.4 (433.0-445.8)   4.3
    window16                        352.4 (334.6-370.2) 3.5    1449.1 (1362.6-1535.5) 14.3
    meanfield8                      322.0 (293.7-350.3) 3.2    1209.1 (1076.1-1342.1) 11.9
    meanfield8, J ~ N(0, 0.3^2)    1900.9 (1881.4-1920.4) 18.7 7019.3 (6903.2-7135.3) 69.2
    banded8                        4976.0 (4378.7-5573.2) 49.0  (not measured)
    (x softmax: against softmax at batch 3)

One evaluation (2048 windows of 64, or 512 of 256; forward only, batch 256; measured once each, same load,
J = 0): T = 64: softmax 4.0 s, h 4.7 s, window16 23.2 s, meanfield8 4.5 s, banded8 36.8 s; T = 256: softmax
13.0 s, h 21.2 s, window16 69.0 s. A run evaluates 9 times (every 250 steps, and once more at the end).

Memory, measured at 13:24-13:25 UTC the same day with :func:`..train.memory_probe` (3 training steps of each
arm's config at lr 1e-3 in a fresh process, J = 0), MiB: peak RSS / RSS before the first step / what the
steps added. T = 64, batch 12: softmax 474 / 384 / 90, h 485 / 384 / 101, window16 589 / 387 / 202,
meanfield8 487 / 387 / 100, banded8 490 / 387 / 103. T = 256, batch 12: softmax 620 / 384 / 236, h
909 / 384 / 525, window16 1162 / 387 / 774, meanfield8 891 / 387 / 504. (The 384 MiB before the steps are
Python, torch and the data; the evaluations, at batch 256, are not in these numbers.)

Stage 3's batch and steps, chosen from these times: batch 12 and 2000 steps, stage 2's, so that T alone
changes between stages 2 and 3 (12 x 256 characters a step, 6.1M in a run, about 6 passes over the 1.0M
training characters, against 1.5 at T = 64). At the measured times it takes 4.5 h of one core, 2.2 h with
two runs at a time: it fits a few hours of the 2-core machine. Batch 3 (the 768 characters a step of T = 64)
would take 1.7 h (its evaluations then cost more than its steps) but change the batch and the amount
of text seen as well as T.

Cost, estimated from the measured step and evaluation times above (2000 steps and 9 evaluations a run; the
memory probe adds seconds), in hours of one core under that load. A run at T = 64: softmax 0.05, h 0.06,
window16 0.23, meanfield8 0.10 (J = 0) to 0.45 (J ~ N(0, 0.3^2); its evaluation there not measured, taken
as 5x, like its steps), banded8 0.89. Stage 1 (3 lrs, one seed): 4.0-5.1 h, banded8 2.7 h of it. Stage 2
(2 more seeds per arm): 2.7-3.4 h; banded8's 3 seeds of stage 2 take 2.7 h of one core, within the 10 h a
mode may take, so banded8 stays in. Each lr added at an edge: one run, at most 0.9 h. Stage 3 (3 seeds of
softmax 0.22 h, h 0.30 h, window16 0.98 h): 4.5 h. In all 11-13 h of one core, about half that with
``--jobs 2`` (6.5 h at most under this load; less on an idle machine).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..report import header_section, lr_decision_notes
from ..results import Results
from ..stats import millinats, paired, relative, stat
from ..sweep import Grid, with_field_bias
from ..tables import fmt_interval, fmt_num, fmt_stat, md_table, table_with_holm
from ..train import TrainConfig
from .baselines import NANOGPT, NANOGPT_LOSS, NANOGPT_T
from .brackets import beyond


@dataclass(frozen=True)
class Arm:
    """One attention variant of the study: its name, mode, method and TrainConfig coupling options."""

    name: str
    mode: str
    method: str = "exact"
    options: tuple[tuple[str, object], ...] = ()

    @property
    def overrides(self) -> dict:
        return dict(self.options)


WINDOW = 16  # the coupled window's W
RANGE = 8    # the relative couplings' range (mean field and banded exact: one model)
ARMS = (
    Arm("softmax", "softmax"),
    Arm("h", "h"),
    Arm(f"window{WINDOW}", "h+J", "exact", (("coupling", "window"), ("coupling_window", WINDOW))),
    Arm(f"meanfield{RANGE}", "h+J", "meanfield", (("coupling", "relative"), ("coupling_range", RANGE))),
    Arm(f"banded{RANGE}", "h+J", "banded", (("coupling", "relative"), ("coupling_range", RANGE))),
)
BY_NAME = {a.name: a for a in ARMS}
COUPLED = tuple(a.name for a in ARMS if "J" in a.mode)  # the h+J arms, each compared with h

PREFIX = "rs-"
SEEDS = (0, 1, 2)
LR_SEEDS = (0,)
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
NANOGPT_LR = NANOGPT["lr"]  # 1e-3: ties go towards it
NEAR_TIE = 0.01             # nats: stage 1's rule counts validation losses this close to the lowest as tied
MEMORY_PROBE_STEPS = 3
LONG_T = 256
FASTEST = f"window{WINDOW}"  # the fastest h+J arm at T = 256 (the measurement in the docstring)
LONG_ARMS = ("softmax", "h", FASTEST)
LONG_BATCH = 12      # stage 3: only T changes from stage 2 (how this was chosen: the docstring)
LONG_STEPS = 2000
LONG_EVAL_WINDOWS = 512

# Stage 1's decisions (see the report for the measurement behind each), as the rule applies them.
# Validation loss of seed 0, 2026-12-02:
# softmax: 3e-4 2.0733, 1e-3 1.8800, 3e-3 1.7759: best at the edge, so 1e-2 was added: 1.8094; decided, 3e-3.
# h: 3e-4 2.1001, 1e-3 1.8797, 3e-3 1.8401: best at the edge, so 1e-2 was added: 2.4404; decided, 3e-3.
# window16: 3e-4 1.9062, 1e-3 1.7865, 3e-3 1.7532: best at the edge, so 1e-2 was added: 1.8026; decided, 3e-3.
# meanfield8: 3e-4 2.0612, 1e-3 1.9083, 3e-3 1.8488: best at the edge, so 1e-2 was added: 1.9037; decided, 3e-3.
# banded8: 3e-4 2.0613, 1e-3 1.9100, 3e-3 1.8469: best at the edge, so 1e-2 was added (its run started
#   before 3e-4's result, on a core that was free): 1.8614; decided, 3e-3.
EXTRA_LEARNING_RATES: dict[str, tuple[float, ...]] = {"softmax": (1e-2,), "h": (1e-2,),  # arm -> lrs added
                                                      "window16": (1e-2,), "meanfield8": (1e-2,),
                                                      "banded8": (1e-2,)}
DIVERGED: dict[str, tuple[float, ...]] = {}              # arm -> lrs at which a stage-1 run diverged
BEST_LR: dict[str, float] = {"softmax": 3e-3, "h": 3e-3, "window16": 3e-3, "meanfield8": 3e-3,  # arm -> lr
                             "banded8": 3e-3}


def variant(arm: str, lr: float, T: int = NANOGPT_T) -> str:
    """``rs-<arm>-lr<lr>`` at T = 64; at T = 256 with the batch and steps of stage 3."""
    return f"{PREFIX}{arm}-lr{lr:g}" + ("" if T == NANOGPT_T else f"-b{LONG_BATCH}-steps{LONG_STEPS}")


def overrides(arm: Arm, lr: float, T: int = NANOGPT_T) -> dict:
    """The TrainConfig fields of ``arm`` at ``lr`` and window T (besides task, T, mode, method, seed)."""
    long = {} if T == NANOGPT_T else {"batch_size": LONG_BATCH, "steps": LONG_STEPS,
                                      "eval_interval": max(1, LONG_STEPS // 8), "eval_windows": LONG_EVAL_WINDOWS}
    return {**NANOGPT, **arm.overrides, "lr": lr, "memory_probe_steps": MEMORY_PROBE_STEPS, **long}


def config(arm: Arm, T: int = NANOGPT_T, lr: float = NANOGPT_LR, **changes) -> TrainConfig:
    """The TrainConfig of ``arm`` (seed 0), with ``changes`` (e.g. for timing at another batch size)."""
    return TrainConfig(task="shakespeare", T=T, mode=arm.mode, method=arm.method,
                       **{**overrides(arm, lr, T), **changes})


def _grid(arm: str, T: int, seed: int, lr: float) -> Grid:
    a = BY_NAME[arm]
    return Grid(("shakespeare",), (T,), modes=(a.mode,), methods=(a.method,), seeds=(seed,),
                variant=variant(arm, lr, T), overrides=overrides(a, lr, T))


def arm_learning_rates(arm: str) -> tuple[float, ...]:
    """Stage 1's lrs for ``arm``: the grid and those added beyond its edge, in increasing order."""
    return tuple(sorted(set(LEARNING_RATES) | set(EXTRA_LEARNING_RATES.get(arm, ()))))


def learning_rate_grids() -> list[Grid]:
    """Stage 1: every arm at every one of its lrs, T = 64, the cheap arms first."""
    return [_grid(a.name, NANOGPT_T, seed, lr) for seed in LR_SEEDS for a in ARMS for lr in arm_learning_rates(a.name)]


def seed_grids() -> list[Grid]:
    """Stage 2 (seed by seed, so that paired comparisons complete early) and stage 3, only for the arms whose
    lr is decided."""
    grids = [_grid(a.name, NANOGPT_T, seed, BEST_LR[a.name]) for seed in SEEDS for a in ARMS if a.name in BEST_LR]
    return grids + [_grid(arm, LONG_T, seed, BEST_LR[arm]) for seed in SEEDS for arm in LONG_ARMS if arm in BEST_LR]


def realsize_grids(field_bias: str) -> list[Grid]:
    """Every stage (see the docstring); ``field_bias`` sets the field bias of the modes other than softmax."""
    return with_field_bias(learning_rate_grids() + seed_grids(), field_bias)


PROFILES = {"realsize": realsize_grids}


# ---------------------------------------------------------------------------------------------------- report

def owns(res: Results) -> bool:
    """True when every run is of this study's variants."""
    return bool(res.all_runs) and all(r.variant.startswith(PREFIX) for r in res.all_runs)


def report(res: Results, results_dir: Path, out: Path) -> list[str]:
    lines = header_section(res, results_dir)
    lines += [__doc__.split("\n\n", 1)[1].strip(), ""]
    lines += learning_rate_section(res)
    lines += comparison_section(res, NANOGPT_T, out)
    lines += comparison_section(res, LONG_T, out)
    return lines


def _group(res: Results, arm: str, lr: float, T: int = NANOGPT_T):
    a = BY_NAME[arm]
    return res.get("shakespeare", variant(arm, lr, T), T, a.mode, a.method)


def per_seed(res: Results, arm: str, lr: float, T: int = NANOGPT_T) -> dict[str, dict[int, float]]:
    """Per seed: the validation loss, the seconds per training step (the run's wall time, which sums every
    segment of a resumed run and includes its evaluations, over its configured steps: ``steps_run`` counts
    only the last segment), and the memory probe's peak RSS and steps' memory (MiB) where recorded."""
    g = _group(res, arm, lr, T)
    if g is None:
        return {"loss": {}, "step_s": {}, "peak_mib": {}, "steps_mib": {}}
    memory = {s: r.raw.get("memory") or {} for s, r in g.runs.items()}
    return {"loss": g.values("loss"),
            "step_s": {s: r.wall_time_s / r.config["steps"] for s, r in g.runs.items()},
            "peak_mib": {s: m["peak_rss_mib"] for s, m in memory.items() if m.get("peak_rss_mib") is not None},
            "steps_mib": {s: m["steps_mib"] for s, m in memory.items() if m.get("steps_mib") is not None}}


def choose_lr(losses: dict[float, float]) -> float | None:
    """Stage 1's rule on {lr: validation loss}: the lowest loss; lrs within NEAR_TIE of it are tied, and the
    one the fewest half-decade steps from nanoGPT's lr wins (3e-4 and 3e-3 are one step from 1e-3), then the
    smaller. None when there is no lr."""
    if not losses:
        return None
    best = min(losses.values())
    tied = [lr for lr, loss in losses.items() if loss <= best + NEAR_TIE + 1e-12]
    return min(tied, key=lambda lr: (abs(round(2 * math.log10(lr / NANOGPT_LR))), lr))


def edge_extension(arm: str, lr: float) -> float | None:
    """The lr to add for ``arm`` when the rule's lr is at the edge of its lrs (else None)."""
    lrs = arm_learning_rates(arm)
    if lr == lrs[0]:
        return beyond(lr, up=False)
    if lr == lrs[-1]:
        return beyond(lr, up=True)
    return None


def decide_learning_rates(res: Results) -> dict[str, tuple[float | None, float | None]]:
    """Per arm whose stage-1 runs are all there (the lrs in DIVERGED aside): (the rule's lr, the lr to add
    beyond the edge or None)."""
    out = {}
    for a in ARMS:
        losses = {}
        for lr in arm_learning_rates(a.name):
            if lr in DIVERGED.get(a.name, ()):
                continue
            seeds = {s: v for s, v in per_seed(res, a.name, lr)["loss"].items() if s in LR_SEEDS}
            if len(seeds) < len(LR_SEEDS):
                break
            losses[lr] = statistics.mean(seeds.values())
        else:
            chosen = choose_lr(losses)
            out[a.name] = (chosen, edge_extension(a.name, chosen) if chosen is not None else None)
    return out


def learning_rate_section(res: Results) -> list[str]:
    decided = decide_learning_rates(res)
    rows = []
    for a in ARMS:
        for lr in arm_learning_rates(a.name):
            found = per_seed(res, a.name, lr)
            loss = {s: v for s, v in found["loss"].items() if s in LR_SEEDS}
            step_s = [v for s, v in found["step_s"].items() if s in LR_SEEDS]  # the same runs as the loss
            diverged = lr in DIVERGED.get(a.name, ())
            if not loss and not diverged:
                continue
            bold = decided.get(a.name, (None,))[0] == lr
            rows.append([a.name, f"**{lr:g}**" if bold else f"{lr:g}",
                         "diverged" if diverged else fmt_stat(stat(loss.values()), digits=4),
                         fmt_num(1000 * statistics.mean(step_s), 0) if step_s else ""])
    if not rows:
        return []
    lines = ["## Stage 1: each arm's learning rate", "",
             f"T = {NANOGPT_T}, validation loss (nats per character) of seed(s) {', '.join(map(str, LR_SEEDS))}; "
             f"ms per step: wall time over steps, evaluations included. Rule (fixed before the runs): the lowest "
             f"loss; losses within {NEAR_TIE:g} nats of it are tied, and the lr the fewest half-decade steps from "
             f"nanoGPT's {NANOGPT_LR:g} wins among them (then the smaller); a winner at the edge of the arm's lrs "
             "adds the next lr beyond it. Bold: the rule's choice.", "",
             md_table(["arm", "lr", "validation loss", "ms per step"], rows), ""]
    return lines + [lr_decision_notes([a.name for a in ARMS], decided, BEST_LR, "studies/realsize.py"), ""]


def comparison_section(res: Results, T: int, out: Path) -> list[str]:
    """Stage 2 (T = 64) or 3 (T = 256): per arm at its BEST_LR, the validation loss, its paired differences
    to softmax and (h+J arms) to h, step time and memory; then what J adds, in words."""
    arms = [a.name for a in ARMS if a.name in BEST_LR and (T == NANOGPT_T or a.name in LONG_ARMS)]
    found = {arm: per_seed(res, arm, BEST_LR[arm], T) for arm in arms}
    found = {arm: f for arm, f in found.items() if f["loss"]}
    if not found:
        return []
    empty = {"loss": {}}
    soft, h = found.get("softmax", empty)["loss"], found.get("h", empty)["loss"]
    soft_step = statistics.mean(found["softmax"]["step_s"].values()) if "softmax" in found else None
    cells = []
    for arm, f in found.items():
        step = statistics.mean(f["step_s"].values())
        cells.append([arm, f"{BEST_LR[arm]:g}", fmt_stat(stat(f["loss"].values()), digits=4),
                      paired(soft, f["loss"], millinats) if arm != "softmax" and soft else None,
                      paired(h, f["loss"], millinats) if arm in COUPLED and h else None,
                      fmt_num(1000 * step, 0), fmt_num(step / soft_step, 1) if soft_step else "",
                      fmt_num(statistics.mean(f["peak_mib"].values()), 0) if f["peak_mib"] else "",
                      fmt_num(statistics.mean(f["steps_mib"].values()), 0) if f["steps_mib"] else ""])
    where = (f"T = {T}, batch {NANOGPT['batch_size']}, {NANOGPT['steps']} steps" if T == NANOGPT_T else
             f"T = {T}, batch {LONG_BATCH}, {LONG_STEPS} steps, {LONG_EVAL_WINDOWS} validation windows")
    lines = [f"## Stage {2 if T == NANOGPT_T else 3}: {where}", "",
             "Validation loss (nats per character, all positions), mean ± std over seeds (n seeds); differences in "
             "millinats (10^-3 nats), paired over seeds, mean [95% interval], positive = lower loss than the "
             "reference; `*` p < 0.05, `**` also after a Holm correction over the column. ms per step: the run's "
             "wall time over its steps (evaluations included; the machine's load at the time included), mean over "
             "seeds, and its ratio to softmax's. Memory: the probe before each run (a fresh process, "
             f"{MEMORY_PROBE_STEPS} training steps): its peak RSS, and what the steps added to it, MiB, mean over "
             "seeds.", "",
             table_with_holm(["arm", "lr", "validation loss", "vs softmax, Δ mnats", "what J adds: vs h, Δ mnats",
                              "ms per step", "x softmax", "peak RSS (MiB)", "steps' memory (MiB)"], cells,
                             {3: "softmax", 4: "h"}), ""]
    png = f"loss_T{T}.png"
    _plot(res, T, found, out / png)
    lines += [f"![validation loss against steps and against step time, T = {T}]({png})", ""]
    if T == NANOGPT_T and soft:
        s = stat(soft.values())
        lines += [f"Softmax: {s.mean:.4f} against nanoGPT's published ~{NANOGPT_LOSS} for this configuration "
                  f"({(s.mean - NANOGPT_LOSS) / NANOGPT_LOSS * 100:+.1f}%).", ""]
    return lines + convergence_lines(res, T, list(found)) + j_verdicts(found, h)


def convergence_lines(res: Results, T: int, arms: list[str]) -> list[str]:
    """Per arm whose runs recorded solver non-convergence (mean field): in how many training steps and
    evaluations, summed over its seeds; a line saying so for the mean-field arm when none was recorded."""
    lines = []
    for arm in arms:
        runs = _group(res, arm, BEST_LR[arm], T).runs.values()
        found = [r.raw["convergence"] for r in runs if r.raw.get("convergence")]
        if found:
            total = {k: sum(c[k] for c in found) for k in ("unconverged_steps", "unconverged_evaluations")}
            lines.append(f"- {arm}: the marginals did not converge in {total['unconverged_steps']} training steps "
                         f"and {total['unconverged_evaluations']} evaluations, summed over {len(found)} of its "
                         f"{len(runs)} runs (their validation loss is then the last iterate's, not a fixed point's).")
        elif BY_NAME[arm].method in ("meanfield", "tap"):
            lines.append(f"- {arm}: the mean field converged in every step and evaluation of its {len(runs)} runs.")
    return ["Convergence of the iterative solver:", "", *lines, ""] if lines else []


def j_verdicts(found: dict, h: dict[int, float]) -> list[str]:
    """One line per h+J arm: whether J helps, hurts or makes no measurable difference against h, and how much
    (millinats and percent of h's loss, 95% intervals)."""
    lines = []
    for arm in COUPLED:
        if arm not in found or not h:
            continue
        d, pct = paired(h, found[arm]["loss"], millinats), paired(h, found[arm]["loss"], relative)
        if d is None or d.n < 2:
            lines.append(f"- {arm}: fewer than 2 seeds paired with h; not tested.")
            continue
        word = ("**J helps**" if d.low > 0 else "**J hurts**" if d.high < 0 else
                "**no measurable difference** (the interval contains 0)")
        lines.append(f"- {arm} against h: {word}: {fmt_interval(d)} millinats, {fmt_interval(pct)}% of h's loss "
                     f"({d.n} paired seeds).")
    return ["What the couplings add (each h+J arm against h, the same model without J):", "", *lines, ""] if lines \
        else []


ARM_COLORS = {"softmax": "black", "h": "tab:orange", f"window{WINDOW}": "tab:blue", f"meanfield{RANGE}": "tab:green",
              f"banded{RANGE}": "tab:purple"}


def _plot(res: Results, T: int, found: dict, path: Path) -> None:
    """Left: each arm's validation loss against training steps (mean over seeds of the evaluations during
    training); right: its final validation loss (mean ± std) against its ms per step."""
    from ..plots import figure, legend, save, title

    fig = figure(9.0, 3.4)
    ax, sax = fig.subplots(1, 2)
    for arm, f in found.items():
        runs = _group(res, arm, BEST_LR[arm], T).runs.values()
        curves = [{h["step"]: h["loss"] for h in r.raw.get("history", [])} for r in runs]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        color = ARM_COLORS.get(arm, "tab:gray")
        if steps:
            ax.plot(steps, [statistics.mean(c[s] for c in curves) for s in steps], marker=".", color=color,
                    label=f"{arm} (lr {BEST_LR[arm]:g})")
        loss = stat(f["loss"].values())
        sax.errorbar([1000 * statistics.mean(f["step_s"].values())], [loss.mean],
                     yerr=[0 if math.isnan(loss.std) else loss.std], marker="o", capsize=3, color=color, label=arm)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation loss (nats per character)")
    title(ax, f"T = {T}: validation loss during training (mean over seeds)")
    sax.set_xscale("log")
    sax.set_xlabel("ms per training step (log scale)")
    sax.set_ylabel("final validation loss")
    title(sax, f"T = {T}: loss against cost")
    for axis in (ax, sax):
        axis.tick_params(labelsize=8)
        legend(axis)
    save(fig, path)
