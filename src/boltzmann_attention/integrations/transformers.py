"""Boltzmann attention in Hugging Face transformers decoders (GPT-2, the Llama family, grouped-query or not).

::

    from transformers import GPT2Config, GPT2LMHeadModel
    from boltzmann_attention.integrations import transformers as bt

    model = GPT2LMHeadModel(GPT2Config(n_positions=256, n_layer=4, n_head=4, n_embd=128, vocab_size=65))
    bt.convert(model, mode="h+J", coupling="window", coupling_window=8)   # exact at any length
    ...                                  # train as usual (bt.parameter_groups: no weight decay on J)
    model.generate(ids, max_new_tokens=100)
    model.save_pretrained(path)
    model = bt.from_pretrained(GPT2LMHeadModel, path)                   # couplings and field biases restored

:func:`convert` attaches to every attention module a :class:`BoltzmannParameters` (the couplings, one of the
library's classes, and a learnable field bias per head, both marked no-weight-decay), stores the options in
``model.config.boltzmann_attention`` and selects the attention implementation ``"boltzmann"``:
:func:`attention_forward`, registered in transformers' ``AttentionInterface`` (and transformers' SDPA mask
builder under the same name in ``AttentionMaskInterface``, so that it receives the padding mask). The query,
key and value projections stay the model's own; only the attention weights change, from softmax to the Ising
marginals of :func:`boltzmann_attention.boltzmann_attention`.

Conventions at the boundary:

- Mask: a bool mask (True: the key takes part), or an additive float mask in which an entry that is -inf or
  at most finfo(dtype).min / 2 (transformers writes the dtype's min) marks an *absent* key (removed from the
  energy, weight 0), and any other finite value is added to the field h. With a KV cache (dynamic or static)
  transformers' mask places the queries: the coupled window reads each query's slot from it (the last key it
  sees, itself, as in every transformers causal mask), so slot a is key (slot - a) also during decoding.
  The library's window aligns its queries top-left only, so the L new queries follow W - 1 placeholder rows
  in a call over their windows' keys, and the keys before every window (independent spins) are added here:
  a decoding step costs about (W - 1 + L) rows of the window, plus L rows of sigmoid attention.
- Grouped-query attention: the key and value heads are repeated (``module.num_key_value_groups``); the
  couplings and field biases are per query head.
- Dropout (transformers passes the module's attention dropout in training): applied to the attention
  weights a_ij, as transformers' eager attention does (each weight zeroed with probability p, the others
  scaled by 1 / (1 - p)), then the output is recomputed from them.
- Weights (B, Hq, L, S) are returned whenever transformers records attentions (``output_attentions=True`` in
  the model's call or in ``generate``); the coupled window assembles its dense weights only then.
- No mask: as transformers' SDPA attention, the call's ``is_causal`` (else the module's) decides, aligned
  top-left for L > 1 queries (transformers gives no mask with L < S keys only for the prefill of an empty
  static cache, whose later slots are empty: they are cut off) and one query (L = 1) sees every key.
- Positions: 'full' couplings index keys by their slot in the cache (0 .. S - 1), so left padding shifts
  them, and a cache that drops old keys (a sliding window shorter than max_position_embeddings) would move
  them: convert() refuses 'full' couplings for such a model. 'relative' couplings and the coupled 'window'
  depend on key distances only and are unchanged by either.
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .. import ising, modes
from ..attention import BoltzmannAttention, RelativeCouplings, boltzmann_attention, parameter_groups
from ..options import unused
from ..validation import check_length

__all__ = ["NAME", "OPTIONS", "BoltzmannParameters", "attention_forward", "attention_modules", "convert",
           "from_pretrained", "parameter_groups", "register", "with_defaults"]

NAME = "boltzmann"               # the attn_implementation, in AttentionInterface and AttentionMaskInterface
CONFIG_KEY = "boltzmann_attention"  # model.config.<CONFIG_KEY>: the options convert() was called with
ATTRIBUTE = "boltzmann"          # attention_module.<ATTRIBUTE>: its BoltzmannParameters

# convert()'s options: BoltzmannAttention's names and defaults, except the couplings': a coupled window of 16
# keys, exact at any sequence length (full couplings enumerate every key: 24 at most, where models have 1024 and
# more). A mode without couplings takes none of them (UNCOUPLED: the layer's own defaults).
WINDOW = 16
DEFAULTS = {"mode": "h+J", "coupling": "window", "coupling_window": WINDOW, "coupling_window_relative": False,
            "coupling_range": None, "method": "exact", "method_options": None, "coupling_init_std": 0.0,
            "field_bias_init": None, "learn_field_bias": True}
UNCOUPLED = {"coupling": "full", "coupling_window": None}
OPTIONS = tuple(DEFAULTS)
# the modes it offers: those with a field bias and no three-body couplings (K has max_len^3 entries per head)
MODES = modes.Names(lambda m: m.field_bias and not m.three_body)
# keyword arguments some transformers models pass to the attention function, with no meaning here
_UNSUPPORTED_KWARGS = ("softcap", "s_aux", "sinks", "position_bias", "head_mask")


class BoltzmannParameters(nn.Module):
    """The Boltzmann attention of one transformers attention module: couplings, field bias, mode, method.

    Built by the library's own :class:`boltzmann_attention.BoltzmannAttention` (with one dimension per head,
    whose projections are discarded), so that options, defaults (couplings at zero, field bias
    -log(max_len) / 2) and the no-weight-decay marks are the library's. ``couplings``: FullCouplings,
    RelativeCouplings, WindowCouplings or None; ``field_bias``: (num_heads,).
    """

    def __init__(self, num_heads: int, max_len: int, options: dict):
        super().__init__()
        layer = BoltzmannAttention(num_heads, num_heads, max_len=max_len, causal=True, bias=False, **options)
        self.num_heads, self.max_len = num_heads, max_len
        self.mode, self.method, self.method_options = layer.mode, layer.method, dict(layer.method_options)
        self.coupling_window = layer.coupling_window
        self.couplings = layer.couplings
        self.field_bias = layer.field_bias

    def extra_repr(self) -> str:
        window = f", coupling_window={self.coupling_window}" if self.coupling_window is not None else ""
        return f"num_heads={self.num_heads}, mode={self.mode!r}, method={self.method!r}{window}"

    def couplings_for(self, length: int, dtype: torch.dtype):
        """The couplings for ``length`` keys as the functional form takes them (None in mode 'h')."""
        if self.couplings is None:
            return None
        if isinstance(self.couplings, RelativeCouplings) and ising.resolve_method(self.method).toeplitz:
            return ising.toeplitz.Toeplitz(self.couplings.weight.to(dtype))  # the profile, never (S, S)
        return self.couplings(length).to(dtype)


def register() -> None:
    """Register :func:`attention_forward` and transformers' SDPA mask builder under the name ``"boltzmann"``."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def _read_mask(mask, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
    """(present: bool, True where the key takes part, or None; the finite additive part for the field, or None)."""
    if mask is None:
        return None, None
    if not isinstance(mask, Tensor):
        raise ValueError(f"attention 'boltzmann' takes a bool or additive float mask tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask, None
    if not mask.is_floating_point():
        raise ValueError(f"the attention mask must be bool or floating point, got {mask.dtype}")
    if torch.isnan(mask).any() or (mask == math.inf).any():
        raise ValueError("the additive attention mask contains NaN or +inf; absent keys are -inf or the dtype's min")
    absent = mask <= torch.finfo(mask.dtype).min / 2  # also -inf
    extra = mask.masked_fill(absent, 0.0)
    return ~absent, (extra.to(dtype) if bool((extra != 0).any()) else None)


def attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      *, scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function signature: query (B, Hq, L, D), key and value (B, Hkv, S, D).

    Returns the output (B, L, Hq, D) and the weights (B, Hq, L, S) (with the coupled window only if
    ``output_attentions`` is asked, else None). The layer's options come from ``module.boltzmann`` (see
    :func:`convert`); masks and alignment as in the module docstring.
    """
    params = getattr(module, ATTRIBUTE, None)
    if not isinstance(params, BoltzmannParameters):
        raise ValueError(f"{type(module).__name__} has no Boltzmann parameters: attn_implementation 'boltzmann' "
                         "needs a model converted by boltzmann_attention.integrations.transformers.convert (or "
                         "loaded by its from_pretrained)")
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(f"attention 'boltzmann' does not take {name!r} (this model passes it); use the "
                             "model's own attention implementation ('eager' or 'sdpa')")
    B, H, L, _ = query.shape
    S = key.shape[-2]
    if H != params.num_heads or H % key.shape[1]:
        raise ValueError(f"{type(module).__name__} gives {H} query heads and {key.shape[1]} key/value heads, but "
                         f"its Boltzmann parameters were built for {params.num_heads} query heads")
    if key.shape[1] != H:  # grouped-query attention: each key/value head serves H / Hkv query heads
        key = key.repeat_interleave(H // key.shape[1], dim=1)
        value = value.repeat_interleave(H // value.shape[1], dim=1)
    present, extra = _read_mask(attention_mask, query.dtype)
    S_all = S
    if present is None:  # as SDPA in transformers: is_causal (the call's, else the module's) decides
        causal = kwargs.get("is_causal")
        causal = bool(getattr(module, "is_causal", True) if causal is None else causal) or L <= 1
        if causal and L < S and L > 1:  # top-left, as SDPA: transformers gives no mask with 1 < L < S only for
            key, value, S = key[..., :L, :], value[..., :L, :], L  # an empty static cache (later slots empty)
        offset = S - L  # one query (L = 1) is the last position and sees every key
    else:  # the mask decides; a causal one shows each query's slot: the last key it sees, itself
        seen = torch.where(present, torch.arange(S, device=present.device), -1).amax(-1)
        offset = max(int((seen - torch.arange(L, device=present.device)).max()), 0) if seen.numel() else 0
        causal = offset + L <= S  # else some query sees a key after its own slot
    bias = 0.0 if params.field_bias is None else params.field_bias.to(query.dtype).view(-1, 1, 1)
    if extra is not None:
        bias = bias + extra
    if scaling is None:
        scaling = _module_scaling(module, query.shape[-1])
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    # the weights come free except for the window (assembled from its band): there only when recorded
    want_weights = params.coupling_window is None or bool(kwargs.get("output_attentions")) or _recording_attentions()
    use_dropout = dropout > 0 and module.training
    call = {"mode": params.mode, "method": params.method, "method_options": params.method_options,
            "scale": scaling, "coupling_window": params.coupling_window, "return_weights": want_weights or use_dropout}

    if params.coupling_window is not None:
        if not causal:
            raise ValueError(f"coupling='window' is causal (slot a is key i - a), but this call of "
                             f"{type(module).__name__} is not: its mask (or is_causal=False without a mask) lets a "
                             "query see a later key; use coupling='relative' or 'full' for non-causal attention")
        out, weights, value = _window(params, query, key, value, present, bias, offset, scaling, call)
    else:  # causal with L == S: the functional's top-left causal mask is the same, and its causal paths cheaper
        result = boltzmann_attention(query, key, value, couplings=params.couplings_for(S, query.dtype),
                                     is_causal=causal and offset == 0 and L == S, attn_mask=present, bias=bias,
                                     **call)
        out, weights = result if call["return_weights"] else (result, None)
    if use_dropout:  # as eager attention: on the weights, then the output again from them
        weights = F.dropout(weights, p=dropout, training=True)
        out = weights @ value
    if weights is not None and weights.shape[-1] < S_all:  # keys cut off (empty cache slots) have weight 0
        weights = F.pad(weights, (0, S_all - weights.shape[-1]))
    return out.transpose(1, 2).contiguous(), (weights if want_weights else None)


def _recording_attentions() -> bool:
    """Whether transformers is collecting the attention weights of this forward: its output-capturing hooks'
    collector (transformers 5 records ``output_attentions`` so, without passing the flag on)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # older transformers pass output_attentions to the attention function
        return False
    collected = _active_collector.get()
    return isinstance(collected, dict) and ("attentions" in collected or "cross_attentions" in collected)


