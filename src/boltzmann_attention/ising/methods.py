"""The method record: one ``Method`` per way of computing marginals, and the registry everything reads.

A ``Method`` says what a method computes (its marginals and, unless it samples, log Z), which options it
takes and how their values are checked, whether it is exact, approximate or sampled, and its limit in
words (with the option that moves it). :func:`boltzmann_attention.ising.marginals`,
:func:`~boltzmann_attention.ising.log_partition`, :func:`~boltzmann_attention.ising.validate_options`,
the attention layer and the error messages all read the record; nothing re-derives these facts.

``resolve_method`` is the one place that turns what a caller passes as ``method`` into a record: a
registered name, or a :class:`~boltzmann_attention.ising.dimod_adapter.DimodSampler` (any dimod sampler,
sampled, no log Z). Two more solvers are reached through the layer, not through a name: the Toeplitz
operator (``ising.toeplitz``, methods 'meanfield' and 'tap' on J_jk = f(|j - k|)) and the coupled window
(``ising.window``, method 'exact' on a slot-indexed J); their records are those of the named methods.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from . import _sampling, annealing, banded, exact, mcmc, meanfield, reference, sqa
from ._inputs import check_int
from .dimod_adapter import DimodSampler

KINDS = ("exact", "approximate", "sampled")


@dataclass(frozen=True)
class Method:
    """One method: ``marginals(h, J, K, mask, **options)`` and ``log_partition`` (None: sampled, no log Z).

    options: the option names it takes; check_options(options): ValueError, naming the option, for a value
    the method would refuse at its first call (called at construction of a layer, not at its first forward);
    kind: 'exact', 'approximate' or 'sampled'; limit: the limit in words, with the option that moves it;
    three_body: whether it takes three-body couplings K; toeplitz: whether it also solves J_jk = f(|j - k|)
    given as its profile (``ising.toeplitz``, never an (n, n) matrix); window: whether it also solves the
    coupled window (``ising.window``, a slot-indexed J shared by all queries).
    """

    name: str
    marginals: Callable
    log_partition: Callable | None
    options: frozenset
    kind: str
    limit: str
    check_options: Callable[[dict], None]
    three_body: bool = False
    toeplitz: bool = False
    window: bool = False

    @property
    def sampled(self) -> bool:
        return self.kind == "sampled"

    @property
    def iterative(self) -> bool:
        """A fixed point that can fail to converge: its ``on_fail`` option chooses warning or error."""
        return "on_fail" in self.options

    def validate(self, options: dict) -> None:
        """ValueError for options that are not a dict, an option the method does not take, or a bad value."""
        if not isinstance(options, dict):
            raise ValueError(f"method options must be a dict of keyword arguments, got {type(options).__name__}")
        unknown = sorted(set(options) - self.options, key=str)
        if unknown:
            name = self.name if self.name.startswith("a ") else f"method {self.name!r}"
            takes = f"known options: {sorted(self.options)}" if self.options else "it takes no options"
            raise ValueError(f"unknown option(s) {unknown} for {name}; {takes}")
        self.check_options(options)


def keyword_options(fn: Callable, drop: frozenset = frozenset()) -> frozenset:
    """The keyword-only parameters of ``fn``: the options a method takes (derived, so they cannot drift)."""
    parameters = inspect.signature(fn).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY) - drop


def _with_defaults(fn: Callable, options: dict) -> dict:
    """fn's keyword-only defaults updated with ``options``."""
    defaults = {p.name: p.default for p in inspect.signature(fn).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return {**defaults, **options}


# --- option values, checked with the methods' own checks (so the words are the same as at the call) -------

def _no_options(options: dict) -> None:
    return None


def _exact_options(options: dict) -> None:
    if "max_spins" in options:
        check_int("max_spins", options["max_spins"], 0)


def _banded_options(options: dict) -> None:
    o = _with_defaults(banded.marginals, options)
    if o["bandwidth"] is not None:
        check_int("bandwidth", o["bandwidth"], 0)
    check_int("max_bandwidth", o["max_bandwidth"], 0)
    if o["chunk_size"] is not None:
        check_int("chunk_size", o["chunk_size"], 1)


def _meanfield_options(options: dict) -> None:
    o = _with_defaults(meanfield.marginals, options)
    meanfield._settings(o["tap"], o["damping"], o["tol"], o["max_iter"], o["on_fail"], None,
                        solver=o["solver"], anderson_memory=o["anderson_memory"])


def _sampling_options(fn: Callable, options: dict) -> dict:
    o = _with_defaults(fn, options)
    _sampling.check_options(o["num_samples"], o["gradient"], o["nudge"])
    _sampling.check_seed(o["seed"], o["generator"])
    return o


def _gibbs_options(options: dict) -> None:
    mcmc._no_extras(options, "gibbs_marginals")
    o = _sampling_options(mcmc.gibbs_marginals, options)
    mcmc._check_schedule(o["warmup"], o["sweeps_per_sample"], o["num_chains"])


def _pt_options(options: dict) -> None:
    mcmc._no_extras(options, "pt_marginals")
    o = _sampling_options(mcmc.pt_marginals, options)
    mcmc._check_schedule(o["warmup"], o["sweeps_per_sample"], o["num_chains"])
    mcmc._ladder(o["betas"], o["num_replicas"], o["beta_min"])


def _sqa_options(options: dict) -> None:
    o = _sampling_options(sqa.sqa_marginals, options)
    sqa._check_schedule(o["sweeps"], o["trotter_slices"], o["gamma_start"], o["gamma_end"], o["beta"])


def _dimod_options(options: dict) -> None:
    o = _with_defaults(DimodSampler.marginals, options)
    _sampling.check_options(1, o["gradient"], o["nudge"])
    _sampling.check_seed(o["seed"], o["generator"])


def _tap(fn: Callable) -> Callable:
    def with_tap(h, J, K, mask, **options):
        return fn(h, J, K, mask, tap=True, **options)
    return with_tap


_SAMPLED_LIMIT = "any n; stochastic (option num_samples), marginals only (no log Z)"

REGISTRY: dict[str, Method] = {m.name: m for m in (
    Method("exact", exact.marginals, exact.log_partition, keyword_options(exact.marginals), "exact",
           f"n <= {exact.MAX_SPINS} present spins per query (option max_spins)", _exact_options, three_body=True,
           window=True),
    Method("reference", lambda h, J, K, mask: reference.marginals(h, J, K, mask),
           lambda h, J, K, mask: reference.log_partition(h, J, K, mask), frozenset(), "exact",
           "n <= 20 spins (brute force in float64, the test oracle)", _no_options, three_body=True),
    Method("banded", banded.marginals, banded.log_partition, keyword_options(banded.marginals), "exact",
           f"J_jk = 0 for |j - k| > w, w <= {banded.MAX_BANDWIDTH} (options bandwidth, max_bandwidth)",
           _banded_options),
    Method("meanfield", meanfield.marginals, meanfield.log_partition, keyword_options(meanfield.marginals),
           "approximate", "any n; may not converge (options max_iter, damping, solver, on_fail)", _meanfield_options,
           three_body=True, toeplitz=True),
    Method("tap", _tap(meanfield.marginals), _tap(meanfield.log_partition),
           keyword_options(meanfield.marginals, frozenset({"tap"})), "approximate",
           "any n, pairwise only; may not converge (options max_iter, damping, solver, on_fail)",
           lambda options: _meanfield_options({**options, "tap": True}), toeplitz=True),
    Method("gibbs", mcmc.gibbs, None, keyword_options(mcmc.gibbs_marginals), "sampled", _SAMPLED_LIMIT,
           _gibbs_options),
    Method("pt", mcmc.pt, None, keyword_options(mcmc.pt_marginals), "sampled", _SAMPLED_LIMIT, _pt_options),
    Method("dqa", annealing.dqa_marginals, None,
           keyword_options(annealing.dqa_marginals) | frozenset(annealing.ANNEAL_OPTIONS), "sampled",
           f"n <= {annealing.MAX_SPINS} spins (a 2^n statevector); not a Boltzmann distribution unless "
           "target_beta=1.0", annealing.check_dqa_options),
    Method("sqa", sqa.sqa_marginals, None, keyword_options(sqa.sqa_marginals), "sampled",
           "any n; the anneal's final state, Boltzmann only while it mixes (options sweeps, trotter_slices)",
           _sqa_options),
)}

_DIMOD_OPTIONS = keyword_options(DimodSampler.marginals)


def resolve_method(method) -> Method:
    """The record of ``method``: a registered name, or a DimodSampler (sampled, no log Z). ValueError for
    anything else, naming the methods there are."""
    if isinstance(method, DimodSampler):
        return Method("a DimodSampler", lambda h, J, K, mask, **options: method.marginals(h, J, K, mask, **options),
                      None, _DIMOD_OPTIONS, "sampled", "one sample_ising call per query; marginals only (no log Z)",
                      _dimod_options)
    if not isinstance(method, str) or method not in REGISTRY:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(REGISTRY)}")
    return REGISTRY[method]


def methods_with(attribute: str) -> tuple[str, ...]:
    """The names of the registered methods whose record has ``attribute`` true (e.g. 'toeplitz', 'window')."""
    return tuple(name for name, m in REGISTRY.items() if getattr(m, attribute))
