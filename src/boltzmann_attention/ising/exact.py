"""Method ``exact``: marginals and log Z by split enumeration, exact for any finite input.

Each query's system is solved over its present spins only (absent spins are removed from the energy, not
clamped), by split enumeration (:mod:`boltzmann_attention.ising.split`): the spins are cut into two
halves, the couplings between them go into one table T (2^(n/2) x 2^(n/2)) per group of queries that share
J and K, and every query of the group costs two GEMMs with that table, Z = u^T T v (about 2 * 2^n MACs per
query). Gradients are the covariances from the same enumeration.

Masks: queries are grouped by mask pattern (:mod:`boltzmann_attention.ising.planner`). Patterns that
split every group evenly (a causal mask: one pattern per query position) are bucketed by size into a few
calls, each padded with free spins; other masks go pattern by pattern.

Numerics (:mod:`boltzmann_attention.ising.numerics`): rows whose Z underflows, and float32 rows whose
energy scale exceeds 2^13, are recomputed in float64, so the marginals match the float64 reference for
any finite input; energies beyond float64's range raise a ValueError. Typical training values never reach
the fallback. The energy convention is the package's (see :mod:`boltzmann_attention.naive`).

float16 and bfloat16 inputs are enumerated in float32 (as the attention layer computes) and the results returned
in the input's dtype.

Limit: ``max_spins`` (default 24) present spins per query. The table holds 2^n entries per group
(64 MB in float32 at n = 24) and the work per query is 2 * 2^n MACs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import planner, split
from ._inputs import batch_shape, check_inputs, check_int, empty_result, group_queries, is_empty
from .numerics import log_2cosh
from .opaque import grads, keep, none_if_empty, token_like, wants_grad
from .record import Method, keyword_options

MAX_SPINS = 24


def marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              max_spins: int = MAX_SPINS, mask_key: str | None = None) -> Tensor:
    """<s_j>, shape of h (..., n). See the module docstring for the algorithm and its limit.

    mask_key: the caller's name for the mask's values, for a mask that is the same at every call (the layer's
    causal mask): its patterns and plan are remembered by the name, so that after the first call the mask's
    values are not read (no host sync). Masks of one key and shape must hold the same values; where checks read
    the host (:mod:`.checks`) a key given to different masks is a ValueError."""
    return _solve(h, J, K, mask, max_spins, mask_key)[0]


def log_partition(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
                  max_spins: int = MAX_SPINS) -> Tensor:
    """log Z, shape h.shape[:-1]. Raises ValueError where log Z is beyond the dtype's range."""
    logz = _solve(h, J, K, mask, max_spins)[1]
    if not bool(torch.isfinite(logz).all()):
        raise ValueError(f"method 'exact': log Z exceeds the range of {h.dtype} for fields and couplings this "
                         f"large (the marginals are fine); pass float64 inputs")
    return logz


def _solve(h, J, K, mask, max_spins, mask_key=None):
    if h.dtype in (torch.float16, torch.bfloat16):  # half precision cannot sum 2^n Boltzmann weights: float32
        m, logz = _solve(*(None if x is None else x.float() for x in (h, J, K)), mask, max_spins, mask_key)
        return m.to(h.dtype), logz.to(h.dtype)
    largest = h.shape[-1] if mask is None else planner.present_spins(mask, mask_key)
    if largest > max_spins:
        raise ValueError(
            f"method 'exact' enumerates 2^n states and is limited to n <= {max_spins} present spins per "
            f"query (got {largest}). Use method='banded' (couplings of limited range), 'meanfield' or "
            f"'tap' (approximate), or raise max_spins if you accept 2^n time and memory.")
    shapes = [h.shape[:-1]] + [x.shape[:-d] for x, d in ((J, 2), (K, 3), (mask, 1)) if x is not None]
    batch = torch.broadcast_shapes(*shapes)
    if h.shape[-1] == 0 or math.prod(batch) == 0:  # nothing to enumerate: <s> is empty, log Z = log 1 = 0
        zero = h.sum() * 0  # keeps the graph, so that backward works on empty results too
        return h.new_zeros(*batch, h.shape[-1]) + zero, h.new_zeros(batch) + zero
    g = group_queries(h, J, K, mask)
    if g.mask is None:
        m, logz = split.solve(g.h, g.J, g.K)
    else:
        m, logz = _by_mask_pattern(g.h, g.J, g.K, g.mask, mask_key)
    return g.ungroup(m).clamp(-1.0, 1.0), g.ungroup(logz)


