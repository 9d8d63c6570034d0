"""The couplings modules: every value against its definition, no weight decay by structure (after deepcopy,
assign=True loading, to_empty and torch.compile), and no state that meta initialisation can leave garbage."""

import copy
import itertools

import pytest
import torch
from torch import nn

from boltzmann_attention import (
    BoltzmannAttention,
    FullCouplings,
    RelativeCouplings,
    ThreeBodyCouplings,
    WindowCouplings,
    parameter_groups,
)

LAYERS = {
    "full": dict(coupling="full"),
    "relative": dict(coupling="relative", coupling_range=3),
    "window": dict(coupling="window", coupling_window=4),
    "window relative": dict(coupling="window", coupling_window=4, coupling_window_relative=True),
    "three-body": dict(mode="h+J+K"),
    "slot bias": dict(slot_bias=3),
}


def _layer(name, **extra):
    options = {"mode": "h+J", **LAYERS[name], **extra}
    return BoltzmannAttention(16, 2, max_len=6, coupling_init_std=0.1, **options)


def _no_decay_names(model):
    ids = {id(p) for p in parameter_groups(model, 0.1)[1]["params"]}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def _expected_no_decay(model):
    return {name for name, p in model.named_parameters()
            if p.dim() < 2 or name.split(".")[-1] == "field_bias" or "couplings" in name
            or "three_body" in name or "slot_bias" in name}


def _copies(model):
    """The paths that hand over Parameter objects without their Python attributes."""
    yield "deepcopy", copy.deepcopy(model)
    with torch.device("meta"):
        meta = type(model)(16, 2, max_len=6, **model._options)
    meta.load_state_dict(model.state_dict(), assign=True)
    yield "meta + load_state_dict(assign=True)", meta
    with torch.device("meta"):
        empty = type(model)(16, 2, max_len=6, **model._options)
    empty = empty.to_empty(device="cpu")
    empty.load_state_dict(model.state_dict())
    yield "to_empty + load_state_dict", empty
    yield "torch.compile wrapper", torch.compile(model)
    for p in model.parameters():  # the attribute alone is no longer what decides
        p.__dict__.pop("_no_weight_decay", None)
    yield "attribute removed", model


@pytest.mark.parametrize("name", list(LAYERS))
def test_no_weight_decay_on_couplings_survives_copies_and_meta_initialisation(name):
    model = _layer(name)
    model._options = {"mode": "h+J", **LAYERS[name], "coupling_init_std": 0.1}
    expected = _expected_no_decay(model)
    assert any("couplings" in n or "three_body" in n or "slot_bias" in n for n in expected)
    assert _no_decay_names(model) == expected
    for how, other in _copies(model):
        got = _no_decay_names(other)
        names = {n.removeprefix("_orig_mod.") for n in got}
        assert names == expected, how
        decayed = parameter_groups(other, 0.1)[0]["params"]
        assert all(p.dim() >= 2 for p in decayed), how


def test_user_parameters_marked_no_weight_decay_still_count_and_shared_ones_once():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    net[1].weight = net[0].weight  # shared
    extra = nn.Parameter(torch.zeros(3, 3))
    extra._no_weight_decay = True
    net.register_parameter("extra", extra)
    decay, no_decay = (g["params"] for g in parameter_groups(net, 0.1))
    assert [id(p) for p in decay] == [id(net[0].weight)]
    assert any(p is extra for p in no_decay)
    assert len(decay) + len(no_decay) == len(list(net.parameters()))


@pytest.mark.parametrize("relative", [False, True])
def test_window_couplings_after_meta_initialisation_equal_the_original(relative):
    torch.manual_seed(0)
    original = WindowCouplings(3, 5, relative=relative, init_std=1.0)
    with torch.device("meta"):
        meta = WindowCouplings(3, 5, relative=relative, init_std=1.0)
    restored = meta.to_empty(device="cpu")
    restored.load_state_dict(original.state_dict())
    assert torch.equal(restored(), original())
    assigned = WindowCouplings(3, 5, relative=relative)
    with torch.device("meta"):
        assigned = WindowCouplings(3, 5, relative=relative)
    assigned.load_state_dict(original.state_dict(), assign=True)
    assert torch.equal(assigned(), original())
    assert not list(original.buffers())  # nothing beyond the parameters to initialise


