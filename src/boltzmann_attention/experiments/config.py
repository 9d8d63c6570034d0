"""The configuration of one run: typed, nested dataclasses, saved resolved with every checkpoint and result.

    TrainConfig            seed, steps, batch_size
      .data    DataConfig        the task and its data: task, T, eval_windows, the bracket task's difficulty
      .arch    ArchConfig        the Transformer around the attention: widths, depth, init, position scheme
      .attention AttentionConfig  the attention layer's options, passed as they are to BoltzmannAttention
      .optim   OptimConfig       AdamW and its schedule
      .measure MeasureConfig     what is measured besides training: evaluation interval, memory probe

Every field has a name that is unique across the sections, its *flat name* (``lr``, ``mode``, ``T``). Grids,
``--set FIELD=VALUE``, the CLI's flags and the result tables address fields by it; :meth:`TrainConfig.flat`
and :meth:`TrainConfig.from_flat` convert. Each field carries its help text (``metadata["help"]``), from
which the CLI builds its flags, so an option is defined once: here and, for the attention, in its record
(:mod:`boltzmann_attention.options`), from which ``AttentionConfig`` is generated.

Results written before the nesting hold the flat dict; :meth:`TrainConfig.from_flat` reads them, filling the
fields that did not exist yet with the values those runs used (``LEGACY``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import asdict, dataclass, field, fields, make_dataclass

import torch

from .. import ising, modes
from ..attention import BoltzmannAttention
from ..options import OPTIONS, unused
from ..validation import LAYER_MODES, check_length
from . import blocks, tasks

TASKS = tuple(tasks.REGISTRY)  # the tasks known when the config module loads (the CLI's choices)
POSITIONS = ("learned", "rope", "alibi", "none")
LAYER_POSITION = {"learned": None, "rope": "rope", "alibi": "alibi", "none": None}  # the layer's option
INITS = ("torch", "gpt2")
MAX_SEED = 2**53
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def option(default, help: str, **metadata):
    """A dataclass field with its help text (and optional 'choices')."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help, **metadata})
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class DataConfig:
    task: str = option("shakespeare", f"the task (blocks needs T >= {blocks.length()} at its default sizes, and in the "
                                      "Boltzmann modes coupling window or relative: full couplings are exact up to 24 "
                                      "keys)", choices=TASKS)
    T: int = option(8, "context length: the number of keys (spins) per query (blocks: at least blocks.length(N, L, "
                       f"blocks, answer), {blocks.length()} at its defaults)")
    eval_windows: int = option(2048, "Shakespeare: number of fixed validation windows")
    num_fillers: int = option(8, "brackets: number of filler symbols")
    train_sequences: int = option(20000, "brackets: size of the fixed training set (validation and test: 2000 each)")
    min_fill: float = option(0.0, "brackets: smallest word, as the fraction p / (T // 2) of its pairs p (at least "
                                  "one pair); the filler density is 1 - 2p / T")
    max_fill: float = option(1.0, "brackets: largest word, as the fraction p / (T // 2) of its pairs p")
    open_probability: float = option(0.5, "brackets: probability that the word opens a bracket where it may "
                                          "(higher: deeper nesting)")
    deduplicate: bool = option(False, "brackets: redraw validation and test sequences that occur in the training set")
    block_size: int = option(5, "blocks: letters per block (N)")
    query_size: int = option(2, "blocks: query letters (L), all in one block only")
    num_blocks: int = option(10, "blocks: blocks per sequence (T must hold them: blocks.length(N, L, blocks, "
                                 "answer))")
    conjunction: bool = option(False, "blocks: every query letter is also in another block, so that only the letters "
                                      "together name the target (needs L >= 2 and 3 blocks)")
    answer: str = option("letters", "blocks: the answer after '=': the target block's letters, or its marker (one "
                                    "token; each block then starts with a random marker)", choices=blocks.ANSWERS)
    modulus: int = option(32, "match3: the residues' modulus M (is there a pair j < k < T with x_T + x_j + x_k = 0 "
                              "mod M?)")


