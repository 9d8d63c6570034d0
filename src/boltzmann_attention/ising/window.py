"""Exact marginals of a coupled window of W spins shared by many queries.

The window model: for query i, slot a (0 <= a < W) holds key i - a, and the W slots are coupled by one
slot-indexed J (W, W) per head, shared by every query of the head. This module solves the window part:

    E_q(s) = - sum_a h_qa s_a - sum_{a<b} J_ab s_a s_b,   s in {-1, +1}^W,   over the present slots,

h (..., W), J (..., W, W) (symmetric, zero diagonal; batch dims broadcast against h's), present (..., W)
bool (False: the slot's key is absent -- before the sequence start or masked -- and is removed from every
term). Returns <s_a> (..., W), 0 at absent slots. The keys outside the window are independent spins,
<s_j> = tanh(h_ij); :mod:`boltzmann_attention.coupled_window` assembles the attention from both parts.

Split enumeration as in method ``exact`` (:mod:`boltzmann_attention.ising.split`): slots A = 0..W/2-1 and
B = W/2..W-1, Z = u^T T v with ONE coupling table T (2^(W/2) x 2^(W/2)) per head, so all queries of a head
(B * L of them) go through two GEMMs of inner size 2^(W/2): about 2 * 2^W MACs per query. Gradients: autograd
through those plain operations.

Absent slots (the first W - 1 queries of a sequence, masked keys): with ``present`` given, each query is
solved on its present slots only, by method ``exact``'s mask patterns (one smaller system per pattern,
patterns of similar size padded with free spins into one call; the full pattern is one system). The
couplings of an absent slot never enter its energies: clamping it and cancelling its couplings by shifting
the fields would lose the fields to cancellation once |J| is large next to them (|J| ~ 1e5 in float32, 1e12
in float64).

Numerics (:mod:`boltzmann_attention.ising.numerics`), as in method ``exact`` (``split.rescued``): u, v and T
are max-shifted in the log domain; a query whose Z still underflows (|h| or |J| in the tens to hundreds,
fields fighting couplings), or whose energy scale is beyond what its dtype resolves, is recomputed in
float64 over its 2^W states, and energies that float64 cannot resolve either raise a ValueError.
Limit: W <= ``max_spins`` (default 24; the table has 2^W entries per head).

Two paths compute the same marginals (equal to float64 precision, tested): ``"split"``, the split enumeration
above, and ``"configurations"``, softmax attention over the window's 2^W configurations through one fused SDPA
kernel (:mod:`boltzmann_attention.ising.configurations`: q = [h, 1], k = [S, E_J(S)], v = S; a query with absent
slots gets them as free spins). :func:`choose_path` is the rule the layer applies unless told a path (method
'configurations', or method 'exact' with the option ``window_path``); it reads W and the device only, so the
path a layer takes is known before it runs (``BoltzmannAttention.window_path``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import configurations, exact, numerics, split
from ._inputs import group_queries
from .opaque import grads, keep, token_like, wants_grad
from .record import WINDOW_PATHS

MAX_SPINS = 24
PATHS = WINDOW_PATHS[1:]  # ("split", "configurations"); "auto" is choose_path
# The rule: the largest W for which the configurations path is the faster one, per device type, from
# measurements of both paths side by side (fwd+bwd, report/benchmark/window_paths.md, docs/design.md). On the
# CPU it is never clearly faster (level at small W, slower beyond): 0. A device type without a measurement
# (CUDA: the GPU check times both paths) takes the split enumeration.
CONFIGURATIONS_UP_TO = {"cpu": 0}


def choose_path(window: int, device) -> str:
    """The coupled window's path for W = ``window`` keys on ``device`` (a torch.device or its type): 'configurations'
    where W <= CONFIGURATIONS_UP_TO of the device type, else 'split'."""
    kind = device if isinstance(device, str) else torch.device(device).type
    return "configurations" if window <= CONFIGURATIONS_UP_TO.get(kind, 0) else "split"


def check_path(path: str) -> str:
    """ValueError unless ``path`` is one of WINDOW_PATHS; returns it."""
    if not isinstance(path, str) or path not in WINDOW_PATHS:
        raise ValueError(f"window_path must be one of {WINDOW_PATHS} ('auto': choose_path's rule on W and the "
                         f"device), got {path!r}")
    return path


def check_window(J: Tensor | None, window: int, max_spins: int = MAX_SPINS) -> None:
    """Raise ValueError unless 1 <= W <= max_spins and J (unless None) is (H, W, W), symmetric, zero diagonal."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"coupling_window must be an integer >= 1, got {window!r}")
    if window > max_spins:
        raise ValueError(
            f"coupling_window {window} is too large for exact window marginals: the window is enumerated as "
            f"2^W states (a 2^W table per head, 2 * 2^W MACs per query) and is limited to W <= {max_spins} "
            f"(option max_spins). Use a smaller window, or couplings of limited range along the whole "
            f"context (coupling='relative' with method='banded', or 'meanfield'/'tap', approximate).")
    if J is None:
        return
    if not isinstance(J, Tensor) or not J.is_floating_point():
        raise ValueError("window couplings must be a floating-point tensor of shape (H, W, W)")
    if J.dim() != 3 or J.shape[-2:] != (window, window):
        raise ValueError(f"window couplings must have shape (H, {window}, {window}) for coupling_window "
                         f"{window} (slot a is key i - a), got {tuple(J.shape)}")
    if not torch.isfinite(J).all():
        raise ValueError("window couplings contain NaN or inf")
    if (J.diagonal(dim1=-2, dim2=-1) != 0).any():
        raise ValueError("window couplings must have a zero diagonal (s_a^2 = 1 makes J_aa a constant)")
    scale = float(J.detach().abs().max()) if J.numel() else 0.0
    if not torch.allclose(J, J.transpose(-1, -2), rtol=0, atol=1e-5 * max(1.0, scale)):
        raise ValueError("window couplings must be symmetric: J_ab and J_ba are the same coupling")


