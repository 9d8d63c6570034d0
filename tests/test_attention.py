"""The attention layer: SDPA conventions, closed forms, masks, gradients and module behaviour."""

import pytest
import torch
import torch.nn.functional as F
from conftest import symmetric_couplings, symmetric_three_body

from boltzmann_attention import (
    BoltzmannAttention,
    RelativeCouplings,
    ThreeBodyCouplings,
    boltzmann_attention,
    modes,
    parameter_groups,
)
from boltzmann_attention.ising import reference


def _qkv(B=2, H=3, L=6, S=6, E=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, E, dtype=dtype, generator=g), torch.randn(B, H, S, E, dtype=dtype, generator=g),
            torch.randn(B, H, S, 5, dtype=dtype, generator=g))


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_mode_is_sdpa(causal):
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 6, 6) > 0.3
    mask[..., 0] = True  # no fully masked row (SDPA gives NaN there)
    for attn_mask in (None, mask):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask & torch.ones(6, 6, dtype=torch.bool)
                                                  .tril() if causal and attn_mask is not None else attn_mask,
                                                  is_causal=causal and attn_mask is None)
        out = boltzmann_attention(q, k, v, mode="softmax", is_causal=causal, attn_mask=attn_mask)
        torch.testing.assert_close(out, expected)
        out, w = boltzmann_attention(q, k, v, mode="softmax", is_causal=causal, attn_mask=attn_mask,
                                     return_weights=True)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w[..., 0]))


@pytest.mark.parametrize("method", ["exact", "configurations", "banded", "meanfield", "tap"])
def test_zero_couplings_give_sigmoid_attention(method, device):
    q, k, v = _qkv()
    scale, bias = 0.3, -0.7
    h = q @ k.transpose(-1, -2) * scale + bias
    expected_w = torch.sigmoid(2 * h).tril()
    for mode in ("h", "h+J"):
        J = torch.zeros(3, 6, 6, dtype=torch.float64, device=device) if mode == "h+J" else None
        out, w = boltzmann_attention(q.to(device), k.to(device), v.to(device), couplings=J, mode=mode,
                                     method=method if J is not None else "exact", is_causal=True, scale=scale,
                                     bias=bias, return_weights=True)  # h: no method
        torch.testing.assert_close(w.cpu(), expected_w, atol=1e-12, rtol=0)
        torch.testing.assert_close(out.cpu(), expected_w @ v, atol=1e-12, rtol=0)


@pytest.mark.parametrize("mode,method", [("h+J+K", "exact"), ("h+J", "configurations")])
def test_weights_are_reference_marginals(mode, method, device):
    q, k, v = _qkv(L=4, S=7)
    J = symmetric_couplings(7, 3)
    K = symmetric_three_body(7, 3, scale=0.2) if "K" in mode else None
    mask = torch.rand(2, 1, 4, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    bias = torch.randn(3, 1, 1, dtype=torch.float64)
    out, w = boltzmann_attention(*(x.to(device) for x in (q, k, v)), couplings=J.to(device),
                                 three_body=None if K is None else K.to(device), mode=mode, method=method,
                                 attn_mask=mask.to(device), bias=bias.to(device), return_weights=True)
    h = q @ k.transpose(-1, -2) / 8**0.5 + bias
    m = reference.marginals(h, J[:, None], None if K is None else K[:, None], mask.expand(2, 3, 4, 7))
    expected = ((m + 1) / 2).masked_fill(~mask, 0)
    torch.testing.assert_close(w.cpu(), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.cpu(), expected @ v, atol=1e-12, rtol=0)


def test_J_mode_ignores_the_input():
    q, k, v = _qkv()
    J = symmetric_couplings(6, 3)
    bias = torch.randn(3, 1, 1, dtype=torch.float64)
    _, w1 = boltzmann_attention(q, k, v, couplings=J, mode="J", is_causal=True, bias=bias, return_weights=True)
    _, w2 = boltzmann_attention(q + 1, -k, v, couplings=J, mode="J", is_causal=True, bias=bias,
                                return_weights=True)
    assert w1.shape == (2, 3, 6, 6)
    torch.testing.assert_close(w1, w2)
    expected = (reference.marginals(bias.expand(3, 6, 6), J[:, None], None,
                                    torch.ones(6, 6, dtype=torch.bool).tril()) + 1) / 2
    torch.testing.assert_close(w1[0], expected.tril(), atol=1e-12, rtol=0)


def test_gradcheck_through_attention():
    q, k, v = (x.requires_grad_() for x in _qkv(B=1, H=2, L=4, S=4, E=3))
    W = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, W):
        J = W.triu(1) + W.triu(1).transpose(-1, -2)
        return boltzmann_attention(q, k, v, couplings=J, is_causal=True, bias=-0.3)

    assert torch.autograd.gradcheck(f, (q, k, v, W), fast_mode=True)


