"""Marginals <s_j> and log Z of small Ising systems, batched, differentiable.

Energy convention (the one used everywhere in this package)::

    E(s) = - sum_j h_j s_j - sum_{j<k} J_jk s_j s_k - sum_{j<k<l} K_jkl s_j s_k s_l,
    p(s) = exp(-E(s)) / Z,   s in {-1, +1}^n.

J is stored as a full symmetric (n, n) matrix with a zero diagonal, K as a fully symmetric (n, n, n)
tensor that is zero where two indices coincide. A spin whose mask entry is False is absent: it is
removed from every term of the energy (not clamped), log Z is that of the remaining spins, and its
marginal is 0.

Methods (one module each, each tested against ``reference``):

=============  ======================================================  ====================
method         what                                                    limit
=============  ======================================================  ====================
``exact``      split enumeration, Z = u^T K v as GEMMs (SAMPLERS §0)    n <= 24 (option)
``reference``  brute-force enumeration in float64 (the test oracle)    n <= 20
``banded``     transfer matrix for J_jk = 0 when |j-k| > w            any n, 2^w states
``meanfield``  naive mean field, damped fixed point, implicit grads    any n, approximate
``tap``        mean field with the TAP (Onsager) correction            any n, approximate
``gibbs``      Gibbs sampling (sequential heat bath), batched           any n, stochastic
``pt``         parallel tempering over a beta ladder                    any n, stochastic
``dqa``        simulated diabatic quantum annealing, then sampling      n <= 16, not Boltzmann
``sqa``        simulated quantum annealing (path-integral MC)           any n, not Boltzmann
=============  ======================================================  ====================

Sampled methods (gibbs, pt, dqa, sqa, and any dimod sampler through :class:`DimodSampler`) take a
``gradient`` option: 'covariance' (fluctuation-dissipation from the same samples), 'ste' (a documented
straight-through surrogate) or 'nudged' (a second sampling phase; works with any sampler). See
``_sampling.py``.

``dqa`` with ``target_beta=1.0`` runs the anneal at the energy scale calibrated to approximate exp(-E)
(``annealing.calibrate_energy_scale``; ``annealing.effective_beta`` measures any anneal's temperature).

No method is ever replaced by another behind the caller's back: a method that cannot handle an input
raises an error naming its limit and the alternatives.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import Tensor

from . import annealing, banded, exact, mcmc, meanfield, reference, sqa, toeplitz, window
from ._inputs import check_inputs, check_int, empty_result, is_empty
from .dimod_adapter import DimodSampler

__all__ = ["marginals", "log_partition", "validate_options", "METHODS", "OPTIONS", "SAMPLED_METHODS",
           "ITERATIVE_METHODS", "DimodSampler", "toeplitz", "window"]


def _tap(fn: Callable) -> Callable:
    def with_tap(h, J, K, mask, **options):
        return fn(h, J, K, mask, tap=True, **options)
    return with_tap


# name -> (marginals, log_partition); every function takes (h, J, K, mask, **options)
METHODS: dict[str, tuple[Callable, Callable]] = {
    "exact": (exact.marginals, exact.log_partition),
    "reference": (lambda h, J, K, mask: reference.marginals(h, J, K, mask),
                  lambda h, J, K, mask: reference.log_partition(h, J, K, mask)),
    "banded": (banded.marginals, banded.log_partition),
    "meanfield": (meanfield.marginals, meanfield.log_partition),
    "tap": (_tap(meanfield.marginals), _tap(meanfield.log_partition)),
    "gibbs": (mcmc.gibbs, mcmc.log_partition),
    "pt": (mcmc.pt, mcmc.log_partition),
    "dqa": (annealing.dqa_marginals, mcmc.log_partition),
    "sqa": (sqa.sqa_marginals, mcmc.log_partition),
}

# methods whose marginals are sample means (stochastic; 'dqa' and 'sqa' are not even Boltzmann): the ones
# without log Z
SAMPLED_METHODS = frozenset(name for name, (_, logz) in METHODS.items() if logz is mcmc.log_partition)


def _keyword_options(fn: Callable, drop: frozenset = frozenset()) -> frozenset:
    """The keyword-only parameters of ``fn``: the options a method takes (derived, so they cannot drift)."""
    parameters = inspect.signature(fn).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY) - drop


# name -> the options the method takes (its marginals and log_partition take the same ones)
OPTIONS: dict[str, frozenset] = {
    "exact": _keyword_options(exact.marginals),
    "reference": frozenset(),
    "banded": _keyword_options(banded.marginals),
    "meanfield": _keyword_options(meanfield.marginals),
    "tap": _keyword_options(meanfield.marginals, frozenset({"tap"})),
    "gibbs": _keyword_options(mcmc.gibbs_marginals),  # incl. return_*, refused with their own message
    "pt": _keyword_options(mcmc.pt_marginals),
    "dqa": _keyword_options(annealing.dqa_marginals) | frozenset(annealing.ANNEAL_OPTIONS),
    "sqa": _keyword_options(sqa.sqa_marginals),
}
_DIMOD_OPTIONS = _keyword_options(DimodSampler.marginals)

# fixed-point methods, which can fail to converge: the ones whose ``on_fail`` option decides between a
# meanfield.ConvergenceWarning and a ConvergenceError
ITERATIVE_METHODS = frozenset(name for name, options in OPTIONS.items() if "on_fail" in options)


def validate_options(method, options: dict) -> None:
    """ValueError naming any option that ``method`` does not take, with the ones it does.

    Also checks the values of exact's options (exact.py takes them as given) and of dqa's
    (:func:`annealing.check_dqa_options`: e.g. energy_scale and target_beta together, before the first
    anneal). The other methods check their option values themselves.
    """
    _lookup(method, 0)
    if not isinstance(options, dict):
        raise ValueError(f"method options must be a dict of keyword arguments, got {type(options).__name__}")
    known = _DIMOD_OPTIONS if isinstance(method, DimodSampler) else OPTIONS[method]
    unknown = sorted(set(options) - known, key=str)
    if unknown:
        name = "a DimodSampler" if isinstance(method, DimodSampler) else f"method {method!r}"
        takes = f"known options: {sorted(known)}" if known else "it takes no options"
        raise ValueError(f"unknown option(s) {unknown} for {name}; {takes}")
    if method == "exact" and "max_spins" in options:
        check_int("max_spins", options["max_spins"], 0)
    if method == "dqa":
        annealing.check_dqa_options(options)


def _lookup(method, which: int) -> Callable:
    if isinstance(method, DimodSampler):  # any dimod sampler, wrapped: marginals only
        return (lambda h, J, K, mask, **options: method.marginals(h, J, K, mask, **options),
                mcmc.log_partition)[which]  # sampling gives no log Z: raises, naming the methods that do
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
    return METHODS[method][which]


def marginals(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, *, mask: Tensor | None = None,
              method: str = "exact", **options) -> Tensor:
    """Magnetisations <s_j>, shaped like ``h`` (..., n).

    h: (..., n) fields; J: (n, n) or broadcastable (..., n, n) couplings; K: (..., n, n, n) three-body
    couplings; mask: (..., n) bool, True where the spin exists. Differentiable in h, J and K.
    ``method``: a name from :data:`METHODS`, or a :class:`DimodSampler`. ``options`` go to the method
    (see its module).
    """
    fn = _lookup(method, 0)
    validate_options(method, options)
    check_inputs(h, J, K, mask)
    if isinstance(method, str) and method == "exact" and is_empty(h, J, K, mask):
        return empty_result(h, J, K, mask, marginals=True)  # nothing to enumerate (exact.py assumes some)
    return fn(h, J, K, mask, **options)


def log_partition(h: Tensor, J: Tensor | None = None, K: Tensor | None = None, *, mask: Tensor | None = None,
                  method: str = "exact", **options) -> Tensor:
    """log Z, shaped like ``h`` without its last dimension. Arguments as in :func:`marginals`."""
    fn = _lookup(method, 1)
    validate_options(method, options)
    check_inputs(h, J, K, mask)
    if isinstance(method, str) and method == "exact" and is_empty(h, J, K, mask):
        return empty_result(h, J, K, mask, marginals=False)
    return fn(h, J, K, mask, **options)
