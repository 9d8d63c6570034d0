"""The layer where models are trained and served: decoding with a key/value cache (SDPA's bottom-right causal
alignment), grouped-query attention, additive float masks, half precision and autocast, meta tensors."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import symmetric_couplings, symmetric_three_body
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from boltzmann_attention import BoltzmannAttention, boltzmann_attention, ising, modes
from boltzmann_attention.naive import naive_boltzmann_attention

DT = torch.float64


def _qkv(B=2, H=2, L=6, S=6, E=4, Hkv=None, dtype=DT, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hkv = H if Hkv is None else Hkv
    return (torch.randn(B, H, L, E, dtype=dtype, generator=g), torch.randn(B, Hkv, S, E, dtype=dtype, generator=g),
            torch.randn(B, Hkv, S, 3, dtype=dtype, generator=g))


# (name, keyword arguments for a sequence of S keys): every mode of the functional form, and the window
def _mode_kwargs(name: str, S: int, H: int = 2, dtype=DT) -> dict:
    g = torch.Generator().manual_seed(7)
    J = symmetric_couplings(S, H, scale=0.6, generator=g).to(dtype)
    K = symmetric_three_body(S, H, scale=0.3, generator=g).to(dtype)
    JW = symmetric_couplings(3, H, scale=0.8, generator=g).to(dtype)
    return {
        "softmax": {"mode": "softmax"},
        "h": {"mode": "h"},
        "J": {"mode": "J", "couplings": J, "bias": -0.4},
        "h+J": {"mode": "h+J", "couplings": J, "bias": -0.3},
        "h+J banded": {"mode": "h+J", "couplings": J, "method": "banded"},
        "h+K": {"mode": "h+K", "three_body": K},
        "h+J+K": {"mode": "h+J+K", "couplings": J, "three_body": K},
        "window h+J": {"mode": "h+J", "couplings": JW, "coupling_window": 3, "bias": -0.2},
        "window J": {"mode": "J", "couplings": JW, "coupling_window": 3, "bias": 0.3},
    }[name]


MODE_NAMES = ["softmax", "h", "J", "h+J", "h+J banded", "h+K", "h+J+K", "window h+J", "window J"]


def _prefix(kwargs: dict, t: int) -> dict:
    """The couplings of the first t keys (position-indexed J and K); a window's slot-indexed J stays."""
    out = dict(kwargs)
    if "coupling_window" not in kwargs and "couplings" in kwargs:
        out["couplings"] = kwargs["couplings"][:, :t, :t]
    if "three_body" in kwargs:
        out["three_body"] = kwargs["three_body"][:, :t, :t, :t]
    return out


# --- decoding: queries that end at the last key ---------------------------------------------------------

@pytest.mark.parametrize("name", MODE_NAMES)
def test_decoding_token_by_token_equals_the_full_causal_forward(name):
    """The keys and values so far are the cache, the query is the newest position: each step is the last row
    of the full causal forward (before, a CausalBias was refused, and a bool mask aligned bottom-right gave the
    window a different answer: its slots count back from the query's position)."""
    N = 6
    q, k, v = _qkv(L=N, S=N)
    kwargs = _mode_kwargs(name, N)
    full = boltzmann_attention(q, k, v, is_causal=True, **kwargs)
    for t in range(1, N + 1):
        step = boltzmann_attention(q[:, :, t - 1:t], k[:, :, :t], v[:, :, :t], attn_mask=causal_lower_right(1, t),
                                   **_prefix(kwargs, t))
        torch.testing.assert_close(step, full[:, :, t - 1:t], atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", MODE_NAMES)
def test_a_block_of_queries_that_ends_at_the_last_key(name):
    """L = 3 queries against S = 7 keys (chunked prefill): the last 3 rows of the full forward, and the naive
    definition with the same CausalBias."""
    q, k, v = _qkv(L=7, S=7)
    kwargs = _mode_kwargs(name, 7)
    full = boltzmann_attention(q, k, v, is_causal=True, **kwargs)
    out, w = boltzmann_attention(q[:, :, 4:], k, v, attn_mask=causal_lower_right(3, 7), return_weights=True,
                                 **kwargs)
    torch.testing.assert_close(out, full[:, :, 4:], atol=1e-12, rtol=0)
    assert (w[..., 0, 5:] == 0).all() and (w[..., 1, 6:] == 0).all()  # no future key
    if name != "softmax":
        naive_kwargs = {key: value for key, value in kwargs.items() if key not in ("mode", "method")}
        if name.startswith("window J") or name == "J":
            q = torch.zeros_like(q)  # mode J: a field of the bias alone is the naive form's zero query
        _, expected = naive_boltzmann_attention(q[:, :, 4:], k, v, attn_mask=causal_lower_right(3, 7), **naive_kwargs)
        torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)


@pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")  # SDPA's softmax; not here
def test_causal_bias_variants_and_more_queries_than_keys():
    """causal_upper_left is is_causal=True; lower right with L > S: the first L - S rows see no key (zero weights
    and output, where SDPA's softmax gives NaN); a CausalBias for other sizes, or with is_causal, is refused."""
    q, k, v = _qkv(L=5, S=3)
    J = symmetric_couplings(3, 2)
    JW = symmetric_couplings(2, 2)
    for kwargs in ({"couplings": J}, {"couplings": JW, "coupling_window": 2}):
        upper = boltzmann_attention(q, k, v, attn_mask=causal_upper_left(5, 3), **kwargs)
        torch.testing.assert_close(upper, boltzmann_attention(q, k, v, is_causal=True, **kwargs), atol=0, rtol=0)
        out, w = boltzmann_attention(q, k, v, attn_mask=causal_lower_right(5, 3), return_weights=True, **kwargs)
        assert (w[:, :, :2] == 0).all() and (out[:, :, :2] == 0).all()
        _, expected = naive_boltzmann_attention(q, k, v, attn_mask=causal_lower_right(5, 3), **kwargs)
        torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"CausalBias attn_mask is for \(L, S\) = \(4, 3\)"):
        boltzmann_attention(q, k, v, couplings=J, attn_mask=causal_lower_right(4, 3))
    with pytest.raises(ValueError, match="either is_causal=True or a CausalBias"):
        boltzmann_attention(q, k, v, couplings=J, attn_mask=causal_lower_right(5, 3), is_causal=True)
    with pytest.raises(ValueError, match="coupling_window needs is_causal=True"):  # a bool mask is not causal
        boltzmann_attention(q, k, v, couplings=JW, coupling_window=2, attn_mask=torch.ones(5, 3, dtype=torch.bool))


# --- grouped-query attention ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["softmax", "h", "h+J", "h+J+K", "window h+J"])
def test_grouped_query_attention_against_the_definition(name):
    """4 query heads on 2 key/value heads (query head h reads key/value head h // 2), couplings per query head:
    the naive definition with the same enable_gqa, SDPA for softmax, and explicitly repeated keys and values."""
    q, k, v = _qkv(H=4, Hkv=2, L=5, S=5)
    kwargs = _mode_kwargs(name, 5, H=4)
    out, w = boltzmann_attention(q, k, v, is_causal=True, enable_gqa=True, return_weights=True, **kwargs)
    repeated = boltzmann_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, **kwargs)
    torch.testing.assert_close(out, repeated, atol=1e-12, rtol=0)
    assert not torch.allclose(out[:, 1], out[:, 2])  # heads 1 and 2 read different key/value heads
    if name == "softmax":
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.testing.assert_close(out, expected)
    else:
        naive_kwargs = {key: value for key, value in kwargs.items() if key not in ("mode", "method")}
        _, expected = naive_boltzmann_attention(q, k, v, is_causal=True, enable_gqa=True, **naive_kwargs)
        torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)


