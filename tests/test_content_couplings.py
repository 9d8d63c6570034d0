"""Couplings that depend on content (key- and query-conditioned, ``couplings.ContentCouplings``) and method
``chain`` (a J per query): against the brute-force definition in float64, gradcheck, cached decoding, the
one-step control's closed form, and the refusals."""

import math

import pytest
import torch

from boltzmann_attention import BoltzmannAttention, ising
from boltzmann_attention.couplings import ContentCouplings
from boltzmann_attention.naive import naive_boltzmann_attention
from boltzmann_attention.positions import rotary


def _banded_per_query(shape, n, w, scale=0.7, seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(*shape, n, n, generator=g, dtype=torch.float64) * scale
    d = (torch.arange(n)[:, None] - torch.arange(n)).abs()
    W = W * ((d > 0) & (d <= w))
    return (W + W.transpose(-1, -2)) / 2


_HOLES = torch.rand(2, 3, 4, 9, generator=torch.Generator().manual_seed(1)) > 0.3
_HOLES[0, 0, 0] = False  # a query with no spin at all
_HOLES[0, 0, 1] = torch.arange(9) == 8  # one whose only spin is the last
MASKS = {"none": None, "causal": torch.ones(4, 9, dtype=torch.bool).tril(5), "holes": _HOLES}


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("w", [1, 3])
@pytest.mark.parametrize("chunk_length", [None, 1, 4, 12], ids=lambda c: f"chunk{c}")
def test_chain_equals_the_reference_with_a_J_per_query(mask, w, chunk_length, device):
    # chunks of 1 (< w: the chunk's transfer keeps negligible entries), 4 (n = 9: a ragged last chunk), 12 (> n)
    h = torch.randn(2, 3, 4, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    J = _banded_per_query((2, 3, 4), 9, w)
    m = MASKS[mask]
    on = [None if x is None else x.to(device) for x in (h, J, m)]
    options = {"method": "chain", "bandwidth": w, "chunk_length": chunk_length}
    got = ising.marginals(on[0], on[1], mask=on[2], **options)
    want = ising.marginals(h, J, mask=m, method="reference")
    assert (got.cpu() - want).abs().max() < 1e-12
    got = ising.log_partition(on[0], on[1], mask=on[2], **options)
    want = ising.log_partition(h, J, mask=m, method="reference")
    assert (got.cpu() - want).abs().max() < 1e-12


def test_chunked_chain_in_float32_errs_no_more_than_twice_the_sequential_one():
    # strong fields and couplings, n = 40 (beyond the reference): the float64 sequential recursion is the truth
    g = torch.Generator().manual_seed(3)
    n, w = 40, 4
    h = torch.randn(64, n, dtype=torch.float64, generator=g) * 8
    J = _banded_per_query((64,), n, w, scale=3.0)
    mask = torch.rand(64, n, generator=g) > 0.2
    options = {"method": "chain", "bandwidth": w}
    want_m, want_z = (f(h, J, mask=mask, **options) for f in (ising.marginals, ising.log_partition))
    error = {}
    for c in (None, 1, 3, 8):
        m = ising.marginals(h.float(), J.float(), mask=mask, chunk_length=c, **options)
        z = ising.log_partition(h.float(), J.float(), mask=mask, chunk_length=c, **options)
        error[c] = ((m.double() - want_m).abs().max(), ((z.double() - want_z) / want_z).abs().max())
    for c in (1, 3, 8):
        assert error[c][0] <= 2 * error[None][0] + 1e-6 and error[c][1] <= 2 * error[None][1] + 1e-7, (c, error)


def test_chain_refuses_a_chunk_length_below_one_at_the_call_and_at_the_layer():
    h, J = torch.randn(5, dtype=torch.float64), _banded_per_query((), 5, 2)
    with pytest.raises(ValueError, match="chunk_length must be an integer >= 1"):
        ising.marginals(h, J, method="chain", bandwidth=2, chunk_length=0)
    with pytest.raises(ValueError, match="chunk_length must be an integer >= 1"):
        BoltzmannAttention(16, 2, max_len=8, coupling="keys", coupling_range=2, method="chain",
                           method_options={"chunk_length": 0})


@pytest.mark.parametrize("chunk_length", [None, 1, 4], ids=lambda c: f"chunk{c}")
def test_chain_gradcheck_in_h_and_J(chunk_length):
    n, w = 6, 2
    band = (torch.arange(n)[:, None] - torch.arange(n)).abs()
    upper = (band > 0) & (band <= w) & (torch.arange(n)[:, None] < torch.arange(n))
    h = torch.randn(2, 3, n, dtype=torch.float64, requires_grad=True)
    U = (torch.randn(2, 3, n, n, dtype=torch.float64) * 0.5 * upper).requires_grad_()
    mask = torch.tensor([True, True, False, True, True, True])

    def f(h, U):
        J = (U * upper) + (U * upper).transpose(-1, -2)
        return ising.marginals(h, J, mask=mask, method="chain", bandwidth=w, chunk_length=chunk_length)

    assert torch.autograd.gradcheck(f, (h, U))


def test_chain_refuses_couplings_beyond_its_bandwidth_and_an_inferred_one_when_trained():
    h = torch.randn(5, dtype=torch.float64)
    J = _banded_per_query((), 5, 3)
    with pytest.raises(ValueError, match="not banded with bandwidth 2"):
        ising.marginals(h, J, method="chain", bandwidth=2)
    with pytest.raises(ValueError, match="explicit `bandwidth`"):
        ising.marginals(h, J.requires_grad_(), method="chain")
    with pytest.raises(ValueError, match="max_bandwidth"):
        ising.marginals(h, J.detach(), method="chain", bandwidth=3, max_bandwidth=2)


@pytest.mark.parametrize("query_conditioned", [False, True])
def test_content_couplings_are_symmetric_banded_and_start_at_zero(query_conditioned):
    k, q = torch.randn(2, 3, 7, 8), torch.randn(2, 3, 5, 8)
    start = ContentCouplings(3, 8, 4, 2, query_conditioned)
    assert start(k, q).abs().max() == 0  # B starts at zero: the layer starts as sigmoid attention
    c = ContentCouplings(3, 8, 4, 2, query_conditioned, init_std=0.5)
    J = c(k, q)
    assert J.shape == (2, 3, 5 if query_conditioned else 1, 7, 7)
    assert torch.equal(J, J.transpose(-1, -2))
    d = (torch.arange(7)[:, None] - torch.arange(7)).abs()
    assert (J[..., (d == 0) | (d > 2)] == 0).all() and (J[..., (d > 0) & (d <= 2)] != 0).all()
    # the definition, by hand: key-conditioned (a_j.b_k + a_k.b_j) / (2 sqrt r); query-conditioned weighted by u_i
    a, b = (torch.einsum("bhse,her->bhsr", k, p) for p in (c.left, c.right))
    if query_conditioned:
        u = torch.einsum("bhle,her->bhlr", q, c.query_weight)
        want = torch.einsum("bhlr,bhjr,bhkr->bhljk", u, a, b)
    else:
        want = torch.einsum("bhjr,bhkr->bhjk", a, b)[:, :, None]
    want = (want + want.transpose(-1, -2)) / (2 * math.sqrt(4)) * ((d > 0) & (d <= 2))
    assert torch.allclose(J, want, atol=1e-6)


def _layer(coupling, mode="h+J", method="chain", position="rope", seed=0, **options):
    torch.manual_seed(seed)
    kw = {} if mode == "h+J-step" else {"method": method}
    return BoltzmannAttention(16, 2, max_len=12, mode=mode, coupling=coupling, coupling_range=3, coupling_rank=4,
                              coupling_init_std=0.5, position=position, **kw, **options).double()


def _heads(layer, x):
    B, L, _ = x.shape
    split = lambda t: t.view(B, L, 2, 8).transpose(1, 2)  # noqa: E731
    q, k, v = split(layer.query(x)), split(layer.key(x)), split(layer.value(x))
    return q, k, v


@pytest.mark.parametrize("coupling", ["keys", "query"])
@pytest.mark.parametrize("method", ["chain", "chain chunked", "banded", "exact"])
def test_the_layer_equals_the_definition_in_float64(coupling, method):
    chunked = method == "chain chunked"
    layer = _layer(coupling, method="chain" if chunked else method,
                   **({"method_options": {"chunk_length": 4}} if chunked else {}))
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    _, weights = layer(x, need_weights=True)
    q, k, v = _heads(layer, x)
    J = layer.couplings(k, q)  # from the keys and queries before the rotary embedding
    positions = torch.arange(9)
    _, want = naive_boltzmann_attention(rotary(q, positions), rotary(k, positions), v, J, is_causal=True,
                                        bias=layer.field_bias.view(-1, 1, 1))
    assert (weights - want).abs().max() < 1e-12


@pytest.mark.parametrize("coupling", ["keys", "query"])
def test_the_one_step_control_takes_the_same_content_couplings(coupling):
    layer = _layer(coupling, mode="h+J-step")
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    _, weights = layer(x, need_weights=True)
    q, k, v = _heads(layer, x)
    J = layer.couplings(k, q)
    positions = torch.arange(9)
    h = rotary(q, positions) @ rotary(k, positions).transpose(-1, -2) / math.sqrt(8) + layer.field_bias.view(-1, 1, 1)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    m0 = torch.tanh(h) * causal
    want = torch.sigmoid(2 * (h + torch.einsum("bhlk,bhlkj->bhlj", m0, J.expand(-1, -1, 9, -1, -1)))) * causal
    assert (weights - want).abs().max() < 1e-12


@pytest.mark.parametrize("coupling,mode", [("keys", "h+J"), ("query", "h+J"), ("keys", "h+J-step")])
def test_cached_decoding_gives_the_rows_of_the_full_forward(coupling, mode):
    layer = _layer(coupling, mode=mode)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    full, _ = layer(x)
    cache = {}
    parts = [layer(x[:, :4], cache=cache)[0]] + [layer(x[:, i:i + 1], cache=cache)[0] for i in range(4, 9)]
    assert (torch.cat(parts, 1) - full).abs().max() < 1e-12
    assert set(cache) == {"owner", "key", "value", "content_key"}


@pytest.mark.parametrize("coupling", ["keys", "query"])
def test_gradcheck_through_the_content_couplings(coupling):
    layer = _layer(coupling, position=None)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    params = [layer.couplings.left, layer.couplings.right] + (
        [layer.couplings.query_weight] if coupling == "query" else [])

    def g(*ps):  # the layer's output as a function of the couplings' parameters
        names = ["couplings.left", "couplings.right", "couplings.query_weight"]
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))[0]

    inputs = tuple(p.detach().clone().requires_grad_() for p in params)
    assert torch.autograd.gradcheck(g, inputs)


