"""The configuration of one run: typed, nested dataclasses, saved resolved with every checkpoint and result.

    TrainConfig            seed, steps, batch_size
      .data    DataConfig        the task and its data: task, T, eval_windows, the bracket task's difficulty
      .model   ArchConfig        the Transformer around the attention: widths, depth, init, position scheme
      .attention AttentionConfig  the attention layer's options, passed as they are to BoltzmannAttention
      .optim   OptimConfig       AdamW and its schedule
      .measure MeasureConfig     what is measured besides training: evaluation interval, memory probe

Every field has a name that is unique across the sections, its *flat name* (``lr``, ``mode``, ``T``). Grids,
``--set FIELD=VALUE``, the CLI's flags and the result tables address fields by it; :meth:`TrainConfig.flat`
and :meth:`TrainConfig.from_flat` convert. Each field carries its help text (``metadata["help"]``), from
which the CLI builds its flags, so an option is defined once: here and, for the attention, in the layer.

Results written before the nesting hold the flat dict; :meth:`TrainConfig.from_flat` reads them, filling the
fields that did not exist yet with the values those runs used (``LEGACY``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def option(default, help: str, **metadata):
    """A dataclass field with its help text (and optional 'choices')."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help, **metadata})
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class DataConfig:
    task: str = option("shakespeare", "the task", choices=("shakespeare", "brackets"))
    T: int = option(8, "window length: the number of keys (spins) per query")
    eval_windows: int = option(2048, "Shakespeare: number of fixed validation windows")
    num_fillers: int = option(8, "brackets: number of filler symbols")
    train_sequences: int = option(20000, "brackets: size of the fixed training set (validation and test: 2000 each)")
    min_fill: float = option(0.0, "brackets: smallest word, as the fraction p / (T // 2) of its pairs p (at least "
                                  "one pair); the filler density is 1 - 2p / T")
    max_fill: float = option(1.0, "brackets: largest word, as the fraction p / (T // 2) of its pairs p")
    open_probability: float = option(0.5, "brackets: probability that the word opens a bracket where it may "
                                          "(higher: deeper nesting)")
    deduplicate: bool = option(False, "brackets: redraw validation and test sequences that occur in the training set")


@dataclass
class ArchConfig:
    d_model: int = option(64, "model width")
    n_heads: int = option(1, "attention heads")
    n_layers: int = option(1, "transformer blocks")
    d_ff: int = option(128, "FFN width; 0 removes the FFN")
    init: str = option("gpt2", "model initialisation: torch (PyTorch's defaults) or gpt2 (nanoGPT's N(0, 0.02))",
                       choices=("torch", "gpt2"))


@dataclass
class AttentionConfig:
    """BoltzmannAttention's keyword options, by the same names (the layer checks them, once)."""

    mode: str = option("h+J", "attention mode (softmax; h: sigmoid attention; J: couplings only; h+J: Boltzmann "
                              "attention; h+K, h+J+K: three-body couplings)")
    method: str = option("exact", "how the marginals are computed (see the README's methods table)")
    method_options: dict = option({}, "JSON object of options for the marginal method, e.g. '{\"bandwidth\": 4}'")
    coupling: str = option("full", "full: a free J for every pair of positions; relative: J = f(|j - k|); window: "
                                   "J between the last coupling_window keys of each query, by slot (any T)",
                           choices=("full", "relative", "window"))
    coupling_range: int | None = option(None, "relative: J = 0 beyond this distance (none: T - 1)")
    coupling_window: int | None = option(None, "window: the number W of coupled keys of each query")
    coupling_window_relative: bool = option(False, "window: J_ab = f(|a - b|) instead of a free (W, W) matrix")
    coupling_init_std: float = option(0.0, "standard deviation of J at initialisation (0: J starts at zero)")
    field_bias_init: float | None = option(None, "initial field bias per head (none: -log(T) / 2)")
    learn_field_bias: bool = option(True, "whether the field bias is learned")


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


@dataclass
class MeasureConfig:
    eval_interval: int = option(1000, "steps between validation evaluations")
    memory_probe_steps: int = option(0, "n > 0: before training, n training steps in a fresh process whose peak "
                                        "memory the result records (0: off)")


SECTIONS = {"data": DataConfig, "model": ArchConfig, "attention": AttentionConfig, "optim": OptimConfig,
            "measure": MeasureConfig}


@dataclass
class TrainConfig:
    seed: int = option(0, "fixes the initialisation and the data order")
    steps: int = option(4000, "optimiser steps")
    batch_size: int = option(64, "sequences per step")
    data: DataConfig = field(default_factory=DataConfig)
    model: ArchConfig = field(default_factory=ArchConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)

    def flat(self) -> dict:
        """{flat name: value} of every field."""
        return {name: getattr(owner, name) for name, owner in _owners(self).items()}

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
        """A config as saved in a result or checkpoint: nested (``dataclasses.asdict``) or, from results
        written before the nesting, flat."""
        if any(isinstance(saved.get(name), dict) for name in SECTIONS):
            flat = {k: v for k, v in saved.items() if k not in SECTIONS}
            for name in SECTIONS:
                flat.update(saved.get(name, {}))
            return cls.from_flat(flat)
        return cls.from_flat(saved, legacy=True)

    def replace(self, **flat) -> TrainConfig:
        """A copy with these flat fields changed."""
        return TrainConfig.from_flat({**self.flat(), **flat})


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
           "FIELDS", "LEGACY", "SECTIONS"]
