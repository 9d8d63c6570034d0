"""Converted transformers decoders (GPT-2, Llama, Mistral with a sliding window) under every cache type
transformers ships for decoders: cached decoding against the full forward, greedy generate with and without
the cache, the attention weights when transformers records them, and loading across base and head classes.
Tiny random models in float64; nothing is downloaded."""

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from test_transformers_integration import (  # noqa: E402
    BIAS,
    CACHE,
    FULL,
    RELATIVE_BANDED,
    VOCAB,
    WINDOW,
    converted,
    ids,
    padded_batch,
)
from transformers import (  # noqa: E402
    DynamicCache,
    GPT2LMHeadModel,
    GPT2Model,
    LlamaForCausalLM,
    LlamaModel,
    MistralConfig,
    MistralForCausalLM,
    StaticCache,
)

from boltzmann_attention.integrations import transformers as bt  # noqa: E402

SLIDING = 6  # Mistral's sliding window here: shorter than the sequences below, so its cache drops keys


def mistral(max_len=32, sliding_window=SLIDING):
    torch.manual_seed(0)
    config = MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=max_len,
                           sliding_window=sliding_window, bos_token_id=0, eos_token_id=0)
    return MistralForCausalLM(config).double().eval()


def convert(name, options):
    if name != "mistral":
        return converted(name, options)
    torch.manual_seed(1)
    return bt.convert(mistral(), field_bias_init=BIAS, coupling_init_std=0.3 if "J" in options["mode"] else 0.0,
                      **options)


# the cache types transformers ships for decoders, each built for the model (for Mistral with sliding layers
# that drop old keys); offloading moves layers between a GPU and the CPU, so it runs only with CUDA. Quantized
# caches need optional backends and change the keys by design; encoder-decoder caches are for encoder-decoders.
OFFLOADED = ("dynamic-offloaded", "static-offloaded")
CACHES = {
    "dynamic": lambda model, n: DynamicCache(config=model.config),
    "dynamic-offloaded": lambda model, n: DynamicCache(config=model.config, offloading=True),
    "static": lambda model, n: StaticCache(config=model.config, max_cache_len=n),
    "static-offloaded": lambda model, n: StaticCache(config=model.config, max_cache_len=n, offloading=True),
}
CASES = [(name, options) for name in ("gpt2", "llama", "mistral")
         for options in ({"mode": "h"}, WINDOW, RELATIVE_BANDED, FULL) if not (name == "mistral" and options is FULL)]
IDS = [f"{name}-{options.get('coupling', 'h')}" for name, options in CASES]


@pytest.mark.parametrize("cache", [pytest.param(c, marks=pytest.mark.skipif(
    c in OFFLOADED and not torch.cuda.is_available(), reason="offloading needs CUDA")) for c in sorted(CACHES)])
@pytest.mark.parametrize("name, options", CASES, ids=IDS)
def test_cached_decoding_equals_the_full_forward_for_every_cache_type(name, options, cache):
    model = convert(name, options)
    if cache in OFFLOADED:
        model = model.cuda()
    x = ids(length=12).to(model.device)
    full = model(x).logits
    past = CACHES[cache](model, 12)
    out = model(x[:, :5], **{CACHE: past}, use_cache=True)
    steps = [out.logits]
    for t in range(5, 12):
        out = model(x[:, t:t + 1], **{CACHE: out.past_key_values}, use_cache=True)
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name, options", CASES, ids=IDS)
def test_greedy_generate_gives_the_same_tokens_with_and_without_the_cache(name, options):
    model = convert(name, options)
    x, mask = ids(2, 4), torch.ones(2, 4, dtype=torch.long)
    settings = {"max_new_tokens": 10, "do_sample": False, "attention_mask": mask, "pad_token_id": 0}
    cached = model.generate(x, **settings)
    assert torch.equal(model.generate(x, use_cache=False, **settings), cached)
    assert torch.equal(model.generate(x, cache_implementation="static", **settings), cached)


@pytest.mark.parametrize("options", [{"mode": "h"}, WINDOW, RELATIVE_BANDED], ids=["h", "window", "relative"])
def test_left_padding_with_a_sliding_window_gives_the_unpadded_logits_and_tokens(options):
    model = convert("mistral", options)
    (a, b), batch, mask, positions = padded_batch()  # 7 and 10 tokens: longer than the window of 6
    padded = model(batch, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(padded[0, 3:], model(a).logits[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(padded[1], model(b).logits[0], rtol=0, atol=1e-10)
    settings = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    together = model.generate(batch, attention_mask=mask, **settings)
    assert torch.equal(together[0, 3:], model.generate(a, **settings)[0])
    assert torch.equal(together[1], model.generate(b, **settings)[0])


def test_full_couplings_are_refused_for_a_cache_that_drops_keys_and_kept_where_none_is_dropped():
    with pytest.raises(ValueError, match="drops old keys .*sliding_window = 6 < max_position_embeddings = 16"):
        bt.convert(mistral(16), **FULL)
    bt.convert(mistral(16, sliding_window=16), **FULL)  # the window covers every position: nothing rolls
    bt.convert(mistral(16), **WINDOW)


ATTENTION_CASES = [(name, options) for name in ("gpt2", "llama", "mistral")
                   for options in (WINDOW, dict(WINDOW, mode="J"), {"mode": "h"}, RELATIVE_BANDED)]


@pytest.mark.parametrize("name, options", ATTENTION_CASES,
                         ids=[f"{n}-{o['mode']}-{o.get('coupling', 'h')}" for n, o in ATTENTION_CASES])
def test_output_attentions_returns_the_weights_in_the_forward_and_in_generate(name, options):
    model = convert(name, options)
    x = ids(2, 9)
    attentions = model(x, output_attentions=True).attentions
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 9, 9)
    assert (attentions[0].sum(-1) > 0).all() and (attentions[0].triu(1) == 0).all()
    out = model.generate(x[:, :5], max_new_tokens=4, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones(2, 5, dtype=torch.long), output_attentions=True,
                         return_dict_in_generate=True)
    assert len(out.attentions) == 4 and all(len(step) == 2 for step in out.attentions)
    last = out.attentions[-1][0]  # the last step's one query, layer 0, on the cached keys (a sliding cache: the last)
    again = model(out.sequences[:, :-1], output_attentions=True).attentions[0][..., -1:, :]
    kept = last.shape[-1]
    torch.testing.assert_close(last, again[..., -kept:], rtol=0, atol=1e-10)
    assert (again[..., :-kept] == 0).all()  # keys the cache dropped are outside the window of the full forward
    assert model(x).attentions is None  # not asked: not assembled


@pytest.mark.parametrize("name, base, head", [("gpt2", GPT2Model, GPT2LMHeadModel),
                                              ("llama", LlamaModel, LlamaForCausalLM)])
def test_a_base_model_loads_a_head_models_checkpoint_and_back(name, base, head, tmp_path):
    model = converted(name, WINDOW)
    model.save_pretrained(tmp_path / "head")
    loaded = bt.from_pretrained(base, tmp_path / "head").double()
    x = ids()
    torch.testing.assert_close(loaded(x).last_hidden_state, model.base_model(x).last_hidden_state, rtol=0, atol=0)
    loaded.save_pretrained(tmp_path / "base")
    again = bt.from_pretrained(head, tmp_path / "base").double()
    torch.testing.assert_close(again.base_model(x).last_hidden_state, model.base_model(x).last_hidden_state,
                               rtol=0, atol=0)

