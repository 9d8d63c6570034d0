"""The naive definition against closed forms, and every attention path against the naive definition."""

import itertools
import math

import pytest
import torch
from conftest import symmetric_couplings, symmetric_three_body

from boltzmann_attention import BoltzmannAttention, boltzmann_attention
from boltzmann_attention.naive import naive_boltzmann_attention


def _qkv(B=2, H=2, L=5, S=5, E=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, E, dtype=torch.float64, generator=g),
            torch.randn(B, H, S, E, dtype=torch.float64, generator=g),
            torch.randn(B, H, S, 3, dtype=torch.float64, generator=g))


# --- the definition against closed forms -------------------------------------------------------------------

def test_zero_couplings_give_sigmoid_attention():
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(1)) > 0.4
    for couplings in (None, torch.zeros(2, 5, 5, dtype=torch.float64)):
        out, w = naive_boltzmann_attention(q, k, v, couplings, attn_mask=mask, bias=-0.3)
        expected = torch.sigmoid(2 * (q @ k.mT / 2.0 - 0.3)) * mask
        torch.testing.assert_close(w, expected, atol=1e-14, rtol=0)
        torch.testing.assert_close(out, expected @ v, atol=1e-14, rtol=0)


def test_two_spins_closed_form():
    """One query, two keys with fields (h, 0) coupled by J: <s_2> = tanh(J) tanh(h), <s_1> = tanh(h)."""
    h, J = 0.8, 0.5
    q = torch.zeros(1, 1, 1, 1, dtype=torch.float64)
    k = torch.zeros(1, 1, 2, 1, dtype=torch.float64)
    v = torch.eye(2, dtype=torch.float64).view(1, 1, 2, 2)
    couplings = torch.tensor([[[0.0, J], [J, 0.0]]], dtype=torch.float64)
    bias = torch.tensor([h, 0.0], dtype=torch.float64)
    out, w = naive_boltzmann_attention(q, k, v, couplings, bias=bias)
    expected = torch.tensor([math.tanh(h), math.tanh(J) * math.tanh(h)], dtype=torch.float64)
    torch.testing.assert_close(w[0, 0, 0], (expected + 1) / 2, atol=1e-15, rtol=0)
    torch.testing.assert_close(out[0, 0, 0], (expected + 1) / 2, atol=1e-15, rtol=0)


