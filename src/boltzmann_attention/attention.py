"""Boltzmann attention: the functional form and the ``nn.Module``.

For query i, key j is a spin s_j in {-1, +1} with field h_ij = scale * q_i.k_j + bias. Couplings J
(one matrix per head, shared by all queries and all batch items) and optional three-body couplings K
couple the keys:

    E_i(s) = - sum_j h_ij s_j - sum_{j<k} J_jk s_j s_k - sum_{j<k<l} K_jkl s_j s_k s_l,
    a_ij   = (<s_j>_i + 1) / 2,        o_i = sum_j a_ij v_j.

Keys that are masked out (causal mask, padding) are absent spins: they are not part of the energy at
all, and a_ij = 0. With J = K = 0, a_ij = sigmoid(2 h_ij): sigmoid attention.

Modes (the paper's ablation): ``softmax`` (plain SDPA), ``h`` (sigmoid(2h), closed form), ``J``
(h = bias only, so the weights do not depend on the input), ``h+J``, ``h+K``, ``h+J+K``.
"""

from __future__ import annotations

import itertools
import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import coupled_window, ising
from .coupled_window import WindowCouplings
from .ising._inputs import _check_finite, check_int, check_real

MODES = ("softmax", "h", "J", "h+J", "h+K", "h+J+K")


def _mode_terms(mode: str) -> tuple[bool, bool, bool]:
    """(uses the QK field, uses J, uses K) for a mode name."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    return mode != "J", "J" in mode, "K" in mode


def _check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Types and shapes (named) of query (B, H, L, E), key (B, H, S, E), value (B, H, S, Ev)."""
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
    for name, x in (("key", key), ("value", value)):
        if x.shape[:2] != (B, H):
            raise ValueError(f"{name} has batch and heads {tuple(x.shape[:2])} but query has {(B, H)}: (B, H) "
                             "must be the same for query, key and value")
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