def test_window_layer_after_meta_initialisation_gives_the_original_output():
    torch.manual_seed(0)
    options = dict(mode="h+J", coupling="window", coupling_window=4, coupling_init_std=0.5)
    original = BoltzmannAttention(16, 2, max_len=8, **options)
    with torch.device("meta"):
        meta = BoltzmannAttention(16, 2, max_len=8, **options)
    restored = meta.to_empty(device="cpu")
    restored.load_state_dict(original.state_dict())
    x = torch.randn(2, 8, 16)
    torch.testing.assert_close(restored(x)[0], original(x)[0], rtol=0, atol=0)


def _brute_pairs(J):
    """Symmetric, zero diagonal."""
    return torch.equal(J, J.transpose(-1, -2)) and bool((J.diagonal(dim1=-2, dim2=-1) == 0).all())


def test_every_couplings_value_against_its_definition():
    torch.manual_seed(0)
    full = FullCouplings(2, 6, init_std=1.0)
    J = full(5)
    for h, j, k in itertools.product(range(2), range(5), range(5)):
        want = 0.0 if j == k else full.weight[h, min(j, k), max(j, k)]
        assert J[h, j, k] == want
    rel = RelativeCouplings(2, 3, init_std=1.0)
    J = rel(7)
    for h, j, k in itertools.product(range(2), range(7), range(7)):
        d = abs(j - k)
        assert J[h, j, k] == (rel.weight[h, d - 1] if 1 <= d <= 3 else 0.0)
    for relative in (False, True):
        win = WindowCouplings(2, 4, relative=relative, init_std=1.0)
        J = win()
        for h, a, b in itertools.product(range(2), range(4), range(4)):
            if a == b:
                want = 0.0
            elif relative:
                want = win.weight[h, abs(a - b) - 1]
            else:
                want = win.weight[h, min(a, b), max(a, b)]
            assert J[h, a, b] == want
        assert _brute_pairs(J)
    three = ThreeBodyCouplings(2, 5, init_std=1.0)
    K = three(4)
    for h, j, k, m in itertools.product(range(2), range(4), range(4), range(4)):
        want = 0.0 if len({j, k, m}) < 3 else three.weight[(h, *sorted((j, k, m)))]
        assert K[h, j, k, m] == want


@pytest.mark.parametrize("module", [FullCouplings(2, 4), RelativeCouplings(2, 3), ThreeBodyCouplings(2, 4)],
                         ids=["full", "relative", "three-body"])
@pytest.mark.parametrize("length", [-1, -3, 2.5, True, None])
def test_a_length_that_is_not_a_count_is_refused(module, length):
    """FullCouplings(-1) silently returned the couplings of max_len - 1 keys; others raised cryptic errors."""
    with pytest.raises(ValueError, match="length must be an integer >= 0"):
        module(length)


def test_a_no_weight_decay_method_of_another_library_does_not_exempt_its_module():
    class TimmStyle(nn.Module):  # timm's convention: a method returning the names to exempt
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def no_weight_decay(self):
            return set()

    decay, _ = (g["params"] for g in parameter_groups(TimmStyle(), 0.1))
    assert len(decay) == 1 and decay[0].dim() == 2


@pytest.mark.parametrize("coupling", ["full", "relative", "window", "keys", "query"])
def test_coupling_matrix_is_the_J_the_forward_solves(coupling):
    """The brute-force definition with the layer's ``coupling_matrix(x)`` gives the layer's own weights, for every
    kind of pairwise couplings; a layer without them has none."""
    from boltzmann_attention.naive import naive_boltzmann_attention

    torch.manual_seed(0)
    options = {"window": {"coupling_window": 4}, "relative": {"coupling_range": 3},
               "keys": {"coupling_range": 3, "coupling_rank": 4, "method": "chain"},
               "query": {"coupling_range": 3, "coupling_rank": 4, "method": "chain"}}.get(coupling, {})
    layer = BoltzmannAttention(16, 2, max_len=8, coupling=coupling, coupling_init_std=0.5, **options).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    _, weights = layer(x, need_weights=True)
    J = layer.coupling_matrix(x)
    shape = {"window": (2, 4, 4), "keys": (2, 2, 1, 7, 7), "query": (2, 2, 7, 7, 7)}.get(coupling, (2, 7, 7))
    assert J.shape == shape and J.abs().max() > 0.1
    split = lambda t: t.view(2, 7, 2, 8).transpose(1, 2)  # noqa: E731
    q, k, v = split(layer.query(x)), split(layer.key(x)), split(layer.value(x))
    _, want = naive_boltzmann_attention(q, k, v, J, is_causal=True, bias=layer.field_bias.view(-1, 1, 1),
                                        coupling_window=4 if coupling == "window" else None)
    assert (weights - want).abs().max() < 1e-12
    assert BoltzmannAttention(16, 2, max_len=8, mode="h").coupling_matrix(x.float()) is None
