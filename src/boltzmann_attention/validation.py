"""Every rule on the attention layer's arguments, in one place.

- :func:`check_options`: the options of a layer (mode, method and its options, the coupling kind and its
  options, causal). Both :func:`~boltzmann_attention.boltzmann_attention` and
  :class:`~boltzmann_attention.BoltzmannAttention` call it, so the module refuses at construction exactly
  what the functional form refuses, in the same words. Method option values are checked by the method's
  record (:mod:`boltzmann_attention.ising.methods`).
- :func:`check_call`: the tensors and per-call arguments of the functional form (types and shapes).
- :func:`check_values`: NaN and inf in every tensor that enters the scores or weights (values, not shapes), on
  the host or as an asynchronous assert (:func:`value_checks`).
- :func:`check_layer_sizes`, :func:`check_sizes`: the module's sizes and initialisation.

The Ising-level checks (h, J, K and mask of :mod:`boltzmann_attention.ising`) are in
``ising/_inputs.py``; ``check_int``, ``check_real`` and ``check_finite`` are re-exported here.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias

from . import ising, modes, options
from .ising import checks
from .ising import window as window_ising
from .ising._inputs import _check_finite as check_finite
from .ising._inputs import check_int, check_pairwise, check_real
from .ising.checks import VALUE_CHECKS, value_checks  # noqa: F401 (the layer's public policy)
from .ising.methods import methods_with, resolve_method
from .modes import LAYER_MODES, MODES, RECENCY_MODES, WINDOW_MODES
from .options import CONTENT_COUPLINGS, COUPLINGS, POSITIONS, SLOT_BIAS_PARAMETRIZATIONS  # noqa: F401 (re-exported)

__all__ = ["MODES", "RECENCY_MODES", "LAYER_MODES", "POSITIONS", "COUPLINGS", "WINDOW_MODES", "mode_terms",
           "check_options", "check_layer_options", "check_length", "check_call", "check_values", "check_layer_sizes",
           "check_sizes", "check_finite", "check_int", "check_real", "VALUE_CHECKS", "value_checks"]


def mode_terms(mode: str) -> tuple[bool, bool, bool]:
    """(uses the QK field, uses J, uses K) for a mode of the functional form (its record in :mod:`.modes`)."""
    record = modes.get(mode, MODES)
    return record.field, record.couplings, record.three_body


def _auto_window_methods() -> tuple[str, ...]:
    """The registered window methods whose path is chosen by the rule (and can be named by window_path)."""
    return tuple(m for m in methods_with("window") if resolve_method(m).window_path == "auto")


def _names(names: tuple[str, ...], conjunction: str = "and") -> str:
    """'a', 'a' and 'b', 'a', 'b' and 'c' (or 'or')."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f" {conjunction} " + quoted[-1]


def _check_bool(name: str, flag) -> None:
    if not isinstance(flag, bool):
        raise ValueError(f"{name} must be True or False, got {flag!r}")


def _refuse_unused(mode: str, /, **given) -> None:
    """ValueError naming the options that ``mode`` does not use and that differ from their defaults."""
    unused = options.unused(mode, **given)
    if unused:
        raise ValueError(f"mode {mode!r} does not use {', '.join(unused)}: keep {'it' if len(unused) == 1 else 'them'} "
                         "at the default (a value there would be ignored)")