def test_grouped_query_attention_errors():
    q, k, v = _qkv(H=3, Hkv=2)
    with pytest.raises(ValueError, match=r"H = 3 query heads to be a multiple of key's Hkv = 2"):
        boltzmann_attention(q, k, v, mode="h", enable_gqa=True)
    q, k, v = _qkv(H=4, Hkv=2)
    with pytest.raises(ValueError, match=r"key has batch and heads \(2, 2\).*enable_gqa=True"):
        boltzmann_attention(q, k, v, mode="h")  # without enable_gqa, as SDPA
    with pytest.raises(ValueError, match=r"value has batch and heads \(2, 1\)"):
        boltzmann_attention(q, k, v[:, :1], mode="h", enable_gqa=True)
    with pytest.raises(ValueError, match=r"couplings must have shape \(H, 6, 6\) with H = 1 or 4"):
        boltzmann_attention(q, k, v, couplings=symmetric_couplings(6, 2), enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa must be True or False"):
        boltzmann_attention(q, k, v, mode="h", enable_gqa=1)


# --- additive float masks -------------------------------------------------------------------------------

def _float_mask(L=6, S=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    mask = torch.randn(2, 1, L, S, dtype=DT, generator=g)
    return mask.masked_fill(torch.rand(2, 1, L, S, generator=g) < 0.3, -math.inf)


@pytest.mark.parametrize("name", ["softmax", "h", "J", "h+J", "h+J+K", "window h+J"])
def test_float_mask_is_additive_and_minus_inf_removes_the_key(name):
    """A float attn_mask: -inf entries are absent keys (removed from the energy, weight 0: the same as a bool
    mask False), finite entries are added to the field (the same as bias); against the naive definition and
    SDPA. Before, a float mask was refused."""
    q, k, v = _qkv()
    mask = _float_mask()
    kwargs = _mode_kwargs(name, 6)
    causal = "coupling_window" in kwargs
    out, w = boltzmann_attention(q, k, v, attn_mask=mask, is_causal=causal, return_weights=True, **kwargs)
    present = mask != -math.inf
    bias = kwargs.pop("bias", 0.0) + mask.masked_fill(~present, 0.0)
    as_bool = boltzmann_attention(q, k, v, attn_mask=present, is_causal=causal, bias=bias, **kwargs)
    if name == "softmax":
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.masked_fill(~present.tril(), -math.inf)
                                                  if causal else mask)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(as_bool, expected)
        return
    torch.testing.assert_close(out, as_bool, atol=1e-12, rtol=0)
    assert (w[~present.expand_as(w)] == 0).all()
    naive_kwargs = {key: value for key, value in kwargs.items() if key not in ("mode", "method")}
    qn = torch.zeros_like(q) if kwargs["mode"] == "J" else q
    _, expected = naive_boltzmann_attention(qn, k, v, attn_mask=mask, is_causal=causal,
                                            bias=_mode_kwargs(name, 6).get("bias", 0.0), **naive_kwargs)
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)


def test_float_mask_is_not_a_clamp():
    """-inf removes a spin; a large finite negative entry only pins it down (s = -1), which the couplings feel:
    the other keys' weights differ."""
    q, k, v = _qkv(L=1, S=3)
    J = torch.tensor([[[0.0, 1.5, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]]], dtype=DT)
    absent = torch.tensor([[-math.inf, 0.0, 0.0]], dtype=DT)
    pinned = torch.tensor([[-30.0, 0.0, 0.0]], dtype=DT)
    _, w_absent = boltzmann_attention(q, k, v, couplings=J, attn_mask=absent, return_weights=True)
    _, w_pinned = boltzmann_attention(q, k, v, couplings=J, attn_mask=pinned, return_weights=True)
    h = q @ k.mT / 2.0
    torch.testing.assert_close(w_absent[..., 1], torch.sigmoid(2 * h[..., 1]), atol=1e-12, rtol=0)  # J_01 gone
    torch.testing.assert_close(w_pinned[..., 1], torch.sigmoid(2 * (h[..., 1] - 1.5)), atol=1e-12, rtol=0)
    assert (w_absent[..., 0] == 0).all()


# --- half precision and autocast -----------------------------------------------------------------------

def _rounded(x, dtype):
    return x.to(dtype) if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", MODE_NAMES)
def test_half_precision_inputs_are_computed_in_float32(name, dtype):
    """float16 and bfloat16 inputs: the result, in the input's dtype, is the float32 computation on the same
    (rounded) inputs rounded once: within half an ulp, |error| <= |x| eps / 2 (plus float16's subnormal spacing).
    Mode 'softmax' is SDPA in the input's dtype, as SDPA itself: a few ulps."""
    q, k, v = _qkv(L=6, S=6)
    kwargs = _mode_kwargs(name, 6)
    half = {key: _rounded(value, dtype) for key, value in kwargs.items()}
    single = {key: _rounded(_rounded(value, dtype), torch.float32) for key, value in kwargs.items()}
    qh, kh, vh = (x.to(dtype) for x in (q, k, v))
    out, w = boltzmann_attention(qh, kh, vh, is_causal=True, return_weights=True, **half)
    expected, expected_w = boltzmann_attention(*(x.float() for x in (qh, kh, vh)), is_causal=True,
                                               return_weights=True, **single)
    assert out.dtype == dtype and w.dtype == dtype
    eps = torch.finfo(dtype).eps
    if name == "softmax":
        torch.testing.assert_close(out.float(), expected, atol=4 * eps, rtol=eps)
        return
    torch.testing.assert_close(out.float(), expected, atol=1e-7, rtol=eps / 2)
    torch.testing.assert_close(w.float(), expected_w, atol=1e-7, rtol=eps / 2)