def _window(params: BoltzmannParameters, query: Tensor, key: Tensor, value: Tensor, present: Tensor | None, bias,
            offset: int, scaling: float, call: dict) -> tuple[Tensor, Tensor | None, Tensor]:
    """The coupled window for L queries at slots offset .. offset + L - 1: (out, weights or None, the values used).

    The library's window aligns its queries top-left (query row i is slot i), so the queries are put after
    placeholder rows in a call over the keys lo .. offset + L - 1 (lo = offset - W + 1: each query's window
    and what follows it); the keys before lo come before every query's window, independent spins with
    weights sigmoid(2h), added here.
    """
    L = query.shape[-2]
    S = offset + L  # later keys are empty cache slots, invisible to every query
    lo = max(0, offset - (params.coupling_window - 1))
    if present is not None:
        present = present.reshape((1,) * (4 - present.dim()) + tuple(present.shape))
    per_key = isinstance(bias, Tensor) and bias.dim() == 4  # a mask's finite values shift the field per key
    result = boltzmann_attention(
        F.pad(query, (0, 0, offset - lo, 0)), key[..., lo:S, :], value[..., lo:S, :],
        couplings=params.couplings_for(S - lo, query.dtype), is_causal=True,
        attn_mask=None if present is None else torch.cat(
            [present.new_ones(*present.shape[:-2], offset - lo, S - lo), present[..., lo:S]], dim=-2),
        bias=F.pad(bias[..., lo:S], (0, 0, offset - lo, 0)) if per_key else bias, **call)
    out, weights = result if call["return_weights"] else (result, None)
    out, weights = out[..., -L:, :], None if weights is None else weights[..., -L:, :]
    if lo == 0:
        return out, weights, value[..., :S, :]
    field = bias[..., :lo] if per_key else bias
    if modes.RECORDS[params.mode].field:
        field = query @ key[..., :lo, :].transpose(-1, -2) * scaling + field
    field = torch.as_tensor(field, dtype=query.dtype, device=query.device).expand(*out.shape[:-1], lo)
    if not bool(torch.isfinite(field).all()):
        raise ValueError("the field h = scale * query.key + bias contains NaN or inf")
    before = torch.sigmoid(2 * field)
    if present is not None:
        before = before.masked_fill(~present[..., :lo], 0.0)
    out = out + before @ value[..., :lo, :]
    return out, None if weights is None else torch.cat([before, weights], dim=-1), value[..., :S, :]


