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


def _queries(q, k):
    """(b, h, r, i): every query row r of q (B, H, L, E) and its position i = S - L + r among S keys."""
    B, H, L, _ = q.shape
    return ((b, h, r, k.shape[-2] - L + r) for b in range(B) for h in range(H) for r in range(L))


def _naive_fox(q, k, v, log_f, scale, prior=None):
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=D)
    for b, h, r, i in _queries(q, k):
        logits = torch.stack([q[b, h, r] @ k[b, h, j] * scale + log_f[b, h, j + 1:i + 1].sum()
                              + (0.0 if prior is None else prior[h, r, j]) for j in range(i + 1)])
        out[b, h, r] = torch.softmax(logits, 0) @ v[b, h, :i + 1]
    return out


def _naive_stickbreaking(q, k, v, scale, attend_current, prior=None):
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=D)
    for b, h, r, i in _queries(q, k):
        last = i if attend_current else i - 1  # the nearest key that takes part
        beta = torch.sigmoid(q[b, h, r] @ k[b, h].T * scale + (0.0 if prior is None else prior[h, r]))
        for j in range(last + 1):
            out[b, h, r] += beta[j] * math.prod(1 - beta[m] for m in range(j + 1, last + 1)) * v[b, h, j]
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


# ------------------------------------------------------------------------------------ the module's options

from boltzmann_attention import BoltzmannAttention  # noqa: E402
from boltzmann_attention.mta import multi_token_attention  # noqa: E402
from boltzmann_attention.naive import naive_boltzmann_attention  # noqa: E402

LAYERS = {  # name: BoltzmannAttention options (besides the prior)
    "softmax": dict(mode="softmax"),
    "h": dict(mode="h"),
    "h+J": dict(mode="h+J", coupling_init_std=0.5),
    "window": dict(mode="h+J", coupling="window", coupling_window=3, coupling_init_std=0.5),
    "fox": dict(mode="fox"),
    "stickbreaking": dict(mode="stickbreaking"),
    "mta": dict(mode="mta"),
}
PRIORS = {"none": {}, "rope": dict(position="rope"), "alibi": dict(position="alibi"), "slot": dict(slot_bias=3),
          "alibi+slot": dict(position="alibi", slot_bias=2)}


def _layer(options, prior, seed=0):
    torch.manual_seed(seed)
    layer = BoltzmannAttention(8, 2, max_len=6, **options, **PRIORS[prior]).double()
    with torch.no_grad():
        for part in (layer.slot_bias, layer.kernel):
            if part is not None:
                part.weight.normal_()
    return layer


def _by_hand(layer, x):
    """The layer's output from its parts, with the position prior built by loops and the attention by the naive
    reference (Boltzmann modes), a plain softmax, or the recency functions."""
    B, L, _ = x.shape
    heads = lambda t: t.view(B, L, 2, 4).transpose(1, 2)  # noqa: E731
    v = heads(layer.value(x))
    q, k = heads(layer.query(x)), heads(layer.key(x))
    if layer.position == "rope":
        q, k = rotary(q, torch.arange(L, dtype=D)), rotary(k, torch.arange(L, dtype=D))
    prior = torch.zeros(2, L, L, dtype=D)
    for h in range(2):
        for i in range(L):
            for j in range(i + 1):
                if layer.position == "alibi":
                    prior[h, i, j] -= alibi_slopes(2)[h] * (i - j)
                if layer.slot_bias is not None and i - j < layer.slot_bias.window:
                    prior[h, i, j] += layer.slot_bias.weight[h, i - j]
    if layer.mode == "softmax":
        scores = q @ k.transpose(-1, -2) / 2 + prior
        scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
        out = torch.softmax(scores, -1) @ v
    elif layer.mode == "fox":
        out = _naive_fox(q, k, v, torch.nn.functional.logsigmoid(layer.forget_gate(x)).transpose(1, 2), 0.5,
                         prior)
    elif layer.mode == "stickbreaking":
        out = _naive_stickbreaking(q, k, v, 0.5, False, prior)
    elif layer.mode == "mta":  # tested against its definition by loops in test_mta
        out = multi_token_attention(q, k, v, layer.kernel.weight, bias=prior)
    else:
        J = layer.couplings(L) if layer.couplings is not None else None
        out = naive_boltzmann_attention(q, k, v, J, is_causal=True, bias=layer.field_bias.view(-1, 1, 1) + prior,
                                        coupling_window=layer.coupling_window)[0]
    return layer.out(out.transpose(1, 2).reshape(B, L, 8))


@pytest.mark.parametrize("prior", sorted(PRIORS))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_module_with_position_priors_against_the_parts(name, prior):
    layer = _layer(LAYERS[name], prior)
    x = torch.randn(2, 6, 8, dtype=D, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(layer(x)[0], _by_hand(layer, x), atol=1e-10)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_module_with_position_priors_is_causal_and_differentiable(name):
    layer = _layer(LAYERS[name], "alibi+slot")
    x = torch.randn(1, 6, 8, dtype=D, generator=torch.Generator().manual_seed(2))
    changed = x.clone()
    changed[:, 4:] += 1.0
    assert torch.equal(layer(x)[0][:, :4], layer(changed)[0][:, :4])
    parameters = [p for p in (layer.slot_bias.weight, layer.forget_gate.weight if layer.forget_gate else None)
                  if p is not None]
    assert torch.autograd.gradcheck(lambda xx, *ps: layer(xx)[0], (x.requires_grad_(), *parameters))


@pytest.mark.parametrize("options, message", [
    (dict(mode="fox", coupling="window", coupling_window=3), "mode 'fox' does not use coupling, coupling_window"),
    (dict(mode="stickbreaking", causal=False), "causal only"),
    (dict(mode="h", position="learned"), "unknown position 'learned'"),
    (dict(mode="J", position="rope"), "mode 'J'"),
    (dict(mode="h", slot_bias=0), "slot_bias must be an integer >= 1"),
    (dict(mode="h", slot_bias=2.0), "slot_bias must be an integer >= 1"),
    (dict(mode="magic"), "unknown mode 'magic'"),
])
def test_module_refuses_bad_prior_options_at_construction(options, message):
    with pytest.raises(ValueError, match=message):
        BoltzmannAttention(8, 2, max_len=6, **options)
    with pytest.raises(ValueError, match="head dimension 3 must be even"):
        BoltzmannAttention(6, 2, max_len=6, mode="h", position="rope")