def test_exact_in_float16_at_sixteen_keys_matches_float64():
    """Before, float16 exact marginals at n = 16 were off by 0.1 to 0.4 (the enumeration ran in float16); now the
    error is that of rounding the result to float16 (inputs rounded first, then the float64 definition)."""
    q, k, v = _qkv(B=1, L=16, S=16, E=8, seed=5)
    J = symmetric_couplings(16, 2, scale=0.4, generator=torch.Generator().manual_seed(2))
    qh, kh, vh, Jh = (x.half() for x in (q, k, v, J))
    _, w = boltzmann_attention(qh, kh, vh, couplings=Jh, bias=-0.5, return_weights=True)
    _, expected = naive_boltzmann_attention(qh.double()[:, :, :3], kh.double(), vh.double(), Jh.double(), bias=-0.5)
    torch.testing.assert_close(w[:, :, :3].double(), expected, atol=1e-3, rtol=0)


def test_bias_couplings_and_masks_of_another_float_dtype_are_cast():
    """A float32 bias, couplings or float mask with float64 queries: cast to the computation's dtype, not refused
    (the error this replaces: 'bias must be a float or a tensor of query's dtype')."""
    q, k, v = _qkv()
    J = symmetric_couplings(6, 2, scale=0.5)
    bias = torch.full((2, 1, 1), -0.25)
    mask = _float_mask().float()
    out = boltzmann_attention(q, k, v, couplings=J.float(), bias=bias, attn_mask=mask)
    expected = boltzmann_attention(q, k, v, couplings=J.float().double(), bias=bias.double(), attn_mask=mask.double())
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    assert out.dtype == DT


@pytest.mark.parametrize("name", MODE_NAMES)
def test_functional_form_under_autocast_takes_inputs_of_mixed_dtypes(name):
    """Under autocast every input is taken in autocast's dtype first, as SDPA does (a model's RoPE can hand over
    float32 q and k beside a bfloat16 v); the result is in autocast's dtype."""
    q, k, v = _qkv(dtype=torch.float32)
    kwargs = _mode_kwargs(name, 6, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = boltzmann_attention(q, k, v.bfloat16(), is_causal=True, **kwargs)
        same = boltzmann_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True, **kwargs)
    assert mixed.dtype == torch.bfloat16
    torch.testing.assert_close(mixed, same, atol=0, rtol=0)


LAYER_CONFIGS = {
    "softmax": {"mode": "softmax"},
    "h": {"mode": "h"},
    "J": {"mode": "J"},
    "h+J exact": {"mode": "h+J"},
    "h+J relative banded": {"mode": "h+J", "coupling": "relative", "coupling_range": 3, "method": "banded"},
    "h+J relative meanfield": {"mode": "h+J", "coupling": "relative", "coupling_range": 3, "method": "meanfield"},
    "h+K": {"mode": "h+K"},
    "window": {"mode": "h+J", "coupling": "window", "coupling_window": 3},
    "fox": {"mode": "fox"},
    "stickbreaking": {"mode": "stickbreaking"},
    "mta": {"mode": "mta"},
    "h+J rope": {"mode": "h+J", "position": "rope"},
    "softmax alibi": {"mode": "softmax", "position": "alibi"},
    "h slot_bias": {"mode": "h", "slot_bias": 3},
}


def _with_init(options: dict) -> dict:
    """The options with couplings initialised at std 0.3 where the mode has couplings (the others refuse it)."""
    uses = modes.RECORDS[options.get("mode", "h+J")].marginals
    return {**options, "coupling_init_std": 0.3} if uses else dict(options)


