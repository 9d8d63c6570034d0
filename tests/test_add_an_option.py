"""Adding a layer option is its record in options.OPTIONS and its use in the layer: the value check, the rule
that a mode that does not use it keeps its default, and the training config's field come from the record."""

from dataclasses import fields

import pytest

from boltzmann_attention import modes, options, validation
from boltzmann_attention.experiments.config import attention_config

NAME = "coupling_temperature"


@pytest.fixture
def added(monkeypatch):
    record = options.Option(NAME, 1.0, "float", "a temperature dividing J", used=lambda m: m.couplings,
                            check=options.real_check(NAME, 0.0))
    monkeypatch.setitem(options.OPTIONS, NAME, record)
    return record


def test_its_value_is_checked_and_unused_modes_refuse_it(added):
    validation.check_layer_options(head_dim=4, mode="h+J", **{NAME: 2.0})  # a mode with couplings takes it
    with pytest.raises(ValueError, match=f"{NAME} must be a finite number >= 0"):
        validation.check_layer_options(head_dim=4, mode="h+J", **{NAME: -1.0})
    with pytest.raises(ValueError, match=f"mode 'h' does not use {NAME}"):
        validation.check_layer_options(head_dim=4, mode="h", **{NAME: 2.0})
    validation.check_layer_options(head_dim=4, mode="h", **{NAME: 1.0})  # at its default: nothing to ignore
    assert options.unused("softmax", **{NAME: 0.5}) == [NAME] and not modes.get("softmax").couplings


def test_the_config_section_has_it(added):
    section = {f.name: f for f in fields(attention_config(options.OPTIONS))}
    assert section[NAME].default == 1.0 and section[NAME].metadata["help"] == added.help
    assert section[NAME].type == "float"
