"""No silently wrong result, and a clear error naming the argument otherwise (the library).

First one test per class of defect, then a battery of bad and edge inputs across the
API (ising.marginals / log_partition for every method, boltzmann_attention, BoltzmannAttention,
parameter_groups). Every battery call must either return a correct result (checked against
``ising.reference`` in float64, or a closed form) or raise ValueError with a message naming the argument.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from conftest import symmetric_couplings, symmetric_three_body
from torch import nn

from boltzmann_attention import BoltzmannAttention, boltzmann_attention, ising, parameter_groups
from boltzmann_attention.attention import MODES, RelativeCouplings

DT = torch.float64
METHODS = sorted(ising.METHODS)
LOG_Z = sorted(set(METHODS) - ising.SAMPLED_METHODS)
# fast settings for the sampled methods: the battery checks shapes and ranges for them, not accuracy
FAST = {"gibbs": {"num_samples": 8, "warmup": 2, "seed": 0}, "pt": {"num_samples": 8, "warmup": 2, "seed": 0},
        "sqa": {"num_samples": 4, "sweeps": 2, "trotter_slices": 2, "seed": 0},
        "dqa": {"num_samples": 4, "trotter_steps": 2, "seed": 0}}


def fast(method: str) -> dict:
    return dict(FAST.get(method, {}))


def problem(n=4, batch=3, seed=0, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, n, dtype=DT, generator=g)
    J = symmetric_couplings(n, scale=0.5, generator=g)
    return h.to(dtype), J.to(dtype)


# ---------------------------------------------------------------------------------------------------
# One test per class of the issue


@pytest.mark.parametrize("chunk_size", [-3, 0, 1.5, True, "4"])
def test_banded_chunk_size_must_be_a_positive_int(chunk_size):
    """chunk_size=-3 returned all-zero marginals; 0 silently became the default."""
    h, J = problem()
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        ising.marginals(h, J, method="banded", chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [1, 2, 5])
def test_banded_small_chunks_are_exact(chunk_size):
    h, J = problem(n=6, batch=5)
    J = J * (torch.ones(6, 6).triu(-2).tril(2) > 0)
    expected = ising.marginals(h, J, method="reference")
    torch.testing.assert_close(ising.marginals(h, J, method="banded", chunk_size=chunk_size), expected,
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("method", ["exact", "banded"])
def test_relative_coupling_range_zero_is_honoured(method):
    """coupling_range=0 became range (and banded bandwidth) max_len - 1: it now means no couplings, so the
    layer's weights are sigmoid attention's, sigmoid(2h), computed here from the layer's own projections."""
    torch.manual_seed(0)
    layer = BoltzmannAttention(8, 2, max_len=6, coupling="relative", coupling_range=0, method=method,
                               coupling_init_std=1.0).double()
    assert layer.couplings.max_distance == 0
    assert (layer.couplings(9) == 0).all()  # any length, no coupling
    if method == "banded":
        assert layer.method_options["bandwidth"] == 0
    x = torch.randn(2, 5, 8, dtype=DT)
    _, weights = layer(x, need_weights=True)
    q = layer.query(x).view(2, 5, 2, 4).transpose(1, 2)
    k = layer.key(x).view(2, 5, 2, 4).transpose(1, 2)
    field = q @ k.transpose(-1, -2) / 2.0 + layer.field_bias.view(-1, 1, 1)
    expected = torch.sigmoid(2 * field) * torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(weights, expected, atol=1e-12, rtol=0)


def test_coupling_range_default_and_refusals():
    assert BoltzmannAttention(8, 2, max_len=6, coupling="relative").couplings.max_distance == 5
    layer = BoltzmannAttention(8, 2, max_len=6, coupling="relative", method="banded")
    assert layer.method_options["bandwidth"] == 5
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="coupling_range must be an integer >= 0"):
            BoltzmannAttention(8, 2, max_len=6, coupling="relative", coupling_range=bad)
    with pytest.raises(ValueError, match="coupling_range applies to coupling='relative', 'keys' or 'query' only"):
        BoltzmannAttention(8, 2, max_len=6, coupling_range=3)


def _attention_inputs(S=5, L=4, dtype=DT, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, L, 3, dtype=dtype, generator=g)
    k = torch.randn(2, 2, S, 3, dtype=dtype, generator=g)
    v = torch.randn(2, 2, S, 4, dtype=dtype, generator=g)
    J = symmetric_couplings(S, 2, scale=0.3, generator=g).to(dtype)
    K = symmetric_three_body(S, 2, scale=0.1, generator=g).to(dtype)
    return q, k, v, J, K


def _mode_kwargs(mode, J, K):
    return {"couplings": J if "J" in mode else None, "three_body": K if "K" in mode else None}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["query", "key"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_query_or_key_raises_in_every_mode(mode, where, bad):
    """Mode h returned NaN where h+J raised; now every mode that uses q and k refuses them alike. Mode J
    does not use q or k (its field is the bias), so its weights must equal those for finite q and k."""
    q, k, v, J, K = _attention_inputs()
    args = {"query": q.clone(), "key": k.clone()}
    args[where][1, 0, 2, 1] = bad
    kwargs = _mode_kwargs(mode, J, K)
    if mode == "J":
        out = boltzmann_attention(args["query"], args["key"], v, mode=mode, **kwargs)
        torch.testing.assert_close(out, boltzmann_attention(q, k, v, mode=mode, **kwargs))
        return
    with pytest.raises(ValueError, match=f"({where}|the field h).* contains NaN or inf"):
        boltzmann_attention(args["query"], args["key"], v, mode=mode, **kwargs)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "softmax"])