@pytest.mark.parametrize("config", sorted(LAYER_CONFIGS))
def test_module_under_autocast_and_in_half_precision(config):
    """The module under torch.autocast('cpu', bfloat16) (before: 'bias must be a float or a tensor of query's
    dtype'), and the module cast to bfloat16 and float16: the output in the low dtype, within the rounding of
    the low-precision projections of the float32 module's output (|out| is about 1 here)."""
    torch.manual_seed(0)
    layer = BoltzmannAttention(16, 2, max_len=8, **_with_init(LAYER_CONFIGS[config]))
    x = torch.randn(2, 8, 16)
    expected = layer(x)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, w = layer(x, need_weights=True)
    assert out.dtype == torch.bfloat16 and w.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=0.03, rtol=0.03)
    out.float().sum().backward()
    grads = [p.grad.clone() for p in layer.parameters() if p.requires_grad]
    layer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the backward inside the block too, as many loops do
        layer(x)[0].float().sum().backward()
    for before, p in zip(grads, (p for p in layer.parameters() if p.requires_grad)):  # the projections' backward
        torch.testing.assert_close(p.grad, before, rtol=0.05, atol=0.05)  # run in bf16
    for dtype, tol in ((torch.bfloat16, 0.03), (torch.float16, 0.005)):
        low = BoltzmannAttention(16, 2, max_len=8, **_with_init(LAYER_CONFIGS[config]))
        low.load_state_dict(layer.state_dict())
        low = low.to(dtype)
        out = low(x.to(dtype))[0]
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


# --- meta tensors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODE_NAMES)
def test_functional_form_on_meta_tensors(name):
    """Shapes and dtypes without data (before: the value checks called .item() on meta tensors)."""
    q, k, v = (x.to("meta") for x in _qkv(L=5, S=6))
    kwargs = {key: value.to("meta") if isinstance(value, torch.Tensor) else value
              for key, value in _mode_kwargs(name, 6).items()}
    out, w = boltzmann_attention(q, k, v, attn_mask=causal_lower_right(5, 6), return_weights=True, **kwargs)
    assert out.shape == (2, 2, 5, 3) and w.shape == (2, 2, 5, 6) and out.device.type == "meta"


@pytest.mark.parametrize("config", sorted(LAYER_CONFIGS))
def test_module_on_meta_tensors(config):
    with torch.device("meta"):
        layer = BoltzmannAttention(16, 2, max_len=8, **_with_init(LAYER_CONFIGS[config]))
        x = torch.randn(2, 8, 16)
    out, w = layer(x, need_weights=True)
    assert out.shape == (2, 8, 16) and w.shape == (2, 2, 8, 8) and out.device.type == "meta"
    out.sum().backward()


@pytest.mark.parametrize("method", sorted(ising.METHODS))
@pytest.mark.parametrize("on_meta", ["h", "J", "h and J"])
def test_the_marginals_refuse_meta_tensors_by_name(method, on_meta):
    """ising computes values, which meta tensors do not have: a ValueError naming them, not torch's own error
    from inside a solver."""
    h, J = torch.zeros(3, 5), torch.zeros(5, 5)
    h, J = (x.to("meta") if name in on_meta.split(" and ") else x for name, x in (("h", h), ("J", J)))
    with pytest.raises(ValueError, match=f"^{on_meta} (is a meta tensor|are meta tensors) .*pass tensors on a real"):
        ising.marginals(h, J, method=method)
    if method not in ising.SAMPLED_METHODS:
        with pytest.raises(ValueError, match=f"^{on_meta} (is a meta tensor|are meta tensors)"):
            ising.log_partition(h, J, method=method)


# --- torch.compile ----------------------------------------------------------------------------------------

class TinyGPT(torch.nn.Module):
    """Two pre-LN attention blocks between an embedding and a head: enough of a model to compile."""

    def __init__(self, **layer):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 16)
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(16) for _ in range(2)])
        self.blocks = torch.nn.ModuleList([BoltzmannAttention(16, 2, max_len=8, **_with_init(layer))
                                           for _ in range(2)])
        self.head = torch.nn.Linear(16, 11)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, block in zip(self.norms, self.blocks):
            x = x + block(norm(x))[0]
        return self.head(x)


