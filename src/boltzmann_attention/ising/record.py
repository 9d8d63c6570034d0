"""The method record: what one way of computing marginals is, in one place.

Each method module declares its own ``Method`` (``exact.METHOD``, ``meanfield.METHODS``, ...) beside its
functions: what it computes (its marginals and, unless it samples, log Z), which options it takes and how their
values are checked, whether it is exact, approximate or sampled, and its size limits as numbers with the option
that moves each. :mod:`boltzmann_attention.ising.methods` builds the read-only registry from these records, and
everything else (the functional form, the layer, the training config, the transformers adapter and the error
messages) reads them; nothing re-derives these facts from a method's name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

KINDS = ("exact", "approximate", "sampled")
WINDOW_PATHS = ("auto", "split", "configurations")  # the coupled window's paths (ising/window.py)


@dataclass(frozen=True)
class Method:
    """One method: ``marginals(h, J, K, mask, **options)`` and ``log_partition`` (None: sampled, no log Z).

    options: the option names it takes; check_options(options): ValueError, naming the option, for a value the
    method would refuse at its first call (called at construction of a layer, not at its first forward); kind: one
    of :data:`KINDS`; limit: the limit in words; max_spins: the most spins one query may enumerate (None: any
    number), moved by the option of the same name when the method takes it; max_bandwidth: the widest band of
    couplings it solves (None: it needs no band), moved likewise; three_body: whether it takes three-body couplings
    K; toeplitz: whether it also solves J_jk = f(|j - k|) given as its profile (``ising.toeplitz``, never an (n, n)
    matrix), with ``toeplitz_options`` ((name, value) pairs) fixed for that solver; band: whether it also takes
    couplings in band form (``ising.chain.Band``, J_{p-d, p} per spin p and
    distance d, for couplings that differ per query); window: whether it also solves the coupled window
    (``ising.window``, a slot-indexed J shared by all queries); keyed_masks: whether ``marginals`` takes
    ``mask_key``, the caller's name for a mask that is the same every call (then not read after the first, see
    ``exact.marginals``); compiled: what runs instead of ``marginals`` while ``torch.compile`` traces (one opaque
    operator, :mod:`boltzmann_attention.ising.opaque`; it takes ``check``, False where the caller has checked the
    inputs, and ``mask_key``), None to trace ``marginals`` itself.
    """

    name: str
    marginals: Callable
    log_partition: Callable | None
    options: frozenset
    kind: str
    limit: str
    check_options: Callable[[dict], None]
    max_spins: int | None = None
    max_bandwidth: int | None = None
    three_body: bool = False
    toeplitz: bool = False
    toeplitz_options: tuple = ()
    band: bool = False
    window: bool = False
    keyed_masks: bool = False
    compiled: Callable | None = None
    window_path: str = "auto"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"a method's kind is one of {KINDS}, got {self.kind!r}")
        if self.window_path not in WINDOW_PATHS:
            raise ValueError(f"a method's window_path is one of {WINDOW_PATHS}, got {self.window_path!r}")
        if (self.log_partition is None) != (self.kind == "sampled"):
            raise ValueError("a sampled method has no log_partition, and every other method has one")

    @property
    def sampled(self) -> bool:
        return self.kind == "sampled"

    @property
    def iterative(self) -> bool:
        """A fixed point that can fail to converge: its ``on_fail`` option chooses warning or error."""
        return "on_fail" in self.options

    def spin_limit(self, options: dict) -> int | None:
        """The most spins one query may enumerate with these options (None: any number)."""
        return self._limit("max_spins", options)

    def bandwidth_limit(self, options: dict) -> int | None:
        """The widest band of couplings solved with these options (None: the method needs no band)."""
        return self._limit("max_bandwidth", options)

    def _limit(self, name: str, options: dict) -> int | None:
        """The record's number ``name``, moved by the option of that name when the method takes it."""
        default = getattr(self, name)
        return options.get(name, default) if default is not None and name in self.options else default

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


def with_defaults(fn: Callable, options: dict) -> dict:
    """fn's keyword-only defaults updated with ``options``."""
    defaults = {p.name: p.default for p in inspect.signature(fn).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return {**defaults, **options}


def no_options(options: dict) -> None:
    """The option check of a method that takes none (its record's ``validate`` refuses any name)."""
    return None
