"""Boltzmann attention in transformers models: against an independent sigmoid attention, the library's
functional form, the full forward (KV-cache decoding), unpadded sequences (padding), a save/load round trip,
and the refused options. Tiny random models in float64; nothing is downloaded."""

import copy
import importlib.util
import inspect
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AttentionInterface, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402

from boltzmann_attention import boltzmann_attention, ising, parameter_groups  # noqa: E402
from boltzmann_attention.integrations import transformers as bt  # noqa: E402

# a mean field that stops short of tol would make the comparisons below meaningless
pytestmark = pytest.mark.filterwarnings("error::boltzmann_attention.ising.meanfield.ConvergenceWarning")

VOCAB = 50
BIAS = -0.75  # field bias of the converted models (field_bias_init) and of the hand-written sigmoid attention


def gpt2(max_len=32):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=max_len, vocab_size=VOCAB, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config).double().eval()


def llama(max_len=32):  # grouped-query: 4 query heads, 2 key/value heads
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=max_len, bos_token_id=0,
                         eos_token_id=0)
    return LlamaForCausalLM(config).double().eval()


MODELS = {"gpt2": gpt2, "llama": llama}
# the cache's keyword: `cache` in recent transformers, `past_key_values` before
CACHE = "cache" if "cache" in inspect.signature(GPT2LMHeadModel.forward).parameters else "past_key_values"
WINDOW = {"mode": "h+J", "coupling": "window", "coupling_window": 4}
RELATIVE_BANDED = {"mode": "h+J", "coupling": "relative", "coupling_range": 3, "method": "banded"}
RELATIVE_MEANFIELD = {"mode": "h+J", "coupling": "relative", "coupling_range": 3, "method": "meanfield",
                      "method_options": {"tol": 1e-12, "max_iter": 2000, "damping": 0.2}}
FULL = {"mode": "h+J", "coupling": "full", "method": "exact"}  # needs max_len <= 24
COUPLINGS_ONLY = {"mode": "J", "coupling": "relative", "coupling_range": 3, "method": "banded"}  # no QK field


def converted(name, options, init_std=None, max_len=None):
    """A converted tiny model with nonzero couplings (init_std) and a field bias of BIAS."""
    if init_std is None:  # mean field: couplings weak enough that every row converges to tol
        init_std = 0.15 if options.get("method") == "meanfield" else 0.3
    max_len = max_len or (16 if options.get("coupling") == "full" else 32)
    model = MODELS[name](max_len)
    torch.manual_seed(1)
    return bt.convert(model, field_bias_init=BIAS, coupling_init_std=init_std if "J" in options["mode"] else 0.0,
                      **options)


def ids(batch=2, length=10, seed=2):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- an independent sigmoid attention: weights sigmoid(2 (scaling q.k + BIAS)) on the visible keys ---------------

def sigmoid_reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    L, S = query.shape[-2], key.shape[-2]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling  # GPT-2 before transformers 5 passes none
    if attention_mask is None:  # causal, the L queries being the last L positions
        visible = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)
    else:
        visible = attention_mask
    weights = torch.sigmoid(2 * (scaling * query @ key.transpose(-1, -2) + BIAS)) * visible
    return (weights @ value).transpose(1, 2), weights


AttentionInterface.register("sigmoid_reference", sigmoid_reference)
AttentionMaskInterface.register("sigmoid_reference", sdpa_mask)


def padded_batch():
    """Two sequences of 7 and 10 tokens, left-padded to 10: ids, attention_mask, position_ids."""
    a, b = ids(1, 7, seed=3), ids(1, 10, seed=4)
    batch = torch.cat([F.pad(a, (3, 0), value=0), b])
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    return [a, b], batch, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("options", [{"mode": "h"}, WINDOW, RELATIVE_BANDED, FULL], ids=["h", "window", "relative",
                                                                                         "full"])