def marginals(h: Tensor, J: Tensor, present: Tensor | None = None, mask_key: str | None = None,
              path: str = "split") -> Tensor:
    """<s_a> of the window system, shape of the broadcast (..., W). See the module docstring; mask_key names
    ``present`` as in :func:`boltzmann_attention.ising.exact.marginals` (not read after the first call); path:
    'split' or 'configurations' (one of PATHS; 'auto' is resolved by the caller, :func:`choose_path`)."""
    if path not in PATHS:
        raise ValueError(f"the window's path must be one of {PATHS} here, got {path!r} ('auto' is resolved by "
                         f"choose_path before the solve)")
    if path == "configurations":  # absent slots: free spins, no mask patterns
        g = group_queries(h, J, None, present)
        return g.ungroup(configurations.solve(g.h, g.J, g.mask))
    if present is not None:  # each query on its present slots only (method exact's mask patterns)
        return exact.marginals(h, J, None, present, max_spins=h.shape[-1], mask_key=mask_key)
    g = group_queries(h, J, None, None)
    return g.ungroup(_split(g.h, g.J))


def _split(h: Tensor, J: Tensor) -> Tensor:
    """h (G, Q, W), J (G, W, W), every slot present -> marginals (G, Q, W).

    One table T = exp(C - row max C) per group for every query (the row maxima go into log u), and plain
    tensor operations, so that autograd
    differentiates it (twice as well): with the table shared by thousands of queries this is the fastest form
    on a CPU. Rows that underflow or that the dtype cannot resolve go to ``split.rescued``'s float64 rescue.
    """
    W = h.shape[-1]
    if W == 1:  # one spin, no coupling
        return torch.tanh(h)
    a = W // 2
    SA = split.half_configurations(a, h.dtype, h.device)      # (2^a, a)
    SB = split.half_configurations(W - a, h.dtype, h.device)  # (2^b, b)
    left, right = split.table_factors(J, None, a, SA, SB)     # log T = left @ right^T, (G, 2^a, 2^b)
    log_table = left @ right.transpose(-1, -2)
    row_max = log_table.detach().amax(-1)  # each row of T shifted by its own maximum, absorbed into log u
    table = torch.exp(log_table - row_max[..., None])
    SA1, SB1 = _with_ones(SA), _with_ones(SB)
    chunk = max(1, numerics.CHUNK_ELEMENTS // max(SA.shape[0], SB.shape[0]))
    pieces = [_contract(h_[..., :a] @ SA.T + row_max[:, None, :], h_[..., a:] @ SB.T, table, SA1, SB1)
              for h_ in h.split(chunk, dim=1)]
    m, logz, ok = (torch.cat(x, dim=1) for x in zip(*pieces)) if len(pieces) > 1 else pieces[0]
    return split.rescued(m, logz, ok, h, J, None)[0]  # underflow and dtype resolution: float64 rows


def _with_ones(S: Tensor) -> Tensor:
    """(2^k, k + 1): the half configurations and a column of ones, so one product gives the sums and Z."""
    return torch.cat([S, torch.ones_like(S[:, :1])], dim=1)


def _contract(log_u: Tensor, log_v: Tensor, table: Tensor, SA1: Tensor, SB1: Tensor):
    """Marginals (G, q, W), log Z up to the table's shift (G, q) and ok (G, q: Z did not underflow)."""
    shift_u, shift_v = log_u.detach().amax(-1, keepdim=True), log_v.detach().amax(-1, keepdim=True)
    u, v = torch.exp(log_u - shift_u), torch.exp(log_v - shift_v)
    sums_a = (u * (v @ table.transpose(-1, -2))) @ SA1  # [(u * T v) @ S_A, Z]
    sums_b = (v * (u @ table)) @ SB1                    # [(v * T^T u) @ S_B, Z]
    z = sums_a[..., -1]
    ok = z.detach() > torch.finfo(z.dtype).tiny ** 0.5
    safe = torch.where(ok, z, 1.0)
    m = torch.cat([sums_a[..., :-1], sums_b[..., :-1]], dim=-1) / safe[..., None]
    logz = torch.log(safe) + (shift_u + shift_v).squeeze(-1)
    return torch.where(ok[..., None], m, 0.0), logz, ok


# --- the opaque operators for torch.compile (ising/opaque.py) ------------------------------------------

def _window_eager(h, J, present, mask_key=None, path="split"):
    return marginals(h, J, present, mask_key, path)


@torch.library.custom_op("boltzmann_attention::window_marginals", mutates_args=())
def window_marginals(h: Tensor, J: Tensor, present: Tensor | None, mask_key: str | None, path: str) -> Tensor:
    """<s_a> of the coupled window (:func:`boltzmann_attention.ising.window.marginals`), eagerly at run time."""
    return _window_eager(h, J, present, mask_key, path).contiguous()


def _window_fake(h, J, present, mask_key=None, path="split"):
    shapes = [h.shape[:-1], J.shape[:-2]] + ([present.shape[:-1]] if present is not None else [])
    return h.new_empty(tuple(torch.broadcast_shapes(*shapes)) + (h.shape[-1],))


window_marginals.register_fake(_window_fake)


@torch.library.custom_op("boltzmann_attention::window_marginals_kept", mutates_args=())
def window_marginals_kept(h: Tensor, J: Tensor, present: Tensor | None, mask_key: str | None, path: str
                          ) -> tuple[Tensor, Tensor]:
    """``window_marginals`` and the token of its kept graph, for the backward (module docstring)."""
    return keep(lambda h, J: _window_eager(h, J, present, mask_key, path), [h, J])


@window_marginals_kept.register_fake
def _(h, J, present, mask_key, path):
    return _window_fake(h, J, present), token_like()


@torch.library.custom_op("boltzmann_attention::window_marginals_backward", mutates_args=())
def window_marginals_backward(h: Tensor, J: Tensor, present: Tensor | None, grad: Tensor,
                              token: Tensor | None, mask_key: str | None, path: str) -> tuple[Tensor, Tensor]:
    gh, gJ = grads(lambda h, J: _window_eager(h, J, present, mask_key, path), [h, J], grad, token)
    return gh, gJ


@window_marginals_backward.register_fake
def _(h, J, present, grad, token, mask_key, path):
    return h.new_empty(h.shape), J.new_empty(J.shape)


def _window_setup(ctx, inputs, output):
    h, J, present, mask_key, path = inputs
    token = output[1] if isinstance(output, tuple) else None
    ctx.save_for_backward(h, J, present, token)
    ctx.mask_key, ctx.path = mask_key, path


def _window_backward(ctx, grad, *token_grad):
    h, J, present, token = ctx.saved_tensors
    gh, gJ = window_marginals_backward(h, J, present, grad, token, ctx.mask_key, ctx.path)
    return gh, gJ, None, None, None


window_marginals.register_autograd(_window_backward, setup_context=_window_setup)
window_marginals_kept.register_autograd(_window_backward, setup_context=_window_setup)


def window_solve(h: Tensor, J: Tensor, present: Tensor | None, mask_key: str | None = None,
                 path: str = "split") -> Tensor:
    """What ``torch.compile`` traces for the coupled window's marginals: the kept variant where a gradient is
    wanted."""
    if wants_grad(h, J):
        return window_marginals_kept(h, J, present, mask_key, path)[0]
    return window_marginals(h, J, present, mask_key, path)