@dataclass
class ArchConfig:
    d_model: int = option(64, "model width")
    n_heads: int = option(1, "attention heads")
    n_layers: int = option(1, "transformer blocks")
    d_ff: int = option(128, "FFN width; 0 removes the FFN")
    init: str = option("gpt2", "model initialisation: torch (PyTorch's defaults) or gpt2 (nanoGPT's N(0, 0.02))",
                       choices=INITS)
    position: str = option("learned", "position scheme: learned (absolute embeddings), rope or alibi (in every "
                                      "attention layer, no absolute embedding), none", choices=POSITIONS)


def attention_config(records: dict = OPTIONS) -> type:
    """The attention section's dataclass, generated from the layer's option records: BoltzmannAttention's keyword
    options by the same names, types, defaults, help and choices (the layer checks them, once); those the model
    sets (causality, the projections' biases, the position scheme) are not in it."""
    return make_dataclass("AttentionConfig", [
        (o.name, o.type, option(o.default_in_config, o.help, **({"choices": o.choices} if o.choices else {})))
        for o in records.values() if o.in_config])


AttentionConfig = attention_config()


@dataclass
class OptimConfig:
    lr: float = option(3e-3, "peak learning rate (AdamW)")
    warmup_steps: int = option(200, "linear warm-up steps, then cosine decay to min_lr_ratio * lr")
    min_lr_ratio: float = option(0.1, "final learning rate as a fraction of lr")
    weight_decay: float = option(0.1, "AdamW weight decay on weight matrices (never on J, K or the field bias)")
    grad_clip: float = option(1.0, "gradient-norm clipping threshold (inf: none)")
    beta2: float = option(0.95, "AdamW's second-moment decay")
    fused_optimizer: bool = option(True, "AdamW's fused kernel (false: the per-tensor loop)")
    coupling_lr_multiplier: float = option(1.0, "learning rate of J and K relative to lr")
    slot_bias_lr_multiplier: float = option(1.0, "learning rate of the slot bias (its pair table too) relative to lr")


@dataclass
class MeasureConfig:
    eval_interval: int = option(1000, "steps between validation evaluations")
    memory_probe_steps: int = option(0, "n > 0: before training, n training steps in a fresh process whose peak "
                                        "memory the result records (0: off)")


LEGACY_ARCH_SECTION = "model"  # the arch section's name in configs saved before it took ModelConfig's word
SECTIONS = {"data": DataConfig, "arch": ArchConfig, "attention": AttentionConfig, "optim": OptimConfig,
            "measure": MeasureConfig}