def _module_scaling(module: nn.Module, head_dim: int) -> float | None:
    """The score scale when the call gives none: GPT-2 before transformers 5 passed none and kept it on the module."""
    if hasattr(module, "scale_attn_weights"):
        scale = head_dim ** -0.5 if module.scale_attn_weights else 1.0
        if getattr(module, "scale_attn_by_inverse_layer_idx", False):
            scale /= float(module.layer_idx + 1)
        return scale
    return getattr(module, "scaling", None)  # None: 1 / sqrt(head_dim)


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every transformers attention module: a ``*Attention`` with ``layer_idx`` and ``is_causal``."""
    return [(name, m) for name, m in model.named_modules()
            if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx") and hasattr(m, "is_causal")]


def _num_heads(module: nn.Module, config) -> int:
    heads = getattr(module, "num_heads", None)
    if heads is None:
        heads = getattr(getattr(module, "config", config), "num_attention_heads", None)
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"cannot read the number of query heads of {type(module).__name__} (module.num_heads or "
                         "config.num_attention_heads)")
    return heads


def _rolling_window(config, max_len: int) -> int | None:
    """The sliding window of a model whose cache drops keys older than it (shorter than max_len), else None."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window >= max_len or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and "sliding_attention" not in layer_types:
        return None
    return window


