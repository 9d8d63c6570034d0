"""Boltzmann attention: the functional form and the ``nn.Module``.

For query i, key j is a spin s_j in {-1, +1} with field h_ij = scale * q_i.k_j + bias. Couplings J
(one matrix per head, shared by all queries and all batch items) and optional three-body couplings K
couple the keys:

    E_i(s) = - sum_j h_ij s_j - sum_{j<k} J_jk s_j s_k - sum_{j<k<l} K_jkl s_j s_k s_l,
    a_ij   = (<s_j>_i + 1) / 2,        o_i = sum_j a_ij v_j.

Keys that are masked out (causal mask, padding) are absent spins: they are not part of the energy at
all, and a_ij = 0. With J = K = 0, a_ij = sigmoid(2 h_ij): sigmoid attention. The definition by brute
force is :func:`boltzmann_attention.naive.naive_boltzmann_attention`; both forms here are tested against it.

Modes (the paper's ablation): ``softmax`` (plain SDPA), ``h`` (sigmoid(2h), closed form), ``J``
(h = bias only, so the weights do not depend on the input), ``h+J``, ``h+K``, ``h+J+K``. The marginals
come from :mod:`boltzmann_attention.ising` (``method``), the coupled window from
:mod:`boltzmann_attention.coupled_window`. Every rule on the arguments is in
:mod:`boltzmann_attention.validation`; the coupling parametrisations are in :mod:`boltzmann_attention.couplings`.
"""

from __future__ import annotations

import contextlib
import math
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.bias import CausalBias, CausalVariant

from . import coupled_window, ising, modes
from .couplings import ContentCouplings, FullCouplings, RelativeCouplings, ThreeBodyCouplings, WindowCouplings
from .mta import KeyQueryKernel
from .options import OPTIONS
from .positions import SlotBias, alibi_bias, alibi_slopes, rotary
from .validation import (
    MODES,
    check_call,
    check_layer_options,
    check_layer_sizes,
    check_real,
    check_values,
    mode_terms,
)

__all__ = ["MODES", "BoltzmannAttention", "FullCouplings", "RelativeCouplings", "ThreeBodyCouplings",
           "WindowCouplings", "boltzmann_attention", "parameter_groups"]