def _by_mask_pattern(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor, mask_key: str | None = None):
    """Solve masked queries. h, mask: (G, Q, n); J: (G, n, n); K: (G, n, n, n).

    Returns marginals (G, Q, n) and log Z (G, Q). Patterns that split every group evenly (a causal mask:
    one pattern per query position) are bucketed by size; the rest go pattern by pattern.
    """
    if J is None and K is None:  # independent spins: the closed form, absent spins removed
        present = mask.to(h.dtype)
        return torch.tanh(h) * present, (log_2cosh(h) * present).sum(-1)
    patterns, which, order = planner.mask_patterns(mask, mask_key)
    if order is None:
        return _patterns_one_by_one(h, J, K, patterns, which.reshape(-1))
    if K is None:  # the whole plan in one autograd node
        plan = planner.plan(patterns, order, h.dtype, split.ENUMERATED_SPINS, mask_key)
        m, logz, ok = split.Pairwise.apply(h, J, plan)
        return split.rescued(m, logz, ok, h, J, K, mask)
    return _buckets_with_three_body(h, J, K, planner.plan(patterns, order, h.dtype, key=mask_key))


def _buckets_with_three_body(h: Tensor, J: Tensor | None, K: Tensor, plan: planner.Plan):
    """The plan's buckets solved one by one with three-body couplings (autograd through gathers and
    scatters): in a bucket padded to L spins the padding spins have zero field and couplings, and their
    factor 2 each in Z is taken out of log Z."""
    G, Q, n = h.shape
    q = plan.q
    h_flat = F.pad(h, (0, 1)).view(G, Q * (n + 1))  # padding column n: zero field
    J_flat = F.pad(J, (0, 1, 0, 1)).view(G, (n + 1) ** 2) if J is not None else None
    K_ext = F.pad(K, (0, 1, 0, 1, 0, 1))
    m_out, logz_out = h.new_zeros(G, Q * (n + 1)), h.new_zeros(G, Q)
    for nb, L, free, flat, hidx, qidx, idx in plan.buckets:
        sub_h = h_flat.gather(1, hidx).view(G * nb, q, L)
        sub_J = J_flat.index_select(1, flat).view(G * nb, L, L) if J is not None else None
        sub_K = K_ext[:, idx[:, :, None, None], idx[:, None, :, None], idx[:, None, None, :]].reshape(G * nb, L, L, L)
        m, logz = split.solve(sub_h, sub_J, sub_K)
        m_out = m_out.scatter(1, hidx, m.reshape(G, -1))  # the padding column n is dropped below
        logz_out = logz_out.scatter(1, qidx, (logz.view(G, nb, q) - free[:, None]).view(G, -1))
    return m_out.view(G, Q, n + 1)[..., :n], logz_out


def _patterns_one_by_one(h, J, K, patterns, which):
    """Each pattern as the smaller system of its present spins: absent spins cost nothing."""
    G, Q, n = h.shape
    flat_h = h.reshape(G * Q, n)
    out_m = h.new_zeros(G * Q, n)
    out_logz = h.new_zeros(G * Q)
    for p, pattern in enumerate(patterns):
        spins = pattern.nonzero().squeeze(-1)
        if spins.numel() == 0:
            continue  # no spin present: marginals 0, log Z = log 1 = 0
        rows = (which == p).nonzero().squeeze(-1)  # ascending, so grouped by g
        groups, counts = torch.unique_consecutive(rows // Q, return_counts=True)
        batches = [(groups, rows)] if bool((counts == counts[0]).all()) else \
            [(groups[i:i + 1], r) for i, r in enumerate(rows.split(counts.tolist()))]
        for grp, r in batches:
            sub_h = flat_h[r][:, spins].reshape(len(grp), -1, len(spins))
            sub_J = J[grp][:, spins][:, :, spins] if J is not None else None
            sub_K = K[grp][:, spins][:, :, spins][:, :, :, spins] if K is not None else None
            m, logz = split.solve(sub_h, sub_J, sub_K)
            out_m = out_m.index_put((r[:, None], spins[None, :]), m.reshape(-1, len(spins)))
            out_logz = out_logz.index_put((r,), logz.reshape(-1))
    return out_m.reshape(G, Q, n), out_logz.reshape(G, Q)


def _check_options(options: dict) -> None:
    if "max_spins" in options:
        check_int("max_spins", options["max_spins"], 1)


def _compiled(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, *,
              max_spins: int = MAX_SPINS, mask_key: str | None = None, check: bool = True) -> Tensor:
    """The marginals as one opaque operator, what ``torch.compile`` traces: ``boltzmann_attention::exact_marginals``
    (or its ``_kept`` variant), which :mod:`boltzmann_attention.ising.opaque` registers around this module's
    solver."""
    return exact_solve(h, J, K, mask, max_spins, check, mask_key)


# --- the opaque operators for torch.compile (ising/opaque.py) ------------------------------------------

def _exact_eager(h, J, K, mask, max_spins, check, mask_key=None):
    """What ``ising.marginals(..., method='exact')`` does in eager: the input checks (unless the caller built
    the inputs and checked them itself, as the attention module does), then the solver."""
    if check:
        check_inputs(h, J, K, mask)
    if is_empty(h, J, K, mask):
        return empty_result(h, J, K, mask, marginals=True)
    return marginals(h, J, K, mask, max_spins=max_spins, mask_key=mask_key)


@torch.library.custom_op("boltzmann_attention::exact_marginals", mutates_args=())
def exact_marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, max_spins: int,
                    check: bool, mask_key: str | None) -> Tensor:
    """<s> of method 'exact' (see :mod:`boltzmann_attention.ising.exact`), computed eagerly at run time."""
    return _exact_eager(h, J, K, mask, max_spins, check, mask_key).contiguous()  # the fake's layout