def _check_options(query: Tensor, shape: tuple[int, ...], mode: str, method, method_options, attn_mask, bias,
                   scale, is_causal, return_weights) -> None:
    """The other arguments of :func:`boltzmann_attention`; shape is (B, H, L, S)."""
    for name, flag in (("is_causal", is_causal), ("return_weights", return_weights)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    if scale is not None:
        check_real("scale", scale)
    if isinstance(bias, Tensor):
        if bias.dtype != query.dtype:
            raise ValueError(f"bias must be a float or a tensor of query's dtype {query.dtype}, got {bias.dtype}")
        _check_broadcasts_to("bias", bias, shape)
    elif isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not math.isfinite(bias):
        raise ValueError(f"bias must be a finite float or a tensor broadcastable to (B, H, L, S), got {bias!r}")
    if mode == "softmax" and (isinstance(bias, Tensor) or bias != 0):
        raise ValueError("mode 'softmax' does not use `bias` (it shifts the Ising field); pass 0.0")
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise ValueError(f"attn_mask must be a bool tensor, got {type(attn_mask).__name__}")
        _check_broadcasts_to("attn_mask", attn_mask, shape)
    ising.validate_options(method, {} if method_options is None else method_options)


def _check_couplings(name: str, x: Tensor | None, query: Tensor, S: int, order: int) -> None:
    """couplings (H or 1, S, S) or three_body (H or 1, S, S, S) of query's dtype."""
    if x is None:
        return
    H = query.shape[1]
    expected = "(H, " + ", ".join([str(S)] * order) + f") with H = 1 or {H} heads"
    if not isinstance(x, Tensor) or x.dtype != query.dtype:
        raise ValueError(f"{name} must be a tensor of query's dtype {query.dtype}, got {type(x).__name__} "
                         f"{getattr(x, 'dtype', '')}")
    if x.dim() != order + 1 or x.shape[1:] != (S,) * order or x.shape[0] not in (1, H):
        raise ValueError(f"{name} must have shape {expected}, got {tuple(x.shape)}")


def _combined_mask(attn_mask: Tensor | None, is_causal: bool, L: int, S: int, device) -> Tensor | None:
    """Bool mask broadcastable to (B, H, L, S), True where the key takes part (SDPA's convention)."""
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise ValueError("attn_mask must be a bool tensor (True means the key takes part); to shift the "
                         "field, pass a float tensor as `bias` instead")
    mask = attn_mask
    if is_causal:  # query i sees keys j <= i, aligned top-left as in SDPA
        causal = torch.ones(L, S, dtype=torch.bool, device=device).tril()
        mask = causal if mask is None else mask & causal
    return mask


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
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention whose weights are Ising marginals, with SDPA's conventions.

    query: (B, H, L, E); key: (B, H, S, E); value: (B, H, S, Ev). couplings: (H, S, S) symmetric with a
    zero diagonal (H may be 1); three_body: (H, S, S, S). attn_mask: bool, broadcastable to (B, H, L, S),
    True where the key takes part. scale defaults to 1 / sqrt(E). bias is added to the field h (a float
    or a tensor broadcastable to (B, H, L, S), e.g. (H, 1, 1) for one bias per head). ``method`` and
    ``method_options`` choose how marginals are computed (see :mod:`boltzmann_attention.ising`); mode
    'h' uses the closed form sigmoid(2h) and ignores them.

    couplings may also be an :class:`ising.toeplitz.Toeplitz` (J_jk = f(|j - k|), profile (H, w)) for
    methods 'meanfield' and 'tap': J is then applied as the banded operator, never as an (S, S) matrix.

    coupling_window=W: the coupled window (causal only, method 'exact'): couplings (H, W, W) indexed by
    window slot (slot a = key i - a), keys before the window independent; any length. See
    :mod:`boltzmann_attention.coupled_window`.

    Returns the output (B, H, L, Ev), and the weights (B, H, L, S) when return_weights is True. A query
    with no visible key gets zero weights and a zero output (SDPA's softmax gives NaN there); B, L or S = 0
    give empty results. Every argument is checked first, and an error names it: query and key must be
    finite in every mode (and the field they make with bias), value is used as given (a NaN in it
    propagates, as in SDPA).
    """
    uses_field, uses_J, uses_K = _mode_terms(mode)
    _check_qkv(query, key, value)
    L, S = query.shape[-2], key.shape[-2]
    _check_options(query, (*query.shape[:2], L, S), mode, method, method_options, attn_mask, bias, scale,
                   is_causal, return_weights)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    mask = _combined_mask(attn_mask, is_causal, L, S, query.device)

    for name, given, needed in (("couplings", couplings, uses_J), ("three_body", three_body, uses_K)):
        if needed and given is None:
            raise ValueError(f"mode {mode!r} needs `{name}`")
        if given is not None and not needed:
            raise ValueError(f"mode {mode!r} does not use `{name}`; pass None or choose another mode")
    toeplitz = isinstance(couplings, ising.toeplitz.Toeplitz)
    if toeplitz:
        _check_toeplitz_call(couplings, three_body, method, coupling_window)
    elif coupling_window is not None:
        _check_window_call(coupling_window, couplings, three_body, uses_J, method, is_causal, method_options)
    else:
        _check_couplings("couplings", couplings, query, S, 2)
    _check_couplings("three_body", three_body, query, S, 3)

    if mode == "softmax":  # NaN/inf: refused in every mode (here query and key, below the field they make)
        _check_finite("query", query)
        _check_finite("key", key)
        logits = query @ key.transpose(-1, -2) * scale
        if not return_weights:
            return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(logits, dim=-1)
        return weights @ value, weights

    if uses_field:
        field = query @ key.transpose(-1, -2) * scale + bias
    else:  # mode J: the field is the bias alone, so compute the weights once, not once per batch item
        shape = torch.broadcast_shapes(torch.as_tensor(bias).shape, (1, 1, L, S),
                                       mask.shape if mask is not None else ())
        field = torch.zeros(shape, dtype=query.dtype, device=query.device) + bias

    _check_finite("the field h = scale * query.key + bias", field)  # every mode, also h (closed form)
    if coupling_window is not None:
        out, weights = coupled_window.window_attention(
            field, value, couplings, coupling_window, mask, scores=(query, key, scale, bias) if uses_field else None,
            return_weights=return_weights, **(method_options or {}))
        return (out, weights) if return_weights else out
    if mode == "h":
        weights = torch.sigmoid(2 * field)  # = (tanh(h) + 1) / 2, exact for independent spins
    else:
        J = couplings.unsqueeze(1) if couplings is not None and not toeplitz else None  # (H, 1, S, S) vs (B, H, L)
        K = three_body.unsqueeze(1) if three_body is not None else None
        spins_mask = None if mask is None else mask.expand(torch.broadcast_shapes(mask.shape, field.shape))
        if toeplitz:  # one profile per head, (H, 1, w) against (B, H, L); causal rows need only keys j <= i
            solve = ising.toeplitz.causal_marginals if is_causal else ising.toeplitz.solve
            m = solve(field.expand(torch.broadcast_shapes(field.shape, (1, 1, L, S))),
                      ising.toeplitz.Toeplitz(couplings.profile[:, None]), spins_mask, tap=method == "tap",
                      **(method_options or {}))[0]
        else:
            m = ising.marginals(field, J, K, mask=spins_mask, method=method, **(method_options or {}))
        weights = (m + 1) / 2
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    out = weights @ value
    return (out, weights.expand(*out.shape[:-1], S)) if return_weights else out


def _check_sizes(init_std: float = 0.0, **sizes: int) -> None:
    """Each size an integer >= 1, init_std a finite number >= 0; ValueError naming the argument."""
    for name, value in sizes.items():
        check_int(name, value, 1)
    check_real("coupling_init_std", init_std, minimum=0.0)


def _check_window_call(window, couplings, three_body, uses_J, method, is_causal, method_options) -> None:
    if not uses_J or three_body is not None:
        raise ValueError("coupling_window needs a mode with pairwise couplings and no three-body terms "
                         "('h+J' or 'J')")
    if method != "exact":
        raise ValueError(f"coupling_window is computed by method 'exact' only, got {method!r}")
    if not is_causal:
        raise ValueError("coupling_window needs is_causal=True (slot a is key i - a, the keys before query i)")
    unknown = set(method_options or {}) - {"max_spins"}
    if unknown:
        raise ValueError(f"unknown method_options {sorted(unknown)} for coupling_window; it takes 'max_spins'")
    coupled_window.window_ising.check_window(couplings, window, (method_options or {}).get(
        "max_spins", coupled_window.window_ising.MAX_SPINS))


def _check_toeplitz_call(couplings, three_body, method, coupling_window) -> None:
    if method not in ("meanfield", "tap"):
        raise ValueError(f"Toeplitz couplings are solved by methods 'meanfield' and 'tap', got {method!r}; pass "
                         "the dense J (Toeplitz.dense(S)) to the other methods")
    if three_body is not None or coupling_window is not None:
        raise ValueError("Toeplitz couplings take no three_body and no coupling_window")
    if couplings.profile.dim() != 2:
        raise ValueError(f"the Toeplitz profile must have shape (H, w), got {tuple(couplings.profile.shape)}")


class FullCouplings(nn.Module):
    """One free coupling J_jk per key pair and head, for lengths up to ``max_len``: (H, S, S)."""

    def __init__(self, num_heads: int, max_len: int, init_std: float = 0.0):
        super().__init__()
        _check_sizes(num_heads=num_heads, max_len=max_len, init_std=init_std)
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(num_heads, max_len, max_len) * init_std)
        self.weight._no_weight_decay = True

    def forward(self, length: int) -> Tensor:
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len {self.max_len} of the couplings; "
                             "use coupling='relative' for any length")
        upper = self.weight[:, :length, :length].triu(1)
        return upper + upper.transpose(-1, -2)


class RelativeCouplings(nn.Module):
    """J_jk = f(|j - k|) per head, with f(d) learnable for 1 <= d <= max_distance and 0 beyond.

    Works for any length. J has bandwidth ``max_distance``, so method='banded' applies directly;
    max_distance = 0 means no couplings (J = 0).
    """

    def __init__(self, num_heads: int, max_distance: int, init_std: float = 0.0):
        super().__init__()
        _check_sizes(num_heads=num_heads, init_std=init_std)
        check_int("max_distance (coupling_range)", max_distance, 0)
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.randn(num_heads, max_distance) * init_std)  # f(1) .. f(max_distance)
        self.weight._no_weight_decay = True

    def forward(self, length: int) -> Tensor:
        zero = self.weight.new_zeros(self.weight.shape[0], 1)
        table = torch.cat([zero, self.weight, zero], dim=1)  # index: distance, clamped past the range
        position = torch.arange(length, device=self.weight.device)
        distance = (position[:, None] - position[None, :]).abs().clamp(max=self.max_distance + 1)
        return table[:, distance]


class ThreeBodyCouplings(nn.Module):
    """One free K_jkl per key triple j<k<l and head, symmetrised: (H, S, S, S)."""

    def __init__(self, num_heads: int, max_len: int, init_std: float = 0.0):
        super().__init__()
        _check_sizes(num_heads=num_heads, max_len=max_len, init_std=init_std)
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(num_heads, max_len, max_len, max_len) * init_std)
        self.weight._no_weight_decay = True

    def forward(self, length: int) -> Tensor:
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len {self.max_len} of the couplings")
        i = torch.arange(length, device=self.weight.device)
        ordered = (i[:, None, None] < i[None, :, None]) & (i[None, :, None] < i[None, None, :])
        upper = self.weight[:, :length, :length, :length] * ordered
        return sum(upper.permute(0, *(1 + p for p in perm)) for perm in itertools.permutations(range(3)))


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
    checked here, before any training.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, max_len: int, mode: str = "h+J",
                 method: str = "exact", causal: bool = True, coupling: str = "full",
                 coupling_range: int | None = None, coupling_init_std: float = 0.0,
                 field_bias_init: float | None = None, learn_field_bias: bool = True,
                 bias: bool = True, method_options: dict | None = None, coupling_window: int | None = None,
                 coupling_window_relative: bool = False):
        super().__init__()
        uses_field, uses_J, uses_K = _mode_terms(mode)
        coupling_range = _check_layer(embed_dim, num_heads, max_len, coupling, coupling_range, coupling_init_std,
                                      field_bias_init, method, method_options, causal)
        if (coupling == "window") != (coupling_window is not None):
            raise ValueError("coupling='window' and coupling_window=W go together (W: the number of coupled keys)")
        if coupling == "window" and uses_J:
            _check_window_call(coupling_window, None, None, not uses_K, method, causal, method_options)
        self.embed_dim, self.num_heads, self.max_len = embed_dim, num_heads, max_len
        self.mode, self.method, self.causal = mode, method, causal
        self.method_options = dict(method_options or {})
        if method == "banded" and coupling == "relative" and uses_J:  # J's band is known: J_jk = 0 beyond the range
            self.method_options.setdefault("bandwidth", coupling_range)
        self.query = nn.Linear(embed_dim, embed_dim, bias=bias) if uses_field else None
        self.key = nn.Linear(embed_dim, embed_dim, bias=bias) if uses_field else None
        self.value = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out = nn.Linear(embed_dim, embed_dim, bias=bias)

        self.couplings = None
        self.coupling_window = coupling_window if coupling == "window" and uses_J else None
        if uses_J and coupling == "window":
            self.couplings = WindowCouplings(num_heads, coupling_window, coupling_window_relative, coupling_init_std)
        elif uses_J and coupling == "full":
            self.couplings = FullCouplings(num_heads, max_len, coupling_init_std)
        elif uses_J:
            self.couplings = RelativeCouplings(num_heads, coupling_range, coupling_init_std)
        self.three_body = ThreeBodyCouplings(num_heads, max_len, coupling_init_std) if uses_K else None

        self.field_bias = None
        if mode != "softmax":
            init = -0.5 * math.log(max_len) if field_bias_init is None else field_bias_init
            self.field_bias = nn.Parameter(torch.full((num_heads,), float(init)),
                                           requires_grad=learn_field_bias)
            self.field_bias._no_weight_decay = True

    def _heads(self, x: Tensor) -> Tensor:  # (B, L, D) -> (B, H, L, D/H)
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, self.embed_dim // self.num_heads).transpose(1, 2)

    def _check_input(self, x: Tensor) -> None:
        dtype = self.value.weight.dtype
        if not isinstance(x, Tensor) or x.dtype != dtype:
            raise ValueError(f"x must be a tensor of the layer's dtype {dtype}, got {type(x).__name__} "
                             f"{getattr(x, 'dtype', '')}")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must have shape (B, L, embed_dim = {self.embed_dim}), got {tuple(x.shape)}")

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, L, embed_dim). key_padding_mask: (B, L) bool, True marks padding to ignore (the
        nn.MultiheadAttention convention). Returns (output (B, L, embed_dim), weights (B, H, L, L) or None).
        """
        self._check_input(x)
        B, L, _ = x.shape
        v = self._heads(self.value(x))
        if self.query is not None:
            q, k = self._heads(self.query(x)), self._heads(self.key(x))
        else:  # mode J: no field from the input; q and k only carry the shapes
            q = k = v.new_zeros(B, self.num_heads, L, 1)
        attn_mask = None
        if key_padding_mask is not None:
            if key_padding_mask.shape != (B, L) or key_padding_mask.dtype != torch.bool:
                raise ValueError(f"key_padding_mask must be a bool tensor of shape ({B}, {L})")
            attn_mask = ~key_padding_mask[:, None, None, :]
        couplings = None
        if isinstance(self.couplings, RelativeCouplings) and self.method in ("meanfield", "tap"):
            couplings = ising.toeplitz.Toeplitz(self.couplings.weight)  # f(1) .. f(range), (H, range)
        elif self.couplings is not None:
            couplings = self.couplings(L)
        result = boltzmann_attention(
            q, k, v,
            couplings=couplings,
            three_body=self.three_body(L) if self.three_body is not None else None,
            mode=self.mode, method=self.method, is_causal=self.causal, attn_mask=attn_mask,
            bias=self.field_bias.view(-1, 1, 1) if self.field_bias is not None else 0.0,
            return_weights=need_weights, method_options=self.method_options,
            coupling_window=self.coupling_window,
        )
        out, weights = result if need_weights else (result, None)
        return self.out(out.transpose(1, 2).reshape(B, L, self.embed_dim)), weights


def _check_layer(embed_dim, num_heads, max_len, coupling, coupling_range, coupling_init_std, field_bias_init,
                 method, method_options, causal) -> int:
    """BoltzmannAttention's options, each named in its error. Returns the coupling range to use."""
    _check_sizes(embed_dim=embed_dim, num_heads=num_heads, max_len=max_len, init_std=coupling_init_std)
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
    if coupling not in ("full", "relative", "window"):
        raise ValueError(f"unknown coupling {coupling!r}; choose 'full', 'relative' or 'window'")
    if coupling_range is not None and coupling != "relative":
        raise ValueError(f"coupling_range applies to coupling='relative' only (got coupling={coupling!r}); "
                         "'full' couples every pair up to max_len")
    if coupling_range is None:
        coupling_range = max_len - 1
    check_int("coupling_range", coupling_range, 0)  # 0: no couplings, honoured (not replaced by a default)
    if field_bias_init is not None:
        check_real("field_bias_init", field_bias_init)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if method_options is not None and not isinstance(method_options, dict):
        raise ValueError(f"method_options must be a dict or None, got {type(method_options).__name__}")
    ising.validate_options(method, method_options or {})  # unknown method or option: now, not at step 1
    return coupling_range


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Optimiser groups: weight decay on matrices, none on biases, norms, couplings and field biases.

    Parameters marked ``_no_weight_decay`` (couplings, field bias) and all parameters with fewer than two
    dimensions go to the group without decay.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
    check_real("weight_decay", weight_decay, minimum=0.0)
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (no_decay if getattr(p, "_no_weight_decay", False) or p.dim() < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
