"""The co-attention analysis: the field-only and uncoupled versions of a coupled window against layers built
independently with the public options, and the decomposition recorded by training."""

import json

import pytest
import torch

from boltzmann_attention import BoltzmannAttention
from boltzmann_attention.experiments.coattention import ANALYSIS, decompose, without_couplings
from boltzmann_attention.experiments.sweep import Grid, run_name, sweep
from boltzmann_attention.experiments.train import load_final

W, D, HEADS, L = 4, 8, 2, 9


def _coupled(seed=0):
    torch.manual_seed(seed)
    layer = BoltzmannAttention(D, HEADS, max_len=L, mode="h+J", coupling="window", coupling_window=W,
                               slot_bias=W, coupling_init_std=0.8).double()
    with torch.no_grad():
        layer.slot_bias.weight.normal_()
    return layer


def _sigmoid_twin(layer, slot_bias):
    """Mode h with the layer's projections and field bias and the given (H, W) slot bias."""
    twin = BoltzmannAttention(D, HEADS, max_len=L, mode="h", slot_bias=W).double()
    state = {k: v for k, v in layer.state_dict().items() if not k.startswith(("couplings", "slot_bias"))}
    twin.load_state_dict({**state, "slot_bias.weight": slot_bias}, strict=True)
    return twin


def test_the_versions_are_sigmoid_attention_with_the_couplings_row_sums_or_nothing_as_slot_bias():
    layer = _coupled()
    x = torch.randn(3, L, D, dtype=torch.float64)
    exact = layer(x, need_weights=True)[1]
    J = layer.couplings()
    with without_couplings(layer, "uncoupled"):
        uncoupled = layer(x, need_weights=True)[1]
    with without_couplings(layer, "field only"):
        field_only = layer(x, need_weights=True)[1]
    torch.testing.assert_close(uncoupled, _sigmoid_twin(layer, layer.slot_bias.weight)(x, need_weights=True)[1])
    # rows with a full window: every slot's key exists, so the per-slot field is -sum_b J_ab
    twin = _sigmoid_twin(layer, layer.slot_bias.weight - J.sum(-1))(x, need_weights=True)[1]
    torch.testing.assert_close(field_only[..., W - 1:, :], twin[..., W - 1:, :])
    assert not torch.allclose(field_only, uncoupled) and not torch.allclose(field_only, exact)
    torch.testing.assert_close(layer(x, need_weights=True)[1], exact)  # restored on exit
    assert layer.mode == "h+J" and layer.coupling_window == W


def test_an_unknown_version_is_refused():
    with pytest.raises(ValueError, match="field only"):
        with without_couplings(_coupled(), "mean field"):
            pass


@pytest.mark.slow
def test_a_trained_coupled_window_records_its_decomposition_and_it_recomputes_from_the_kept_model(tmp_path, capsys):
    tiny = dict(steps=4, batch_size=4, eval_interval=4, eval_windows=8, d_model=16, d_ff=32, n_layers=2,
                n_heads=2, warmup_steps=1, coupling="window", coupling_window=W, coupling_init_std=0.5, slot_bias=W)
    grid = Grid(("shakespeare",), (12,), modes=("h+J",), seeds=(0,), overrides=tiny, analyses=(ANALYSIS,))
    (name,) = [run_name(cfg) for _, cfg in grid.runs()]
    assert sweep([grid], tmp_path) == [name]
    recorded = json.loads((tmp_path / "runs" / f"{name}.json").read_text())
    split = recorded["coattention"]
    assert len(split["layers"]) == 2 and all(len(x["explained"]) == 2 for x in split["layers"])
    assert split["loss"]["exact"] == pytest.approx(recorded["metrics"]["val"]["loss"], rel=1e-6)
    assert split["loss"]["field only"] != split["loss"]["exact"] != split["loss"]["uncoupled"]
    for x in split["layers"]:
        assert all(e <= 1 for e in x["explained"]) and all(c > 0 for c in x["coupling_effect"])
    for x in split["layers"]:  # the mean squares give the explained share, so heads and runs can be pooled
        for e, f, c in zip(x["explained"], x["field_only_square"], x["coupling_square"]):
            assert e == pytest.approx(1 - f / c, rel=1e-5)
    task, model = load_final(tmp_path / "final" / f"{name}.pt")
    assert json.loads(json.dumps(decompose(model, task))) == split  # deterministic: the same numbers
    # a finished run without the measurement gets it from its kept model at the next sweep, the same numbers
    path = tmp_path / "runs" / f"{name}.json"
    path.write_text(json.dumps({k: v for k, v in recorded.items() if k != "coattention"}))
    capsys.readouterr()
    assert sweep([grid], tmp_path) == []
    assert "recorded the grids' analyses of 1 finished run" in capsys.readouterr().out
    assert json.loads(path.read_text())["coattention"] == split
    # the loop knows no study: a grid that does not name the analysis does not get it
    plain = Grid(("shakespeare",), (12,), modes=("h+J",), seeds=(0,), overrides=tiny)
    assert sweep([plain], tmp_path / "plain") == [name]
    assert "coattention" not in json.loads((tmp_path / "plain" / "runs" / f"{name}.json").read_text())


def test_a_model_without_coupled_window_has_no_decomposition(tmp_path):
    tiny = dict(steps=2, batch_size=4, eval_interval=2, eval_windows=8, d_model=16, d_ff=32, n_layers=1,
                n_heads=2, warmup_steps=1)
    grid = Grid(("shakespeare",), (8,), modes=("h",), seeds=(0,), overrides=tiny, analyses=(ANALYSIS,))
    sweep([grid], tmp_path)
    (name,) = [run_name(cfg) for _, cfg in grid.runs()]
    assert "coattention" not in json.loads((tmp_path / "runs" / f"{name}.json").read_text())
