"""The registry of methods, built from the records that the method modules declare, and read-only.

A :class:`~boltzmann_attention.ising.record.Method` lives beside its functions (``exact.METHOD``,
``meanfield.METHODS``, ...). :data:`REGISTRY` maps each registered name to its record and cannot be changed at
run time: a method is added by declaring its record in its module and listing it here, or, without touching
the package, by passing the record itself as ``method`` (to ``ising.marginals`` or the layer).

``resolve_method`` is the one place that turns what a caller passes as ``method`` into a record: a
registered name, a record, or a :class:`~boltzmann_attention.ising.dimod_adapter.DimodSampler` (any dimod
sampler, sampled, no log Z). Two more solvers are reached through the layer, not through a name: the Toeplitz
operator (``ising.toeplitz``, methods 'meanfield' and 'tap' on J_jk = f(|j - k|)) and the coupled window
(``ising.window``, methods 'exact' and 'configurations' on a slot-indexed J); their records are those of the named
methods.
"""

from __future__ import annotations

from types import MappingProxyType

from . import annealing, banded, chain, configurations, exact, mcmc, meanfield, reference, sqa
from .dimod_adapter import DimodSampler
from .record import KINDS, WINDOW_PATHS, Method, keyword_options

REGISTRY = MappingProxyType({m.name: m for m in (
    exact.METHOD, configurations.METHOD, reference.METHOD, banded.METHOD, chain.METHOD, *meanfield.METHODS,
    *mcmc.METHODS, annealing.METHOD, sqa.METHOD,
)})


def resolve_method(method) -> Method:
    """The record of ``method``: a registered name, a :class:`Method`, or a DimodSampler (sampled, no log Z).
    ValueError for anything else, naming the methods there are."""
    if isinstance(method, Method):
        return method
    if isinstance(method, DimodSampler):
        return method.record
    if not isinstance(method, str) or method not in REGISTRY:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(REGISTRY)}")
    return REGISTRY[method]


def methods_with(attribute: str) -> tuple[str, ...]:
    """The names of the registered methods whose record has ``attribute`` true (e.g. 'toeplitz', 'window')."""
    return tuple(name for name, m in REGISTRY.items() if getattr(m, attribute))


__all__ = ["KINDS", "REGISTRY", "WINDOW_PATHS", "Method", "keyword_options", "methods_with", "resolve_method"]
