"""Co-attention or a recency prior? Profile ``priors`` and its report.

The real-size model (:data:`...recipes.NANOGPT`: 4 layers, 4 heads, d_model 128, nanoGPT's CPU recipe) with
the field's position priors and learned-recency attentions beside the coupled window, so that what the
couplings add beyond a position prior is measured: each arm is a mode and a position scheme (``ARMS``), and
the decisive pair is the coupled window with a learned per-slot bias against sigmoid attention with the same
slot bias and no couplings. The stages, their rules and costs are in ``protocol.md``; the decisions made from
runs in ``decisions.json`` (:class:`Decisions`). The real-size study's softmax, h and window16 runs count as
this study's arms of the same names (its archive, ``READS``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ... import lr_rule
from ...recipes import NANOGPT, NANOGPT_T
from ...report import ReportContext, archive_runs, header_section, lr_decision_notes, protocol_sections
from ...results import Results
from ...stats import millinats, paired, stat
from ...sweep import Grid, beyond
from ...tables import fmt_num, fmt_stat, md_table, table_with_holm


@dataclass(frozen=True)
class Arm:
    """One attention variant: its name, mode, method and config options (flat names)."""

    name: str
    mode: str
    options: tuple[tuple[str, object], ...] = ()
    method: str = "exact"

    @property
    def overrides(self) -> dict:
        return dict(self.options)

    @property
    def coupled(self) -> bool:
        return "J" in self.mode


def _window(W: int, *more) -> tuple:
    return (("coupling", "window"), ("coupling_window", W), *more)


ARMS = (  # this study's own arms
    Arm("softmax-rope", "softmax", (("position", "rope"),)),
    Arm("softmax-alibi", "softmax", (("position", "alibi"),)),
    Arm("softmax-slot16", "softmax", (("slot_bias", 16),)),
    Arm("fox", "fox", (("position", "none"),)),
    Arm("stickbreaking", "stickbreaking", (("position", "none"),)),
    Arm("h-alibi", "h", (("position", "alibi"),)),
    Arm("h-slot16", "h", (("slot_bias", 16),)),
    Arm("window16-slot16", "h+J", _window(16, ("slot_bias", 16))),
    Arm("window8-slot8", "h+J", _window(8, ("slot_bias", 8))),
)
REUSED = (Arm("softmax", "softmax"), Arm("h", "h"), Arm("window16", "h+J", _window(16)))  # the real-size runs
SOFTMAX_POSITIONS = {"softmax": "learned", "softmax-rope": "rope", "softmax-alibi": "alibi",
                     "softmax-slot16": "slot16"}
DECISIVE = ("window16-slot16", "h-slot16")  # (coupled, its uncoupled twin)

READS = ("realsize",)
PREFIX = "pr-"
REALSIZE_PREFIX = "rs-"
REALSIZE_LR = 3e-3  # the real-size study's decided lr of its softmax, h and window16 (its decisions.json)
SEEDS = (0, 1, 2)
LONG_SEEDS = (0, 1, 2, 3, 4)  # the decisive pair at T = 256
LR_SEEDS = (0,)
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
NANOGPT_LR = NANOGPT["lr"]
NEAR_TIE = 0.01      # nats: stage 1's tie (the real-size rule)
CHOICE_TIE = 0.005   # nats: stage 2's choices between arms (means over 3 seeds); ties go to the faster arm
MEMORY_PROBE_STEPS = 3
LONG_T = 256
LONG_BATCH = 12
LONG_STEPS = 2000
LONG_EVAL_WINDOWS = 512


@dataclass(frozen=True)
class Decisions:
    """The decisions made from runs (``decisions.json``; the measurements behind them: the report)."""

    extra_learning_rates: dict[str, tuple[float, ...]] = field(default_factory=dict)  # stage 1: arm -> lrs added
    diverged: dict[str, tuple[float, ...]] = field(default_factory=dict)   # stage 1: arm -> lrs that diverged
    best_lr: dict[str, float] = field(default_factory=dict)                # stage 1: arm -> lr
    softmax_position: str | None = None   # stage 2: the best of SOFTMAX_POSITIONS (None: not decided)
    best_uncoupled: str | None = None     # stage 2: the best arm without couplings
    best_coupled: str | None = None       # stage 2: the best arm with couplings
    long_lr: dict[str, float] = field(default_factory=dict)   # stage 3: the decisive pair's lr at T = 256
    equal_compute_steps: int | None = None  # stage 4: the best uncoupled arm's steps at the coupled arm's time


def window_at_softmax_position(d: Decisions) -> Arm | None:
    """The coupled window (W = 16) with the position scheme best for softmax (stage 2), once decided; None
    when that is the learned embedding or the slot bias, which window16 and window16-slot16 already are."""
    if d.softmax_position in (None, "learned", "slot16"):
        return None
    return Arm(f"window16-{d.softmax_position}", "h+J", _window(16, ("position", d.softmax_position)))


def own_arms(d: Decisions) -> tuple[Arm, ...]:
    extra = window_at_softmax_position(d)
    return ARMS + ((extra,) if extra else ())


def all_arms(d: Decisions) -> dict[str, Arm]:
    return {a.name: a for a in REUSED + own_arms(d)}


def variant(arm: str, lr: float, T: int = NANOGPT_T, steps: int | None = None) -> str:
    """``pr-<arm>-lr<lr>`` at T = 64; at T = 256 with stage 3's batch and steps (stage 4: its steps)."""
    if arm in {a.name for a in REUSED}:
        return f"{REALSIZE_PREFIX}{arm}-lr{lr:g}" + ("" if T == NANOGPT_T else f"-b{LONG_BATCH}-steps{LONG_STEPS}")
    long = "" if T == NANOGPT_T else f"-b{LONG_BATCH}-steps{steps or LONG_STEPS}"
    return f"{PREFIX}{arm}-lr{lr:g}{long}"