def check_options(mode: str, method, method_options: dict | None, *, causal: bool, coupling: str = "full",
                  coupling_window: int | None = None, coupling_window_relative: bool = False,
                  coupling_range: int | None = None) -> None:
    """ValueError, naming the option, for any option of a layer that its forward would refuse.

    coupling: 'full' (a dense J per call), 'relative' (J_jk = f(|j - k|), f = 0 beyond coupling_range) or
    'window' (coupling_window=W keys coupled by a slot-indexed J; causal, mode 'h+J' or 'J', method 'exact'
    with option max_spins only). The functional form passes coupling='window' when it is given a
    coupling_window, else 'full'.
    """
    mode_terms(mode)
    _check_bool("causal", causal)
    _refuse_unused(mode, method=method, method_options=method_options, coupling=coupling,
                   coupling_range=coupling_range, coupling_window=coupling_window,
                   coupling_window_relative=coupling_window_relative)
    if method_options is not None and not isinstance(method_options, dict):
        raise ValueError(f"method_options must be a dict or None, got {type(method_options).__name__}")
    given = method_options or {}
    if not isinstance(coupling, str) or coupling not in COUPLINGS:
        raise ValueError(f"unknown coupling {coupling!r}; choose one of {COUPLINGS}")
    if coupling_range is not None:
        if coupling not in ("relative",) + CONTENT_COUPLINGS:
            raise ValueError(f"coupling_range applies to coupling='relative', 'keys' or 'query' only (got "
                             f"coupling={coupling!r}); 'full' couples every pair up to max_len")
        check_int("coupling_range", coupling_range, 0)  # 0: no couplings, honoured (not replaced by a default)
    _check_bool("coupling_window_relative", coupling_window_relative)
    if (coupling == "window") != (coupling_window is not None):
        raise ValueError("coupling='window' and coupling_window=W go together (W: the number of coupled keys)")
    if coupling != "window":
        if coupling_window_relative:
            raise ValueError(f"coupling_window_relative applies to coupling='window' only, got coupling={coupling!r}")
        ising.validate_options(method, given)  # names and values: now, not at the first forward
        if modes.get(mode).three_body and not resolve_method(method).three_body:
            raise ValueError(f"mode {mode!r} has three-body couplings, which method {method!r} does not take; use "
                             f"one of the methods {_names(methods_with('three_body'))}")
        return
    if mode not in WINDOW_MODES:
        raise ValueError(f"coupling_window needs a mode with pairwise couplings and no three-body terms "
                         f"({' or '.join(map(repr, WINDOW_MODES))}), got mode {mode!r}")
    if not resolve_method(method).window:
        raise ValueError(f"coupling_window is computed by method {_names(methods_with('window'))} only, "
                         f"got {method!r}")
    if not causal:
        raise ValueError("coupling_window needs is_causal=True (slot a is key i - a, the keys before query i)")
    record = resolve_method(method)
    unknown = set(given) - {"max_spins", "window_path"}
    if unknown:
        raise ValueError(f"unknown method_options {sorted(unknown)} for coupling_window; it takes 'max_spins' and "
                         f"'window_path'")
    if "window_path" in given:
        window_ising.check_path(given["window_path"])
        if record.window_path != "auto":
            raise ValueError(f"method {record.name!r} always runs the coupled window's {record.window_path!r} path; "
                             f"window_path applies to method {_names(_auto_window_methods())}")
    ising.validate_options(method, {k: v for k, v in given.items() if k != "window_path"})
    coupling_window = check_int("coupling_window", coupling_window, 1)  # any integral type, as every size
    window_ising.check_window(None, coupling_window, record.spin_limit(given))


def check_length(method, n: int, coupling: str, coupling_range: int | None, method_options: dict | None, *,
                 length: str = "T") -> None:
    """ValueError, naming the limit and the alternatives, when method ``method`` cannot solve a layer whose queries
    see up to ``n`` keys with these couplings: the spins one query enumerates (every coupling but the window, which
    bounds them) and the band of couplings it solves (relative and content couplings up to ``coupling_range``, n - 1
    by default; full couplings have no band). ``length`` names n in the message (the config's T, the adapter's
    max_len). The one rule for the training config and ``convert()``."""
    record, given = resolve_method(method), method_options or {}
    if coupling_range is not None:
        check_int("coupling_range", coupling_range, 0)
    limit, most = record.spin_limit(given), record.bandwidth_limit(given)
    name = method if isinstance(method, str) else type(method).__name__
    if coupling != "window" and limit is not None and n > limit:
        option = " (option max_spins)" if "max_spins" in record.options else ""
        raise ValueError(f"{length} = {n} is beyond the limit of method {name!r}, {limit} spins per query{option}; use "
                         f"coupling='window' (exact at any length), coupling='relative' with method "
                         f"{_names(methods_with('max_bandwidth'), 'or')} (exact), or method "
                         f"{_names(_approximate(), 'or')} (any length); or mode='h' (no couplings)")
    if most is None:
        return
    if coupling == "full":
        raise ValueError(f"coupling='full' couples every pair of keys, so method {name!r} has no band to use; use "
                         f"coupling='relative' with coupling_range <= {most}, or coupling='window'")
    if coupling in ("relative",) + CONTENT_COUPLINGS:
        width = n - 1 if coupling_range is None else coupling_range
        if width > most:
            default = f" ({length} - 1, the default)" if coupling_range is None else ""
            raise ValueError(f"method {name!r} runs a chain of 2^w states for coupling range w = {width}{default}, "
                             f"beyond its max_bandwidth {most}; set coupling_range <= {most}, or use method "
                             f"{_names(_approximate(), 'or')} (any range), or coupling='window'")