def test_zero_couplings_is_sigmoid_attention(name, options):
    model = converted(name, options, init_std=0.0)  # mode h+J with J = 0 (or mode h)
    reference = MODELS[name](16 if options.get("coupling") == "full" else 32)
    reference.set_attn_implementation("sigmoid_reference")
    x = ids()
    torch.testing.assert_close(model(x).logits, reference(x).logits, rtol=0, atol=1e-10)
    _, batch, mask, _ = padded_batch()
    torch.testing.assert_close(model(batch, attention_mask=mask).logits,
                               reference(batch, attention_mask=mask).logits, rtol=0, atol=1e-10)
    softmax = MODELS[name](16 if options.get("coupling") == "full" else 32)
    assert not torch.allclose(model(x).logits, softmax(x).logits, atol=1e-3)  # it is not softmax any more


def _capture(model):
    """Record each attention call's inputs and output under another registered name."""
    calls = []

    def capture(module, query, key, value, attention_mask, **kwargs):
        out = bt.attention_forward(module, query, key, value, attention_mask, **kwargs)
        calls.append((module, query, key, value, attention_mask, kwargs.get("scaling"), out[0]))
        return out

    AttentionInterface.register("boltzmann_capture", capture)
    AttentionMaskInterface.register("boltzmann_capture", sdpa_mask)
    model.set_attn_implementation("boltzmann_capture")
    return calls


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("options", [WINDOW, RELATIVE_BANDED, RELATIVE_MEANFIELD, FULL, COUPLINGS_ONLY],
                         ids=["window", "relative-banded", "relative-meanfield", "full", "J"])
def test_layer_equals_the_functional_form(name, options):
    model = converted(name, options)
    calls = _capture(model)
    model(ids())
    assert len(calls) == 2
    module, q, k, v, mask, scaling, out = calls[1]
    params = module.boltzmann
    J = params.couplings_for(k.shape[-2], q.dtype)
    assert (J.profile if isinstance(J, ising.toeplitz.Toeplitz) else J).abs().max() > 0.05  # really coupled
    groups = q.shape[1] // k.shape[1]
    expected = boltzmann_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), couplings=J,
                                   mode=params.mode, method=params.method, method_options=params.method_options,
                                   is_causal=True, scale=scaling, bias=params.field_bias.view(-1, 1, 1),
                                   coupling_window=params.coupling_window)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-12)
    sigmoid = boltzmann_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), mode="h",
                                  is_causal=True, scale=scaling, bias=params.field_bias.view(-1, 1, 1))
    assert (out - sigmoid.transpose(1, 2)).abs().max() > 1e-4  # the couplings change the output


CACHE_CASES = [{"mode": "h"}, RELATIVE_BANDED, RELATIVE_MEANFIELD, WINDOW, FULL, COUPLINGS_ONLY]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("options", CACHE_CASES, ids=["h", "relative-banded", "relative-meanfield", "window", "full",
                                                      "J"])