def test_functional_errors():
    q, k, v = _qkv()
    J = symmetric_couplings(6, 3)
    with pytest.raises(ValueError, match="unknown mode"):
        boltzmann_attention(q, k, v, mode="h+X")
    with pytest.raises(ValueError, match="needs `couplings`"):
        boltzmann_attention(q, k, v, mode="h+J")
    with pytest.raises(ValueError, match="does not use `couplings`"):
        boltzmann_attention(q, k, v, couplings=J, mode="h")
    with pytest.raises(ValueError, match=r"couplings must have shape \(H, 6, 6\)"):
        boltzmann_attention(q, k, v, couplings=J[:, :5, :5])
    with pytest.raises(ValueError, match="attn_mask must be a bool tensor .* or a float tensor"):
        boltzmann_attention(q, k, v, couplings=J, attn_mask=torch.zeros(6, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_mask must be a bool or float tensor or a CausalBias"):
        boltzmann_attention(q, k, v, couplings=J, attn_mask=[[True]])
    with pytest.raises(ValueError, match="4-D"):
        boltzmann_attention(q[0], k[0], v[0], couplings=J)
    with pytest.raises(ValueError, match="unknown method"):
        boltzmann_attention(q, k, v, couplings=J, method="magic")


@pytest.mark.parametrize("mode", ["softmax", "h", "J", "h+J", "h+K", "h+J+K"])
@pytest.mark.parametrize("method", ["exact", "banded", "meanfield", "tap", "window"])
def test_causal_parity(mode, method, device):
    """Changing future tokens leaves earlier outputs unchanged, for every mode and method (and for the
    coupled window, solved exactly)."""
    if "K" in mode and method not in ("exact", "window"):
        pytest.skip("three-body couplings need method='exact'")
    if method == "window" and mode not in ("J", "h+J"):
        pytest.skip("the coupled window needs pairwise couplings alone")
    if not modes.RECORDS[mode].marginals and method != "exact":
        pytest.skip("a mode without marginals has no method (the layer refuses one)")
    torch.manual_seed(0)
    coupling = {"banded": {"coupling": "relative", "coupling_range": 3},
                "window": {"coupling": "window", "coupling_window": 3}}.get(method, {})
    method = "exact" if method == "window" else method
    options = dict(method=method, coupling_init_std=0.3, **coupling) if modes.RECORDS[mode].marginals else {}
    layer = BoltzmannAttention(16, 2, max_len=9, mode=mode, **options).to(device)
    x = torch.randn(2, 9, 16).to(device)
    y = x.clone()
    y[:, 5:] = torch.randn(2, 4, 16).to(device)
    with torch.no_grad():
        a, _ = layer(x)
        b, _ = layer(y)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_key_padding_mask():
    torch.manual_seed(0)
    layer = BoltzmannAttention(8, 2, max_len=6, coupling_init_std=0.3, causal=False)
    x = torch.randn(2, 6, 8)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    out, w = layer(x, key_padding_mask=pad, need_weights=True)
    assert (w[1, :, :, 4:] == 0).all() and (w[0] > 0).all()
    y = x.clone()
    y[1, 4:] = 100.0  # padded tokens' values must not leak into real tokens' outputs
    out2, _ = layer(y, key_padding_mask=pad)
    torch.testing.assert_close(out[1, :4], out2[1, :4])
    with pytest.raises(ValueError, match="key_padding_mask"):
        layer(x, key_padding_mask=pad.float())


def test_module_defaults_and_errors():
    layer = BoltzmannAttention(8, 2, max_len=16)
    assert torch.equal(layer.couplings(16), torch.zeros(2, 16, 16))  # starts as sigmoid attention
    torch.testing.assert_close(layer.field_bias, torch.full((2,), -0.5 * torch.log(torch.tensor(16.0)).item()))
    with pytest.raises(ValueError, match="exceeds max_len"):
        layer(torch.randn(1, 17, 8))
    with pytest.raises(ValueError, match="divisible"):
        BoltzmannAttention(10, 3, max_len=4)
    with pytest.raises(ValueError, match="unknown mode"):
        BoltzmannAttention(8, 2, max_len=4, mode="K")
    with pytest.raises(ValueError, match="unknown method"):
        BoltzmannAttention(8, 2, max_len=4, method="sa")
    with pytest.raises(ValueError, match="unknown coupling"):
        BoltzmannAttention(8, 2, max_len=4, coupling="sparse")
    assert BoltzmannAttention(8, 2, max_len=4, mode="softmax").field_bias is None
    assert BoltzmannAttention(8, 2, max_len=4, mode="J").query is None


def test_no_weight_decay_on_couplings_and_field_bias():
    layer = BoltzmannAttention(8, 2, max_len=6, mode="h+J+K")
    decay, no_decay = parameter_groups(layer, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    no_decay_ids = {id(p) for p in no_decay["params"]}
    for p in (layer.couplings.weight, layer.three_body.weight, layer.field_bias):
        assert id(p) in no_decay_ids
    assert {id(p) for p in decay["params"]} == {id(m.weight) for m in (layer.query, layer.key, layer.value,
                                                                       layer.out)}


def test_relative_couplings_any_length():
    rel = RelativeCouplings(2, max_distance=3, init_std=1.0)
    for length in (2, 5, 40):
        J = rel(length)
        assert J.shape == (2, length, length)
        torch.testing.assert_close(J, J.transpose(-1, -2))
        d = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).abs()
        assert (J[:, d == 0] == 0).all() and (J[:, d > 3] == 0).all()
        for dist in range(1, min(4, length)):
            assert torch.equal(J[:, d == dist], rel.weight[:, dist - 1, None].expand(-1, int((d == dist).sum())))


def test_three_body_couplings_symmetric():
    K = ThreeBodyCouplings(2, 5, init_std=1.0)(4)
    for perm in [(0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)]:
        torch.testing.assert_close(K, K.permute(*perm))
    i = torch.arange(4)
    assert (K[:, i, i, :] == 0).all() and (K[:, :, i, i] == 0).all()


def test_banded_layer_trains_couplings_from_zero():
    """Relative couplings start at J = 0; the layer passes its coupling range as the band, so J gets gradients."""
    torch.manual_seed(0)
    layer = BoltzmannAttention(8, 1, max_len=6, method="banded", coupling="relative", coupling_range=2)
    exact = BoltzmannAttention(8, 1, max_len=6, method="exact", coupling="relative", coupling_range=2)
    exact.load_state_dict(layer.state_dict())
    x = torch.randn(3, 6, 8, dtype=torch.float32)
    for m in (layer, exact):
        m(x)[0].pow(2).sum().backward()
    assert layer.couplings.weight.grad.abs().min() > 0
    torch.testing.assert_close(layer.couplings.weight.grad, exact.couplings.weight.grad, atol=1e-5, rtol=1e-4)