COMPILED_MODES = {
    "softmax": {"mode": "softmax"},
    "h": {"mode": "h"},
    "h+J exact": {"mode": "h+J", "method": "exact"},
    "window": {"mode": "h+J", "coupling": "window", "coupling_window": 3},
    "window configurations": {"mode": "h+J", "coupling": "window", "coupling_window": 3,
                              "method_options": {"window_path": "configurations"}},
    "h+J configurations": {"mode": "h+J", "method": "configurations"},
    "keys exact": {"mode": "h+J", "coupling": "keys", "coupling_rank": 4, "method": "exact"},
    "keys chain chunked": {"mode": "h+J", "coupling": "keys", "coupling_rank": 4, "method": "chain",
                           "method_options": {"chunk_length": 3}},
}


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(COMPILED_MODES))
def test_a_small_model_compiles_in_one_graph_and_trains_as_in_eager(config):
    """torch.compile(fullgraph=True) of a two-layer model, causal, T = 8: no graph break (torch._dynamo.explain),
    and the loss and every gradient of a training step equal eager's (float32 reassociation only). Before, the
    value checks (.item()), the mask planner and the float64 rescue of method 'exact' broke the graph; they now
    run eagerly inside one opaque operator (ising/opaque.py)."""
    import copy

    torch.manual_seed(0)
    model = TinyGPT(**COMPILED_MODES[config])
    tokens = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:  # nothing the compiler must guess at, such as a cache
        warnings.simplefilter("always")
        explanation = torch._dynamo.explain(model)(tokens)
        compiled_model = copy.deepcopy(model)
        compiled = torch.compile(compiled_model, fullgraph=True)
        for run in (model, compiled):
            run(tokens).square().mean().backward()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert not [w for w in caught if "Dynamo" in str(w.message)], [str(w.message) for w in caught]
    torch.testing.assert_close(compiled(tokens), model(tokens), atol=2e-6, rtol=2e-6)
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=2e-6, rtol=2e-5, msg=name)


def test_compiled_exact_keeps_the_float64_rescue(monkeypatch):
    """Fields of ~1e4 in float32 exceed the float32 energy scale, so method 'exact' solves those rows in float64
    (counted here); the compiled function (the same opaque solver) returns the same numbers, not float32's."""
    from boltzmann_attention.ising import split

    rescued = []
    fallback = split.float64_fallback
    monkeypatch.setattr(split, "float64_fallback", lambda m, logz, ok, *rest: rescued.append(int((~ok).sum()))
                        or fallback(m, logz, ok, *rest))
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 6, 4, generator=g) for _ in range(3))
    q = q * 1e4
    J = symmetric_couplings(6, 1, scale=30.0, generator=g).float()

    def attend(q, k, v, J):
        return boltzmann_attention(q, k, v, couplings=J, is_causal=True, return_weights=True)[1]

    eager = attend(q, k, v, J)
    assert rescued and rescued[0] > 0
    compiled = torch.compile(attend, fullgraph=True)(q, k, v, J)
    assert len(rescued) == 2 and rescued[1] == rescued[0]
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)
    _, expected = naive_boltzmann_attention(q.double(), k.double(), v.double(), J.double(), is_causal=True)
    torch.testing.assert_close(compiled.double(), expected, atol=1e-5, rtol=0)


def test_opaque_operators_pass_opcheck():
    """The fake (shape) functions, schemas and autograd registrations of the opaque solvers agree with the
    eager ones (torch.library.opcheck), with a mask, couplings broadcast over queries, and the window."""
    from boltzmann_attention.ising import exact, window

    g = torch.Generator().manual_seed(5)
    h = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    J = symmetric_couplings(5, 2, generator=g).float()[:, None].requires_grad_()
    mask = torch.rand(2, 3, 5, generator=g) > 0.3
    torch.library.opcheck(exact.exact_marginals, (h, J, None, mask, 24, True, None))
    torch.library.opcheck(exact.exact_marginals, (h, J, None, None, 24, False, "test: no mask"))
    JW = symmetric_couplings(3, 2, generator=g).float()[:, None].requires_grad_()
    for path in window.PATHS:
        torch.library.opcheck(window.window_marginals, (h[..., :3], JW, mask[..., :3], None, path))
        torch.library.opcheck(window.window_marginals, (h[..., :3], JW, None, None, path))
    # the kept variants return a fresh token each call, so the check that compares two calls' outputs does not
    # apply; the compiled tests here run them under AOT autograd against eager's gradients
    kept = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(exact.exact_marginals_kept, (h, J, None, mask, 24, True, None), test_utils=kept)
    for path in window.PATHS:
        torch.library.opcheck(window.window_marginals_kept, (h[..., :3], JW, mask[..., :3], None, path),
                              test_utils=kept)


