"""The layer's options are defined once, in boltzmann_attention.options: the layer, the functional form, the
training config and convert() agree with the table."""

import inspect
import re
from dataclasses import MISSING, fields

import pytest

from boltzmann_attention import BoltzmannAttention, boltzmann_attention, modes
from boltzmann_attention.experiments.config import AttentionConfig, TrainConfig
from boltzmann_attention.options import OPTIONS, unused


def test_the_layer_takes_every_option_by_its_name_and_default():
    parameters = inspect.signature(BoltzmannAttention.__init__).parameters
    for name, record in OPTIONS.items():
        assert name in parameters, name
        assert parameters[name].default == record.default, name
    layer_only = set(parameters) - set(OPTIONS) - {"self"}
    assert layer_only == {"embed_dim", "num_heads", "max_len"}  # sizes, not options


def test_the_functional_form_shares_the_defaults_of_the_options_it_takes():
    parameters = inspect.signature(boltzmann_attention).parameters
    # bias: the functional form's is a per-call field bias (a float or tensor), not the projections' biases
    shared = [n for n in parameters if n in OPTIONS and n != "bias"]
    assert set(shared) == {"mode", "method", "method_options", "coupling_window"}
    for name in shared:
        assert parameters[name].default == OPTIONS[name].default, name


def test_the_config_section_is_the_table():
    section = {f.name: f for f in fields(AttentionConfig)}
    assert list(section) == [n for n, o in OPTIONS.items() if o.in_config]
    for name, f in section.items():
        default = f.default_factory() if f.default is MISSING else f.default
        assert default == OPTIONS[name].default_in_config and f.metadata["help"] == OPTIONS[name].help
        assert f.type == OPTIONS[name].type
        assert f.metadata.get("choices") == OPTIONS[name].choices


def test_convert_offers_options_of_the_table():
    pytest.importorskip("transformers")
    from boltzmann_attention.integrations import transformers as bt
    assert set(bt.OPTIONS) <= set(OPTIONS)


@pytest.mark.parametrize("mode", list(modes.LAYER_MODES))
def test_one_unused_rule_for_the_layer_and_the_config(mode):
    """Each option a mode does not use is refused at a non-default value, by the layer and by the config, with
    the same words; one it uses is never refused by that rule."""
    record = modes.get(mode)
    values = {"coupling_range": 3, "coupling_rank": 8, "coupling_init_std": 0.1, "field_bias_init": -1.0,
              "learn_field_bias": False, "mta_kernel_queries": 3, "mta_kernel_keys": 5, "method": "meanfield"}
    for name, value in values.items():
        used = OPTIONS[name].used(record)
        assert unused(mode, **{name: value}) == ([] if used else [name])
        if used:
            continue
        message = re.escape(f"mode {mode!r} does not use {name}")
        with pytest.raises(ValueError, match=message):
            BoltzmannAttention(8, 2, max_len=8, mode=mode, **{name: value})
        with pytest.raises(ValueError, match=message):
            TrainConfig.build(mode=mode, **{name: value}).validate()


@pytest.mark.parametrize("name, value, message", [
    ("coupling", "diagonal", "unknown coupling 'diagonal'"),
    ("coupling_rank", 0, "coupling_rank must be an integer >= 1"),
    ("coupling_window", 0, "coupling_window must be an integer >= 1"),
    ("coupling_init_std", -1.0, "coupling_init_std must be a finite number >= 0"),
    ("learn_field_bias", 1, "learn_field_bias must be True or False"),
    ("slot_bias", 0, "slot_bias must be an integer >= 1"),
    ("position", "learned", "unknown position 'learned'; choose None or one of"),
])
def test_each_value_is_checked_by_its_record(name, value, message):
    with pytest.raises(ValueError, match=message):
        OPTIONS[name].check(value)
    with pytest.raises(ValueError, match=message):
        BoltzmannAttention(8, 2, max_len=8, **{name: value})


def test_the_layer_chooses_by_records_never_by_a_mode_or_method_name():
    """attention.py, validation.py and the transformers adapter read what a mode or method does from its record."""
    from pathlib import Path

    import boltzmann_attention

    root = Path(boltzmann_attention.__file__).parent
    for name in ("attention.py", "validation.py", "integrations/transformers.py"):
        text = (root / name).read_text()
        found = re.findall(r"\b(?:mode|method)\s*[!=]=\s*[\"']", text)
        assert not found, (name, found)