def test_three_body_closed_form():
    """Three keys, one K and a field h on key 1: p(s) ~ exp(h s1 + K s1 s2 s3). Summing s2, s3 out leaves
    4 cosh K for either s1, so <s_1> = tanh(h); summing s1 and s3 out leaves a function of s2 s3's two
    values that does not depend on s2, so <s_2> = <s_3> = 0."""
    K = torch.zeros(1, 3, 3, 3, dtype=torch.float64)
    for j, k_, l_ in itertools.permutations(range(3)):
        K[0, j, k_, l_] = 0.7
    q = torch.zeros(1, 1, 1, 1, dtype=torch.float64)
    k = torch.zeros(1, 1, 3, 1, dtype=torch.float64)
    v = torch.zeros(1, 1, 3, 1, dtype=torch.float64)
    _, w = naive_boltzmann_attention(q, k, v, None, K, bias=torch.tensor([0.4, 0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(w[0, 0, 0], (torch.tensor([math.tanh(0.4), 0.0, 0.0], dtype=torch.float64) + 1) / 2,
                               atol=1e-15, rtol=0)


def test_absent_keys_are_removed():
    """A masked key has weight 0 and does not act on the others: the same as deleting it."""
    q, k, v = _qkv(B=1, H=1, L=1, S=4)
    J = symmetric_couplings(4, 1)
    mask = torch.tensor([True, False, True, True])
    out, w = naive_boltzmann_attention(q, k, v, J, attn_mask=mask)
    keep = mask.nonzero().flatten()
    out_small, w_small = naive_boltzmann_attention(q, k[:, :, keep], v[:, :, keep], J[:, keep][:, :, keep])
    assert w[..., 1].item() == 0
    torch.testing.assert_close(w[..., keep], w_small, atol=1e-15, rtol=0)
    torch.testing.assert_close(out, out_small, atol=1e-15, rtol=0)


def test_window_as_wide_as_the_sequence_is_the_full_model_for_the_last_query():
    """With W >= L, query i couples keys j, k by J[i - j, i - k]: for the last query one full matrix."""
    L = 5
    q, k, v = _qkv(L=L, S=L)
    Jw = symmetric_couplings(L, 2)
    flip = torch.arange(L - 1, -1, -1)
    J_full = Jw[:, flip][:, :, flip]  # J_full[j, k] = Jw[L-1-j, L-1-k]
    _, w_window = naive_boltzmann_attention(q, k, v, Jw, is_causal=True, coupling_window=L)
    _, w_full = naive_boltzmann_attention(q, k, v, J_full, is_causal=True)
    torch.testing.assert_close(w_window[..., -1, :], w_full[..., -1, :], atol=1e-14, rtol=0)


def test_window_of_one_key_is_sigmoid_attention():
    q, k, v = _qkv()
    _, w = naive_boltzmann_attention(q, k, v, torch.zeros(2, 1, 1, dtype=torch.float64), is_causal=True,
                                     coupling_window=1)
    torch.testing.assert_close(w, torch.sigmoid(2 * q @ k.mT / 2.0).tril(), atol=1e-15, rtol=0)


# --- the functional form and the module against the definition ---------------------------------------------

MODES = ["h", "J", "h+J", "h+K", "h+J+K"]


def _padding(B, S, seed=3):
    mask = torch.rand(B, 1, 1, S, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask[..., 0] = True
    return mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("masking", ["none", "causal", "padding", "causal+padding"])
def test_functional_matches_naive(mode, masking):
    B, H, L = 2, 2, 5
    q, k, v = _qkv(B, H, L, L)
    if mode == "J":
        q_naive = torch.zeros_like(q)
    else:
        q_naive = q
    J = symmetric_couplings(L, H, scale=0.7) if "J" in mode else None
    K = symmetric_three_body(L, H, scale=0.4) if "K" in mode else None
    causal = "causal" in masking
    mask = _padding(B, L) if "padding" in masking else None
    bias = torch.tensor([-0.3, 0.2], dtype=torch.float64).view(H, 1, 1)
    out, w = boltzmann_attention(q, k, v, couplings=J, three_body=K, mode=mode, is_causal=causal, attn_mask=mask,
                                 bias=bias, return_weights=True)
    out_ref, w_ref = naive_boltzmann_attention(q_naive, k, v, J, K, is_causal=causal, attn_mask=mask, bias=bias)
    torch.testing.assert_close(w, w_ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, out_ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("padding", [False, True])
def test_functional_window_matches_naive(padding):
    B, H, L, W = 2, 2, 7, 3
    q, k, v = _qkv(B, H, L, L)
    Jw = symmetric_couplings(W, H, scale=0.8)
    mask = _padding(B, L) if padding else None
    out, w = boltzmann_attention(q, k, v, couplings=Jw, coupling_window=W, is_causal=True, attn_mask=mask,
                                 bias=-0.2, return_weights=True)
    out_ref, w_ref = naive_boltzmann_attention(q, k, v, Jw, is_causal=True, attn_mask=mask, bias=-0.2,
                                               coupling_window=W)
    torch.testing.assert_close(w, w_ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, out_ref, atol=1e-12, rtol=0)


def _layer_reference(layer: BoltzmannAttention, x, key_padding_mask):
    """The layer's output from its own projections and couplings, with the naive definition in between."""
    B, L, D = x.shape
    H = layer.num_heads

    def heads(t):
        return t.view(B, L, H, D // H).transpose(1, 2)

    v = heads(layer.value(x))
    q, k = (heads(layer.query(x)), heads(layer.key(x))) if layer.query is not None else \
        (x.new_zeros(B, H, L, 1), x.new_zeros(B, H, L, 1))
    J = layer.couplings(L) if layer.couplings is not None else None
    K = layer.three_body(L) if layer.three_body is not None else None
    mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
    out, w = naive_boltzmann_attention(q, k, v, J, K, is_causal=layer.causal, attn_mask=mask,
                                       bias=layer.field_bias.view(-1, 1, 1), coupling_window=layer.coupling_window)
    return layer.out(out.transpose(1, 2).reshape(B, L, D)), w


@pytest.mark.parametrize("mode,options", [
    ("h", {}), ("J", {}), ("h+J", {}), ("h+K", {}), ("h+J+K", {}),
    ("h+J", {"coupling": "relative", "coupling_range": 2}),
    ("h+J", {"coupling": "relative", "coupling_range": 2, "method": "banded"}),
    ("h+J", {"coupling": "window", "coupling_window": 3}),
    ("h+J", {"coupling": "window", "coupling_window": 3, "coupling_window_relative": True}),
    ("J", {"coupling": "window", "coupling_window": 2}),
])
@pytest.mark.parametrize("causal", [False, True])
def test_module_matches_naive(mode, options, causal):
    if options.get("coupling") == "window" and not causal:
        pytest.skip("the coupled window is causal")
    torch.manual_seed(0)
    L = 6
    init = {"coupling_init_std": 0.5} if mode != "h" else {}  # mode h has no couplings (and refuses the option)
    layer = BoltzmannAttention(8, 2, max_len=L, mode=mode, causal=causal, **init, **options).double()
    x = torch.randn(2, L, 8, dtype=torch.float64)
    padding = torch.zeros(2, L, dtype=torch.bool)
    padding[1, 2] = padding[1, 4] = True
    for key_padding_mask in (None, padding):
        out, w = layer(x, key_padding_mask=key_padding_mask, need_weights=True)
        out_ref, w_ref = _layer_reference(layer, x, key_padding_mask)
        torch.testing.assert_close(w, w_ref, atol=1e-12, rtol=0)
        torch.testing.assert_close(out, out_ref, atol=1e-12, rtol=0)


# --- the definition's masks and heads, SDPA's conventions ------------------------------------------------------

@pytest.mark.parametrize("window", [None, 2])
def test_bottom_right_causal_rows_are_the_last_rows_of_the_causal_definition(window):
    """causal_lower_right(L, S): query row r is position S - L + r, so the L queries get the last L rows of the
    full causal definition (the window's slots counted from that position)."""
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = _qkv(L=5, S=5)
    J = symmetric_couplings(5 if window is None else window, 2)
    full_out, full_w = naive_boltzmann_attention(q, k, v, J, is_causal=True, coupling_window=window)
    out, w = naive_boltzmann_attention(q[:, :, 3:], k, v, J, attn_mask=causal_lower_right(2, 5),
                                       coupling_window=window)
    torch.testing.assert_close(w, full_w[:, :, 3:], atol=0, rtol=0)
    torch.testing.assert_close(out, full_out[:, :, 3:], atol=0, rtol=0)


def test_float_mask_and_grouped_heads_of_the_definition():
    """A float mask: -inf is a bool mask's False (absent), a finite entry a bias; enable_gqa is keys and values
    repeated per group of query heads."""
    q, k, v = _qkv(H=4, L=4, S=5)
    J = symmetric_couplings(5, 4)
    mask = torch.randn(2, 1, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    present = mask > -0.5
    mask = mask.masked_fill(~present, -math.inf)
    _, w = naive_boltzmann_attention(q, k, v, J, attn_mask=mask)
    _, expected = naive_boltzmann_attention(q, k, v, J, attn_mask=present, bias=mask.masked_fill(~present, 0.0))
    torch.testing.assert_close(w, expected, atol=0, rtol=0)
    assert (w[~present.expand_as(w)] == 0).all()
    out, w = naive_boltzmann_attention(q, k[:, :2], v[:, :2], J, enable_gqa=True)
    expected_out, expected = naive_boltzmann_attention(q, k[:, :2].repeat_interleave(2, 1),
                                                       v[:, :2].repeat_interleave(2, 1), J)
    torch.testing.assert_close(w, expected, atol=0, rtol=0)
    torch.testing.assert_close(out, expected_out, atol=0, rtol=0)
