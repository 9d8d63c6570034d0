"""The paper's model: a small pre-LayerNorm Transformer whose attention is any mode of Boltzmann attention.

    tokens (B, T) -> token (+ learned position) embeddings (B, T, d_model)
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

Defaults are the paper's: 1 layer, 1 head, d_model 64, d_ff 128, learned absolute position embeddings.

Position (``arch.position``): ``learned`` adds a learned embedding of each absolute position to the tokens;
``rope`` and ``alibi`` leave the tokens alone and give every attention layer the relative scheme
(:mod:`boltzmann_attention.positions`); ``none`` has no position information besides the causal mask (the
learned-recency modes 'fox' and 'stickbreaking' are meant to run so).

Initialisation (``init``):
- ``gpt2`` (the default): nanoGPT's / GPT-2's scheme: every Linear and Embedding weight N(0, 0.02^2), zero biases, and
  the residual output projections (attention output, the FFN's second layer) N(0, (0.02 / sqrt(2 n_layers))^2).
  LayerNorms stay at (1, 0); couplings, field and slot biases keep their own initialisation (zero couplings
  and slot biases, -log(T) / 2 field bias); FoX's forget gate is a Linear like the others, as in its authors'
  code. It gives softmax a lower validation perplexity than ``torch`` on Shakespeare (report/baselines).
- ``torch``: PyTorch's module defaults (nn.Embedding N(0, 1), nn.Linear uniform(+-1/sqrt(fan_in))): the
  recipe of the committed full, fair and sampling studies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import BoltzmannAttention
from .config import INITS, LAYER_POSITION, POSITIONS, ArchConfig, AttentionConfig


@dataclass
class ModelConfig:
    """Everything the model needs: the vocabulary, the context length T, the architecture, the attention's options."""

    vocab_size: int
    max_len: int                      # the context length T
    arch: ArchConfig = field(default_factory=ArchConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    head: str = "lm"                  # lm | position

    @classmethod
    def build(cls, vocab_size: int, max_len: int, head: str = "lm", **options) -> ModelConfig:
        """A config from flat options: ArchConfig's fields go to ``arch``, the others to ``attention``."""
        arch = {f.name for f in fields(ArchConfig)}
        return cls(vocab_size, max_len, ArchConfig(**{k: v for k, v in options.items() if k in arch}),
                   AttentionConfig(**{k: v for k, v in options.items() if k not in arch}), head)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_model = cfg.arch.d_model
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = BoltzmannAttention(d_model, cfg.arch.n_heads, max_len=cfg.max_len, causal=True,
                                       position=LAYER_POSITION[cfg.arch.position], **asdict(cfg.attention))
        self.ffn = None
        if cfg.arch.d_ff > 0:
            self.ln_ffn = nn.LayerNorm(d_model)
            self.ffn = nn.Sequential(nn.Linear(d_model, cfg.arch.d_ff), nn.GELU(), nn.Linear(cfg.arch.d_ff, d_model))

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
        if cfg.arch.init not in INITS:
            raise ValueError(f"unknown init {cfg.arch.init!r}; choose one of {INITS}")
        if cfg.arch.position not in POSITIONS:
            raise ValueError(f"unknown position {cfg.arch.position!r}; choose one of {POSITIONS}")
        self.cfg = cfg
        d_model = cfg.arch.d_model
        self.token_embedding = nn.Embedding(cfg.vocab_size, d_model)
        self.position_embedding = nn.Embedding(cfg.max_len, d_model) if cfg.arch.position == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.arch.n_layers))
        self.ln_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, cfg.vocab_size if cfg.head == "lm" else cfg.max_len)
        if cfg.arch.init == "gpt2":
            self._init_gpt2()

    def _init_gpt2(self) -> None:
        """nanoGPT's initialisation (model.py of karpathy/nanoGPT): N(0, 0.02^2) weights, zero biases,
        N(0, (0.02 / sqrt(2 n_layers))^2) on the projections that write into the residual stream."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.arch.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.out.weight, mean=0.0, std=residual_std)
            if block.ffn is not None:
                nn.init.normal_(block.ffn[-1].weight, mean=0.0, std=residual_std)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, T) -> logits (B, T, vocab) for 'lm', or position scores (B, T, T)."""
        B, T = tokens.shape
        if T > self.cfg.max_len:
            raise ValueError(f"sequence length {T} exceeds the model's max_len {self.cfg.max_len}")
        x = self.token_embedding(tokens)
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(T, device=tokens.device))
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
