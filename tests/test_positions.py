"""Position priors and the recency attentions against float64 loops written from their papers' formulas."""

import math

import pytest
import torch

from boltzmann_attention.positions import SlotBias, alibi_bias, alibi_slopes, distances, rotary
from boltzmann_attention.recency import forgetting_attention, stickbreaking_attention

D = torch.float64


def test_rotary_is_a_complex_rotation_and_scores_depend_on_distance_only():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=g, dtype=D)
    positions = torch.tensor([0.0, 1.0, 3.0, 7.0, 30.0], dtype=D)
    y = rotary(x, positions)
    # independent form: pair (c, c + 4) as the complex number x_c + i x_{c+4}, times exp(i p 10000^(-2c/8))
    z = torch.complex(x[..., :4], x[..., 4:])
    angle = positions[:, None] * 10000.0 ** (-2 * torch.arange(4, dtype=D) / 8)
    w = z * torch.polar(torch.ones_like(angle), angle)
    assert torch.allclose(y, torch.cat([w.real, w.imag], dim=-1), atol=1e-12)
    q, k = torch.randn(2, 8, generator=g, dtype=D)
    score = [rotary(q[None], torch.tensor([p + 4.0], dtype=D)) @ rotary(k[None], torch.tensor([p], dtype=D)).T
             for p in (0.0, 5.0, 100.0)]
    assert torch.allclose(score[0], score[1], atol=1e-12) and torch.allclose(score[0], score[2], atol=1e-10)


@pytest.mark.parametrize("H, expected", [
    (8, [2.0 ** -h for h in range(1, 9)]),
    (4, [2.0 ** (-2 * h) for h in range(1, 5)]),
    (6, [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]),  # Press et al.'s interleaving
    (1, [2.0 ** -8]),
])
def test_alibi_slopes(H, expected):
    assert torch.allclose(alibi_slopes(H), torch.tensor(expected, dtype=D), rtol=0, atol=1e-15)


def test_alibi_and_slot_bias_by_loops():
    L, S, W = 3, 7, 4
    slopes = alibi_slopes(2)
    bias = alibi_bias(slopes, L, S)
    module = SlotBias(2, W).double()
    with torch.no_grad():
        module.weight.copy_(torch.arange(1.0, 9.0, dtype=D).view(2, W))
    slot = module(L, S)
    for r in range(L):
        i = S - L + r
        for j in range(S):
            assert distances(L, S)[r, j] == i - j
            for h in range(2):
                assert bias[h, r, j] == -slopes[h] * abs(i - j)
                assert slot[h, r, j] == (module.weight[h, i - j] if 0 <= i - j < W else 0.0)


def _naive_fox(q, k, v, log_f, scale):
    B, H, L, _ = q.shape
    S = k.shape[-2]
    out = torch.zeros(B, H, L, v.shape[-1], dtype=D)
    for b in range(B):
        for h in range(H):
            for r in range(L):
                i = S - L + r
                logits = torch.stack([q[b, h, r] @ k[b, h, j] * scale + log_f[b, h, j + 1:i + 1].sum()
                                      for j in range(i + 1)])
                out[b, h, r] = torch.softmax(logits, 0) @ v[b, h, :i + 1]
    return out


def _naive_stickbreaking(q, k, v, scale, attend_current):
    B, H, L, _ = q.shape
    S = k.shape[-2]
    out = torch.zeros(B, H, L, v.shape[-1], dtype=D)
    for b in range(B):
        for h in range(H):
            for r in range(L):
                last = S - L + r if attend_current else S - L + r - 1  # the nearest key that takes part
                beta = torch.sigmoid(q[b, h, r] @ k[b, h].T * scale)
                for j in range(last + 1):
                    a = beta[j] * math.prod(1 - beta[m] for m in range(j + 1, last + 1))
                    out[b, h, r] += a * v[b, h, j]
    return out


def _inputs(L, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, e, generator=g, dtype=D) for n, e in ((L, 4), (S, 4), (S, 3)))
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 2, S, generator=g, dtype=D) + 1)
    return q, k, v, log_f


@pytest.mark.parametrize("L, S", [(5, 5), (2, 6), (1, 4)])
def test_forgetting_attention_against_loops(L, S):
    q, k, v, log_f = _inputs(L, S)
    assert torch.allclose(forgetting_attention(q, k, v, log_f), _naive_fox(q, k, v, log_f, 0.5), atol=1e-12)


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("L, S", [(5, 5), (2, 6), (1, 4)])
def test_stickbreaking_attention_against_loops(L, S, attend_current):
    q, k, v, _ = _inputs(L, S)
    out = stickbreaking_attention(q, k, v, attend_current=attend_current)
    assert torch.allclose(out, _naive_stickbreaking(q, k, v, 0.5, attend_current), atol=1e-12)


def test_stickbreaking_weights_are_a_partial_stick():
    q, k, v, _ = _inputs(6, 6)
    _, a = stickbreaking_attention(q * 3, k, v, return_weights=True)
    total = a.sum(-1)
    assert (a >= 0).all() and (total <= 1 + 1e-12).all()
    assert (total[..., 0] == 0).all()  # the first query sees no key


def test_gradients_of_the_recency_attentions():
    q, k, v, log_f = (x.requires_grad_() for x in _inputs(3, 4))
    assert torch.autograd.gradcheck(lambda *a: forgetting_attention(*a), (q, k, v, log_f))
    assert torch.autograd.gradcheck(lambda *a: stickbreaking_attention(*a), (q, k, v))


def test_decoding_rows_equal_the_full_computation():
    q, k, v, log_f = _inputs(6, 6, seed=3)
    for fn, extra in ((forgetting_attention, (log_f,)), (stickbreaking_attention, ())):
        full = fn(q, k, v, *extra)
        for t in range(1, 7):  # the query at position t - 1 against the cache of its first t keys
            row = fn(q[..., t - 1:t, :], k[..., :t, :], v[..., :t, :], *(x[..., :t] for x in extra))
            assert torch.allclose(row, full[..., t - 1:t, :], atol=1e-12)


def test_half_precision_is_computed_in_float32():
    q, k, v, log_f = _inputs(5, 5)
    for fn, extra in ((forgetting_attention, (log_f,)), (stickbreaking_attention, ())):
        low = fn(*(x.bfloat16() for x in (q, k, v)), *(x.bfloat16() for x in extra))
        assert low.dtype == torch.bfloat16
        assert torch.allclose(low.double(), fn(q, k, v, *extra), atol=0.05)
