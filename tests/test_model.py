"""The paper's model: initialisation schemes."""

import math

import pytest
import torch

from boltzmann_attention.experiments.model import Model, ModelConfig


def _model(init: str, n_layers: int = 3, mode: str = "h+J") -> Model:
    torch.manual_seed(0)
    return Model(ModelConfig(vocab_size=65, max_len=64, mode=mode, d_model=128, n_heads=4, n_layers=n_layers,
                             d_ff=512, init=init))


@pytest.mark.parametrize("mode", ["softmax", "h+J"])
def test_gpt2_init_matches_nanogpt(mode):
    """N(0, 0.02^2) weights, zero biases, 0.02 / sqrt(2 n_layers) on the residual projections; LayerNorm,
    couplings and field bias untouched."""
    model = _model("gpt2", mode=mode)
    residual_std = 0.02 / math.sqrt(2 * 3)
    residual = {id(b.attn.out.weight) for b in model.blocks} | {id(b.ffn[-1].weight) for b in model.blocks}
    for name, p in model.named_parameters():
        if "ln" in name:
            assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
        elif "couplings" in name:
            assert torch.all(p == 0), name
        elif "field_bias" in name:
            assert torch.allclose(p, torch.full_like(p, -0.5 * math.log(64))), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:
            expected = residual_std if id(p) in residual else 0.02
            assert abs(p.std().item() - expected) < 0.1 * expected, (name, p.std().item(), expected)
            assert abs(p.mean().item()) < 0.2 * expected, name


def test_torch_init_is_pytorch_default():
    """'torch' leaves the modules' defaults: embeddings N(0, 1), Linear biases nonzero."""
    model = _model("torch")
    assert abs(model.token_embedding.weight.std().item() - 1.0) < 0.05
    assert model.head.bias.abs().sum() > 0


def test_unknown_init_is_refused():
    with pytest.raises(ValueError, match="unknown init"):
        _model("xavier")
