"""Multi-token attention's key-query convolution against its definition by loops in float64, gradcheck, the
identity kernel against softmax attention, causality and decoding with a cache."""

import pytest
import torch
import torch.nn.functional as F

from boltzmann_attention import BoltzmannAttention, parameter_groups
from boltzmann_attention.mta import multi_token_attention

D = torch.float64


def _naive_mta(q, k, v, kernel, scale, prior=None):
    """z'_ij = sum_a sum_t theta[a, t] z(i - a, j + t - c), z(i', j') = scale q_i'.k_j' where 0 <= j' <= i' and
    query i' exists (it is one of the given rows), else 0; softmax over j <= i, row by row."""
    B, H, L, _ = q.shape
    S = k.shape[-2]
    cq, ck = kernel.shape[-2:]
    c = (ck - 1) // 2
    first = S - L  # the position of the first given query

    def z(b, h, i, j):
        if i < first or j < 0 or j > i:
            return torch.zeros((), dtype=D)
        return q[b, h, i - first] @ k[b, h, j] * scale

    out = torch.zeros(B, H, L, v.shape[-1], dtype=D)
    for b in range(B):
        for h in range(H):
            for r in range(L):
                i = first + r
                logits = torch.stack([sum(kernel[h, a, t] * z(b, h, i - a, j + t - c)
                                          for a in range(cq) for t in range(ck))
                                      + (0.0 if prior is None else prior[h, r, j]) for j in range(i + 1)])
                out[b, h, r] = torch.softmax(logits, 0) @ v[b, h, :i + 1]
    return out


def _inputs(L, S, kernel_shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, e, generator=g, dtype=D) for n, e in ((L, 4), (S, 4), (S, 3)))
    return q, k, v, torch.randn(2, *kernel_shape, generator=g, dtype=D)


@pytest.mark.parametrize("kernel_shape", [(2, 9), (3, 4), (1, 1), (2, 2)])
@pytest.mark.parametrize("L, S", [(6, 6), (2, 6), (1, 4)])
def test_against_the_definition_by_loops(L, S, kernel_shape):
    q, k, v, kernel = _inputs(L, S, kernel_shape)
    prior = torch.randn(2, L, S, dtype=D, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(multi_token_attention(q, k, v, kernel, bias=prior),
                               _naive_mta(q, k, v, kernel, 0.5, prior), atol=1e-12, rtol=0)


def test_gradients():
    q, k, v, kernel = (x.requires_grad_() for x in _inputs(4, 5, (2, 3)))
    assert torch.autograd.gradcheck(lambda *a: multi_token_attention(*a), (q, k, v, kernel))


def test_the_identity_kernel_is_causal_softmax_attention():
    q, k, v, _ = _inputs(6, 6, (2, 9))
    kernel = torch.zeros(2, 2, 9, dtype=D)
    kernel[:, 0, 4] = 1
    out, weights = multi_token_attention(q, k, v, kernel, return_weights=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-12, rtol=0)
    assert (weights.triu(1) == 0).all()


def test_no_row_reads_a_later_key_or_query():
    q, k, v, kernel = _inputs(6, 6, (3, 9))
    base = multi_token_attention(q, k, v, kernel)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[..., 4:, :] += 1.0
    k2[..., 4:, :] -= 1.0
    v2[..., 4:, :] *= 3.0
    changed = multi_token_attention(q2, k2, v2, kernel)
    torch.testing.assert_close(changed[..., :4, :], base[..., :4, :], atol=0, rtol=0)
    assert not torch.allclose(changed[..., 4:, :], base[..., 4:, :])


def test_half_precision_is_computed_in_float32():
    q, k, v, kernel = _inputs(5, 5, (2, 9))
    low = multi_token_attention(*(x.bfloat16() for x in (q, k, v)), kernel)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), multi_token_attention(q, k, v, kernel), atol=0.05, rtol=0)


# ------------------------------------------------------------------------------------------------ the module

def _layer(seed=0, **options):
    torch.manual_seed(seed)
    layer = BoltzmannAttention(8, 2, max_len=8, mode="mta", **options).double()
    with torch.no_grad():
        layer.kernel.weight.normal_()
    return layer


def test_the_module_at_its_initial_kernel_is_softmax_attention():
    torch.manual_seed(0)
    mta = BoltzmannAttention(8, 2, max_len=8, mode="mta")
    softmax = BoltzmannAttention(8, 2, max_len=8, mode="softmax")
    softmax.load_state_dict({n: p for n, p in mta.state_dict().items() if not n.startswith("kernel.")})
    x = torch.randn(2, 8, 8)
    torch.testing.assert_close(mta(x)[0], softmax(x)[0])
    assert mta.kernel.weight.shape == (2, 2, 9)


@pytest.mark.parametrize("kernel", [(2, 9), (3, 3), (1, 5)])
@pytest.mark.parametrize("position", [None, "rope", "alibi"])
def test_decoding_with_a_cache_gives_the_full_forwards_rows(kernel, position):
    layer = _layer(mta_kernel_queries=kernel[0], mta_kernel_keys=kernel[1], position=position)
    x = torch.randn(2, 8, 8, dtype=D)
    full = layer(x)[0]
    for cuts in ([1] * 8, [3, 1, 4], [5, 3]):
        cache, rows, start = {}, [], 0
        for n in cuts:
            rows.append(layer(x[:, start:start + n], cache=cache)[0])
            start += n
        torch.testing.assert_close(torch.cat(rows, 1), full, atol=1e-12, rtol=0)
        assert cache["query"].shape[-2] == min(kernel[0] - 1, 8)


def test_the_kernel_learns_and_has_no_weight_decay():
    layer = _layer()
    layer(torch.randn(1, 8, 8, dtype=D))[0].square().sum().backward()
    assert layer.kernel.weight.grad.abs().sum() > 0
    no_decay = parameter_groups(layer, 0.1)[1]["params"]
    assert any(p is layer.kernel.weight for p in no_decay)


@pytest.mark.parametrize("options, word", [
    (dict(mta_kernel_queries=0), "mta_kernel_queries must be an integer >= 1"),
    (dict(mta_kernel_keys=2.5), "mta_kernel_keys must be an integer >= 1"),
    (dict(causal=False), "causal only"),
    (dict(coupling="relative"), "does not use coupling"),
])
def test_bad_options_are_refused(options, word):
    with pytest.raises(ValueError, match=word):
        BoltzmannAttention(8, 2, max_len=8, mode="mta", **options)


def test_other_modes_refuse_the_kernel_options():
    with pytest.raises(ValueError, match="does not use mta_kernel_keys"):
        BoltzmannAttention(8, 2, max_len=8, mode="softmax", mta_kernel_keys=3)


def test_a_padding_mask_is_refused():
    layer = _layer()
    with pytest.raises(ValueError, match="takes no key_padding_mask"):
        layer(torch.randn(1, 8, 8, dtype=D), key_padding_mask=torch.zeros(1, 8, dtype=torch.bool))