def overrides(arm: Arm, lr: float, T: int = NANOGPT_T, steps: int | None = None) -> dict:
    """The config fields of ``arm`` at ``lr`` and window T (besides task, T, mode, method, seed)."""
    long = {}
    if T != NANOGPT_T:
        n = steps or LONG_STEPS
        long = {"batch_size": LONG_BATCH, "steps": n, "eval_interval": max(1, n // 8),
                "eval_windows": LONG_EVAL_WINDOWS, "warmup_steps": round(NANOGPT["warmup_steps"] * n / LONG_STEPS)}
    return {**NANOGPT, **arm.overrides, "lr": lr, "memory_probe_steps": MEMORY_PROBE_STEPS, **long}


def _grid(arm: Arm, T: int, seed: int, lr: float, steps: int | None = None) -> Grid:
    return Grid(("shakespeare",), (T,), modes=(arm.mode,), methods=(arm.method,), seeds=(seed,),
                variant=variant(arm.name, lr, T, steps), overrides=overrides(arm, lr, T, steps))


def arm_learning_rates(arm: str, d: Decisions) -> tuple[float, ...]:
    return tuple(sorted(set(LEARNING_RATES) | set(d.extra_learning_rates.get(arm, ()))))


def long_arms(d: Decisions) -> tuple[str, ...]:
    """Stage 3's arms (each once): the decisive pair and window8-slot8, which need no choice of stage 2, and
    the best uncoupled arm and the best softmax variant once stage 2 has chosen them."""
    chosen = ()
    if d.best_uncoupled is not None and d.softmax_position is not None:
        softmax = next(a for a, p in SOFTMAX_POSITIONS.items() if p == d.softmax_position)
        chosen = (d.best_uncoupled, softmax)
    return tuple(dict.fromkeys((*DECISIVE, "window8-slot8", *chosen)))


def priors_grids(field_bias: str, d: Decisions) -> list[Grid]:
    """Every stage whose rule's inputs are decided (protocol.md). The field bias is the default one."""
    arms = all_arms(d)
    own = own_arms(d)
    grids = [_grid(a, NANOGPT_T, s, lr) for s in LR_SEEDS for a in own for lr in arm_learning_rates(a.name, d)]
    grids += [_grid(a, NANOGPT_T, s, d.best_lr[a.name]) for s in SEEDS for a in own if a.name in d.best_lr]
    for name in long_arms(d):
        if name in {a.name for a in REUSED}:
            continue  # the real-size study ran softmax and h at T = 256 (3 seeds)
        if name not in d.best_lr:
            continue  # its stage-1 lr is not decided yet
        lr = d.long_lr.get(name, d.best_lr.get(name, REALSIZE_LR))
        if name in DECISIVE:  # stage 3's lr check: seed 0 at the stage-1 lr and one step either side
            base = d.best_lr.get(name)
            if base is not None:
                grids += [_grid(arms[name], LONG_T, 0, x) for x in (beyond(base, up=False), base,
                                                                    beyond(base, up=True))]
            if name not in d.long_lr:
                continue
        seeds = LONG_SEEDS if name in DECISIVE else SEEDS
        grids += [_grid(arms[name], LONG_T, s, lr) for s in seeds]
    if d.equal_compute_steps is not None and d.best_uncoupled is not None:
        name = d.best_uncoupled
        lr = d.long_lr.get(name, d.best_lr.get(name, REALSIZE_LR))
        grids += [_grid(arms[name], LONG_T, s, lr, d.equal_compute_steps) for s in SEEDS]
    return grids


PROFILES = {"priors": priors_grids}
HELP = {"priors": "the coupled window against position priors (RoPE, ALiBi, slot bias) and learned recency "
                  "(FoX, stick-breaking), at equal steps and equal compute"}


# ---------------------------------------------------------------------------------------------------- report

def owns(res: Results) -> bool:
    """True when every run is of this study's variants."""
    return bool(res.all_runs) and all(r.variant.startswith(PREFIX) for r in res.all_runs)


def _with_reused(res: Results, context: ReportContext) -> Results:
    """This study's runs and the real-size study's runs of the reused arms."""
    names = {variant(a.name, REALSIZE_LR, T) for a in REUSED for T in (NANOGPT_T, LONG_T)}
    found = archive_runs(context.archives.get("realsize"), lambda r: r.variant in names)
    return Results(list(res.all_runs) + (list(found.all_runs) if found else []))


def per_seed(res: Results, arm: Arm, lr: float, T: int = NANOGPT_T, steps: int | None = None) -> dict:
    """Per seed: validation loss and seconds per step (wall time over configured steps, evaluations included)."""
    g = res.get("shakespeare", variant(arm.name, lr, T, steps), T, arm.mode, arm.method)
    if g is None:
        return {"loss": {}, "step_s": {}}
    return {"loss": g.values("loss"), "step_s": {s: r.wall_time_s / r.config["steps"] for s, r in g.runs.items()}}


def decide_learning_rates(res: Results, d: Decisions) -> dict[str, tuple[float | None, float | None]]:
    """Per own arm whose stage-1 runs are all there: (the rule's lr, the lr to add beyond the edge or None)."""
    arms = {a.name: a for a in own_arms(d)}

    def losses_of(arm: str, lr: float) -> dict[int, float] | None:
        seeds = {s: v for s, v in per_seed(res, arms[arm], lr)["loss"].items() if s in LR_SEEDS}
        return seeds if len(seeds) == len(LR_SEEDS) else None

    return lr_rule.decide(list(arms), lambda arm: arm_learning_rates(arm, d), losses_of, d.diverged, NEAR_TIE,
                          NANOGPT_LR)


def choose_arm(found: dict[str, dict]) -> str | None:
    """Stage 2's choice among arms ({arm: per_seed}), each with all of SEEDS: the lowest mean validation loss;
    arms within CHOICE_TIE nats of it are tied, and the one with the lowest mean step time wins."""
    complete = {a: f for a, f in found.items() if all(s in f["loss"] for s in SEEDS)}
    if not complete or len(complete) < len(found):
        return None
    mean = {a: statistics.mean(f["loss"].values()) for a, f in complete.items()}
    best = min(mean.values())
    tied = [a for a, m in mean.items() if m <= best + CHOICE_TIE + 1e-12]
    return min(tied, key=lambda a: statistics.mean(complete[a]["step_s"].values()))


def stage2(res: Results, d: Decisions) -> dict[str, dict]:
    """Every arm at its decided lr at T = 64 (the reused ones at the real-size lr), as per_seed."""
    lrs = {a.name: REALSIZE_LR for a in REUSED} | d.best_lr
    arms = all_arms(d)
    found = {name: per_seed(res, arms[name], lr) for name, lr in lrs.items() if name in arms}
    return {name: f for name, f in found.items() if f["loss"]}


def stage2_choices(found: dict[str, dict], d: Decisions) -> dict[str, str | None]:
    """The three choices of stage 2's rule from its runs (None until their arms are complete)."""
    arms = all_arms(d)
    pick = lambda names: choose_arm({n: found.get(n, {"loss": {}, "step_s": {}}) for n in names})  # noqa: E731
    softmax = pick(SOFTMAX_POSITIONS)
    return {"softmax_position": SOFTMAX_POSITIONS.get(softmax) if softmax else None,
            "best_uncoupled": pick([n for n, a in arms.items() if not a.coupled]),
            "best_coupled": pick([n for n, a in arms.items() if a.coupled])}


def report(res: Results, context: ReportContext) -> list[str]:
    """Header, protocol, stage 1's learning rates, stage 2's comparisons and choices."""
    d = context.decisions
    own = res
    res = _with_reused(res, context)
    lines = header_section(own, context.results_dir)
    lines += [protocol_sections(context.protocol)[""], ""]
    lines += learning_rate_section(res, d)
    lines += stage2_section(res, d)
    return lines


def learning_rate_section(res: Results, d: Decisions) -> list[str]:
    decided = decide_learning_rates(res, d)
    arms = {a.name: a for a in own_arms(d)}
    rows = lr_rule.table_rows(list(arms), lambda arm: arm_learning_rates(arm, d),
                              lambda arm, lr: per_seed(res, arms[arm], lr), decided, d.diverged, LR_SEEDS)
    if not rows:
        return []
    lines = ["## Stage 1: each arm's learning rate", "",
             f"T = {NANOGPT_T}, validation loss (nats per character) of seed 0; ms per step: wall time over steps, "
             "evaluations included. The rule of protocol.md; bold: its choice.", "",
             md_table(["arm", "lr", "validation loss", "ms per step"], rows), ""]
    notes = lr_decision_notes([a.name for a in own_arms(d)], decided, d.best_lr, "studies/priors/decisions.json")
    return lines + [notes, ""]


def stage2_section(res: Results, d: Decisions) -> list[str]:
    found = stage2(res, d)
    if not found:
        return []
    soft = found.get("softmax", {"loss": {}})["loss"]
    soft_step = statistics.mean(found["softmax"]["step_s"].values()) if "softmax" in found else None
    twin = {"window16-slot16": "h-slot16", "window8-slot8": "h-slot16", "window16": "h"}
    cells = []
    for name, f in found.items():
        step = statistics.mean(f["step_s"].values())
        ref = found.get(twin.get(name, ""), {"loss": {}})["loss"]
        cells.append([name, fmt_stat(stat(f["loss"].values()), digits=4),
                      paired(soft, f["loss"], millinats) if name != "softmax" and soft else None,
                      paired(ref, f["loss"], millinats) if name in twin and ref else None,
                      fmt_num(1000 * step, 0), fmt_num(step / soft_step, 1) if soft_step else ""])
    lines = [f"## Stage 2: T = {NANOGPT_T}, every arm at its lr", "",
             "Validation loss (nats per character), mean ± std over seeds (n); differences in millinats, paired "
             "over seeds, mean [95% interval], positive = lower loss than the reference; `*` p < 0.05, `**` also "
             "after Holm over the column. The twin: the same slots without couplings (window16-slot16 and "
             "window8-slot8 against h-slot16, window16 against h).", "",
             table_with_holm(["arm", "validation loss", "vs softmax, Δ mnats", "vs its uncoupled twin, Δ mnats",
                              "ms per step", "x softmax"], cells, {2: "softmax", 3: "twin"}), ""]
    choices = stage2_choices(found, d)
    lines += ["Stage 2's choices by its rule (protocol.md): "
              + "; ".join(f"{k.replace('_', ' ')}: {v or 'not decided (runs missing)'}" for k, v in choices.items())
              + ".", ""]
    return lines