def test_cached_decoding_equals_the_full_forward(name, options):
    model = converted(name, options)
    x = ids(length=12)
    full = model(x).logits
    out = model(x[:, :5], use_cache=True)
    steps = [out.logits]
    out = model(x[:, 5:7], **{CACHE: out.past_key_values}, use_cache=True)  # two queries on 7 keys
    steps.append(out.logits)
    for t in range(7, 12):
        out = model(x[:, t:t + 1], **{CACHE: out.past_key_values}, use_cache=True)
        steps.append(out.logits)
    tolerance = 1e-9 if options.get("method") == "meanfield" else 1e-10
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=tolerance)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("options", [{"mode": "h"}, RELATIVE_BANDED, WINDOW], ids=["h", "relative", "window"])
def test_left_padding_gives_the_unpadded_logits(name, options):
    model = converted(name, options)
    (a, b), batch, mask, positions = padded_batch()
    padded = model(batch, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(padded[0, 3:], model(a).logits[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(padded[1], model(b).logits[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MODELS)
def test_padded_generation_with_the_cache(name):
    model = converted(name, WINDOW)
    (a, _), batch, mask, positions = padded_batch()
    with_cache = model(batch, attention_mask=mask, position_ids=positions, use_cache=True)
    nxt = ids(2, 1, seed=5)
    mask2 = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
    step = model(nxt, attention_mask=mask2, position_ids=positions[:, -1:] + 1,
                 **{CACHE: with_cache.past_key_values}, use_cache=True).logits
    alone = model(torch.cat([a, nxt[:1]], dim=1)).logits[0, -1]
    torch.testing.assert_close(step[0, -1], alone, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("options", [WINDOW, RELATIVE_MEANFIELD, FULL], ids=["window", "relative", "full"])
def test_save_and_load_round_trip(name, options, tmp_path):
    model = converted(name, options)
    with torch.no_grad():
        for _, module in bt.attention_modules(model):
            module.boltzmann.field_bias.copy_(torch.linspace(-1.0, 0.5, module.boltzmann.num_heads))
    model.save_pretrained(tmp_path)
    loaded = bt.from_pretrained(type(model), tmp_path, dtype=torch.float64).eval()
    assert loaded.config._attn_implementation == "boltzmann"
    assert loaded.config.boltzmann_attention == model.config.boltzmann_attention
    original = {k: v for k, v in model.state_dict().items() if ".boltzmann." in k}
    restored = {k: v for k, v in loaded.state_dict().items() if ".boltzmann." in k}
    assert original.keys() == restored.keys() and len(original) >= 4  # couplings and field bias, 2 layers
    for key, value in original.items():
        torch.testing.assert_close(restored[key], value, rtol=0, atol=0)
    x = ids()
    torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=1e-12)
    marked = [p for _, m in bt.attention_modules(loaded) for p in m.boltzmann.parameters()]
    assert all(getattr(p, "_no_weight_decay", False) for p in marked)
    no_decay = parameter_groups(loaded, weight_decay=0.1)[1]["params"]
    assert all(any(p is q for q in no_decay) for p in marked)


def test_loading_an_unconverted_checkpoint_is_refused(tmp_path):
    gpt2().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds no Boltzmann attention options"):
        bt.from_pretrained(GPT2LMHeadModel, tmp_path)


@pytest.mark.parametrize("options, message", [
    ({"mode": "h+J", "coupling": "full"},
     r"max_len \(the model's max_position_embeddings\) = 32 is beyond the limit of method 'exact', 24 spins per "
     r"query.*coupling='window'.*mode='h'"),
    ({"mode": "h+J", "coupling": "relative", "method": "exact"}, r"limit of method 'exact', 24 spins"),
    ({"mode": "h+J", "coupling": "relative", "method": "banded"},
     r"coupling range w = 31 \(max_len .* - 1, the default\), beyond its max_bandwidth 16"),
    ({"mode": "h+J", "coupling": "full", "method": "banded"}, r"no band"),
    ({"mode": "softmax"}, r"'sdpa' or 'eager'"),
    ({"mode": "h+J+K"}, r"three-body"),
    ({"mode": "sigmoid"}, r"unknown mode"),
    ({"windw": 4}, r"unknown option\(s\) \['windw'\]"),
    ({"coupling": "relative", "coupling_range": 3, "method": "banded", "coupling_window": 4},
     r"coupling_window=W go together"),
    ({"coupling": "window", "coupling_window": 30}, r"W <= 24"),
    ({"mode": "h+J", "method": "nope"}, r"unknown method 'nope'"),
    ({"mode": "h+J", "coupling": "keys", "coupling_range": 3, "method": "chain"}, r"BoltzmannAttention only"),
    ({"mode": "h", "coupling": "window", "coupling_window": 4},
     r"mode 'h' does not use \['coupling', 'coupling_window'\] .* would be ignored"),
    ({"mode": "h+J", "coupling": "relative", "method": "meanfield", "method_options": {"tolerance": 1}},
     r"unknown option\(s\) \['tolerance'\]"),
    ({"mode": "h+J", "coupling": "relative", "method": "meanfield", "method_options": {"x": object()}},
     r"JSON-serialisable"),
])
def test_bad_options_are_refused_before_any_change(options, message):
    model = gpt2()
    with pytest.raises(ValueError, match=message):
        bt.convert(model, **options)
    assert model.config._attn_implementation != "boltzmann"
    assert not hasattr(model.config, "boltzmann_attention")
    assert not any(hasattr(m, "boltzmann") for _, m in bt.attention_modules(model))


def test_converting_twice_and_running_unconverted_are_refused():
    model = bt.convert(gpt2(), mode="h")
    with pytest.raises(ValueError, match="already converted"):
        bt.convert(model, mode="h")
    bare = gpt2()
    bare.set_attn_implementation("boltzmann")
    with pytest.raises(ValueError, match="has no Boltzmann parameters"):
        bare(ids())


# --- the attention function itself: masks, dropout, weights ----------------------------------------------------

class _Module(torch.nn.Module):
    def __init__(self, options, heads=4, max_len=16):
        super().__init__()
        torch.manual_seed(3)
        init = {"coupling_init_std": 0.3} if "J" in options["mode"] else {}
        self.boltzmann = bt.BoltzmannParameters(heads, max_len, bt.with_defaults({**init, **options})).double()
        self.is_causal = True


def _qkv(L=6, S=6, heads=4, kv_heads=2):
    g = torch.Generator().manual_seed(4)
    return (torch.randn(2, heads, L, 8, generator=g, dtype=torch.float64),
            torch.randn(2, kv_heads, S, 8, generator=g, dtype=torch.float64),
            torch.randn(2, kv_heads, S, 8, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("options", [{"mode": "h"}, FULL, WINDOW], ids=["h", "full", "window"])
def test_float_masks_mark_absent_keys_and_shift_the_field(options):
    module = _Module(options)
    q, k, v = _qkv()
    present = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    present[0, :, :, 1] = False
    shift = 0.3 * torch.randn(2, 1, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    additive = shift.masked_fill(~present, torch.finfo(torch.float64).min)
    additive[1, 0, 0, 3] = -math.inf  # -inf is absent too (a key that is above the diagonal anyway)
    out, _ = bt.attention_forward(module, q, k, v, additive, scaling=0.4)
    params = module.boltzmann
    expected = boltzmann_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                   couplings=params.couplings_for(6, q.dtype), mode=params.mode, method=params.method,
                                   is_causal=True, attn_mask=present, scale=0.4,
                                   bias=params.field_bias.view(-1, 1, 1) + shift.masked_fill(~present, 0.0),
                                   coupling_window=params.coupling_window)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-12)
    bool_out, _ = bt.attention_forward(module, q, k, v, present, scaling=0.4)
    zero_shift, _ = bt.attention_forward(module, q, k, v, additive.masked_fill(present, 0.0), scaling=0.4)
    torch.testing.assert_close(zero_shift, bool_out, rtol=0, atol=0)  # an all-zero shift is the bool mask
    assert (bool_out - out).abs().max() > 1e-4
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        bt.attention_forward(module, q, k, v, additive.masked_fill(present, math.nan), scaling=0.4)


@pytest.mark.parametrize("mode", ["h+J", "J"])
def test_window_decoding_rows_equal_the_last_rows_of_a_full_call(mode):
    module = _Module({**WINDOW, "mode": mode})
    module.eval()
    L, S = 2, 9  # the queries sit at slots 7 and 8: keys 0 .. 3 come before both windows (W = 4)
    q, k, v = _qkv(L=L, S=S)
    present = torch.ones(S, S, dtype=torch.bool).tril().expand(2, 1, S, S).clone()
    present[0, :, :, :2] = False  # left padding of the first sequence
    present[1, :, :, 5] = False   # an absent key inside the window
    shift = 0.3 * torch.randn(2, 1, S, S, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    additive = shift.masked_fill(~present, torch.finfo(torch.float64).min)
    out, weights = bt.attention_forward(module, q, k, v, additive[..., S - L:, :], scaling=0.4,
                                        output_attentions=True)
    params = module.boltzmann
    full_q = torch.cat([torch.zeros(2, 4, S - L, 8, dtype=torch.float64), q], dim=-2)  # rows 0 .. 6: placeholders
    expected, expected_weights = boltzmann_attention(
        full_q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), couplings=params.couplings_for(S, q.dtype),
        mode=mode, is_causal=True, attn_mask=present, scale=0.4, return_weights=True,
        bias=params.field_bias.view(-1, 1, 1) + shift.masked_fill(~present, 0.0), coupling_window=4)
    torch.testing.assert_close(out, expected[..., S - L:, :].transpose(1, 2), rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, expected_weights[..., S - L:, :], rtol=0, atol=1e-12)
    assert (weights[0, ..., :2] == 0).all() and (weights[1, ..., 5] == 0).all() and (weights[..., :4] > 0).any()


def test_window_refuses_a_mask_that_sees_later_keys():
    module = _Module(WINDOW)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="lets a .*query see a later key"):
        bt.attention_forward(module, q, k, v, torch.ones(2, 1, 6, 6, dtype=torch.bool))


@pytest.mark.parametrize("options", [FULL, WINDOW], ids=["full", "window"])
def test_dropout_applies_to_the_weights_in_training(options):
    module = _Module(options)
    q, k, v = _qkv(L=3, S=6)  # decoding-shaped: the 3 queries are the last 3 of 6 positions
    visible = torch.ones(3, 6, dtype=torch.bool).tril(3)
    mask = visible.expand(2, 1, 3, 6)
    module.eval()
    out, weights = bt.attention_forward(module, q, k, v, mask, dropout=0.5, output_attentions=True)  # eval: no dropout
    assert (weights[..., ~visible] == 0).all() and (weights[..., visible] > 0).all()
    module.train()
    torch.manual_seed(7)
    dropped, dropped_weights = bt.attention_forward(module, q, k, v, mask, dropout=0.5, output_attentions=True)
    torch.manual_seed(7)
    expected = F.dropout(weights, p=0.5, training=True)
    torch.testing.assert_close(dropped_weights, expected, rtol=0, atol=0)
    torch.testing.assert_close(dropped, (expected @ v.repeat_interleave(2, 1)).transpose(1, 2), rtol=0, atol=1e-12)


@pytest.mark.parametrize("options", [FULL, WINDOW], ids=["full", "window"])
def test_no_mask_follows_sdpa_in_transformers(options):
    module = _Module(options)
    q, k, v = _qkv(L=1, S=6)  # one query: the last position, sees every key
    _, weights = bt.attention_forward(module, q, k, v, None, output_attentions=True)
    _, masked = bt.attention_forward(module, q, k, v, torch.ones(2, 1, 1, 6, dtype=torch.bool),
                                     output_attentions=True)
    assert (weights > 0).all()
    torch.testing.assert_close(weights, masked, rtol=0, atol=1e-12)  # the window's masked and unmasked paths
    q, k, v = _qkv(L=3, S=6)  # the prefill of an empty static cache: top-left, the later slots cut off
    out, weights = bt.attention_forward(module, q, k, v, None, output_attentions=True)
    alone, alone_weights = bt.attention_forward(module, q, k[..., :3, :], v[..., :3, :], None,
                                                output_attentions=True)
    torch.testing.assert_close(out, alone, rtol=0, atol=0)
    assert (weights[..., 3:] == 0).all() and weights.shape[-1] == 6
    torch.testing.assert_close(weights[..., :3], alone_weights, rtol=0, atol=0)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("options", [WINDOW, FULL, RELATIVE_BANDED], ids=["window", "full", "relative"])
def test_static_cache_generation_equals_the_dynamic_one(name, options):
    model = converted(name, options)
    x, mask = ids(2, 4), torch.ones(2, 4, dtype=torch.long)
    settings = {"max_new_tokens": 6, "do_sample": False, "attention_mask": mask, "pad_token_id": 0,
                "output_logits": True, "return_dict_in_generate": True}
    dynamic = model.generate(x, **settings)
    static = model.generate(x, cache_implementation="static", **settings)
    assert torch.equal(static.sequences, dynamic.sequences)
    full = model(dynamic.sequences).logits[:, 3:-1].float()  # generate() hands out float32 logits
    torch.testing.assert_close(torch.stack(dynamic.logits, 1), full, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.stack(static.logits, 1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("options", [{"mode": "h"}, RELATIVE_BANDED], ids=["h", "relative"])
def test_output_attentions_returns_the_weights(options):
    model = converted("llama", options)
    attentions = model(ids(), output_attentions=True).attentions
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 10, 10)
    assert (attentions[0].sum(-1) > 0).all() and (attentions[0].triu(1) == 0).all()


def test_the_couplings_learn():
    for options in (WINDOW, RELATIVE_BANDED):
        model = converted("gpt2", options).train()
        x = ids()
        F.cross_entropy(model(x).logits[:, :-1].flatten(0, 1), x[:, 1:].flatten()).backward()
        for _, module in bt.attention_modules(model):
            assert module.boltzmann.couplings.weight.grad.abs().max() > 0
            assert module.boltzmann.field_bias.grad.abs().max() > 0


def test_the_shakespeare_example_runs_quickly(capsys):
    path = Path(__file__).resolve().parents[1] / "examples" / "transformers_shakespeare.py"
    spec = importlib.util.spec_from_file_location("transformers_shakespeare", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(["--quick"])
    printed = capsys.readouterr().out
    assert "loss" in printed and "sample:" in printed


def test_copying_a_converted_model_keeps_its_parameters():
    model = converted("gpt2", WINDOW)
    twin = copy.deepcopy(model)
    x = ids()
    torch.testing.assert_close(twin(x).logits, model(x).logits, rtol=0, atol=0)


def test_the_defaults_convert_a_model_of_real_length():
    """GPT-2's 1024 positions: the default couplings are a coupled window of 16 keys (full couplings stop at 24
    positions), and a mode without couplings stores none."""
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
    assert config.n_positions == 1024
    model = bt.convert(GPT2LMHeadModel(config))
    stored = model.config.boltzmann_attention
    assert (stored["mode"], stored["coupling"], stored["coupling_window"]) == ("h+J", "window", bt.WINDOW)
    assert torch.isfinite(model(torch.randint(0, VOCAB, (1, 40))).logits).all()
    stored = bt.convert(GPT2LMHeadModel(config), mode="h").config.boltzmann_attention
    assert (stored["coupling"], stored["coupling_window"]) == ("full", None)
    stored = bt.convert(GPT2LMHeadModel(config), coupling="relative", coupling_range=4,
                        method="banded").config.boltzmann_attention
    assert stored["coupling_window"] is None


@pytest.mark.slow
def test_the_class_own_from_pretrained_cannot_give_a_softmax_model(tmp_path):
    """A converted checkpoint records attn_implementation 'boltzmann': the class's own from_pretrained (without
    the Boltzmann parameters) refuses at the first forward, and, where this package is not imported, at loading."""
    import subprocess
    import sys

    model = converted("gpt2", WINDOW).eval()
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, VOCAB, (1, 8))
    plain = GPT2LMHeadModel.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no Boltzmann parameters"):
        plain(ids)
    torch.testing.assert_close(bt.from_pretrained(GPT2LMHeadModel, tmp_path).double().eval()(ids).logits,
                               model(ids).logits)
    fresh = subprocess.run([sys.executable, "-c", f"import transformers; "
                            f"transformers.GPT2LMHeadModel.from_pretrained({str(tmp_path)!r})"],
                           capture_output=True, text=True)
    assert fresh.returncode != 0 and 'attn_implementation="boltzmann"' in fresh.stderr


@pytest.mark.slow
def test_the_readme_path_converted_trained_under_bf16_autocast_and_compiled():
    """What a new user does from the README: convert a decoder (the default coupled window), compile it, and
    train a step under bf16 autocast; the compiled loss and gradients are eager's (bf16 rounding aside)."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=50, max_position_embeddings=64)
    model = bt.convert(LlamaForCausalLM(config), mode="h+J", coupling="window", coupling_window=4,
                       coupling_init_std=0.1)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    losses = []
    for run in (model, torch.compile(twin)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], atol=2e-2, rtol=2e-2)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert q.grad is not None and torch.isfinite(q.grad).all(), name
        if "couplings" in name:
            torch.testing.assert_close(q.grad, p.grad, atol=2e-2, rtol=5e-2, msg=name)
