"""The paper's model: a small pre-LayerNorm Transformer whose attention is any mode of Boltzmann attention.

    tokens (B, T) -> token + learned position embeddings (B, T, d_model)
                  -> n_layers x [x + Attention(LN(x)); x + FFN(LN(x))]   (FFN optional: d_ff = 0 drops it)
                  -> LN -> head

Heads:
- ``lm``: next-token logits (B, T, vocab).
- ``position``: for bracket matching, a linear map from the representation of position i to one score per
  position j of the window, (B, T, T), with j >= i masked to -inf (an opening bracket comes before its
  closing one). A closing bracket's target is the position of its opening bracket, so a cross-entropy over j
  is the loss. The head sees only x_i, so whatever it knows about where the match is must have been gathered
  by the attention layer: a bilinear (pointer) head would be a second attention layer and can solve the task
  on its own, even with input-independent attention (mode J reached 100% at T = 16 that way). Row 0 has no
  earlier position; its scores are all -inf except j = 0 (it never carries a label).

Defaults are the paper's: 1 layer, 1 head, d_model 64, d_ff 128.

Initialisation (``init``):
- ``gpt2`` (the default): nanoGPT's / GPT-2's scheme: every Linear and Embedding weight N(0, 0.02^2), zero biases, and
  the residual output projections (attention output, the FFN's second layer) N(0, (0.02 / sqrt(2 n_layers))^2).
  LayerNorms stay at (1, 0); couplings and field biases keep their own initialisation. It gives softmax a
  3.5-4.1% lower validation perplexity than ``torch`` on Shakespeare at T = 8 and 12 (report/baselines).
- ``torch``: PyTorch's module defaults (nn.Embedding N(0, 1), nn.Linear uniform(+-1/sqrt(fan_in))): the
  package's recipe before December 2026, that of the committed full, fair and sampling studies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import BoltzmannAttention


@dataclass
class ModelConfig:
    vocab_size: int
    max_len: int                      # the window T
    mode: str = "h+J"                 # softmax | h | J | h+J | h+K | h+J+K
    method: str = "exact"             # how marginals are computed (boltzmann_attention.ising)
    d_model: int = 64
    n_heads: int = 1
    n_layers: int = 1
    d_ff: int = 128                   # 0: no FFN (the paper's attention-only ablation)
    head: str = "lm"                  # lm | position
    coupling: str = "full"            # full | relative | window
    coupling_range: int | None = None  # relative: J = 0 beyond this distance (None: max_len - 1)
    coupling_window: int | None = None  # window: the W coupled keys of each query (coupling 'window' only)
    coupling_window_relative: bool = False  # window: J_ab = f(|a - b|) instead of a free (W, W) matrix
    coupling_init_std: float = 0.0
    field_bias_init: float | None = None  # None: -log(max_len) / 2
    learn_field_bias: bool = True
    method_options: dict = field(default_factory=dict)
    init: str = "gpt2"                # gpt2 | torch (see the module docstring)


INITS = ("torch", "gpt2")


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        self.attn = BoltzmannAttention(
            cfg.d_model, cfg.n_heads, max_len=cfg.max_len, mode=cfg.mode, method=cfg.method, causal=True,
            coupling=cfg.coupling, coupling_range=cfg.coupling_range, coupling_window=cfg.coupling_window,
            coupling_window_relative=cfg.coupling_window_relative, coupling_init_std=cfg.coupling_init_std,
            field_bias_init=cfg.field_bias_init, learn_field_bias=cfg.learn_field_bias,
            method_options=cfg.method_options)
        self.ffn = None
        if cfg.d_ff > 0:
            self.ln_ffn = nn.LayerNorm(cfg.d_model)
            self.ffn = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_attn(x))[0]
        if self.ffn is not None:
            x = x + self.ffn(self.ln_ffn(x))
        return x


class Model(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.head not in ("lm", "position"):
            raise ValueError(f"unknown head {cfg.head!r}; choose 'lm' or 'position'")
        if cfg.init not in INITS:
            raise ValueError(f"unknown init {cfg.init!r}; choose one of {INITS}")
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embedding = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_out = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size if cfg.head == "lm" else cfg.max_len)
        if cfg.init == "gpt2":
            self._init_gpt2()

    def _init_gpt2(self) -> None:
        """nanoGPT's initialisation (model.py of karpathy/nanoGPT): N(0, 0.02^2) weights, zero biases,
        N(0, (0.02 / sqrt(2 n_layers))^2) on the projections that write into the residual stream."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.out.weight, mean=0.0, std=residual_std)
            if block.ffn is not None:
                nn.init.normal_(block.ffn[-1].weight, mean=0.0, std=residual_std)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, T) -> logits (B, T, vocab) for 'lm', or position scores (B, T, T)."""
        B, T = tokens.shape
        if T > self.cfg.max_len:
            raise ValueError(f"sequence length {T} exceeds the model's max_len {self.cfg.max_len}")
        x = self.token_embedding(tokens) + self.position_embedding(torch.arange(T, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        out = self.head(self.ln_out(x))
        if self.cfg.head == "lm":
            return out
        scores = out[..., :T]
        earlier = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
        earlier[0, 0] = True  # keep row 0 finite; it never has a label
        return scores.masked_fill(~earlier, float("-inf"))


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over labelled positions (targets == -100 are ignored). outputs (B, T, C)."""
    return F.cross_entropy(outputs.flatten(0, 1), targets.flatten(), ignore_index=-100)