@pytest.mark.parametrize("config", ["h+J exact", "window"])
def test_a_compiled_training_step_solves_once_as_eager_does(config, monkeypatch):
    """The compiled step's backward differentiates the graph its forward kept (ising/opaque.py), so the solver
    runs once per layer and step, as in eager, and the kept graphs are released: none is left after the step,
    nor after a forward whose graph is dropped without a backward. Without its kept graph the backward
    recomputes, to the same gradients."""
    from boltzmann_attention.ising import exact, opaque, window

    module = exact if config == "h+J exact" else window
    solves = []
    solver = module.marginals
    monkeypatch.setattr(module, "marginals", lambda *a, **k: solves.append(1) or solver(*a, **k))
    torch.manual_seed(0)
    model = TinyGPT(**COMPILED_MODES[config])
    compiled = torch.compile(model, fullgraph=True)
    tokens = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    compiled(tokens).square().mean().backward()  # the first step compiles
    grads = []
    for keep in (True, False):
        model.zero_grad()
        solves.clear()
        loss = compiled(tokens).square().mean()
        forward = len(solves)
        assert forward >= 2  # both layers (the window solves its partial and full rows apart)
        if not keep:
            opaque._KEPT.clear()
        loss.backward()
        assert len(solves) == forward * (1 if keep else 2) and not opaque._KEPT
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    out = compiled(tokens)
    assert opaque._KEPT  # kept for a backward ...
    del out
    assert not opaque._KEPT  # ... and released with the dropped graph


@pytest.mark.parametrize("config", sorted(LAYER_CONFIGS))
def test_module_decodes_with_a_cache_as_the_full_forward(config):
    """The module with a cache: a prompt of 3 tokens, then one token at a time, then a block of 2: every output
    row equals the full causal forward's (positions of rope, ALiBi and the slot bias, the window's slots, the
    forget gates and position-indexed couplings all count from the cached keys)."""
    torch.manual_seed(0)
    layer = BoltzmannAttention(16, 2, max_len=8, **_with_init(LAYER_CONFIGS[config])).double()
    with torch.no_grad():
        for p in layer.parameters():  # away from zero: every term of the field matters
            p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(2, 8, 16, dtype=DT)
    full, full_w = layer(x, need_weights=True)
    cache = {}
    pieces = [layer(x[:, :3], cache=cache)[0]]
    pieces += [layer(x[:, t:t + 1], cache=cache)[0] for t in range(3, 6)]
    out, w = layer(x[:, 6:], cache=cache, need_weights=True)
    tol = 1e-5 if "meanfield" in config else 1e-12  # a fixed point solved to tol 1e-6 over other row blocks
    torch.testing.assert_close(torch.cat(pieces + [out], dim=1), full, atol=tol, rtol=0)
    torch.testing.assert_close(w, full_w[:, :, 6:], atol=tol, rtol=0)
    assert cache["value"].shape == (2, 2, 8, 8)
    with pytest.raises(ValueError, match="cache must be a dict"):
        layer(x, cache=[])


@pytest.mark.parametrize("config", ["h+J exact", "h+K", "window"])
def test_module_refuses_couplings_that_are_not_finite(config):
    """The module's couplings are symmetric with a zero diagonal by construction, so a forward checks only their
    values, in the one reduction of the field's check: a NaN parameter is named, never solved."""
    layer = BoltzmannAttention(16, 2, max_len=8, **LAYER_CONFIGS[config])
    couplings = layer.couplings if layer.couplings is not None else layer.three_body
    with torch.no_grad():
        couplings.weight[0].view(-1)[1] = math.nan
    name = "K" if config == "h+K" else "J"
    with pytest.raises(ValueError, match=f"the couplings {name} contains NaN or inf"):
        layer(torch.randn(2, 8, 16))


@pytest.mark.parametrize("config", ["h+J exact", "window"])
def test_module_decodes_a_padded_batch_with_a_cache(config):
    """Left padding in a batch decoded with a cache: key_padding_mask covers every position so far (B, S), and
    the rows equal the full forward with the same mask."""
    torch.manual_seed(0)
    layer = BoltzmannAttention(16, 2, max_len=8, **_with_init(LAYER_CONFIGS[config])).double()
    x = torch.randn(2, 6, 16, dtype=DT)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :2] = True
    full = layer(x, key_padding_mask=pad)[0]
    cache = {}
    outs = [layer(x[:, :3], key_padding_mask=pad[:, :3], cache=cache)[0]]
    outs += [layer(x[:, t:t + 1], key_padding_mask=pad[:, :t + 1], cache=cache)[0] for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 7\)"):
        layer(x[:, :1], key_padding_mask=pad[:, :1], cache=cache)