@exact_marginals.register_fake
def _(h, J, K, mask, max_spins, check, mask_key):
    return h.new_empty(tuple(batch_shape(h, J, K, mask)) + (h.shape[-1],))


@torch.library.custom_op("boltzmann_attention::exact_marginals_kept", mutates_args=())
def exact_marginals_kept(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None,
                         max_spins: int, check: bool, mask_key: str | None) -> tuple[Tensor, Tensor]:
    """``exact_marginals`` and the token of its kept graph, for the backward (module docstring)."""
    return keep(lambda h, J, K: _exact_eager(h, J, K, mask, max_spins, check, mask_key), [h, J, K])


@exact_marginals_kept.register_fake
def _(h, J, K, mask, max_spins, check, mask_key):
    return h.new_empty(tuple(batch_shape(h, J, K, mask)) + (h.shape[-1],)), token_like()


@torch.library.custom_op("boltzmann_attention::exact_marginals_backward", mutates_args=())
def exact_marginals_backward(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, grad: Tensor,
                             token: Tensor | None, max_spins: int, mask_key: str | None
                             ) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients in h, J and K (an empty tensor for an absent J or K) of <grad, <s>>: through the graph kept
    under ``token``, or by recomputation."""
    gh, gJ, gK = grads(lambda h, J, K: _exact_eager(h, J, K, mask, max_spins, False, mask_key), [h, J, K], grad,
                        token)
    return gh, gJ, gK


@exact_marginals_backward.register_fake
def _(h, J, K, mask, grad, token, max_spins, mask_key):
    return (h.new_empty(h.shape), h.new_empty(0) if J is None else J.new_empty(J.shape),
            h.new_empty(0) if K is None else K.new_empty(K.shape))


def _exact_setup(ctx, inputs, output):
    h, J, K, mask, max_spins, check, mask_key = inputs
    token = output[1] if isinstance(output, tuple) else None
    ctx.save_for_backward(h, J, K, mask, token)
    ctx.max_spins, ctx.mask_key, ctx.has = max_spins, mask_key, (J is not None, K is not None)


def _exact_backward(ctx, grad, *token_grad):
    h, J, K, mask, token = ctx.saved_tensors
    gh, gJ, gK = exact_marginals_backward(h, J, K, mask, grad, token, ctx.max_spins, ctx.mask_key)
    return gh, none_if_empty(gJ, ctx.has[0]), none_if_empty(gK, ctx.has[1]), None, None, None, None


exact_marginals.register_autograd(_exact_backward, setup_context=_exact_setup)
exact_marginals_kept.register_autograd(_exact_backward, setup_context=_exact_setup)


def exact_solve(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, max_spins: int,
                check: bool = True, mask_key: str | None = None) -> Tensor:
    """What ``torch.compile`` traces for method 'exact': the kept variant where a gradient is wanted."""
    if wants_grad(h, J, K):
        return exact_marginals_kept(h, J, K, mask, max_spins, check, mask_key)[0]
    return exact_marginals(h, J, K, mask, max_spins, check, mask_key)


METHOD = Method("exact", marginals, log_partition, keyword_options(marginals, frozenset({"mask_key"})), "exact",
                f"n <= {MAX_SPINS} present spins per query (option max_spins)", _check_options,
                max_spins=MAX_SPINS, three_body=True, window=True, keyed_masks=True, compiled=_compiled)
