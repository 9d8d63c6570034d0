"""The attention modes, one record each: what a mode uses, and so which options apply to it.

Everything that lists, parses or validates modes reads :data:`RECORDS`: the tuples of names (``MODES``: the
functional form's; ``LAYER_MODES``: the module's, with the learned-recency baselines) and the rule that an
option a mode does not use keeps its default (:func:`unused_options`), so that it is refused rather than
silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    """One attention mode.

    field: the query-key score enters the weights (as the Ising field h, or as softmax's score); couplings:
    pairwise couplings J between keys; three_body: three-body couplings K; field_bias: a learnable field bias
    per head; recency: a learned-recency softmax baseline (:mod:`boltzmann_attention.recency`), offered by the
    module only.
    """

    name: str
    summary: str
    field: bool = True
    couplings: bool = False
    three_body: bool = False
    field_bias: bool = False
    recency: bool = False

    @property
    def marginals(self) -> bool:
        """Whether its weights are Ising marginals computed by a method (else a closed form or a softmax)."""
        return self.couplings or self.three_body

    @property
    def window(self) -> bool:
        """Whether it can take the coupled window: pairwise couplings and no three-body terms."""
        return self.couplings and not self.three_body


RECORDS: dict[str, Mode] = {m.name: m for m in (
    Mode("softmax", "F.scaled_dot_product_attention itself"),
    Mode("h", "sigmoid attention, sigmoid(2h), closed form", field_bias=True),
    Mode("J", "couplings only: the weights do not depend on the input", field=False, couplings=True,
         field_bias=True),
    Mode("h+J", "Boltzmann attention", couplings=True, field_bias=True),
    Mode("h+K", "three-body couplings", three_body=True, field_bias=True),
    Mode("h+J+K", "pairwise and three-body couplings", couplings=True, three_body=True, field_bias=True),
    Mode("fox", "forgetting attention (module only)", recency=True),
    Mode("stickbreaking", "stick-breaking attention (module only)", recency=True),
)}

LAYER_MODES = tuple(RECORDS)
MODES = tuple(n for n, m in RECORDS.items() if not m.recency)
RECENCY_MODES = tuple(n for n, m in RECORDS.items() if m.recency)
WINDOW_MODES = tuple(n for n, m in RECORDS.items() if m.window)

# the module's options that only some modes use: name -> (its default, which modes use it)
USED_BY = {
    "method": ("exact", lambda m: m.marginals),
    "method_options": ({}, lambda m: m.marginals),
    "coupling": ("full", lambda m: m.couplings),
    "coupling_range": (None, lambda m: m.couplings),
    "coupling_window": (None, lambda m: m.couplings),
    "coupling_window_relative": (False, lambda m: m.couplings),
    "coupling_init_std": (0.0, lambda m: m.marginals),
    "field_bias_init": (None, lambda m: m.field_bias),
    "learn_field_bias": (True, lambda m: m.field_bias),
}


def get(name, choices: tuple[str, ...] = LAYER_MODES) -> Mode:
    """The record of mode ``name``; ValueError naming the choices for an unknown one."""
    if not isinstance(name, str) or name not in choices:
        raise ValueError(f"unknown mode {name!r}; choose one of {choices}")
    return RECORDS[name]


def unused_options(mode: str, **options) -> list[str]:
    """The names among ``options`` (of :data:`USED_BY`) that ``mode`` does not use and that differ from their
    defaults (None counts as the default of method_options)."""
    record = get(mode)
    out = []
    for name, value in options.items():
        default, used = USED_BY[name]
        if name == "method_options" and value is None:
            value = {}
        if not used(record) and not (value is default or value == default):
            out.append(name)
    return out


__all__ = ["LAYER_MODES", "MODES", "RECENCY_MODES", "RECORDS", "USED_BY", "WINDOW_MODES", "Mode", "get",
           "unused_options"]
