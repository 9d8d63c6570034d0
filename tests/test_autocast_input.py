"""Under autocast the layer takes what a Linear gives it (SDPA's and nn.MultiheadAttention's convention): a
bf16 or fp16 input, in every mode, with a result close to the float32 forward and gradients that flow."""

import pytest
import torch

from boltzmann_attention import BoltzmannAttention

CASES = {
    "softmax": dict(mode="softmax"), "h": dict(mode="h"), "h+J": dict(mode="h+J", coupling_init_std=0.1),
    "J": dict(mode="J", coupling_init_std=0.1), "h+K": dict(mode="h+K", coupling_init_std=0.1),
    "h+J+K": dict(mode="h+J+K", coupling_init_std=0.1), "fox": dict(mode="fox"),
    "stickbreaking": dict(mode="stickbreaking"), "mta": dict(mode="mta"),
    "window": dict(mode="h+J", coupling="window", coupling_window=4, coupling_init_std=0.1),
    "relative banded": dict(mode="h+J", coupling="relative", coupling_range=3, method="banded", coupling_init_std=0.1),
    "h rope slot bias": dict(mode="h", position="rope", slot_bias=4),
    "softmax alibi": dict(mode="softmax", position="alibi"),
}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 3e-3}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_linear_output_under_autocast_is_taken(name, dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 16)
    layer = BoltzmannAttention(16, 2, max_len=8, **CASES[name])
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 8, 16)
    expected = layer(linear(x))[0]
    with torch.autocast("cpu", dtype=dtype):
        y = linear(x)
        out, weights = layer(y, need_weights=True)
        mha_out = mha(y, y, y)[0]
    assert y.dtype == dtype and out.dtype == mha_out.dtype == dtype and weights.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=0)
    out.float().square().sum().backward()
    grads = [p.grad for p in layer.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and linear.weight.grad is not None


def test_a_narrower_input_without_autocast_is_refused_by_name():
    layer = BoltzmannAttention(16, 2, max_len=8)
    with pytest.raises(ValueError, match=r"x must be a tensor of the layer's dtype torch.float32, got Tensor "
                                         r"torch.bfloat16"):
        layer(torch.randn(2, 8, 16, dtype=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(
            ValueError, match=r"or, under autocast, torch.bfloat16, got Tensor torch.float16"):
        layer(torch.randn(2, 8, 16, dtype=torch.float16))