def with_defaults(options: dict) -> dict:
    """convert()'s ``options`` with its defaults, as it fills them in: the default coupled window goes with the
    default coupling only, and a mode without couplings takes the layer's coupling defaults (none apply)."""
    opts = {**DEFAULTS, **options}
    if not modes.get(opts["mode"]).couplings:
        opts.update(UNCOUPLED)
    elif opts["coupling"] != "window" and "coupling_window" not in options:
        opts["coupling_window"] = None
    return opts


def _check_options(options: dict, max_len: int, modules: list[tuple[str, nn.Module]], config=None) -> dict:
    """The options with defaults filled in; ValueError naming the limit and the alternatives."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for convert(); it takes {list(OPTIONS)}")
    opts = {**DEFAULTS, **options}
    mode, method, coupling = opts["mode"], opts["method"], opts["coupling"]
    record = modes.RECORDS.get(mode) if isinstance(mode, str) else None
    if record is not None and record.softmax:
        raise ValueError(f"mode {mode!r} is transformers' own attention: keep attn_implementation 'sdpa' or "
                         f"'eager' instead of converting; convert() takes modes {MODES}")
    if record is not None and record.three_body:
        raise ValueError(f"three-body couplings (mode {mode!r}) are not offered by the transformers adapter "
                         "(K has max_len^3 entries per head); use boltzmann_attention.BoltzmannAttention, or "
                         f"one of {MODES}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; convert() takes {MODES}")
    if not isinstance(method, str):
        raise ValueError(f"method must be a method name (one of {sorted(ising.METHODS)}): convert() stores the "
                         "options in model.config so that the model can be rebuilt, and a sampler object cannot be "
                         f"stored; got {type(method).__name__}. Use BoltzmannAttention for dimod samplers")
    method_options = opts["method_options"] or {}
    if not isinstance(method_options, dict):
        raise ValueError(f"method_options must be a dict or None, got {type(method_options).__name__}")
    try:
        json.dumps(method_options)
    except (TypeError, ValueError):
        raise ValueError("method_options must be JSON-serialisable (numbers, strings, booleans): convert() stores "
                         f"them in model.config; got {method_options!r}") from None
    uses_J = modes.RECORDS[mode].couplings
    ignored = unused(mode, **{k: v for k, v in options.items() if k != "mode"})
    if ignored:
        raise ValueError(f"mode {mode!r} does not use {ignored} (it has no couplings: sigmoid attention, in closed "
                         "form), so they would be ignored: drop them, or use mode 'h+J'")
    opts = with_defaults(options)
    coupling = opts["coupling"]
    if coupling in ("keys", "query"):
        raise ValueError(f"coupling={coupling!r} (couplings computed from the keys) is offered by BoltzmannAttention "
                         "only; convert() takes 'window', 'relative' or 'full'")
    if coupling == "window" and not modes.RECORDS[mode].window:
        default = "" if "coupling" in options else f" (convert()'s default: a window of {WINDOW} keys)"
        raise ValueError(f"mode {mode!r} takes no coupled window, coupling='window'{default}; pass "
                         "coupling='relative' (J = f(|j - k|), any length, up to coupling_range) or coupling='full' "
                         "(a free J per pair of positions)")
    if modes.RECORDS[mode].marginals:  # a method solves the couplings: its limits at the model's length
        check_length(method, max_len, coupling, opts["coupling_range"], method_options,
                     length="max_len (the model's max_position_embeddings)")
    if uses_J and coupling == "full":
        rolling = _rolling_window(config, max_len)
        if rolling is not None:
            raise ValueError(f"coupling='full' indexes each key by its slot in the cache, and this model's cache drops "
                             f"old keys (sliding_window = {rolling} < max_position_embeddings = {max_len}), which "
                             "moves every key's slot and its couplings; use coupling='window' or 'relative' (they "
                             "depend on key distances only)")
    if coupling == "window":
        not_causal = [name for name, m in modules if not getattr(m, "is_causal", True)]
        if not_causal:
            raise ValueError(f"coupling='window' is causal, but attention modules {not_causal} are not (e.g. "
                             "cross-attention); use coupling='relative' or 'full'")
    return opts


def convert(model: PreTrainedModel, **options) -> PreTrainedModel:
    """Turn every attention module of a transformers decoder into Boltzmann attention, in place; returns model.

    options: BoltzmannAttention's names and defaults: mode ('h', 'J', 'h+J'), coupling ('full', 'relative',
    'window'), coupling_window, coupling_window_relative, coupling_range, method, method_options,
    coupling_init_std, field_bias_init, learn_field_bias; except that the couplings default to a coupled window
    of ``WINDOW`` = 16 keys (exact at any length), since full couplings stop at 24 positions. A mode that takes
    no window (the one-step control 'h+J-step') needs coupling='relative' or 'full'. max_len is the model's
    max_position_embeddings.
    Everything is checked before the model is changed. The options are stored in
    ``model.config.boltzmann_attention`` (save_pretrained writes them; :func:`from_pretrained` reads them)
    and ``model.set_attn_implementation("boltzmann")`` selects :func:`attention_forward`; config.json records
    that implementation too, so that ``model_class.from_pretrained(path)`` (the class's own, without the
    Boltzmann parameters) fails at its first forward, or at loading where this package is not imported, rather
    than returning a softmax model of these weights.
    """
    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"convert() takes a transformers PreTrainedModel, got {type(model).__name__}")
    modules = attention_modules(model)
    if not modules:
        raise ValueError(f"found no attention module in {type(model).__name__} (a '*Attention' module with layer_idx "
                         "and is_causal, calling transformers' AttentionInterface, as in GPT-2 and Llama)")
    if any(hasattr(m, ATTRIBUTE) for _, m in modules):
        raise ValueError(f"{type(model).__name__} is already converted to Boltzmann attention; convert the original "
                         "model, or load a saved one with from_pretrained")
    max_len = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError("convert() needs config.max_position_embeddings (the longest sequence: it sizes 'full' "
                         f"couplings and the field bias), got {max_len!r}")
    opts = _check_options(options, max_len, modules, model.config)
    holders = []
    for _, module in modules:  # all built first: an invalid option changes nothing
        holder = BoltzmannParameters(_num_heads(module, model.config), max_len, opts)
        reference = next(module.parameters(), None)
        if reference is not None:
            holder.to(device=reference.device, dtype=reference.dtype)
        holders.append(holder)
    register()
    for (_, module), holder in zip(modules, holders):
        module.add_module(ATTRIBUTE, holder)
    setattr(model.config, CONFIG_KEY, dict(opts))
    model.set_attn_implementation(NAME)
    # saved into config.json, so that the class's own from_pretrained cannot give a softmax model of these
    # weights: it selects attention "boltzmann", which refuses modules without their Boltzmann parameters (and
    # is unknown where this package is not imported)
    model.config.attn_implementation = NAME
    return model


def _checkpoint_tensors(path: str, names: list[str], prefix: str = "") -> dict[str, Tensor]:
    """The named tensors from a save_pretrained directory (model.safetensors, sharded or not). prefix: the base
    model's (transformers' ``base_model_prefix``): a name is also found with it added or removed, as
    transformers loads a base model from a head model's checkpoint and the other way round."""
    from safetensors import safe_open

    def spellings(name: str) -> list[str]:
        if not prefix:
            return [name]
        if name.startswith(prefix + "."):
            return [name, name[len(prefix) + 1:]]
        return [name, f"{prefix}.{name}"]

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:
            weight_map = dict.fromkeys(f.keys(), "model.safetensors")
    else:
        raise ValueError(f"found no model.safetensors (or its index) in {path!r}: from_pretrained reads the Boltzmann "
                         "parameters from a local directory written by save_pretrained")
    stored = {name: next((k for k in spellings(name) if k in weight_map), None) for name in names}
    where = {name: weight_map.get(key) for name, key in stored.items()}
    missing = sorted(name for name, file in where.items() if file is None)
    if missing:
        raise ValueError(f"the checkpoint in {path!r} lacks the Boltzmann parameters {missing[:4]}"
                         f"{' ...' if len(missing) > 4 else ''}: was it saved after convert() with the same options?")
    tensors = {}
    for file in sorted(set(where.values())):
        with safe_open(os.path.join(path, file), framework="pt") as f:
            tensors.update({name: f.get_tensor(stored[name]) for name in names if where[name] == file})
    return tensors