@dataclass
class TrainConfig:
    seed: int = option(0, "fixes the initialisation and the data order")
    steps: int = option(4000, "optimiser steps")
    batch_size: int = option(64, "sequences per step")
    data: DataConfig = field(default_factory=DataConfig)
    arch: ArchConfig = field(default_factory=ArchConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)

    def __post_init__(self):
        for name, kind in SECTIONS.items():
            section = getattr(self, name)
            if not isinstance(section, kind):
                raise ValueError(f"TrainConfig's section {name!r} must be an instance of {kind.__name__}, got "
                                 f"{type(section).__name__}; from plain values use TrainConfig.build(**flat fields) "
                                 "or TrainConfig.from_dict(saved)")

    def __setattr__(self, name: str, value) -> None:
        """Write access by flat name too (``cfg.lr = 0.5`` sets ``cfg.optim.lr``): a flat write that only set
        an attribute on the outer config would be ignored by training and by the saved config."""
        section = FLAT.get(name)
        if section is not None:
            setattr(getattr(self, section), name, value)
        elif name in FLAT or name in SECTIONS:
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __getattr__(self, name: str):
        """Read access by flat name (``cfg.lr`` is ``cfg.optim.lr``); called only where no attribute matched."""
        section = FLAT.get(name) if name != "__setstate__" else None
        if section is None:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        return getattr(getattr(self, section), name)

    def flat(self) -> dict:
        """{flat name: value} of every field."""
        return {name: getattr(owner, name) for name, owner in _owners(self).items()}

    @classmethod
    def build(cls, **flat) -> TrainConfig:
        """The config with these fields, by flat name; the others at their defaults."""
        return cls.from_flat(flat)

    @classmethod
    def from_flat(cls, values: dict, *, legacy: bool = False) -> TrainConfig:
        """The config with these flat fields, the others at their defaults (``legacy``: the values that
        results written before a field existed used). ValueError naming unknown fields."""
        unknown = sorted(set(values) - set(FLAT))
        if unknown:
            raise ValueError(f"unknown config fields: {unknown}")
        values = {**(LEGACY if legacy else {}), **values}
        sections = {name: kind(**{k: v for k, v in values.items() if FLAT[k] == name})
                    for name, kind in SECTIONS.items()}
        return cls(**{k: v for k, v in values.items() if FLAT[k] is None}, **sections)

    @classmethod
    def from_dict(cls, saved: dict) -> TrainConfig:
        """A config as saved in a result or checkpoint: nested (``dataclasses.asdict``; the arch section under its
        earlier name ``model`` too) or, from results written before the nesting, flat."""
        if not isinstance(saved, dict):
            raise ValueError(f"a saved config must be a dict, got {type(saved).__name__}")
        if isinstance(saved.get(LEGACY_ARCH_SECTION), dict) and "arch" not in saved:
            saved = {("arch" if k == LEGACY_ARCH_SECTION else k): v for k, v in saved.items()}
        if any(isinstance(saved.get(name), dict) for name in SECTIONS):
            flat = {k: v for k, v in saved.items() if k not in SECTIONS}
            for name in SECTIONS:
                section = saved.get(name, {})
                if not isinstance(section, dict):
                    raise ValueError(f"the saved config's section {name!r} must be a dict of its fields, got "
                                     f"{type(section).__name__}")
                both = {k for k in section if k in flat and flat[k] != section[k]}
                if both:
                    raise ValueError(f"the saved config holds {sorted(both)} both flat and in section {name!r}, "
                                     "with different values: keep one")
                flat.update(section)
            return _without_unused(cls.from_flat(flat))
        wrong = [name for name in SECTIONS if name in saved]
        if wrong:
            raise ValueError(f"the saved config's section {wrong[0]!r} must be a dict of its fields, got "
                             f"{type(saved[wrong[0]]).__name__}")
        return _without_unused(cls.from_flat(saved, legacy=True))

    def replace(self, **flat) -> TrainConfig:
        """A copy with these flat fields changed."""
        return TrainConfig.from_flat({**self.flat(), **flat})

    def validate(self) -> None:
        """Raise ValueError for anything that would fail or train wrongly later, before any training.

        Every field's type and range; the attention options by the layer itself (built on the meta device, so
        its rules and words apply and nothing is allocated); the limits of the marginal method at this T. Warns
        (UserWarning) when warm-up never ends (warmup_steps >= steps).
        """
        d, m, a, o = self.data, self.arch, self.attention, self.optim
        _choice("task", d.task, tuple(tasks.REGISTRY))
        _integer("T", d.T, 2)
        _integer("seed", self.seed, 0, MAX_SEED - 1)
        for owner, name, minimum in ((self, "steps", 1), (self, "batch_size", 1), (o, "warmup_steps", 0),
                                     (self.measure, "eval_interval", 1), (d, "eval_windows", 1), (m, "d_model", 1),
                                     (m, "n_heads", 1), (m, "n_layers", 1), (m, "d_ff", 0), (d, "num_fillers", 1),
                                     (d, "train_sequences", 1), (self.measure, "memory_probe_steps", 0)):
            _integer(name, getattr(owner, name), minimum)
        _number("lr", o.lr, above=0.0)
        _number("min_lr_ratio", o.min_lr_ratio, at_least=0.0, at_most=1.0)
        _number("weight_decay", o.weight_decay, at_least=0.0)
        _number("grad_clip", o.grad_clip, above=0.0, allow_inf=True)  # inf: no clipping
        _number("coupling_init_std", a.coupling_init_std, at_least=0.0)
        for name in ("coupling_lr_multiplier", "slot_bias_lr_multiplier"):
            _number(name, getattr(o, name), above=0.0)
        if a.field_bias_init is not None:
            _number("field_bias_init", a.field_bias_init)
        for owner, name in ((a, "learn_field_bias"), (o, "fused_optimizer"), (d, "deduplicate"),
                            (a, "coupling_window_relative")):
            if not isinstance(getattr(owner, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(owner, name)!r}")
        for name, value in (("lr", o.lr), ("lr * coupling_lr_multiplier", o.lr * o.coupling_lr_multiplier),
                            ("lr * slot_bias_lr_multiplier", o.lr * o.slot_bias_lr_multiplier)):
            if value > FLOAT32_MAX:
                raise ValueError(f"{name} = {value:g} overflows float32, the training precision")
        if o.lr * o.weight_decay >= 1.0:
            raise ValueError(f"lr * weight_decay must be < 1 (AdamW scales the weights by 1 - lr * weight_decay "
                             f"every step), got {o.lr * o.weight_decay:g}")
        if m.d_model % m.n_heads:
            raise ValueError(f"d_model ({m.d_model}) must be divisible by n_heads ({m.n_heads})")
        _choice("init", m.init, INITS)
        _choice("position", m.position, POSITIONS)
        _choice("mode", a.mode, LAYER_MODES)
        _choice("method", a.method, sorted(ising.METHODS))
        _check_method_options(a.method, a.method_options, a.coupling)
        with torch.device("meta"):  # the layer checks its own options, with its own words, and allocates nothing
            BoltzmannAttention(m.d_model, m.n_heads, max_len=d.T, causal=True, position=LAYER_POSITION[m.position],
                               **asdict(a))
        if d.task == "blocks":
            self._check_blocks_length()
        self._check_limits()
        if o.slot_bias_lr_multiplier != 1.0 and a.slot_bias is None:
            raise ValueError(f"slot_bias_lr_multiplier = {o.slot_bias_lr_multiplier:g} scales the slot bias's "
                             "learning rate, and this model has none: set slot_bias = W or keep it at 1")
        record = modes.get(a.mode)
        if o.coupling_lr_multiplier != 1.0 and not (record.couplings or record.three_body):
            raise ValueError(f"coupling_lr_multiplier = {o.coupling_lr_multiplier:g} scales the learning rate of the "
                             f"couplings J and K, and mode {a.mode!r} has none: keep it at 1, or use a mode with "
                             "couplings (" + ", ".join(repr(n) for n, m in modes.RECORDS.items()
                                                        if m.couplings or m.three_body) + ")")
        for name in ("min_fill", "max_fill", "open_probability"):
            _number(name, getattr(d, name), at_least=0.0, at_most=1.0)
        for other in tasks.REGISTRY.values():  # a task's own options mean nothing to the others: refused
            changed = [n for n in other.options if getattr(d, n) != getattr(DataConfig, n)] if other.name != d.task \
                else []
            if changed:
                raise ValueError(f"{', '.join(changed)} {'is an option' if len(changed) == 1 else 'are options'} "
                                 f"of task {other.name!r} only; task {d.task!r} must keep the default")
        tasks.get(d.task).check(d)
        _number("beta2", o.beta2, at_least=0.0)
        if o.beta2 >= 1.0:
            raise ValueError(f"beta2 must lie in [0, 1), got {o.beta2}")
        if o.warmup_steps >= self.steps:
            warnings.warn(f"warmup_steps ({o.warmup_steps}) >= steps ({self.steps}): the learning rate never "
                          f"reaches lr and never decays", stacklevel=2)

    def _check_blocks_length(self) -> None:
        """Task 'blocks': ValueError naming the T its sequences need when T is shorter, and the attention options
        that T needs as well when the configured ones cannot take it (full couplings: 24 keys exactly)."""
        d = self.data
        blocks.check_options(None, d.block_size, d.query_size, d.num_blocks, d.conjunction, d.answer)
        needed = blocks.length(d.block_size, d.query_size, d.num_blocks, d.answer)
        if d.T >= needed:
            return
        then = ""
        try:
            self.replace(T=needed)._check_limits()
        except ValueError as e:
            then = (f"; at T = {needed} the attention needs other options too: {e} (the blocks study trains "
                    "coupling='window' with coupling_window=16, and coupling='relative' with coupling_range=4 and "
                    "method 'banded')")
        raise ValueError(f"task 'blocks' with {d.num_blocks} blocks of {d.block_size} letters and a query of "
                         f"{d.query_size} (answer {d.answer!r}) needs T >= {needed}, got T = {d.T}: set T = {needed} "
                         f"(fewer num_blocks need less){then}")

    def _check_limits(self) -> None:
        """The marginal method's size limits at this T (:func:`..validation.check_length`), for a mode whose
        couplings a method solves."""
        a = self.attention
        record = modes.get(a.mode)
        if record.marginals:
            check_length(a.method, self.data.T, a.coupling, a.coupling_range, a.method_options)


def _without_unused(cfg: TrainConfig) -> TrainConfig:
    """The saved config with the options its mode does not use at their defaults: results written before such
    options were refused hold them (softmax runs with a field-bias variant, say), and their training ignored
    them, so the defaults describe the same model."""
    a = cfg.attention
    if a.mode in modes.RECORDS:
        for name in unused(a.mode, **{f.name: getattr(a, f.name) for f in fields(a)}):
            setattr(a, name, OPTIONS[name].default_in_config)
    return cfg


def _choice(name: str, value, choices) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {tuple(choices)}")


def _integer(name: str, value, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum or (
            maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")


def _number(name: str, value, *, above: float | None = None, at_least: float | None = None,
            at_most: float | None = None, allow_inf: bool = False) -> None:
    """ValueError unless value is a real number, finite (or +inf if allowed) and within the bounds."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and not math.isnan(value)
    ok = ok and (math.isfinite(value) or (allow_inf and value == math.inf))
    ok = ok and (above is None or value > above) and (at_least is None or value >= at_least)
    ok = ok and (at_most is None or value <= at_most)
    if not ok:
        bounds = [f"> {above:g}" if above is not None else "", f">= {at_least:g}" if at_least is not None else "",
                  f"<= {at_most:g}" if at_most is not None else ""]
        bound = " and ".join(b for b in bounds if b)
        kind = "a number (inf allowed)" if allow_inf else "a finite number"
        raise ValueError(f"{name} must be {kind}{' ' + bound if bound else ''}, got {value!r}")


def _check_method_options(method: str, options, coupling: str = "full") -> None:
    """ValueError for options that are not a dict of names, or that the method's record refuses (an
    unknown name, or a value the method would refuse at its first call). The coupled window's own option
    ``window_path`` is the layer's to check (it is no option of a method's marginals)."""
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ValueError(f"method_options must be a dict of option names to values, got {options!r}")
    ising.validate_options(method, {k: v for k, v in options.items() if not (coupling == "window"
                                                                           and k == "window_path")})


def _owners(cfg: TrainConfig) -> dict:
    """{flat name: the dataclass instance holding it}."""
    owners = {f.name: cfg for f in fields(TrainConfig) if f.name not in SECTIONS}
    for name in SECTIONS:
        section = getattr(cfg, name)
        owners.update({f.name: section for f in fields(section)})
    return owners


# flat name -> its section (None: a field of TrainConfig itself)
FLAT: dict[str, str | None] = {f.name: None for f in fields(TrainConfig) if f.name not in SECTIONS}
for _section, _kind in SECTIONS.items():
    FLAT.update({f.name: _section for f in fields(_kind)})

# {flat name: the dataclasses.Field}, for help texts, choices and types
FIELDS = {f.name: f for f in fields(TrainConfig) if f.name not in SECTIONS}
for _kind in SECTIONS.values():
    FIELDS.update({f.name: f for f in fields(_kind)})

# The values that runs recorded before a field existed used (their result files lack it).
LEGACY = {"init": "torch", "beta2": 0.95, "fused_optimizer": False, "train_sequences": 20000, "min_fill": 0.0,
          "max_fill": 1.0, "open_probability": 0.5, "deduplicate": False, "coupling_range": None,
          "coupling_window": None, "coupling_window_relative": False, "memory_probe_steps": 0}

__all__ = ["TrainConfig", "DataConfig", "ArchConfig", "AttentionConfig", "OptimConfig", "MeasureConfig", "FLAT",
           "FIELDS", "LEGACY", "SECTIONS", "POSITIONS"]