def _approximate() -> tuple[str, ...]:
    return tuple(n for n, m in ising.methods.REGISTRY.items() if m.kind == "approximate")


def check_call(query: Tensor, key: Tensor, value: Tensor, *, couplings, three_body, mode: str, method,
               method_options, is_causal, attn_mask, scale, bias, return_weights, coupling_window,
               enable_gqa: bool = False) -> None:
    """The functional form's arguments: types and shapes of the tensors, and the options (``check_options``)."""
    _, uses_J, uses_K = mode_terms(mode)
    for name, flag in (("is_causal", is_causal), ("return_weights", return_weights), ("enable_gqa", enable_gqa)):
        _check_bool(name, flag)
    _check_qkv(query, key, value, enable_gqa)
    L, S = query.shape[-2], key.shape[-2]
    shape = (*query.shape[:2], L, S)
    if scale is not None:
        check_real("scale", scale)
    if isinstance(bias, Tensor):
        if not bias.is_floating_point():
            raise ValueError(f"bias must be a float or a floating-point tensor (cast to the computation's dtype), "
                             f"got {bias.dtype}")
        _check_broadcasts_to("bias", bias, shape)
    elif isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not math.isfinite(bias):
        raise ValueError(f"bias must be a finite float or a tensor broadcastable to (B, H, L, S), got {bias!r}")
    causal = is_causal
    if isinstance(attn_mask, CausalBias):
        if is_causal:
            raise ValueError("pass either is_causal=True or a CausalBias attn_mask, not both (as SDPA)")
        if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (L, S):
            raise ValueError(f"the CausalBias attn_mask is for (L, S) = ({attn_mask.seq_len_q}, "
                             f"{attn_mask.seq_len_kv}) but query and key give ({L}, {S})")
        causal = True
    elif attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise ValueError(f"attn_mask must be a bool or float tensor or a CausalBias, got "
                             f"{type(attn_mask).__name__}")
        _check_broadcasts_to("attn_mask", attn_mask, shape)
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise ValueError(f"attn_mask must be a bool tensor (True means the key takes part) or a float tensor "
                             f"(added to the field, -inf: the key is absent), got {attn_mask.dtype}")
    if coupling_window is not None:
        coupling_window = check_int("coupling_window", coupling_window, 1)
    toeplitz = isinstance(couplings, ising.toeplitz.Toeplitz)
    if toeplitz:  # a layer with relative couplings and method 'meanfield' or 'tap' (no window: checked below)
        check_options(mode, method, method_options, causal=causal)
    else:
        check_options(mode, method, method_options, causal=causal,
                      coupling="full" if coupling_window is None else "window", coupling_window=coupling_window)
    for name, given, needed in (("couplings", couplings, uses_J), ("three_body", three_body, uses_K)):
        if needed and given is None:
            raise ValueError(f"mode {mode!r} needs `{name}`")
        if given is not None and not needed:
            raise ValueError(f"mode {mode!r} does not use `{name}`; pass None or choose another mode")
    if toeplitz:
        _check_toeplitz(couplings, three_body, method, coupling_window)
    elif coupling_window is not None:
        if not isinstance(couplings, Tensor) or not couplings.is_floating_point():
            raise ValueError(f"couplings must be a tensor of query's dtype {query.dtype} (or another float dtype, "
                             f"cast), got {type(couplings).__name__} {getattr(couplings, 'dtype', '')}")
        window_ising.check_window(None if _skip_value_checks(couplings) else couplings, coupling_window,
                                  resolve_method(method).spin_limit(method_options or {}))
        if couplings.dim() == 3 and couplings.shape[0] not in (1, query.shape[1]):
            raise ValueError(f"window couplings must have shape (H, {coupling_window}, {coupling_window}) with H = 1 "
                             f"or {query.shape[1]} query heads, got {tuple(couplings.shape)}")
    else:
        _check_couplings("couplings", couplings, query, S, 2)
        if couplings is not None and modes.RECORDS[mode].weights is not None and not _skip_value_checks(couplings):
            check_pairwise("couplings", couplings)  # a closed form solves nothing that would check them
    _check_couplings("three_body", three_body, query, S, 3)