def from_pretrained(model_class: type[PreTrainedModel], path: str, **kwargs) -> PreTrainedModel:
    """Load a converted model saved by ``save_pretrained``: the model, then its couplings and field biases.

    ``model_class.from_pretrained(path, **kwargs)`` loads the transformers weights (it does not know the
    Boltzmann parameters; they are kept out of its unexpected-keys report), :func:`convert` rebuilds the Boltzmann
    attention from ``config.boltzmann_attention``, and the couplings and field biases are read from the
    checkpoint in ``path`` (a local directory); a missing one is an error.
    """
    register()
    if kwargs.get("attn_implementation", NAME) != NAME:
        raise ValueError(f"a converted model runs attn_implementation {NAME!r}, got {kwargs['attn_implementation']!r}; "
                         f"load it with {model_class.__name__}.from_pretrained to use the stored weights otherwise")
    kwargs.pop("attn_implementation", None)
    config = kwargs.pop("config", None) or model_class.config_class.from_pretrained(path)
    options = getattr(config, CONFIG_KEY, None)
    if not isinstance(options, dict):
        raise ValueError(f"{path!r} holds no Boltzmann attention options (config.{CONFIG_KEY}): it was not saved from "
                         f"a converted model. Load it with {model_class.__name__}.from_pretrained and call convert()")
    # the Boltzmann keys are read below, and a missing one is an error: not "unexpected" for transformers' report
    own = "_keys_to_ignore_on_load_unexpected" in vars(model_class)
    saved = getattr(model_class, "_keys_to_ignore_on_load_unexpected", None)
    model_class._keys_to_ignore_on_load_unexpected = [*(saved or []), rf"\.{ATTRIBUTE}\."]
    try:
        model = model_class.from_pretrained(path, config=config, **kwargs)
    finally:
        if own:
            model_class._keys_to_ignore_on_load_unexpected = saved
        else:
            del model_class._keys_to_ignore_on_load_unexpected
    convert(model, **options)
    for name, module in attention_modules(model):
        holder = getattr(module, ATTRIBUTE)
        keys = list(holder.state_dict())
        tensors = _checkpoint_tensors(path, [f"{name}.{ATTRIBUTE}.{k}" for k in keys],
                                      getattr(model, "base_model_prefix", ""))
        holder.load_state_dict({k: tensors[f"{name}.{ATTRIBUTE}.{k}"] for k in keys}, strict=True)
    return model
