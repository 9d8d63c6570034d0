"""One validation: the module refuses at construction what the functional form refuses, in the same words,
and the method records refuse option values up front with the words the methods use at their call."""

import pytest
import torch
from conftest import symmetric_couplings

from boltzmann_attention import BoltzmannAttention, boltzmann_attention, ising
from boltzmann_attention.ising import methods


def _error(thunk) -> str:
    with pytest.raises(ValueError) as info:
        thunk()
    return str(info.value)


# (module keyword arguments, functional keyword arguments or None where the functional form has no such
# option, a pattern of the message)
REFUSED = {
    "window with three-body mode": (dict(mode="h+K", coupling="window", coupling_window=3),
                                    dict(mode="h+K", coupling_window=3, is_causal=True),
                                    "mode 'h+K' does not use coupling, coupling_window"),
    "window with mode h": (dict(mode="h", coupling="window", coupling_window=3),
                           dict(mode="h", coupling_window=3, is_causal=True),
                           "mode 'h' does not use coupling, coupling_window"),
    "negative window": (dict(mode="h+J", coupling="window", coupling_window=-5),
                        dict(coupling_window=-5, is_causal=True), "integer >= 1"),
    "window without coupling='window'": (dict(mode="h+J", coupling_window=4), None, "go together"),
    "a method for mode h": (dict(mode="h", method="banded"), dict(mode="h", method="banded"),
                            "mode 'h' does not use method"),
    "method options for softmax": (dict(mode="softmax", method_options={"max_spins": 3}),
                                   dict(mode="softmax", method_options={"max_spins": 3}),
                                   "mode 'softmax' does not use method_options"),
    "window, not causal": (dict(causal=False, coupling="window", coupling_window=3),
                           dict(coupling_window=3), "is_causal=True"),
    "window, method meanfield": (dict(method="meanfield", coupling="window", coupling_window=3),
                                 dict(method="meanfield", coupling_window=3, is_causal=True),
                                 "'exact' and 'configurations' only"),
    "window, other options": (dict(coupling="window", coupling_window=3, method_options={"damping": 0.5}),
                              dict(coupling_window=3, is_causal=True, method_options={"damping": 0.5}),
                              "takes 'max_spins'"),
    "relative window with full couplings": (dict(coupling="full", coupling_window_relative=True), None,
                                            "coupling='window' only"),
    "window_relative not a bool": (dict(coupling="window", coupling_window=3, coupling_window_relative="yes"), None,
                                   "True or False"),
    "damping 1.5": (dict(method="meanfield", method_options={"damping": 1.5}),
                    dict(method="meanfield", method_options={"damping": 1.5}), "damping"),
    "on_fail explode": (dict(method="tap", method_options={"on_fail": "explode"}),
                        dict(method="tap", method_options={"on_fail": "explode"}), "on_fail"),
    "bandwidth -1": (dict(method="banded", method_options={"bandwidth": -1}),
                     dict(method="banded", method_options={"bandwidth": -1}), "bandwidth"),
    "num_samples 0": (dict(method="gibbs", method_options={"num_samples": 0}),
                      dict(method="gibbs", method_options={"num_samples": 0}), "num_samples"),
    "pt ladder without 1": (dict(method="pt", method_options={"betas": [0.5]}),
                            dict(method="pt", method_options={"betas": [0.5]}), "must contain 1.0"),
    "sqa odd slices": (dict(method="sqa", method_options={"trotter_slices": 3}),
                       dict(method="sqa", method_options={"trotter_slices": 3}), "even"),
    "seed and generator": (dict(method="gibbs", method_options={"seed": 1, "generator": torch.Generator()}),
                           dict(method="gibbs", method_options={"seed": 1, "generator": torch.Generator()}),
                           "not both"),
    "max_spins -1": (dict(method_options={"max_spins": -1}), dict(method_options={"max_spins": -1}), "max_spins"),
    "unknown option": (dict(method_options={"bogus": 1}), dict(method_options={"bogus": 1}), "bogus"),
    "method_options not a dict": (dict(method_options=[1]), dict(method_options=[1]), "must be a dict"),
    # the module also has the module-only modes, which the functional form does not: its list names them
    "unknown mode": (dict(mode="h+Q"), None, "'fox', 'stickbreaking', 'mta')"),
    "unknown method": (dict(method="magic"), dict(method="magic"), "unknown method"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_construction_refuses_what_the_functional_form_refuses(name):
    layer_options, call_options, pattern = REFUSED[name]
    message = _error(lambda: BoltzmannAttention(8, 2, max_len=8, **layer_options))
    assert pattern in message
    if call_options is None:
        return
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 4, 4, dtype=torch.float64, generator=g).unbind(0)
    mode = call_options.get("mode", "h+J")
    window = call_options.get("coupling_window")
    J = None
    if "J" in mode:
        J = symmetric_couplings(window if isinstance(window, int) and window > 0 else 4, 2)
    K = torch.zeros(2, 4, 4, 4, dtype=torch.float64) if "K" in mode else None
    assert _error(lambda: boltzmann_attention(q, k, v, couplings=J, three_body=K, **call_options)) == message


def test_layers_that_build_also_run():
    """The options the checks let through work at the first forward (no check refuses a valid layer)."""
    x = torch.randn(2, 6, 8)
    for options in (dict(coupling="window", coupling_window=3, coupling_window_relative=True),
                    dict(mode="J", coupling="window", coupling_window=2),
                    dict(coupling="relative", coupling_range=0),
                    dict(coupling="relative", method="banded"),
                    dict(method="meanfield", method_options={"damping": 0.0, "solver": "anderson"}),
                    dict(method="gibbs", method_options={"num_samples": 4, "seed": 0}),
                    dict(mode="h", slot_bias=2)):
        out, _ = BoltzmannAttention(8, 2, max_len=6, **options)(x)
        assert out.shape == x.shape and torch.isfinite(out).all()


# --- the method record --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method,options", [
    ("meanfield", {"damping": 1.0}), ("meanfield", {"tol": 0.0}), ("meanfield", {"max_iter": 0}),
    ("tap", {"solver": "newton"}), ("tap", {"anderson_memory": 0}),
    ("banded", {"max_bandwidth": -2}), ("banded", {"chunk_size": 0}),
    ("gibbs", {"warmup": -1}), ("gibbs", {"nudge": 0.0}), ("gibbs", {"gradient": "magic"}),
    ("gibbs", {"return_samples": True}),
    ("pt", {"num_replicas": 1}), ("pt", {"betas": [1.0, 1.0]}),
    ("sqa", {"sweeps": 0}), ("sqa", {"gamma_end": -1.0}),
    ("dqa", {"trotter_steps": 0}),
])
def test_option_values_refused_up_front_in_the_words_of_the_call(method, options):
    """validate_options refuses what the method itself refuses at its call, with the same message."""
    record = ising.resolve_method(method)
    h = torch.zeros(1, 2, dtype=torch.float64)
    J = symmetric_couplings(2)
    at_call = _error(lambda: record.marginals(h, J, None, None, **options))
    assert _error(lambda: ising.validate_options(method, options)) == at_call


