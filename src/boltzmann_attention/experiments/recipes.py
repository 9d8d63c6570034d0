"""Training recipes that several studies share: the field-bias variants (and the one the fair study chose),
nanoGPT's configuration and its reference loss, the strong recipe (the initialisation and each mode's learning
rate the baselines study chose), the settings of J's sensitivity, and the sampler settings of training through
samplers.

No study imported, and no study's folder read: a study reuses a recipe by importing it from here.
``DEFAULT_FIELD_BIAS``, ``CHOSEN_INIT`` and ``BEST_LR`` are what the fair and baselines studies decided; each study
owns its decision (its ``decisions.json``), and ``tests/test_fairness.py`` keeps the two equal. nanoGPT's values
are from its ``config/train_shakespeare_char.py`` with the README's CPU overrides.
"""

from __future__ import annotations

from dataclasses import replace

from .sweep import FieldBias, Grid

# The field bias b of modes h, J and h+J (one per head), by name. The weights are sigmoid(2h), so b is a logit
# bias of 2b: "learn-half-log-T" starts at sigmoid attention's recommended logit bias -log T (Ramapuram et al.,
# 2024). The paper's energy has no bias term, so "fixed-0" is the paper-faithful parametrisation.
FIELD_BIASES = {
    "fixed-0": FieldBias(learnable=False, coefficient=0.0),
    "learn-0": FieldBias(learnable=True, coefficient=0.0),
    "learn-half-log-T": FieldBias(learnable=True, coefficient=-0.5),
    "fixed-log-T": FieldBias(learnable=False, coefficient=-1.0),
}
DEFAULT_FIELD_BIAS = "learn-half-log-T"  # TrainConfig's default field bias: the fair study's CHOSEN_FIELD_BIAS
PAPER_FIELD_BIAS = "fixed-0"


def field_bias(name: str) -> FieldBias:
    """The field-bias variant ``name`` (a key of FIELD_BIASES); ValueError naming the choices otherwise."""
    if name not in FIELD_BIASES:
        raise ValueError(f"unknown field bias {name!r}; choose one of {sorted(FIELD_BIASES)}")
    return FIELD_BIASES[name]


def with_field_bias(grids: list[Grid], name: str) -> list[Grid]:
    """The grids with every mode that has a field bias at variant ``name``; unchanged for the default, which
    TrainConfig's defaults already are."""
    bias = field_bias(name)
    return grids if name == DEFAULT_FIELD_BIAS else [replace(g, field_bias=bias) for g in grids]


# nanoGPT's CPU configuration for Tiny Shakespeare (characters), as TrainConfig overrides, at context length NANOGPT_T.
NANOGPT = {"batch_size": 12, "steps": 2000, "lr": 1e-3, "warmup_steps": 100, "min_lr_ratio": 0.1, "beta2": 0.99,
           "weight_decay": 0.1, "grad_clip": 1.0, "eval_interval": 250, "d_model": 128, "n_heads": 4,
           "n_layers": 4, "d_ff": 512, "init": "gpt2", "fused_optimizer": False}
NANOGPT_T = 64
NANOGPT_LOSS = 1.88  # nanoGPT's README: "validation loss of about 1.88" for this configuration

# The strong recipe: the initialisation and each mode's best learning rate (Shakespeare, T = 8 and 12) that
# the baselines study chose.
CHOSEN_INIT = "gpt2"
BEST_LR: dict[str, float] = {"softmax": 3e-3, "h": 3e-3, "J": 1e-2, "h+J": 3e-3}  # mode -> lr

# The package's first recipe, which the committed full, fair and sampling studies ran with: PyTorch's default
# initialisation and the per-tensor AdamW. Their profiles keep it, so that they reproduce their reports.
FIRST_RECIPE = {"init": "torch", "fused_optimizer": False}

# The sensitivity of J: its learning-rate multipliers besides 1, and a small random initialisation N(0, std^2).
J_LR_MULTIPLIERS = (0.3, 3.0)
J_INIT_STD = 0.1

# Sampler settings of models trained through samplers: DQA at the paper's 200 Trotter steps and 5 ns (the
# defaults of ising.annealing) with its straight-through estimator; PT and Gibbs with few sweeps, since every
# training step samples afresh. Gibbs with nudged gradients is gradient-free in J.
TRAINING_SAMPLER_OPTIONS = {
    "dqa": {"num_samples": 100, "gradient": "ste"},
    "pt": {"num_samples": 64, "warmup": 16, "num_replicas": 4, "gradient": "covariance"},
    "gibbs": {"num_samples": 64, "warmup": 16, "gradient": "nudged"},
}
