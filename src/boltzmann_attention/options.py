"""The attention layer's options, one record each: each is defined here once.

An :class:`Option` holds the option's default, type, choices and help, which modes use it, and the check of its
value alone. What reads the table:

- :class:`~boltzmann_attention.BoltzmannAttention` takes every option as a keyword of the same name and default
  (``tests/test_options.py`` checks its signature against the table, and the functional form's);
- :mod:`boltzmann_attention.validation` checks each given value by its record, refuses an option that the mode
  does not use unless it keeps its default (:func:`unused`), then applies the rules that tie options together;
- the training config's attention section is generated from the table (those with ``in_config``), and the
  CLI's flags from the config;
- ``integrations.transformers.convert`` takes a subset, with its own defaults for the couplings, and refuses
  unused options by :func:`unused` too.

Adding an option is its record here and its use in the layer (``tests/test_add_an_option.py`` adds one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import modes
from .ising._inputs import check_int, check_real
from .modes import Mode

COUPLINGS = ("full", "relative", "window", "keys", "query")
CONTENT_COUPLINGS = ("keys", "query")  # computed from each call's keys (and queries): the module's only
POSITIONS = ("rope", "alibi")  # the module's relative position schemes (boltzmann_attention.positions)
SLOT_BIAS_PARAMETRIZATIONS = ("direct", "pairs")  # positions.SlotBias: a scalar per slot, or plus a pair table's field


def _always(_: Mode) -> bool:
    return True


def _any(_value) -> None:
    return None


_SAME = object()  # Option.config_default: the same as the layer's default


@dataclass(frozen=True)
class Option:
    """One option of the layer.

    default: the layer's default; type: its annotation, as text (the config's field type); choices: the
    values it takes, when a list says it (None: any value its check accepts); used: which modes use it (an
    unused option must keep its default); check(value): ValueError naming the option for a value it never
    takes, whatever the others are; in_config: whether TrainConfig's attention section has it (the layer's
    causality, bias and position scheme are set by the model); config_default: the config's default where it
    differs (a JSON object for method_options, which the layer defaults to None).
    """

    name: str
    default: Any
    type: str
    help: str
    choices: tuple | None = None
    used: Callable[[Mode], bool] = _always
    check: Callable[[Any], None] = _any
    in_config: bool = True
    config_default: Any = _SAME

    @property
    def default_in_config(self) -> Any:
        return self.default if self.config_default is _SAME else self.config_default

    def is_default(self, value) -> bool:
        """Whether ``value`` is the layer's or the config's default (method_options: None and {} both are)."""
        return value is self.default or value == self.default or value == self.default_in_config


# --------------------------------------------------------------------------------------------------- checks

def bool_check(name: str) -> Callable[[Any], None]:
    def check(value) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    return check


def choice_check(name: str, choices: tuple, optional: bool = False) -> Callable[[Any], None]:
    def check(value) -> None:
        if optional and value is None:
            return
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"unknown {name} {value!r}; choose {'None or ' if optional else ''}one of {choices}")
    return check


def int_check(name: str, minimum: int, optional: bool = False) -> Callable[[Any], None]:
    """An integer (any integral type, not bool) >= minimum, or None when optional."""
    def check(value) -> None:
        if not (optional and value is None):
            check_int(name, value, minimum)
    return check


def real_check(name: str, minimum: float | None = None, optional: bool = False) -> Callable[[Any], None]:
    """A finite real number (not bool) >= minimum, or None when optional."""
    def check(value) -> None:
        if not (optional and value is None):
            check_real(name, value, minimum=minimum)
    return check


def _method_options_check(value) -> None:
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"method_options must be a dict or None, got {type(value).__name__}")


def _mode_check(value) -> None:
    modes.get(value)  # ValueError naming the modes


# ---------------------------------------------------------------------------------------------------- table

def _couplings(m: Mode) -> bool:
    return m.couplings


def _marginals(m: Mode) -> bool:
    return m.marginals


def _field_bias(m: Mode) -> bool:
    return m.field_bias


def _convolution(m: Mode) -> bool:
    return m.convolution


def _any_couplings(m: Mode) -> bool:
    return m.couplings or m.three_body


OPTIONS: dict[str, Option] = {o.name: o for o in (
    Option("mode", "h+J", "str",
           "attention mode (softmax; h: sigmoid attention; J: couplings only; h+J: Boltzmann attention; h+K, "
           "h+J+K: three-body couplings; h+J-step: one mean-field step; fox, stickbreaking: learned-recency softmax "
           "baselines; mta: multi-token attention's key-query convolution)",
           choices=modes.LAYER_MODES, check=_mode_check),
    Option("method", "exact", "str", "how the marginals are computed (see the README's methods table)",
           used=_marginals),  # a name or a sampler object: ising.resolve_method checks it
    Option("method_options", None, "dict",
           "JSON object of options for the marginal method, e.g. '{\"bandwidth\": 4}'", used=_marginals,
           check=_method_options_check, config_default={}),
    Option("coupling", "full", "str",
           "full: a free J for every pair of positions; relative: J = f(|j - k|); window: J between the last "
           "coupling_window keys of each query, by slot (any T); keys: J_jk from rank-r projections of keys j and "
           "k; query: J_jk(i), trilinear in query i and keys j, k (keys and query: zero beyond coupling_range)",
           choices=COUPLINGS, used=_couplings, check=choice_check("coupling", COUPLINGS)),
    Option("coupling_range", None, "int | None",
           "relative, keys, query: J = 0 beyond this distance (none: T - 1)", used=_couplings,
           check=int_check("coupling_range", 0, optional=True)),
    Option("coupling_rank", 16, "int", "keys, query: the rank r of the projections the couplings are computed from",
           used=_couplings, check=int_check("coupling_rank", 1)),
    Option("coupling_window", None, "int | None", "window: the number W of coupled keys of each query",
           used=_couplings, check=int_check("coupling_window", 1, optional=True)),
    Option("coupling_window_relative", False, "bool", "window: J_ab = f(|a - b|) instead of a free (W, W) matrix",
           used=_couplings, check=bool_check("coupling_window_relative")),
    Option("coupling_init_std", 0.0, "float", "standard deviation of J at initialisation (0: J starts at zero)",
           used=_any_couplings, check=real_check("coupling_init_std", 0.0)),
    Option("field_bias_init", None, "float | None", "initial field bias per head (none: -log(T) / 2)",
           used=_field_bias, check=real_check("field_bias_init", optional=True)),
    Option("learn_field_bias", True, "bool", "whether the field bias is learned", used=_field_bias,
           check=bool_check("learn_field_bias")),
    Option("slot_bias", None, "int | None",
           "W: a learned bias per head on the score or field of each query's last W keys, by distance (none: off)",
           check=int_check("slot_bias", 1, optional=True)),
    Option("slot_bias_parametrization", "direct", "str",
           "the slot bias: direct (a free scalar per slot) or pairs (plus the per-slot field -sum_b P_ab of a pair "
           "table P, parametrised as the coupled window's J)", choices=SLOT_BIAS_PARAMETRIZATIONS,
           check=choice_check("slot_bias_parametrization", SLOT_BIAS_PARAMETRIZATIONS)),
    Option("mta_kernel_queries", 2, "int", "mta: the convolution's extent over queries (the query and its "
           "predecessors)", used=_convolution, check=int_check("mta_kernel_queries", 1)),
    Option("mta_kernel_keys", 9, "int", "mta: the convolution's extent over keys, centred on the key",
           used=_convolution, check=int_check("mta_kernel_keys", 1)),
    Option("position", None, "str | None", "the relative position scheme: rope, alibi or None", choices=POSITIONS,
           check=choice_check("position", POSITIONS, optional=True), in_config=False),
    Option("causal", True, "bool", "whether query i attends to keys j <= i only", check=bool_check("causal"),
           in_config=False),
    Option("bias", True, "bool", "whether the projections have biases", check=bool_check("bias"), in_config=False),
)}


def unused(mode: str, /, **given) -> list[str]:
    """The names among ``given`` (options of :data:`OPTIONS`) that ``mode`` does not use and that differ from their
    defaults: a value there would be ignored, so it is refused."""
    record = modes.get(mode)
    return [name for name, value in given.items()
            if not OPTIONS[name].used(record) and not OPTIONS[name].is_default(value)]


def check_values(**given) -> None:
    """Each given option's own check (ValueError naming it), in the table's order."""
    for name in OPTIONS:
        if name in given:
            OPTIONS[name].check(given[name])


__all__ = ["CONTENT_COUPLINGS", "COUPLINGS", "OPTIONS", "POSITIONS", "SLOT_BIAS_PARAMETRIZATIONS", "Option",
           "check_values", "unused"]