def test_records_derive_the_public_tables():
    assert set(ising.METHODS) == set(methods.REGISTRY) == set(ising.OPTIONS)
    assert ising.SAMPLED_METHODS == {"gibbs", "pt", "dqa", "sqa"}
    assert ising.ITERATIVE_METHODS == {"meanfield", "tap"}
    for name, record in methods.REGISTRY.items():
        assert record.kind in methods.KINDS
        assert (record.log_partition is None) == record.sampled == (name in ising.SAMPLED_METHODS)
        assert record.limit
    assert methods.REGISTRY["exact"].kind == "exact" and "max_spins" in methods.REGISTRY["exact"].limit
    assert methods.REGISTRY["meanfield"].kind == "approximate"
    assert methods.methods_with("toeplitz") == ("meanfield", "tap")
    assert methods.methods_with("window") == ("exact", "configurations")
    assert set(methods.methods_with("three_body")) == {"exact", "reference", "meanfield"}


@pytest.mark.parametrize("name", sorted(methods.REGISTRY))
def test_three_body_flag_is_what_the_method_does(name):
    """A record with three_body runs with K (an exact one matches the reference); one without refuses K."""
    h = torch.tensor([[0.3, -0.2, 0.5]], dtype=torch.float64)
    K = torch.zeros(3, 3, 3, dtype=torch.float64)
    for p in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
        K[p] = 0.4
    options = {"num_samples": 8, "seed": 0} if methods.REGISTRY[name].sampled else {}
    if methods.REGISTRY[name].three_body:
        m = ising.marginals(h, None, K, method=name, **options)
        assert m.shape == h.shape and torch.isfinite(m).all()
        if methods.REGISTRY[name].kind == "exact":
            torch.testing.assert_close(m, ising.reference.marginals(h, None, K), atol=1e-12, rtol=0)
    else:
        with pytest.raises(ValueError, match="pairwise|K must be None"):
            ising.marginals(h, None, K, method=name, **options)


def test_resolve_method_names_the_methods_and_takes_dimod_samplers():
    with pytest.raises(ValueError, match="unknown method 'magic'; choose one of"):
        ising.resolve_method("magic")

    class Sampler:  # the interface DimodSampler needs: sample_ising and its parameters
        parameters = {"num_reads": []}

        def sample_ising(self, h, J, **kwargs):  # pragma: no cover - not called here
            raise AssertionError

    try:
        sampler = ising.DimodSampler(Sampler(), num_reads=4)
    except (ImportError, ValueError) as error:
        pytest.skip(f"DimodSampler unavailable here: {error}")
    record = ising.resolve_method(sampler)
    assert record.sampled and record.log_partition is None
    with pytest.raises(ValueError, match="unknown option"):
        ising.validate_options(sampler, {"num_samples": 3})
    with pytest.raises(ValueError, match="sampling does not give log Z"):
        ising.log_partition(torch.zeros(2, dtype=torch.float64), method=sampler)
