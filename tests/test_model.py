"""The paper's model: initialisation schemes."""

import math

import pytest
import torch

from boltzmann_attention.experiments.model import Model, ModelConfig


def _model(init: str, n_layers: int = 3, mode: str = "h+J") -> Model:
    torch.manual_seed(0)
    return Model(ModelConfig.build(vocab_size=65, max_len=64, mode=mode, d_model=128, n_heads=4, n_layers=n_layers,
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


# --- the coupled window in the model ----------------------------------------------------------------------

def _pair(reference: dict, **window) -> tuple[Model, Model]:
    """A model with the coupled window and a reference model (``reference``: its ModelConfig options), both
    with the same weights apart from the couplings; 2 layers, 2 heads, T = 6."""
    common = dict(vocab_size=11, max_len=6, d_model=8, n_heads=2, n_layers=2, d_ff=16, init="torch")  # O(1) weights
    torch.manual_seed(0)
    windowed = Model(ModelConfig.build(**common, mode="h+J", coupling="window", **window))
    ref = Model(ModelConfig.build(**common, **reference))
    state = {k: v for k, v in windowed.state_dict().items() if "couplings" not in k}
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and all("couplings" in k for k in missing)
    for layer in windowed.blocks:
        assert layer.attn.couplings.weight.shape[1:] == (
            (window["coupling_window"] - 1,) if window.get("coupling_window_relative") else
            (window["coupling_window"],) * 2)
    return windowed, ref


@pytest.mark.parametrize("W", [6, 9])
def test_a_window_covering_the_sequence_is_the_full_coupling_model(W):
    """W >= T with slot couplings J_ab = f(|a - b|): every query sees J_jk = f(|j - k|) over all its keys,
    which is coupling 'full' with that J (mapped from slots to positions)."""
    windowed, full = _pair({"mode": "h+J", "coupling": "full"}, coupling_window=W, coupling_window_relative=True)
    tokens = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for wl, fl in zip(windowed.blocks, full.blocks):
            f = 0.4 * torch.randn(2, W - 1)  # f(1) .. f(W - 1) per head
            wl.attn.couplings.weight.copy_(f)
            distance = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).abs()
            fl.attn.couplings.weight.copy_(torch.cat([torch.zeros(2, 1), f], 1)[:, distance])
        expected = full(tokens)
        torch.testing.assert_close(windowed(tokens), expected, atol=1e-5, rtol=1e-5)
        windowed.blocks[0].attn.couplings.weight[0, 0] += 0.5  # and the couplings do act
        assert (windowed(tokens) - expected).abs().max() > 1e-3


def test_a_window_with_zero_couplings_is_mode_h():
    windowed, h = _pair({"mode": "h"}, coupling_window=3)
    tokens = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(windowed(tokens), h(tokens), atol=1e-5, rtol=1e-5)
