"""Marginals <s_j> and log Z of small Ising systems, batched, differentiable.

Energy convention (the one used everywhere in this package)::

    E(s) = - sum_j h_j s_j - sum_{j<k} J_jk s_j s_k - sum_{j<k<l} K_jkl s_j s_k s_l,
    p(s) = exp(-E(s)) / Z,   s in {-1, +1}^n.

J is stored as a full symmetric (n, n) matrix with a zero diagonal, K as a fully symmetric (n, n, n)
tensor that is zero where two indices coincide. A spin whose mask entry is False is absent: it is
removed from every term of the energy (not clamped), log Z is that of the remaining spins, and its
marginal is 0.

Methods (one module each, each tested against ``reference``; each module declares its record, with options,
kind and limits, and :mod:`boltzmann_attention.ising.methods` collects them):

==================  =======================================================  ======================
method              what                                                     limit
==================  =======================================================  ======================
``exact``           split enumeration, Z = u^T T v as GEMMs (``split``)      n <= 24 (option)
``configurations``  softmax attention over the 2^n states (one SDPA)         n <= 16 (option)
``reference``       brute-force enumeration in float64 (the test oracle)     n <= 20
``banded``          transfer matrix for J_jk = 0 when |j-k| > w              any n, 2^w states
``chain``           the same, log domain, a J per query (content couplings)  any n, 2^w states
``meanfield``       naive mean field, damped fixed point, implicit grads     any n, approximate
``tap``             mean field with the TAP (Onsager) correction             any n, approximate
``gibbs``           Gibbs sampling (sequential heat bath), batched           any n, stochastic
``pt``              parallel tempering over a beta ladder                    any n, stochastic
``dqa``             simulated diabatic quantum annealing, then sampling      n <= 16, not Boltzmann
``sqa``             simulated quantum annealing (path-integral MC)           any n, not Boltzmann
==================  =======================================================  ======================

Sampled methods (gibbs, pt, dqa, sqa, and any dimod sampler through :class:`DimodSampler`) take a
``gradient`` option: 'covariance' (fluctuation-dissipation from the same samples), 'ste' (a documented
straight-through surrogate) or 'nudged' (a second sampling phase; works with any sampler). See
``_sampling.py``.

:class:`QPUSampler` (module ``qpu``, extra ``[qpu]``) runs them on a D-Wave QPU: fixed embeddings per shape,
many queries per call, chain strength and the device's ranges, and the temperature calibrated to exp(-E).

``dqa`` with ``target_beta=1.0`` runs the anneal at the energy scale calibrated to approximate exp(-E)
(``annealing.calibrate_energy_scale``; ``annealing.effective_beta`` measures any anneal's temperature).

No method is ever replaced by another behind the caller's back: a method that cannot handle an input
raises an error naming its limit and the alternatives.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
from torch import Tensor

from . import (  # noqa: F401
    annealing,
    banded,
    chain,
    configurations,
    exact,
    mcmc,
    meanfield,
    opaque,
    qpu,
    reference,
    sqa,
    toeplitz,
    window,
)
from ._inputs import check_inputs, empty_result, is_empty
from .dimod_adapter import DimodSampler
from .methods import REGISTRY, Method, resolve_method
from .qpu import QPUSampler

__all__ = ["marginals", "log_partition", "validate_options", "resolve_method", "Method", "METHODS", "OPTIONS",
           "SAMPLED_METHODS", "ITERATIVE_METHODS", "DimodSampler", "QPUSampler", "annealing", "banded",
           "configurations", "exact", "mcmc", "meanfield", "qpu", "reference", "sqa", "toeplitz", "window"]

# name -> (marginals, log_partition), every function taking (h, J, K, mask, **options); a sampled method's
# log_partition raises, naming the methods that give log Z. Read-only, as the registry it is read from.
METHODS = MappingProxyType({
    name: (m.marginals, m.log_partition or mcmc.log_partition) for name, m in REGISTRY.items()})

# name -> the options the method takes (its marginals and log_partition take the same ones)
OPTIONS = MappingProxyType({name: m.options for name, m in REGISTRY.items()})

# methods whose marginals are sample means (stochastic; 'dqa' and 'sqa' are not even Boltzmann): no log Z
SAMPLED_METHODS = frozenset(name for name, m in REGISTRY.items() if m.sampled)

# fixed-point methods, which can fail to converge: the ones whose ``on_fail`` option decides between a
# meanfield.ConvergenceWarning and a ConvergenceError
ITERATIVE_METHODS = frozenset(name for name, m in REGISTRY.items() if m.iterative)


def validate_options(method, options: dict) -> None:
    """ValueError for an unknown method, options that are not a dict, an option ``method`` does not take
    (naming the ones it does), or an option value it would refuse at its first call (each record's
    ``check_options``: e.g. damping outside [0, 1), num_samples < 1, dqa's energy_scale and target_beta
    together)."""
    resolve_method(method).validate(options)


def marginals(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, *, mask: Tensor | None = None,
              method: str = "exact", **options) -> Tensor:
    """Magnetisations <s_j>, shaped like ``h`` (..., n).

    h: (..., n) fields; J: (n, n) or broadcastable (..., n, n) couplings; K: (..., n, n, n) three-body
    couplings; mask: (..., n) bool, True where the spin exists. Differentiable in h, J and K.
    ``method``: a name from :data:`METHODS`, a :class:`Method` record, or a :class:`DimodSampler`. ``options``
    go to the method (see its module). Under ``torch.compile``, a method whose record has a ``compiled``
    function (method 'exact': one opaque operator that runs this eager code at run time,
    :mod:`boltzmann_attention.ising.opaque`) runs that: the same numbers, no graph break.
    """
    return _marginals(h, J, K, mask, method, options)


def _marginals(h: Tensor, J: Tensor | None, K: Tensor | None, mask: Tensor | None, method, options: dict,
               check_inputs_: bool = True, mask_key: str | None = None) -> Tensor:
    """:func:`marginals`; the attention module passes check_inputs_=False for couplings it built itself
    (symmetric with a zero diagonal by construction) after checking their values and the field's finite, and
    names its causal mask by ``mask_key`` (the record's ``keyed_masks``: the mask is not read after the first
    call)."""
    record = resolve_method(method)
    record.validate(options)
    if mask_key is not None and record.keyed_masks and mask is not None:
        options = {**options, "mask_key": mask_key}
    if record.compiled is not None and torch.compiler.is_compiling():  # one opaque node: see ising/opaque.py
        return record.compiled(h, J, K, mask, check=check_inputs_, **options)
    if check_inputs_:
        check_inputs(h, J, K, mask)
    if is_empty(h, J, K, mask):
        return empty_result(h, J, K, mask, marginals=True)  # no spin to solve for
    return record.marginals(h, J, K, mask, **options)


def log_partition(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, *, mask: Tensor | None = None,
                  method: str = "exact", **options) -> Tensor:
    """log Z, shaped like ``h`` without its last dimension. Arguments as in :func:`marginals`."""
    record = resolve_method(method)
    record.validate(options)
    check_inputs(h, J, K, mask)
    if record.log_partition is None:  # sampling gives no log Z: raises, naming the methods that do
        return mcmc.log_partition(h, J, K, mask, **options)
    if is_empty(h, J, K, mask):
        return empty_result(h, J, K, mask, marginals=False)
    return record.log_partition(h, J, K, mask, **options)