def test_content_couplings_are_refused_where_they_cannot_apply():
    with pytest.raises(ValueError, match="does not use coupling"):
        BoltzmannAttention(16, 2, max_len=8, mode="h", coupling="keys")
    with pytest.raises(ValueError, match="needs mode 'h\\+J' or 'h\\+J-step'"):
        BoltzmannAttention(16, 2, max_len=8, mode="J", coupling="keys")
    with pytest.raises(ValueError, match="coupling_rank applies to coupling='keys' or 'query' only"):
        BoltzmannAttention(16, 2, max_len=8, mode="h+J", coupling="full", coupling_rank=8)
    with pytest.raises(ValueError, match="coupling_rank must be an integer >= 1"):
        BoltzmannAttention(16, 2, max_len=8, mode="h+J", coupling="keys", coupling_rank=0)


@pytest.mark.parametrize("query_conditioned", [False, True])
def test_the_band_form_holds_the_dense_couplings_band_and_solves_the_same(query_conditioned):
    k, q = torch.randn(2, 3, 7, 8, dtype=torch.float64), torch.randn(2, 3, 5, 8, dtype=torch.float64)
    c = ContentCouplings(3, 8, 4, 2, query_conditioned, init_std=0.5).double()
    dense, band = c(k, q), c.band(k, q)
    assert band.shape == dense.shape[:-1] + (2,)
    for p in range(7):
        for d in (1, 2):
            want = dense[..., p - d, p] if p >= d else torch.zeros_like(dense[..., 0, 0])
            assert torch.allclose(band[..., p, d - 1], want, atol=1e-12)
    h = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    mask = torch.ones(5, 7, dtype=torch.bool).tril(2)
    got = ising.chain.band_marginals(h, ising.chain.Band(band), mask)
    assert (got - ising.marginals(h, dense, mask=mask, method="reference")).abs().max() < 1e-12
    with pytest.raises(ValueError, match="beyond bandwidth 1"):
        ising.chain.band_marginals(h, ising.chain.Band(band), mask, bandwidth=1)


def test_chain_with_a_mask_key_reads_the_lengths_once_and_refuses_the_key_on_another_mask(monkeypatch):
    from boltzmann_attention.ising import planner

    g = torch.Generator().manual_seed(5)
    h = torch.randn(2, 7, 7, dtype=torch.float64, generator=g)
    band = torch.randn(2, 7, 7, 2, dtype=torch.float64, generator=g)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    want = ising.chain.band_marginals(h, ising.chain.Band(band), causal)
    derived, remember = [], planner._remember
    monkeypatch.setattr(planner, "_remember", lambda *args: derived.append(args[2]) or remember(*args))
    for _ in range(3):
        got = ising.chain.band_marginals(h, ising.chain.Band(band), causal, mask_key="test: chain causal 7")
        assert (got - want).abs().max() < 1e-12
    assert derived == ["chain lengths"]  # derived once, then remembered
    with pytest.raises(ValueError, match="was given to masks of different values"):
        ising.chain.band_marginals(h, ising.chain.Band(band), causal.flip(-1), mask_key="test: chain causal 7")