def _skip_value_checks(x: Tensor) -> bool:
    """True where a check of values cannot run: meta tensors (no data) and while torch.compile traces
    (a data-dependent branch would break the graph)."""
    return x.device.type == "meta" or torch.compiler.is_compiling()




def check_values(mode: str, query: Tensor, key: Tensor, field: Tensor | None,
                 others: tuple[tuple[str, Tensor], ...] = ()) -> None:
    """NaN or inf, refused in every mode, in every tensor that enters the scores or weights: query and key for
    mode 'softmax', else the field h they make with the bias (also for mode 'h', the closed form), and the named
    ``others`` (the couplings the module built, whose symmetry and zero diagonal hold by construction; a bias,
    float attn_mask or position prior added to softmax's scores; a forget gate; a convolution's kernel). value is
    used as given (a NaN propagates, as in SDPA). One reduction per tensor (a finite sum proves every entry
    finite; summed in float32 at least, so that a half-precision sum of finite entries cannot overflow), then the
    check that :func:`value_checks` chooses: by default a host read on CPU (only a sum that is not finite takes
    the entry-wise checks, which name the tensor) and an asynchronous assert elsewhere. Skipped on meta
    tensors."""
    if query.device.type == "meta" or checks.policy() == "off":
        return
    named = [("query", query), ("key", key)] if modes.RECORDS[mode].softmax else \
        [("the field h = scale * query.key + bias", field)]
    named += list(others)
    dtype = torch.promote_types(named[0][1].dtype, torch.float32)
    total = named[0][1].detach().sum(dtype=dtype)
    for _, x in named[1:]:
        total = total + x.detach().sum(dtype=torch.promote_types(x.dtype, torch.float32)).to(dtype)
    if not checks.on_host(query.device):
        torch._assert_async(torch.isfinite(total), f"NaN or inf in {' or '.join(n for n, _ in named)} (mode "
                            f"{mode!r}); run under boltzmann_attention.validation.value_checks('host') for the "
                            "tensor by name")
        return
    if bool(torch.isfinite(total)):
        return
    for name, x in named:
        check_finite(name, x)


def check_layer_options(*, head_dim: int, **given) -> None:
    """The module's options (``given``: any of :data:`.options.OPTIONS`, by name; the others at their defaults):
    each value by its record, then the rule that an option the mode does not use keeps its default (it would be
    ignored), then the rules that tie options together: :func:`check_options` for the modes with marginals or
    a closed form, and for the module only the learned-recency modes ('fox', 'stickbreaking') and 'mta' (causal
    softmax variants without couplings or marginals), the content couplings, the position scheme (rope needs
    queries and keys with an even head dimension) and the slot bias's parametrisation (with a slot bias only)."""
    unknown = sorted(set(given) - set(options.OPTIONS))
    if unknown:
        raise ValueError(f"unknown layer option(s) {unknown}; the layer takes {list(options.OPTIONS)}")
    o = {name: given.get(name, record.default) for name, record in options.OPTIONS.items()}
    options.check_values(**o)
    mode = o["mode"]
    record = modes.get(mode)
    _refuse_unused(mode, **{name: value for name, value in o.items() if name in given and name != "mode"})
    coupling = o["coupling"]
    if coupling in CONTENT_COUPLINGS:
        if not record.field or record.three_body:
            raise ValueError(f"coupling={coupling!r} computes J from the keys and queries: it needs mode 'h+J' or "
                             f"'h+J-step', got {mode!r}")
    elif not options.OPTIONS["coupling_rank"].is_default(o["coupling_rank"]):
        raise ValueError(f"coupling_rank applies to coupling='keys' or 'query' only, got coupling={coupling!r}: keep "
                         f"it at {options.OPTIONS['coupling_rank'].default} (a value there would be ignored)")
    if (record.recency or record.convolution) and not o["causal"]:
        what = "a learned recency over the keys before the query" if record.recency else \
            "its convolution reads the query's predecessors"
        raise ValueError(f"mode {mode!r} is causal only ({what})")
    if not record.module_only:
        check_options(mode, o["method"], o["method_options"], causal=o["causal"], coupling=coupling,
                      coupling_window=o["coupling_window"], coupling_window_relative=o["coupling_window_relative"],
                      coupling_range=o["coupling_range"])
    if o["position"] == "rope" and not record.field:
        raise ValueError(f"position 'rope' rotates queries and keys, which mode {mode!r} does not have")
    if o["position"] == "rope" and head_dim % 2:
        raise ValueError(f"position 'rope' rotates channel pairs: the head dimension {head_dim} must be even")
    if o["slot_bias"] is None and o["slot_bias_parametrization"] != "direct":
        raise ValueError(f"slot_bias_parametrization {o['slot_bias_parametrization']!r} parametrises the slot bias: "
                         "set slot_bias = W as well")