def test_overflowing_or_nan_field_raises_in_every_mode(mode):
    q, k, v, J, K = _attention_inputs(dtype=torch.float32)
    kwargs = _mode_kwargs(mode, J, K)
    with pytest.raises(ValueError, match="bias must be a finite float"):
        boltzmann_attention(q, k, v, mode=mode, bias=math.nan, **kwargs)
    with pytest.raises(ValueError, match="the field h .* contains NaN or inf"):  # a tensor bias, per head
        boltzmann_attention(q, k, v, mode=mode, bias=torch.tensor([0.0, math.inf]).view(2, 1, 1), **kwargs)
    if mode != "J":  # finite q and k whose product overflows float32
        with pytest.raises(ValueError, match="the field h .* contains NaN or inf"):
            boltzmann_attention(q * 1e30, k * 1e30, v, mode=mode, **kwargs)


BAD_COUPLINGS = {
    "not symmetric": (lambda J: J + torch.triu(torch.ones_like(J), 1) * 0.1, "symmetric"),
    "nonzero diagonal": (lambda J: J + torch.eye(J.shape[-1], dtype=J.dtype), "zero diagonal"),
    "nan": (lambda J: J.masked_fill(torch.eye(J.shape[-1], dtype=torch.bool).roll(1, 0) | torch.eye(
        J.shape[-1], dtype=torch.bool).roll(1, 1), math.nan), "NaN or inf"),
    "inf": (lambda J: J.masked_fill(torch.eye(J.shape[-1], dtype=torch.bool).roll(1, 0) | torch.eye(
        J.shape[-1], dtype=torch.bool).roll(1, 1), math.inf), "NaN or inf"),
}


@pytest.mark.parametrize("mode", [m for m in MODES if "J" in m])
@pytest.mark.parametrize("case", sorted(BAD_COUPLINGS))
def test_the_functional_form_refuses_bad_couplings_in_every_mode_with_couplings(mode, case):
    """Modes whose weights are a closed form (h+J-step) solve nothing that would check J: they refuse the same
    couplings as the modes that do."""
    q, k, v, J, K = _attention_inputs()
    make, message = BAD_COUPLINGS[case]
    kwargs = _mode_kwargs(mode, make(J), K)
    with pytest.raises(ValueError, match=message):
        boltzmann_attention(q, k, v, mode=mode, **kwargs)


