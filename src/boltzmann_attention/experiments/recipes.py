"""Training recipes that several studies share: nanoGPT's configuration and its reference loss, the strong
recipe (the initialisation and each mode's learning rate the baselines study chose), the settings of J's
sensitivity, and the sampler settings of training through samplers.

No study imported: a study reuses a recipe by importing it from here. ``CHOSEN_INIT`` and ``BEST_LR`` are
the baselines study's decisions, read from its ``decisions.json`` (data, not code), so they are written once;
nanoGPT's values are from its ``config/train_shakespeare_char.py`` with the README's CPU overrides.
"""

from __future__ import annotations

import json
from pathlib import Path


def _decisions(study: str) -> dict:
    """The decisions a study recorded (its folder's decisions.json), as data."""
    return json.loads((Path(__file__).parent / "studies" / study / "decisions.json").read_text())


# nanoGPT's CPU configuration for Tiny Shakespeare (characters), as TrainConfig overrides, at window NANOGPT_T.
NANOGPT = {"batch_size": 12, "steps": 2000, "lr": 1e-3, "warmup_steps": 100, "min_lr_ratio": 0.1, "beta2": 0.99,
           "weight_decay": 0.1, "grad_clip": 1.0, "eval_interval": 250, "d_model": 128, "n_heads": 4,
           "n_layers": 4, "d_ff": 512, "init": "gpt2", "fused_optimizer": False}
NANOGPT_T = 64
NANOGPT_LOSS = 1.88  # nanoGPT's README: "validation loss of about 1.88" for this configuration

# The strong recipe: the initialisation and each mode's best learning rate (Shakespeare, T = 8 and 12) that
# the baselines study chose.
CHOSEN_INIT: str = _decisions("baselines")["CHOSEN_INIT"]
BEST_LR: dict[str, float] = dict(_decisions("baselines")["BEST_LR"])  # mode -> lr

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