def boltzmann_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    couplings: Tensor | None = None,
    three_body: Tensor | None = None,
    mode: str = "h+J",
    method: str = "exact",
    is_causal: bool = False,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
    bias: float | Tensor = 0.0,
    return_weights: bool = False,
    method_options: dict | None = None,
    coupling_window: int | None = None,
    enable_gqa: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention whose weights are Ising marginals, with SDPA's conventions.

    query: (B, H, L, E); key: (B, Hkv, S, E); value: (B, Hkv, S, Ev), Hkv = H unless ``enable_gqa`` (grouped-query
    attention, as SDPA: H a multiple of Hkv, query head h reads key/value head h // (H / Hkv)). couplings: (H, S, S)
    symmetric with a zero diagonal (H may be 1; one per query head); three_body: (H, S, S, S). scale defaults
    to 1 / sqrt(E). bias is added to the field h (a float or a tensor broadcastable to (B, H, L, S), e.g.
    (H, 1, 1) for one bias per head); in mode 'softmax' it is added to the scores. ``method`` and
    ``method_options`` choose how marginals are computed (see :mod:`boltzmann_attention.ising`); modes
    'softmax' and 'h' (the closed form sigmoid(2h)) compute none, and refuse a method or options other than
    the defaults, as every mode refuses an option it does not use.

    attn_mask, broadcastable to (B, H, L, S), as SDPA: a bool tensor, True where the key takes part; or a float
    tensor added to the field (SDPA's additive mask): an entry -inf removes the key (it is absent, not clamped:
    no spin, weight 0), a finite entry is added to h_ij -- however negative: with couplings, an entry of
    torch.finfo(dtype).min, as some libraries build for absent keys, makes energies no float can resolve, and the
    methods refuse it with an error (mode 'h' gives the key weight 0); pass -inf or a bool mask for absent keys
    (the transformers adapter reads such entries as absent) --; or a
    ``torch.nn.attention.bias.CausalBias`` (``causal_lower_right(L, S)``: query row r is the position S - L + r
    and sees keys j <= S - L + r, so queries that end at the last key -- decoding with a key/value cache -- get
    the last rows of the full causal forward; ``causal_lower_right(L, S)`` with L = S, and
    ``causal_upper_left``, are ``is_causal=True``). is_causal=True
    is SDPA's top-left alignment (row r sees j <= r); with a bool or float attn_mask as well, both apply.

    couplings may also be an :class:`ising.toeplitz.Toeplitz` (J_jk = f(|j - k|), profile (H, w)) for
    methods 'meanfield' and 'tap': J is then applied as the banded operator, never as an (S, S) matrix.

    coupling_window=W: the coupled window (causal only, method 'exact'): couplings (H, W, W) indexed by
    window slot (slot a = the key a positions before the query), keys before the window independent; any
    length, either causal alignment. See :mod:`boltzmann_attention.coupled_window`.

    Dtypes: float32 and float64 are computed in their own dtype. float16 and bfloat16 inputs, and any input
    under ``torch.autocast``, have their fields, marginals and weighted sum computed in float32 (float64 stays
    float64) and the result returned in the input's dtype, or the autocast dtype under autocast (as SDPA).
    Tensors of bias, couplings, three_body and a float attn_mask of another float dtype are cast.

    Returns the output (B, H, L, Ev), and the weights (B, H, L, S) when return_weights is True. A query
    with no visible key gets zero weights and a zero output (SDPA's softmax gives NaN there); B, L or S = 0
    give empty results. Every argument is checked first, and an error names it: every tensor that enters the
    scores or weights must be finite in every mode (query and key, the field they make, a bias tensor, a float
    attn_mask apart from its -inf entries, the couplings), value is used as given (a NaN in it propagates, as in
    SDPA). The value checks are skipped on meta tensors and while ``torch.compile`` traces
    (``torch.compiler.is_compiling()``): there they would need the data. On meta tensors the result has the
    right shape and dtype and no values (nothing is solved).
    """
    if isinstance(query, Tensor) and _result_dtype(query) != query.dtype:  # under autocast, as SDPA: every
        dtype = _result_dtype(query)                                         # input in autocast's dtype
        query, key, value = (x.to(dtype) if isinstance(x, Tensor) and x.is_floating_point() else x
                             for x in (query, key, value))
    check_call(query, key, value, couplings=couplings, three_body=three_body, mode=mode, method=method,
               method_options=method_options, is_causal=is_causal, attn_mask=attn_mask, scale=scale, bias=bias,
               return_weights=return_weights, coupling_window=coupling_window, enable_gqa=enable_gqa)
    L, S = query.shape[-2], key.shape[-2]
    causal_offset = 0 if is_causal else None
    if isinstance(attn_mask, CausalBias):
        causal_offset = S - L if attn_mask.variant == CausalVariant.LOWER_RIGHT else 0
        attn_mask = None
    if key.shape[1] != query.shape[1]:  # grouped-query attention: query head h reads key/value head h // group
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    return _attend(query, key, value, couplings, three_body, mode, method, causal_offset, attn_mask, scale, bias,
                   return_weights, method_options or {}, None if coupling_window is None else int(coupling_window))


def _result_dtype(x: Tensor) -> torch.dtype:
    """The dtype of the result: the autocast dtype under autocast (as SDPA), else x's."""
    device = x.device.type
    if device in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def _no_autocast(device: str):
    """A context without autocast on ``device`` (the Boltzmann modes pick their own dtype)."""
    if device in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


def _as(x, dtype: torch.dtype):
    """x cast to dtype when it is a tensor (a Toeplitz operator: its profile)."""
    if isinstance(x, ising.toeplitz.Toeplitz):
        return ising.toeplitz.Toeplitz(x.profile.to(dtype))
    if isinstance(x, ising.chain.Band):
        return ising.chain.Band(x.values.to(dtype))
    return x.to(dtype) if isinstance(x, Tensor) else x


def _values(x):
    """The tensor behind couplings given as a Toeplitz profile or a band, or the tensor itself."""
    if isinstance(x, ising.toeplitz.Toeplitz):
        return x.profile
    return x.values if isinstance(x, ising.chain.Band) else x


def _attend(query, key, value, couplings, three_body, mode, method, causal_offset, attn_mask, scale, bias,
            return_weights, method_options: dict, coupling_window, built_couplings: bool = False):
    """:func:`boltzmann_attention` on checked arguments (the module checks its options once, at construction):
    the field, the marginals, the weighted sum. Only the values are checked here (NaN/inf in the field).

    causal_offset: None (not causal) or the offset d of the causal mask, query row r seeing keys j <= r + d
    (0: SDPA's top-left alignment, S - L: bottom-right). attn_mask: None, bool, or float (additive, -inf absent).
    built_couplings: the couplings come from the module's parametrisations (symmetric with a zero diagonal by
    construction), so only their values are checked, in the field's one reduction.
    """
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    mask, additive = attn_mask, None
    if mask is not None and mask.is_floating_point():  # SDPA's additive mask: -inf absent, the rest on the field
        mask, additive = mask != float("-inf"), mask
        additive = additive.masked_fill(~mask, 0.0)
    keys_mask = mask  # without the causal part, which the coupled window builds into its slots
    mask_key = None  # names a mask made from the shapes alone: the solver need not read it
    if causal_offset is not None:  # True where the key takes part
        causal = torch.ones(L, S, dtype=torch.bool, device=query.device).tril(causal_offset)
        if mask is None:
            mask, mask_key = causal, f"causal: L={L} S={S} offset={causal_offset}"
        else:
            mask = mask & causal

    if modes.RECORDS[mode].softmax:  # bias and a float mask: added to the scores (SDPA's additive mask)
        check_values(mode, query, key, None, tuple((name, x) for name, x in (("bias", bias), ("attn_mask", additive))
                                                   if isinstance(x, Tensor)))
        if additive is not None:
            bias = additive + bias
        if isinstance(bias, Tensor) or bias != 0:
            shift = torch.zeros(L, S, dtype=query.dtype, device=query.device) + _as(bias, query.dtype)
            mask = shift if mask is None else shift.masked_fill(~mask, float("-inf"))
        if not return_weights:
            return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        logits = query @ key.transpose(-1, -2) * scale
        if mask is not None:
            logits = logits + mask if mask.is_floating_point() else logits.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(logits, dim=-1)
        return weights @ value, weights

    result_dtype = _result_dtype(query)
    compute = torch.promote_types(query.dtype, torch.float32)  # float16, bfloat16 -> float32; float64 stays
    with _no_autocast(query.device.type):
        if additive is not None:
            bias = additive.to(compute) + _as(bias, compute)
        query, key, value = query.to(compute), key.to(compute), value.to(compute)
        out, weights = _boltzmann(query, key, value, _as(couplings, compute), _as(three_body, compute), mode, method,
                                  causal_offset, mask, scale, _as(bias, compute), return_weights, method_options,
                                  coupling_window, built_couplings, keys_mask, mask_key)
    out = out.to(result_dtype)
    return (out, weights.to(result_dtype)) if return_weights else out


def _boltzmann(query, key, value, couplings, three_body, mode, method, causal_offset, mask, scale, bias,
               return_weights, method_options, coupling_window, built_couplings=False, keys_mask=None, mask_key=None):
    """The Boltzmann modes of :func:`_attend` in one dtype: (out, weights or None). keys_mask: the mask without
    its causal part, for the coupled window (whose slots are causal by construction: a causal mask passed to it
    would send every row through the masked path); mask_key: the name of a mask made from the shapes alone."""
    uses_field, _, _ = mode_terms(mode)
    L, S = query.shape[-2], key.shape[-2]
    if uses_field:
        field = query @ key.transpose(-1, -2) * scale + bias
    else:  # mode J: the field is the bias alone, so compute the weights once, not once per batch item
        shape = torch.broadcast_shapes(torch.as_tensor(bias).shape, (1, 1, L, S),
                                       mask.shape if mask is not None else ())
        field = torch.zeros(shape, dtype=query.dtype, device=query.device) + bias
    built = [(f"the couplings {name}", _values(x))
             for name, x in (("J", couplings), ("K", three_body)) if built_couplings and x is not None]
    check_values(mode, query, key, field, tuple(built))

    if field.device.type == "meta":  # shapes and dtypes only: there are no values to solve for
        weights = torch.sigmoid(2 * field)
        weights = weights if mask is None else weights.masked_fill(~mask, 0.0)
        if couplings is not None or three_body is not None:  # in the graph, as a computed result would be
            weights = weights + sum(_values(x).sum() * 0 for x in (couplings, three_body) if x is not None)
        out = weights @ value
        return out, (weights.expand(*out.shape[:-1], S) if return_weights else None)
    if coupling_window is not None:
        record = ising.resolve_method(method)
        return coupled_window.window_attention(
            field, value, couplings, coupling_window, keys_mask,
            scores=(query, key, scale, bias) if uses_field else None, return_weights=return_weights,
            offset=causal_offset, check_couplings=False, max_spins=record.spin_limit(method_options),
            window_path=method_options.get("window_path", record.window_path))
    closed_form = modes.RECORDS[mode].weights
    if closed_form is not None:  # mode h: sigmoid(2h); h+J-step: sigmoid(2(h + J tanh h))
        weights = closed_form(field, couplings, mask)
    else:
        spins_mask = None if mask is None else mask.expand(torch.broadcast_shapes(mask.shape, field.shape))
        if isinstance(couplings, ising.toeplitz.Toeplitz):  # one profile per head, (H, 1, w) against (B, H, L)
            solve = ising.toeplitz.causal_marginals if causal_offset == 0 else ising.toeplitz.solve
            m = solve(field.expand(torch.broadcast_shapes(field.shape, (1, 1, L, S))),
                      ising.toeplitz.Toeplitz(couplings.profile[:, None]), spins_mask,
                      **dict(ising.resolve_method(method).toeplitz_options), **method_options)[0]
        elif isinstance(couplings, ising.chain.Band):  # from content, (B, H, 1 or L, S, w) against (B, H, L, S)
            m = ising.chain.band_marginals(field, couplings, spins_mask, mask_key=mask_key, **method_options)
        else:  # (H, 1, S, S) against (B, H, L); content couplings come as (B, H, 1 or L, S, S)
            J = couplings.unsqueeze(1) if couplings is not None and couplings.dim() == 3 else couplings
            K = three_body.unsqueeze(1) if three_body is not None else None
            m = ising._marginals(field, J, K, spins_mask, method, method_options, check_inputs_=not built_couplings,
                                 mask_key=mask_key)
        weights = (m + 1) / 2
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    out = weights @ value
    return out, (weights.expand(*out.shape[:-1], S) if return_weights else None)


class BoltzmannAttention(nn.Module):
    """Multi-head Boltzmann attention over x: (B, L, embed_dim).

    Owns the query/key/value/output projections, the couplings (zero at init, so mode h+J starts as
    sigmoid attention) and a field bias per head. The field bias starts at -log(max_len) / 2: the
    weights are sigmoid(2h), so this is sigmoid attention's recommended logit bias -log n (Ramapuram et
    al., 2024) expressed as a field. Couplings and the field bias are marked ``_no_weight_decay``; build
    the optimiser with :func:`parameter_groups` so that weight decay does not pull J towards zero.

    coupling: 'full' (a free J_jk for every pair, lengths <= max_len), 'relative' (J_jk = f(|j-k|),
    any length, f = 0 beyond ``coupling_range``, default max_len - 1; 0 means no couplings) or 'window' (the
    coupled window of ``coupling_window`` keys: J (H, W, W) indexed by slot a = key i - a, earlier keys
    independent, any length, causal, method 'exact'; ``coupling_window_relative=True`` for J_ab = f(|a - b|)).
    With 'relative' and method 'meanfield' or 'tap', J goes to the solver as its profile (a Toeplitz operator
    applied in blocks), not as an (L, L) matrix: the same model and method, fewer operations. All options are
    checked here, before any training, by the rules the functional form applies
    (:func:`boltzmann_attention.validation.check_options`); a forward checks only x, key_padding_mask and the
    values of the field.

    Position priors (:mod:`boltzmann_attention.positions`), for the field of the Boltzmann modes and the score of
    the softmax ones: ``position='rope'`` rotates queries and keys, ``position='alibi'`` adds ALiBi's fixed
    per-head slopes times -|i - j|, and ``slot_bias=W`` adds one learned scalar per head and per distance
    0..W-1 (zero at init, no weight decay); ``slot_bias_parametrization='pairs'`` adds to it the per-slot field
    -sum_b P_ab of a pair table P parametrised as the coupled window's J, without its interaction term
    (:class:`~boltzmann_attention.positions.SlotBias`). Modes 'fox' (forgetting attention, with a per-head forget gate
    Linear(embed_dim, num_heads) initialised like the other projections) and 'stickbreaking' are the learned-
    recency baselines of :mod:`boltzmann_attention.recency`; mode 'mta' is multi-token attention's key-query
    convolution of the scores before the softmax (:mod:`boltzmann_attention.mta`), with a kernel of
    ``mta_kernel_queries`` x ``mta_kernel_keys`` (default 2 x 9, its authors' toy-task setting) at identity.
    These three are causal and take no coupling options.

    Decoding: ``forward(x, cache={})`` keeps the keys and values in the dict and attends the next positions to
    them (SDPA's bottom-right alignment); token by token it gives the full forward's rows. Dtypes: the module
    cast to float16 or bfloat16, or run under ``torch.autocast``, computes fields and marginals in float32 and
    returns the low dtype (see :func:`boltzmann_attention`). ``torch.compile(fullgraph=True)`` traces modes
    softmax, h, h+J with method 'exact' and the coupled window without a graph break (method 'exact' and the
    window's solver are opaque operators there: :mod:`boltzmann_attention.ising.opaque`).
    """

    def __init__(self, embed_dim: int, num_heads: int, *, max_len: int, mode: str = "h+J",
                 method: str = "exact", causal: bool = True, coupling: str = "full",
                 coupling_range: int | None = None, coupling_init_std: float = 0.0,
                 field_bias_init: float | None = None, learn_field_bias: bool = True,
                 bias: bool = True, method_options: dict | None = None, coupling_window: int | None = None,
                 coupling_window_relative: bool = False, position: str | None = None, slot_bias: int | None = None,
                 slot_bias_parametrization: str = "direct", mta_kernel_queries: int = 2, mta_kernel_keys: int = 9,
                 coupling_rank: int = 16):
        super().__init__()
        check_layer_sizes(embed_dim, num_heads, max_len, coupling_init_std, field_bias_init)
        given = {name: value for name, value in locals().items() if name in OPTIONS}  # every option, by its name
        check_layer_options(head_dim=embed_dim // num_heads, **given)
        record = modes.RECORDS[mode]
        uses_field, uses_J, uses_K = record.field, record.couplings, record.three_body
        if coupling_range is None:
            coupling_range = max_len - 1
        self.embed_dim, self.num_heads, self.max_len = embed_dim, num_heads, max_len
        self.mode, self.method, self.causal = mode, method, causal
        solver = ising.resolve_method(method)
        self._toeplitz = solver.toeplitz  # relative J goes to the solver as its profile
        self._band = solver.band  # couplings from content go to the solver in band form
        self.method_options = dict(method_options or {})
        if "bandwidth" in solver.options and coupling in ("relative", "keys", "query") and uses_J:  # 0 beyond
            self.method_options.setdefault("bandwidth", coupling_range)
        self.query = nn.Linear(embed_dim, embed_dim, bias=bias) if uses_field else None
        self.key = nn.Linear(embed_dim, embed_dim, bias=bias) if uses_field else None
        self.value = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out = nn.Linear(embed_dim, embed_dim, bias=bias)

        self.couplings = None
        self.coupling_window = None if coupling_window is None else int(coupling_window)  # any integral type
        if uses_J and coupling == "window":
            self.couplings = WindowCouplings(num_heads, self.coupling_window, coupling_window_relative,
                                             coupling_init_std)
        elif uses_J and coupling == "full":
            self.couplings = FullCouplings(num_heads, max_len, coupling_init_std)
        elif uses_J and coupling in ("keys", "query"):
            self.couplings = ContentCouplings(num_heads, embed_dim // num_heads, coupling_rank, coupling_range,
                                              coupling == "query", coupling_init_std)
        elif uses_J:
            self.couplings = RelativeCouplings(num_heads, coupling_range, coupling_init_std)
        self.three_body = ThreeBodyCouplings(num_heads, max_len, coupling_init_std) if uses_K else None

        self.position = position
        self.slot_bias = SlotBias(num_heads, slot_bias, slot_bias_parametrization) if slot_bias is not None else None
        self.forget_gate = nn.Linear(embed_dim, num_heads) if record.forget_gate else None
        self.kernel = KeyQueryKernel(num_heads, mta_kernel_queries, mta_kernel_keys) if record.convolution else None

        self.field_bias = None
        if record.field_bias:
            init = -0.5 * math.log(max_len) if field_bias_init is None else field_bias_init
            self.field_bias = nn.Parameter(torch.full((num_heads,), float(init)),
                                           requires_grad=learn_field_bias)
            self.field_bias._no_weight_decay = True

    @property
    def window_path(self) -> str | None:
        """The path that computes the coupled window's marginals on the layer's device: 'split' or 'configurations'
        (:mod:`boltzmann_attention.ising.window`): the method's own, the option window_path, or for 'auto' the
        rule ``ising.window.choose_path`` on W and the device. None without a coupled window."""
        if self.coupling_window is None or self.couplings is None:
            return None
        path = self.method_options.get("window_path", ising.resolve_method(self.method).window_path)
        return ising.window.choose_path(self.coupling_window, self.value.weight.device) if path == "auto" else path

    def _heads(self, x: Tensor) -> Tensor:  # (B, L, D) -> (B, H, L, D/H)
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, self.embed_dim // self.num_heads).transpose(1, 2)

    def _check_input(self, x: Tensor) -> None:
        """x of the layer's dtype, or under autocast of x's device (SDPA's convention) of the dtype autocast
        gives a Linear's output, which the layer's own Linears then take as autocast says."""
        dtype = self.value.weight.dtype
        autocast = isinstance(x, Tensor) and torch.amp.is_autocast_available(x.device.type) \
            and torch.is_autocast_enabled(x.device.type)
        allowed = (dtype, torch.get_autocast_dtype(x.device.type)) if autocast else (dtype,)
        if not isinstance(x, Tensor) or x.dtype not in allowed:
            under = f" or, under autocast, {allowed[1]}" if autocast else ""
            raise ValueError(f"x must be a tensor of the layer's dtype {dtype}{under}, got {type(x).__name__} "
                             f"{getattr(x, 'dtype', '')}")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must have shape (B, L, embed_dim = {self.embed_dim}), got {tuple(x.shape)}")

    def _check_cache(self, cache: dict, x: Tensor) -> None:
        """ValueError unless ``cache`` is this layer's, from earlier calls with x's batch size and device."""
        expected = {"owner", "key", "value"} | ({"log_forget"} if self.forget_gate is not None else set()) \
            | ({"query"} if self.kernel is not None else set()) \
            | ({"content_key"} if isinstance(self.couplings, ContentCouplings) else set())
        owner = cache.get("owner")
        if not isinstance(owner, weakref.ref) or owner() is not self:
            raise ValueError("cache holds another layer's keys (or was filled by hand): give each layer its own dict, "
                             "empty at the first call")
        if set(cache) != expected:
            raise ValueError(f"cache must hold exactly {sorted(expected)} from this layer's earlier calls, got "
                             f"{sorted(cache)}; start from an empty dict")
        value = cache["value"]
        if not isinstance(value, Tensor) or value.dim() != 4 or value.shape[0] != x.shape[0] \
                or value.shape[1] != self.num_heads or value.device != x.device:
            raise ValueError(f"cache holds values of shape {tuple(getattr(value, 'shape', ()))} on "
                             f"{getattr(value, 'device', None)}, but this call has batch size {x.shape[0]} and "
                             f"{self.num_heads} heads on {x.device}; start from an empty dict for a new batch")

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, need_weights: bool = False,
                cache: dict | None = None) -> tuple[Tensor, Tensor | None]:
        """x: (B, L, embed_dim). key_padding_mask: (B, S) bool, True marks padding to ignore (the
        nn.MultiheadAttention convention; S = L without a cache). Returns (output (B, L, embed_dim), weights
        (B, H, L, S) or None).

        cache: a dict, empty at the first call, for decoding: the keys and values of the earlier calls (after
        the rotary embedding; with mode 'fox' also the forget gates, with mode 'mta' the last queries its
        convolution reads) are kept in it, and x holds the next L
        positions, which attend to every cached position and, causally, to each other (SDPA's bottom-right
        alignment). Token by token this gives the rows of the full forward over the whole sequence. The dict
        belongs to the layer that filled it (it keeps a weak reference to it under "owner"): another layer's
        dict, one missing a key, or one from another batch size is refused.
        """
        self._check_input(x)
        if not isinstance(need_weights, bool):
            raise ValueError(f"need_weights must be True or False, got {need_weights!r}")
        if cache is not None and not isinstance(cache, dict):
            raise ValueError(f"cache must be a dict (empty at the first call) or None, got {type(cache).__name__}")
        B, L, _ = x.shape
        if cache:
            self._check_cache(cache, x)
        past = 0 if not cache else cache["value"].shape[-2]
        S = past + L
        v = self._heads(self.value(x))
        if self.query is not None:
            q, k = self._heads(self.query(x)), self._heads(self.key(x))
        else:  # mode J: no field from the input; q and k only carry the shapes
            q = k = v.new_zeros(B, self.num_heads, L, 1)
        content_q, content_k = q, k  # before the rotary embedding: what content couplings read
        if self.position == "rope":
            positions = torch.arange(past, S, device=x.device)
            q, k = rotary(q, positions), rotary(k, positions)
        gate = self.forget_gate
        log_forget = None if gate is None else F.logsigmoid(gate(x)).transpose(1, 2)  # (B, H, L)
        rows = q  # mta: the queries its convolution reads, the cached ones before these
        if cache is not None:
            extra = {}
            if past:
                k, v = torch.cat([cache["key"], k], dim=-2), torch.cat([cache["value"], v], dim=-2)
                if log_forget is not None:
                    log_forget = torch.cat([cache["log_forget"], log_forget], dim=-1)
                if self.kernel is not None:
                    rows = torch.cat([cache["query"], q], dim=-2)
            if isinstance(self.couplings, ContentCouplings):
                if past:
                    content_k = torch.cat([cache["content_key"], content_k], dim=-2)
                extra["content_key"] = content_k
            if log_forget is not None:
                extra["log_forget"] = log_forget
            if self.kernel is not None:
                extra["query"] = rows[..., max(rows.shape[-2] - (self.kernel.weight.shape[1] - 1), 0):, :]
            cache.update(owner=weakref.ref(self), key=k, value=v, **extra)
        prior = self._position_bias(L, S, x.dtype)  # (H, L, S) or None
        if modes.RECORDS[self.mode].module_only:
            check_values("softmax", q, k, None, tuple((name, x) for name, x in (
                ("the forget gate", log_forget), ("the position prior (ALiBi, slot bias)", prior),
                ("mta's kernel", None if self.kernel is None else self.kernel.weight)) if x is not None))
            if key_padding_mask is not None:
                raise ValueError(f"mode {self.mode!r} takes no key_padding_mask (it runs over every key before the "
                                 "query)")
            kernel = None if self.kernel is None else self.kernel.weight
            state = {"log_forget": log_forget, "rows": rows, "kernel": kernel}
            result = modes.RECORDS[self.mode].attend(q, k, v, state, 0.0 if prior is None else prior, need_weights)
            out, weights = result if need_weights else (result, None)
            return self.out(out.transpose(1, 2).reshape(B, L, self.embed_dim)), weights
        attn_mask = None
        if key_padding_mask is not None:
            if not isinstance(key_padding_mask, Tensor) or key_padding_mask.shape != (B, S) \
                    or key_padding_mask.dtype != torch.bool:
                raise ValueError(f"key_padding_mask must be a bool tensor of shape ({B}, {S})")
            attn_mask = ~key_padding_mask[:, None, None, :]
        couplings = None
        if isinstance(self.couplings, RelativeCouplings) and self._toeplitz and x.device.type != "meta":
            couplings = ising.toeplitz.Toeplitz(self.couplings.weight)  # f(1) .. f(range), (H, range)
        elif isinstance(self.couplings, ContentCouplings) and self._band:
            couplings = ising.chain.Band(self.couplings.band(content_k, content_q))
        elif isinstance(self.couplings, ContentCouplings):
            couplings = self.couplings(content_k, content_q)
        elif self.couplings is not None:
            couplings = self.couplings(S)
        bias = self.field_bias.view(-1, 1, 1) if self.field_bias is not None else 0.0
        if prior is not None:
            bias = bias + prior
        result = _attend(q, k, v, couplings, self.three_body(S) if self.three_body is not None else None, self.mode,
                         self.method, S - L if self.causal else None, attn_mask, None, bias, need_weights,
                         self.method_options, self.coupling_window, built_couplings=True)
        out, weights = result if need_weights else (result, None)
        return self.out(out.transpose(1, 2).reshape(B, L, self.embed_dim)), weights

    def coupling_matrix(self, x: Tensor) -> Tensor | None:
        """The pairwise couplings J the layer applies to x (B, L, embed_dim) in a forward without a cache, dense, to
        look at: None without pairwise couplings; (H, L, L) for 'full' and 'relative'; (H, W, W) by slot for the
        coupled window (slot a: the key a positions before the query); for couplings from content, computed from
        x's keys (and queries) before any rotary embedding, as the forward does, (B, H, 1, L, L) for 'keys' and
        (B, H, L, L, L), one J per query, for 'query'. Three-body couplings K are not pairwise: not here."""
        self._check_input(x)
        if self.couplings is None:
            return None
        if isinstance(self.couplings, ContentCouplings):
            return self.couplings(self._heads(self.key(x)), self._heads(self.query(x)))
        return self.couplings(x.shape[1])

    def _position_bias(self, L: int, S: int, dtype: torch.dtype) -> Tensor | None:
        """ALiBi's and the slot bias's (H, L, S) sum (queries the last L of S positions), added to the field or the
        score; None without either."""
        prior = None
        if self.position == "alibi":
            prior = alibi_bias(alibi_slopes(self.num_heads).to(device=self.value.weight.device, dtype=dtype), L, S)
        if self.slot_bias is not None:
            slots = self.slot_bias(L, S).to(dtype)
            prior = slots if prior is None else prior + slots
        return prior


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Optimiser groups: weight decay on matrices, none on biases, norms, couplings and field biases.

    No decay for: every parameter of the couplings modules (``FullCouplings``, ``RelativeCouplings``,
    ``WindowCouplings``, ``ThreeBodyCouplings``: any module class with ``no_weight_decay = True``) and of
    ``SlotBias``; parameters named ``field_bias``; parameters with fewer than two dimensions; and parameters
    marked ``p._no_weight_decay = True`` (for a user's own parameters). The rule is by the owning module's
    class and the parameter's name, not only by the attribute on the Parameter object, so it holds after
    ``copy.deepcopy``, ``load_state_dict(assign=True)``, ``to_empty`` and ``torch.compile`` (each of which
    may hand over new Parameter objects without the attribute). A parameter shared by several modules is
    listed once.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
    check_real("weight_decay", weight_decay, minimum=0.0)
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        # `is True`: other libraries define a method of this name (timm: the names to exempt), which must not
        # exempt the whole module
        exempt_module = getattr(type(module), "no_weight_decay", False) is True or isinstance(module, SlotBias)
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            exempt = exempt_module or name == "field_bias" or getattr(p, "_no_weight_decay", False) or p.dim() < 2
            (no_decay if exempt else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