def check_sizes(init_std: float = 0.0, **sizes: int) -> None:
    """Each size an integer >= 1, init_std a finite number >= 0; ValueError naming the argument."""
    for name, value in sizes.items():
        check_int(name, value, 1)
    check_real("coupling_init_std", init_std, minimum=0.0)


def check_layer_sizes(embed_dim, num_heads, max_len, coupling_init_std, field_bias_init) -> None:
    """BoltzmannAttention's sizes and initialisation, each named in its error."""
    check_sizes(embed_dim=embed_dim, num_heads=num_heads, max_len=max_len, init_std=coupling_init_std)
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
    if field_bias_init is not None:
        check_real("field_bias_init", field_bias_init)


def _check_qkv(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool = False) -> None:
    """Types and shapes (named) of query (B, H, L, E), key (B, Hkv, S, E), value (B, Hkv, S, Ev); Hkv = H, or with
    enable_gqa a divisor of H."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {type(x).__name__} "
                             f"{getattr(x, 'dtype', '')}")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("query, key and value must be 4-D: (B, H, L, E), (B, H, S, E), (B, H, S, Ev); got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(f"query, key and value must have one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    B, H = query.shape[:2]
    heads = H
    if enable_gqa and key.shape[1] != H:  # grouped-query attention: key and value share Hkv, a divisor of H
        heads = key.shape[1]
        if heads == 0 or H % heads:
            raise ValueError(f"grouped-query attention needs H = {H} query heads to be a multiple of key's "
                             f"Hkv = {heads} heads")
    for name, x in (("key", key), ("value", value)):
        if x.shape[:2] != (B, heads):
            raise ValueError(f"{name} has batch and heads {tuple(x.shape[:2])} but query has {(B, H)}: (B, H) "
                             "must be the same for query, key and value (with enable_gqa=True, key and value may "
                             "have Hkv heads, H a multiple of Hkv)")
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(f"key's last dimension E = {key.shape[-1]} must equal query's E = {query.shape[-1]}")
    if value.shape[-2] != key.shape[-2]:
        raise ValueError(f"value has {value.shape[-2]} keys (dimension -2) but key has S = {key.shape[-2]}")


def _check_broadcasts_to(name: str, x: Tensor, shape: tuple[int, ...]) -> None:
    try:
        ok = torch.broadcast_shapes(x.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} of shape {tuple(x.shape)} does not broadcast to (B, H, L, S) = {shape}")


def _check_couplings(name: str, x: Tensor | None, query: Tensor, S: int, order: int) -> None:
    """couplings (H or 1, S, S) or three_body (H or 1, S, S, S) of query's dtype."""
    if x is None:
        return
    H = query.shape[1]
    expected = "(H, " + ", ".join([str(S)] * order) + f") with H = 1 or {H} heads"
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a tensor of query's dtype {query.dtype} (or another float dtype, cast), "
                         f"got {type(x).__name__} {getattr(x, 'dtype', '')}")
    if x.dim() != order + 1 or x.shape[1:] != (S,) * order or x.shape[0] not in (1, H):
        raise ValueError(f"{name} must have shape {expected}, got {tuple(x.shape)}")


def _check_toeplitz(couplings, three_body, method, coupling_window) -> None:
    if not resolve_method(method).toeplitz:
        raise ValueError(f"Toeplitz couplings are solved by methods {_names(methods_with('toeplitz'))}, got "
                         f"{method!r}; pass the dense J (Toeplitz.dense(S)) to the other methods")
    if three_body is not None or coupling_window is not None:
        raise ValueError("Toeplitz couplings take no three_body and no coupling_window")
    if couplings.profile.dim() != 2:
        raise ValueError(f"the Toeplitz profile must have shape (H, w), got {tuple(couplings.profile.shape)}")