@pytest.mark.parametrize("where", ["bias", "attn_mask"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("mode", MODES)
def test_a_non_finite_bias_or_float_mask_raises_in_every_mode(mode, where, bad):
    """Every tensor that enters the scores or the field is checked, softmax's too; -inf in a float attn_mask
    is an absent key, not an error."""
    q, k, v, J, K = _attention_inputs()
    tensor = torch.zeros(2, 1, 1, 5, dtype=DT)
    tensor[1, 0, 0, 2] = bad
    kwargs = _mode_kwargs(mode, J, K)
    with pytest.raises(ValueError, match="contains NaN or inf"):
        boltzmann_attention(q, k, v, mode=mode, **{where: tensor}, **kwargs)
    if where == "attn_mask":
        absent = torch.zeros(2, 1, 1, 5, dtype=DT)
        absent[1, 0, 0, 2] = -math.inf
        out = boltzmann_attention(q, k, v, mode=mode, attn_mask=absent, **kwargs)
        assert torch.isfinite(out).all()


def _break_slot_bias(layer):
    with torch.no_grad():
        layer.slot_bias.weight[0, 1] = math.nan


def _break_kernel(layer):
    with torch.no_grad():
        layer.kernel.weight[0, 0, 0] = math.inf


def _break_alibi(monkeypatch):
    from boltzmann_attention import attention
    monkeypatch.setattr(attention, "alibi_slopes", lambda n: torch.full((n,), math.nan, dtype=torch.float64))


LAYER_TENSORS = {  # what enters a module-only mode's scores besides query and key
    "slot bias": (dict(slot_bias=3), _break_slot_bias),
    "pairs slot bias": (dict(slot_bias=3, slot_bias_parametrization="pairs"), _break_slot_bias),
    "alibi": (dict(position="alibi"), None),
}


@pytest.mark.parametrize("mode", ["softmax", "fox", "stickbreaking", "mta", "h", "h+J"])
@pytest.mark.parametrize("case", sorted(LAYER_TENSORS) + ["mta kernel"])
@pytest.mark.parametrize("policy", ["host", "async"])
def test_every_tensor_that_enters_a_layer_forward_is_checked(mode, case, policy, monkeypatch):
    from boltzmann_attention import value_checks

    if case == "mta kernel" and mode != "mta":
        pytest.skip("the kernel is mta's")
    options, breaks = LAYER_TENSORS.get(case, ({}, _break_kernel))
    torch.manual_seed(0)
    layer = BoltzmannAttention(8, 2, max_len=6, mode=mode, **options)
    x = torch.randn(2, 6, 8)
    assert torch.isfinite(layer(x)[0]).all()
    if breaks is None:
        _break_alibi(monkeypatch)
    else:
        breaks(layer)
    error = ValueError if policy == "host" else RuntimeError
    with value_checks(policy), pytest.raises(error, match="NaN or inf"):
        layer(x)
    with value_checks(policy), pytest.raises(error, match="NaN or inf"):  # decoding with a cache too
        layer(x[:, :2], cache={})


@pytest.mark.parametrize("method", METHODS)
def test_unknown_option_names_it_and_the_known_ones(method):
    h, J = problem()
    known = sorted(ising.OPTIONS[method])
    pattern = r"unknown option\(s\) \['bogus'\] for method '" + method + "'; " \
        + (re.escape(f"known options: {known}") if known else "it takes no options")
    with pytest.raises(ValueError, match=pattern):
        ising.marginals(h, J, method=method, bogus=1, **fast(method))
    if method in LOG_Z:
        with pytest.raises(ValueError, match=pattern):
            ising.log_partition(h, J, method=method, bogus=1)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['bogus'\]"):  # at construction, not step 1
        BoltzmannAttention(8, 2, max_len=4, method=method, method_options={"bogus": 1})


def test_known_options_are_the_signatures():
    """The lists are derived from the functions, so each known option is accepted by the method."""
    assert ising.OPTIONS["exact"] == {"max_spins"}
    assert ising.OPTIONS["banded"] == {"bandwidth", "max_bandwidth", "chunk_size"}
    assert ising.OPTIONS["tap"] == ising.OPTIONS["meanfield"] - {"tap"}
    assert {"trotter_steps", "anneal_time_ns", "num_samples", "gradient"} <= ising.OPTIONS["dqa"]
    assert ising.OPTIONS["reference"] == frozenset()


EMPTY_SHAPES = {  # name: (h shape, J shape or None, mask shape or None, result batch shape)
    "n=0": ((3, 0), (0, 0), None, (3,)),
    "n=0 no J": ((3, 0), None, (3, 0), (3,)),
    "batch 0": ((0, 4), (4, 4), None, (0,)),
    "batch 0 masked": ((0, 4), (4, 4), (0, 4), (0,)),
    "J batch 0": ((4,), (0, 4, 4), None, (0,)),
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", sorted(EMPTY_SHAPES))
def test_empty_inputs_give_empty_results(method, case):
    h_shape, J_shape, mask_shape, batch = EMPTY_SHAPES[case]
    n = h_shape[-1]
    h = torch.zeros(h_shape, dtype=DT, requires_grad=True)
    J = None if J_shape is None else torch.zeros(J_shape, dtype=DT)
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    m = ising.marginals(h, J, mask=mask, method=method, **fast(method))
    assert m.shape == (*batch, n) and m.dtype == DT
    m.sum().backward()  # connected to h, like any result
    assert h.grad.shape == h.shape and (h.grad == 0).all()
    if method in LOG_Z:
        logz = ising.log_partition(h.detach(), J, mask=mask, method=method)
        assert logz.shape == batch and (logz == 0).all()  # log Z of no spins is log 1


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("empty", ["B", "L", "S"])
def test_empty_attention(method, empty):
    """B = 0, L = 0 or S = 0 give an empty output, or zeros for queries that have no key to attend to."""
    sizes = {"B": 2, "L": 3, "S": 4}
    sizes[empty] = 0
    B, L, S = sizes["B"], sizes["L"], sizes["S"]
    q, k, v = torch.randn(B, 2, L, 3, dtype=DT), torch.randn(B, 2, S, 3, dtype=DT), torch.randn(B, 2, S, 5, dtype=DT)
    out, w = boltzmann_attention(q, k, v, couplings=torch.zeros(2, S, S, dtype=DT), method=method, is_causal=True,
                                 return_weights=True, method_options=fast(method))
    assert out.shape == (B, 2, L, 5) and w.shape == (B, 2, L, S)
    assert (out == 0).all() if S == 0 else out.numel() == 0
    options = {**fast(method), **({"bandwidth": 3} if method == "banded" else {})}  # banded: J is trained
    layer = BoltzmannAttention(8, 2, max_len=4, method=method, method_options=options)
    y, _ = layer(torch.randn(B, max(L, S), 8) if L and S else torch.randn(B if empty != "B" else 0, 0, 8))
    assert y.shape[-1] == 8


ATTENTION_SHAPE_ERRORS = {  # name: (changes to valid keyword arguments, message)
    "key batch": (lambda a: {"key": a["key"][:1], "value": a["value"][:1]}, r"key has batch and heads \(1, 2\)"),
    "key heads": (lambda a: {"key": a["key"][:, :1]}, r"key has batch and heads \(2, 1\)"),
    "value batch": (lambda a: {"value": a["value"][:1]}, r"value has batch and heads \(1, 2\)"),
    "value keys": (lambda a: {"value": a["value"][:, :, :3]}, "value has 3 keys"),
    "key E": (lambda a: {"key": a["key"][..., :2]}, "key's last dimension E = 2"),
    "query 3-D": (lambda a: {"query": a["query"][0]}, "must be 4-D"),
    "bias shape": (lambda a: {"bias": torch.zeros(7, dtype=DT)}, r"bias of shape \(7,\) does not broadcast"),
    "bias dtype": (lambda a: {"bias": torch.zeros(1, dtype=torch.long)}, "bias must be a float or a floating-point"),
    "bias bool": (lambda a: {"bias": True}, "bias must be a finite float"),
    "mask shape": (lambda a: {"attn_mask": torch.ones(3, 5, dtype=torch.bool)}, r"attn_mask of shape \(3, 5\)"),
    "mask dtype": (lambda a: {"attn_mask": torch.ones(4, 5, dtype=torch.long)}, "attn_mask must be a bool tensor"),
    "couplings heads": (lambda a: {"couplings": torch.zeros(3, 5, 5, dtype=DT)},
                        r"couplings must have shape \(H, 5, 5\) with H = 1 or 2 heads, got \(3, 5, 5\)"),
    "couplings size": (lambda a: {"couplings": torch.zeros(2, 4, 4, dtype=DT)}, r"couplings must have shape"),
    "couplings dtype": (lambda a: {"couplings": a["couplings"].long()}, "couplings must be a tensor of query's"),
    "three_body heads": (lambda a: {"mode": "h+J+K", "three_body": torch.zeros(3, 5, 5, 5, dtype=DT)},
                         r"three_body must have shape \(H, 5, 5, 5\)"),
    "value dtype": (lambda a: {"value": a["value"].float()}, "query, key and value must have one dtype"),
    "query int": (lambda a: {"query": a["query"].long()}, "query must be a floating-point tensor"),
    "is_causal str": (lambda a: {"is_causal": "yes"}, "is_causal must be True or False"),
    "scale nan": (lambda a: {"scale": math.nan}, "scale must be a finite number"),
    "scale bool": (lambda a: {"scale": True}, "scale must be a finite number"),
    "mode": (lambda a: {"mode": "h+X"}, "unknown mode"),
    "method": (lambda a: {"method": "magic"}, "unknown method 'magic'"),
    "method option": (lambda a: {"method_options": {"max_spin": 3}}, r"unknown option\(s\) \['max_spin'\]"),
}


@pytest.mark.parametrize("case", sorted(ATTENTION_SHAPE_ERRORS))
def test_attention_errors_name_the_argument(case):
    q, k, v, J, _ = _attention_inputs()
    args = {"query": q, "key": k, "value": v, "couplings": J}
    change, message = ATTENTION_SHAPE_ERRORS[case]
    args.update(change(args))
    with pytest.raises(ValueError, match=message):
        boltzmann_attention(args.pop("query"), args.pop("key"), args.pop("value"), **args)


LAYER_ERRORS = {  # name: (keyword arguments, message)
    "num_heads 0": ({"num_heads": 0}, "num_heads must be an integer >= 1"),
    "num_heads -2": ({"num_heads": -2}, "num_heads must be an integer >= 1"),
    "max_len 0": ({"max_len": 0}, "max_len must be an integer >= 1"),
    "max_len -1": ({"max_len": -1}, "max_len must be an integer >= 1"),
    "max_len 2.5": ({"max_len": 2.5}, "max_len must be an integer >= 1"),
    "embed_dim 0": ({"embed_dim": 0}, "embed_dim must be an integer >= 1"),
    "embed_dim float": ({"embed_dim": 8.0}, "embed_dim must be an integer >= 1"),
    "embed_dim bool": ({"embed_dim": True, "num_heads": 1}, "embed_dim must be an integer >= 1"),
    "indivisible": ({"embed_dim": 7}, "embed_dim 7 is not divisible by num_heads 2"),
    "coupling": ({"coupling": "banded"}, "unknown coupling"),
    "init std nan": ({"coupling_init_std": math.nan}, "coupling_init_std must be a finite number >= 0"),
    "init std negative": ({"coupling_init_std": -1.0}, "coupling_init_std must be a finite number >= 0"),
    "field bias nan": ({"field_bias_init": math.nan}, "field_bias_init must be a finite number"),
    "field bias str": ({"field_bias_init": "0"}, "field_bias_init must be a finite number"),
    "method": ({"method": "magic"}, "unknown method 'magic'"),
    "method unhashable": ({"method": ["exact"]}, "unknown method"),
    "options not dict": ({"method_options": [("max_spins", 3)]}, "method_options must be a dict"),
    "causal str": ({"causal": "no"}, "causal must be True or False"),
}


@pytest.mark.parametrize("case", sorted(LAYER_ERRORS))
def test_layer_options_are_checked_at_construction(case):
    kwargs, message = LAYER_ERRORS[case]
    kwargs = {"embed_dim": 8, "num_heads": 2, "max_len": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        BoltzmannAttention(kwargs.pop("embed_dim"), kwargs.pop("num_heads"), **kwargs)


@pytest.mark.parametrize("x, message", [
    (torch.randn(4, 8), r"x must have shape \(B, L, embed_dim = 8\), got \(4, 8\)"),
    (torch.randn(1, 2, 4, 8), r"x must have shape \(B, L, embed_dim = 8\)"),
    (torch.randn(2, 4, 6), r"got \(2, 4, 6\)"),
    (torch.ones(2, 4, 8, dtype=torch.long), "x must be a tensor of the layer's dtype torch.float32"),
    (torch.randn(2, 4, 8, dtype=DT), "x must be a tensor of the layer's dtype torch.float32"),
    (torch.randn(2, 5, 8), "sequence length 5 exceeds max_len 4"),
], ids=["2-D", "4-D", "embed", "int", "float64", "too long"])
def test_layer_input_errors(x, message):
    layer = BoltzmannAttention(8, 2, max_len=4)
    with pytest.raises(ValueError, match=message):
        layer(x)


def test_relative_couplings_accept_zero_distance_only_as_int():
    assert RelativeCouplings(2, 0).weight.shape == (2, 0)
    with pytest.raises(ValueError, match="max_distance"):
        RelativeCouplings(2, -1)


# ---------------------------------------------------------------------------------------------------
# DimodSampler with an exact solver


try:
    import dimod
except ImportError:  # the test extra installs it; without it only the dimod cases are skipped
    dimod = None
needs_dimod = pytest.mark.skipif(dimod is None, reason="dimod not installed")


@needs_dimod
def test_dimod_exact_solver_gives_exact_marginals_and_gradients():
    """ExactSolver returns every state once (not num_reads reads): weighted by exp(-E) with this package's
    E, they give the exact marginals and, through the covariance estimator, the exact gradients."""
    h, J = problem(n=5, batch=3, seed=1)
    J = J * 3  # strong couplings: a sign error would show
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    sampler = ising.DimodSampler(dimod.ExactSolver())
    assert sampler.enumerates
    hs, Js = h.clone().requires_grad_(), J.clone().requires_grad_()
    hr, Jr = h.clone().requires_grad_(), J.clone().requires_grad_()
    m = ising.marginals(hs, Js, mask=mask, method=sampler)
    expected = ising.marginals(hr, Jr, mask=mask, method="reference")
    torch.testing.assert_close(m, expected, atol=1e-12, rtol=0)
    g = torch.randn(3, 5, dtype=DT)
    (m * g).sum().backward()
    (expected * g).sum().backward()
    torch.testing.assert_close(hs.grad, hr.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(Js.grad, 0.5 * (Jr.grad + Jr.grad.T), atol=1e-12, rtol=0)


class _CountingSampler:
    """A sampler that declares its parameters; returns ``reads`` reads of all +1 whatever num_reads is."""

    def __init__(self, parameters, reads):
        self.parameters, self.reads = parameters, reads

    def sample_ising(self, h, J, **kwargs):
        labels = list(h)
        return dimod.SampleSet.from_samples((np.ones((self.reads, len(labels)), dtype=np.int8), labels),
                                            vartype="SPIN", energy=np.zeros(self.reads))


@needs_dimod
def test_dimod_refuses_read_counts_it_cannot_use():
    h = torch.zeros(1, 3, dtype=DT)
    with pytest.raises(ValueError, match="returned 7 reads .* expected num_reads = 4.*ExactSolver"):
        ising.DimodSampler(_CountingSampler({"num_reads": []}, 7), num_reads=4).marginals(h)
    with pytest.raises(ValueError, match="takes no num_reads, so it is used as an exact enumeration"):
        ising.DimodSampler(_CountingSampler({}, 8)).marginals(h)  # 8 identical reads, not the 8 states


# ---------------------------------------------------------------------------------------------------
# The battery


class Raises:
    """The call must raise ValueError whose message matches ``pattern`` (which names the argument)."""

    def __init__(self, pattern: str):
        self.pattern = pattern

    def __call__(self, thunk):
        with pytest.raises(ValueError, match=self.pattern):
            thunk()


class Equals:
    """The call must return ``expected()`` (float64 reference or closed form) within atol."""

    def __init__(self, expected, atol: float):
        self.expected, self.atol = expected, atol

    def __call__(self, thunk):
        got, want = thunk(), self.expected()
        assert got.shape == want.shape
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want.double(), atol=self.atol, rtol=0)


class Marginals:
    """A sampled or approximate method: shape, finite, |m| <= 1, exact zeros at absent spins."""

    def __init__(self, shape, mask=None):
        self.shape, self.mask = shape, mask

    def __call__(self, thunk):
        m = thunk()
        assert m.shape == self.shape and torch.isfinite(m).all() and (m.abs() <= 1).all()
        if self.mask is not None:
            assert (m[..., ~self.mask] == 0).all() if self.mask.dim() == 1 else (m * ~self.mask == 0).all()


BATTERY: dict[str, tuple] = {}


def case(name, thunk, expect):
    assert name not in BATTERY, name
    BATTERY[name] = (thunk, expect)


def _ref(h, J=None, K=None, mask=None, logz=False):
    def expected():
        def to64(x):
            return None if x is None else x.double()
        f = ising.log_partition if logz else ising.marginals
        return f(to64(h), to64(J), to64(K), mask=mask, method="reference")
    return expected


EXACTISH = {"exact": 1e-10, "reference": 1e-12, "banded": 1e-10}  # methods checked against the reference


def _method_cases(method: str) -> None:
    h, J = problem()
    K = symmetric_three_body(4, scale=0.3, generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[True, True, False, True], [False] * 4, [True] * 4])
    exactish = EXACTISH
    opts = fast(method)

    def call(h=h, J=J, K=None, mask=None, method=method, logz=False, **extra):
        f = ising.log_partition if logz else ising.marginals
        return lambda: f(h, J, K, mask=mask, method=method, **{**opts, **extra})

    def result(h=h, J=J, K=None, mask=None, dtype_atol=None):
        shape = torch.broadcast_shapes(h.shape, mask.shape if mask is not None else ())
        if method in exactish:
            return Equals(_ref(h, J, K, mask), dtype_atol or exactish[method])
        if method in ("meanfield", "tap") and J is None and K is None:
            return Equals(lambda: torch.tanh(h.double()) * (1 if mask is None else mask), 1e-12)
        return Marginals(shape, mask)

    p = f"{method}: "
    case(p + "valid float64", call(), result())
    case(p + "valid masked", call(mask=mask), result(mask=mask))
    case(p + "mask all absent", call(mask=torch.zeros(3, 4, dtype=torch.bool)),
         Equals(lambda: torch.zeros(3, 4, dtype=DT), 0.0))
    case(p + "no couplings", call(J=None), result(J=None))
    case(p + "float32", call(h=h.float(), J=J.float()), result(h=h.float(), J=J.float(), dtype_atol=1e-5))
    if method not in ising.SAMPLED_METHODS:  # (half-precision sampling on CPU: slow, and not a use)
        case(p + "float16", call(h=h.half(), J=J.half()), result(h=h.half(), J=J.half(), dtype_atol=5e-3))
    case(p + "broadcast J per item", call(J=torch.stack([J, -J, J])), result(J=torch.stack([J, -J, J])))
    # every field huge: all spins frozen. (A huge field next to an O(1) one is beyond float64's resolution of
    # E itself, for the reference too: 1e30 + 3 == 1e30.)
    huge = torch.tensor([[1e30, -1e30, 2e29, -5e29]], dtype=DT)
    case(p + "huge finite fields", call(h=huge),  # DQA's phases of 1e30 rad would be noise: refused
         Raises("problem phases reach") if method == "dqa" else result(h=huge))
    case(p + "h int", call(h=h.long()), Raises("h must be a floating-point tensor"))
    case(p + "h bool", call(h=h > 0), Raises("h must be a floating-point tensor"))
    case(p + "h list", call(h=h.tolist()), Raises("h must be a floating-point tensor"))
    case(p + "h 0-dim", call(h=h[0, 0], J=None), Raises("h must have at least one dimension"))
    for bad in (math.nan, math.inf):
        hb = h.clone()
        hb[2, 1] = bad
        case(p + f"h {bad}", call(h=hb), Raises("h contains NaN or inf"))
        Jb = J.clone()
        Jb[0, 3] = Jb[3, 0] = bad
        case(p + f"J {bad}", call(J=Jb), Raises("J contains NaN or inf"))
    Ja = J.clone()
    Ja[0, 1] += 1.0
    case(p + "J not symmetric", call(J=Ja), Raises("J must be symmetric"))
    case(p + "J diagonal", call(J=J + torch.eye(4, dtype=DT)), Raises("J must have a zero diagonal"))
    case(p + "J wrong size", call(J=J[:3, :3]), Raises(r"J must have shape \(\.\.\., 4, 4\)"))
    case(p + "J batch mismatch", call(J=torch.stack([J, J])), Raises("batch shape .* of J does not broadcast"))
    case(p + "J float32 with h float64", call(J=J.float()), Raises("J must be a tensor of h's dtype"))
    case(p + "J int", call(J=J.long()), Raises("J must be a tensor of h's dtype"))
    case(p + "mask float", call(mask=mask.double()), Raises("mask must be a bool tensor"))
    case(p + "mask wrong size", call(mask=mask[:, :3]), Raises(r"mask must have shape \(\.\.\., 4\)"))
    case(p + "unknown option", call(bogus=True), Raises(r"unknown option\(s\) \['bogus'\]"))
    if method in ("exact", "reference", "meanfield"):
        case(p + "three-body", call(K=K), result(K=K) if method != "meanfield" else Marginals((3, 4)))
    else:
        case(p + "three-body refused", call(K=K), Raises("K must be None|three-body|got K|pairwise"))
    if method in LOG_Z:
        case(p + "log Z valid", call(logz=True), Equals(_ref(h, J, logz=True), 1e-10)
             if method in exactish else _finite_logz((3,)))
        case(p + "log Z masked", call(mask=mask, logz=True), Equals(_ref(h, J, mask=mask, logz=True), 1e-10)
             if method in exactish else _finite_logz((3,)))
    else:
        case(p + "log Z refused", call(logz=True), Raises("estimate marginals only"))


def _ising_cases():
    for method in METHODS:
        _method_cases(method)
    # size limits name the limit and the alternatives
    case("reference: n = 21", lambda: ising.marginals(torch.zeros(1, 21, dtype=DT), method="reference"),
         Raises("limited to n <= 20.*exact"))
    J25 = symmetric_couplings(25, scale=0.1)
    case("exact: n = 25", lambda: ising.marginals(torch.zeros(1, 25, dtype=DT), J25),
         Raises("limited to n <= 24 .*banded"))
    case("dqa: n = 17", lambda: ising.marginals(torch.zeros(1, 17, dtype=DT), method="dqa", **fast("dqa")),
         Raises("limited to n <= 16"))
    case("banded: wide band", lambda: ising.marginals(torch.zeros(1, 25, dtype=DT), J25, method="banded",
                                                      max_bandwidth=8), Raises("exceeds max_bandwidth=8"))
    # huge option values that are harmless: the band and the size limit are capped by n
    h4, J4 = problem()
    case("banded: bandwidth 10**9", lambda: ising.marginals(h4, J4, method="banded", bandwidth=10**9,
                                                            max_bandwidth=10**9), Equals(_ref(h4, J4), 1e-10))
    case("exact: max_spins 10**9", lambda: ising.marginals(h4, J4, max_spins=10**9), Equals(_ref(h4, J4), 1e-10))
    case("banded: J bool", lambda: ising.marginals(h4, J4 != 0, method="banded"), Raises("J must be a tensor of h's"))
    if dimod is not None:
        _dimod_cases(h4, J4)
    # the issue's example: fields and couplings of 1e15 fighting
    hx = torch.tensor([1.5e15, -1e15, 0.5, 0.5], dtype=DT)
    Jx = torch.zeros(4, 4, dtype=DT)
    Jx[0, 1] = Jx[1, 0] = 2e15
    for method in ("banded", "reference", "exact"):
        case(f"{method}: huge fields against huge couplings",
             lambda method=method: ising.marginals(hx, Jx, method=method),
             Equals(lambda: torch.tensor([1.0, 1.0, math.tanh(0.5), math.tanh(0.5)], dtype=DT), 1e-12))


def _dimod_cases(h4, J4):
    """A dimod exact solver through the dispatcher."""
    exact_solver = ising.DimodSampler(dimod.ExactSolver())
    mask4 = torch.tensor([[True, False, True, True]])
    case("dimod ExactSolver: masked", lambda: ising.marginals(h4, J4, mask=mask4, method=exact_solver),
         Equals(_ref(h4, J4, mask=mask4), 1e-12))
    case("dimod ExactSolver: no couplings", lambda: ising.marginals(h4, method=exact_solver),
         Equals(lambda: torch.tanh(h4), 1e-12))
    for shape in ((0, 4), (3, 0)):
        empty = torch.zeros(shape, dtype=DT)
        case(f"dimod ExactSolver: empty {shape}", lambda empty=empty: ising.marginals(empty, method=exact_solver),
             Equals(lambda empty=empty: empty.clone(), 0.0))
        reads3 = ising.DimodSampler(_CountingSampler({"num_reads": []}, 3), num_reads=3)  # a sampling sampler
        case(f"dimod sampler: empty {shape}",
             lambda empty=empty, sampler=reads3: ising.marginals(empty, method=sampler),
             Equals(lambda empty=empty: empty.clone(), 0.0))
    case("dimod: unknown option", lambda: ising.marginals(h4, J4, method=exact_solver, num_reads=5),
         Raises(r"unknown option\(s\) \['num_reads'\] for a DimodSampler; known options"))
    case("dimod: three-body", lambda: ising.marginals(h4, J4, symmetric_three_body(4), method=exact_solver),
         Raises("DimodSampler is pairwise only"))
    case("dimod: log Z", lambda: ising.log_partition(h4, J4, method=exact_solver), Raises("estimate marginals only"))
    case("dimod: num_reads 0", lambda: ising.DimodSampler(dimod.ExactSolver(), num_reads=0),
         Raises("num_reads must be an integer >= 1"))
    case("dimod: not a sampler", lambda: ising.DimodSampler("ExactSolver"), Raises("sampler must have a sample_ising"))


def _finite_logz(shape):
    def check(thunk):
        z = thunk()
        assert z.shape == shape and torch.isfinite(z).all()
    return check


OPTION_ERRORS = {  # method: [(options, message)]
    "exact": [({"max_spins": 0}, "max_spins must be an integer >= 1"), ({"max_spins": True}, "max_spins"),
              ({"max_spins": 2.5}, "max_spins"), ({"max_spins": "24"}, "max_spins"),
              ({"max_spins": 3}, "limited to n <= 3 present spins")],
    "banded": [({"chunk_size": -3}, "chunk_size"), ({"chunk_size": 0}, "chunk_size"),
               ({"chunk_size": 2.0}, "chunk_size"), ({"bandwidth": True}, "bandwidth must be an integer"),
               ({"bandwidth": -1}, "bandwidth must be an integer"), ({"bandwidth": 1}, "not banded with bandwidth 1"),
               ({"max_bandwidth": -1}, "max_bandwidth"), ({"max_bandwidth": None}, "max_bandwidth")],
    "meanfield": [({"damping": 1.0}, "damping must be a finite number >= 0 and < 1"),
                  ({"damping": math.nan}, "damping"),
                  ({"damping": True}, "damping"), ({"damping": "0.5"}, "damping"), ({"tol": 0}, "tol must be"),
                  ({"tol": math.inf}, "tol"), ({"max_iter": 0}, "max_iter"), ({"max_iter": True}, "max_iter"),
                  ({"on_fail": "quiet"}, "on_fail must be one of"), ({"tap": "yes"}, "tap must be True or False")],
    "tap": [({"damping": -0.5}, "damping"), ({"max_iter": 1.5}, "max_iter")],
    "gibbs": [({"num_samples": 0}, "num_samples must be an integer >= 1"), ({"num_samples": True}, "num_samples"),
              ({"warmup": -1}, "warmup"), ({"sweeps_per_sample": 0}, "sweeps_per_sample"),
              ({"num_chains": 0}, "num_chains"), ({"gradient": "exact"}, "unknown gradient estimator"),
              ({"nudge": 0.0}, "nudge must be a finite number > 0"), ({"nudge": math.nan}, "nudge"),
              ({"nudge": True}, "nudge"), ({"seed": "1"}, "seed must be an int"), ({"seed": True}, "seed"),
              ({"generator": torch.Generator()}, "either seed or generator"),
              ({"return_samples": True}, "not available through ising.marginals")],
    "pt": [({"betas": [0.5, 0.7]}, "must contain 1.0"), ({"betas": [1.0, math.nan]}, "betas"),
           ({"betas": []}, "betas must not be empty"), ({"betas": [1.0, True]}, "betas"),
           ({"num_replicas": 1}, "num_replicas must be an integer >= 2"), ({"beta_min": 0.0}, "beta_min"),
           ({"beta_min": 1.0}, "beta_min"), ({"betas": [1.0], "num_replicas": 2}, "either betas or num_replicas")],
    "sqa": [({"trotter_slices": 3}, "trotter_slices must be even"), ({"sweeps": 0}, "sweeps"),
            ({"gamma_start": 0.0}, "gamma_start"), ({"gamma_end": math.nan}, "gamma_end"), ({"beta": True}, "beta")],
    "dqa": [({"trotter_steps": 0}, "trotter_steps"), ({"trotter_steps": True}, "trotter_steps"),
            ({"anneal_time_ns": 0.0}, "anneal_time_ns"), ({"anneal_time_ns": math.nan}, "anneal_time_ns"),
            ({"energy_scale": -1.0}, "energy_scale"), ({"schedule": "cubic"}, "unknown schedule"),
            ({"a_max_ghz": True}, "a_max_ghz"), ({"b_max_ghz": math.inf}, "b_max_ghz"),
            ({"target_beta": 0.0}, "target_beta"), ({"target_beta": 1.0, "energy_scale": 0.1}, "not both")],
    "reference": [({"max_spins": 3}, "takes no options")],
}


def _option_cases():
    h, J = problem()
    for method, bad in OPTION_ERRORS.items():
        for options, message in bad:
            opts = {**fast(method), **options}  # the sampled methods' seed makes generator= a conflict

            def thunk(method=method, opts=opts):
                return ising.marginals(h, J, method=method, **opts)
            shown = {k: type(v).__name__ if isinstance(v, torch.Generator) else v for k, v in options.items()}
            case(f"{method} option {shown}", thunk, Raises(message))  # the same name in every process (xdist)


def _attention_cases():
    q, k, v, J, K = _attention_inputs()
    mask = torch.rand(2, 1, 4, 5, generator=torch.Generator().manual_seed(2)) > 0.3
    bias = torch.tensor([-0.3, 0.2], dtype=DT).view(2, 1, 1)

    def expected(mode, method_mask=None, causal=False):
        """(out, weights) from the reference: a_ij = (<s_j> + 1) / 2 over visible keys, field q.k / sqrt(E) + bias."""
        def compute():
            field = q @ k.transpose(-1, -2) / math.sqrt(3) + bias
            visible = torch.ones(4, 5, dtype=torch.bool)
            if causal:
                visible = visible.tril()
            if method_mask is not None:
                visible = visible & method_mask
            visible = visible.expand(2, 2, 4, 5)
            if mode == "h":
                weights = torch.sigmoid(2 * field)
            else:
                Jm = J[:, None] if "J" in mode else None
                Km = K[:, None] if "K" in mode else None
                weights = (ising.marginals(field, Jm, Km, mask=visible, method="reference") + 1) / 2
            weights = weights * visible
            return weights @ v
        return compute

    for mode in ("h", "h+J", "h+K", "h+J+K"):
        for label, attn_mask, causal in (("", None, False), (" causal", None, True), (" masked", mask, False)):
            case(f"attention {mode}{label}",
                 lambda mode=mode, attn_mask=attn_mask, causal=causal: boltzmann_attention(
                     q, k, v, mode=mode, bias=bias, attn_mask=attn_mask, is_causal=causal, **_mode_kwargs(mode, J, K)),
                 Equals(expected(mode, attn_mask, causal), 1e-10))
    for method in ("banded", "exact"):
        case(f"attention h+J via {method}, one J for all heads",
             lambda method=method: boltzmann_attention(q, k, v, couplings=J[:1].expand(2, 5, 5).contiguous()[:1],
                                                       bias=bias, method=method),
             Equals(lambda: _shared_J_expected(q, k, v, J[:1], bias), 1e-10))
    case("attention int couplings", lambda: boltzmann_attention(q, k, v, couplings=J.long()),
         Raises("couplings must be a tensor of query's dtype"))
    case("attention couplings not symmetric", lambda: boltzmann_attention(q, k, v, couplings=J + torch.triu(J, 1)),
         Raises("J must be symmetric"))
    case("attention couplings NaN", lambda: boltzmann_attention(q, k, v, couplings=J * math.nan),
         Raises("J contains NaN or inf"))
    case("attention return_weights 1", lambda: boltzmann_attention(q, k, v, couplings=J, return_weights=1),
         Raises("return_weights must be True or False"))
    case("attention method_options list", lambda: boltzmann_attention(q, k, v, couplings=J, method_options=[1]),
         Raises("method_options must be a dict"))
    case("attention value NaN propagates (as SDPA)",
         lambda: torch.isnan(boltzmann_attention(q, k, v * math.nan, couplings=J)).all().view(1).double(),
         Equals(lambda: torch.ones(1, dtype=DT), 0.0))


def _shared_J_expected(q, k, v, J, bias):
    field = q @ k.transpose(-1, -2) / math.sqrt(3) + bias
    return (ising.marginals(field, J[0], method="reference") + 1) / 2 @ v


def _layer_cases():
    def model():
        torch.manual_seed(0)
        return nn.Sequential(BoltzmannAttention(8, 2, max_len=4), nn.LayerNorm(8))

    def groups_ok(thunk):
        net = model()
        groups = parameter_groups(net, 0.1)
        decay, no_decay = ({id(p) for p in g["params"]} for g in groups)
        assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
        assert decay.isdisjoint(no_decay) and decay | no_decay == {id(p) for p in net.parameters()}
        attn = net[0]
        assert id(attn.couplings.weight) in no_decay and id(attn.field_bias) in no_decay
        assert id(attn.query.weight) in decay and id(net[1].weight) in no_decay

    case("parameter_groups valid", None, groups_ok)
    for bad in (-0.1, math.nan, math.inf, True, "0.1", None):
        case(f"parameter_groups weight_decay {bad!r}", lambda bad=bad: parameter_groups(model(), bad),
             Raises("weight_decay must be a finite number >= 0"))
    case("parameter_groups not a module", lambda: parameter_groups([torch.zeros(2, requires_grad=True)], 0.1),
         Raises("model must be an nn.Module"))

    def layer_weights_vs_reference(thunk):
        torch.manual_seed(1)
        layer = BoltzmannAttention(6, 2, max_len=5, coupling_init_std=0.5, causal=True).double()
        x = torch.randn(3, 5, 6, dtype=DT)
        padding = torch.tensor([[False] * 5, [False, False, False, True, True], [True] + [False] * 4])
        _, weights = layer(x, key_padding_mask=padding, need_weights=True)
        qh = layer.query(x).view(3, 5, 2, 3).transpose(1, 2)
        kh = layer.key(x).view(3, 5, 2, 3).transpose(1, 2)
        field = qh @ kh.transpose(-1, -2) / math.sqrt(3) + layer.field_bias.view(-1, 1, 1)
        visible = torch.ones(5, 5, dtype=torch.bool).tril() & ~padding[:, None, None, :]
        Jl = layer.couplings(5)[:, None]
        ref = (ising.marginals(field, Jl, mask=visible.expand(3, 2, 5, 5), method="reference") + 1) / 2 * visible
        torch.testing.assert_close(weights, ref, atol=1e-10, rtol=0)

    case("layer weights equal the reference", None, layer_weights_vs_reference)
    layer = BoltzmannAttention(8, 2, max_len=4)
    case("layer padding mask float", lambda: layer(torch.randn(2, 4, 8), key_padding_mask=torch.zeros(2, 4)),
         Raises(r"key_padding_mask must be a bool tensor of shape \(2, 4\)"))
    case("layer padding mask shape", lambda: layer(torch.randn(2, 4, 8), key_padding_mask=torch.zeros(2, 3).bool()),
         Raises("key_padding_mask must be a bool tensor"))


_ising_cases()
_option_cases()
_attention_cases()
_layer_cases()

@pytest.mark.parametrize("name", sorted(BATTERY))
def test_battery(name):
    thunk, expect = BATTERY[name]
    expect(thunk)


def test_battery_size():
    assert len(BATTERY) >= 300
