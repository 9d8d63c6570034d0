"""The conjunction study's analysis of a trained model: the pair of query letters it reads, the couplings between
them by hand for each coupling kind, and the J = 0 evaluation against the same model made sigmoid attention."""

import pytest
import torch
from conftest import layer_input

from boltzmann_attention.experiments import blocks
from boltzmann_attention.experiments.config import TrainConfig
from boltzmann_attention.experiments.conjunction import measure, query_pair, without_couplings
from boltzmann_attention.experiments.train import setup_run

T = blocks.length(5, 2, 3, "marker")
BASE = dict(task="blocks", T=T, num_blocks=3, conjunction=True, answer="marker", n_layers=2, n_heads=2, d_model=16,
            d_ff=32, position="rope", coupling_init_std=0.3)
KINDS = {
    "relative": dict(mode="h+J", coupling="relative", coupling_range=4, method="banded"),
    "keys": dict(mode="h+J", coupling="keys", coupling_range=4, coupling_rank=4, method="chain"),
    "query": dict(mode="h+J", coupling="query", coupling_range=4, coupling_rank=4, method="chain"),
    "keys-step": dict(mode="h+J-step", coupling="keys", coupling_range=4, coupling_rank=4),
    "window": dict(mode="h+J", coupling="window", coupling_window=8),
}


def _model(kind):
    task, model, *_ = setup_run(TrainConfig.build(**BASE, **KINDS[kind]))
    task.val = tuple(t[:64] for t in task.val)
    task.data.test = tuple(t[:64] for t in task.data.test)
    return task, model


def test_the_pair_is_the_two_query_letters_in_the_target_block():
    x, _ = blocks.generate(200, torch.Generator().manual_seed(0), T + 2, 5, 2, 3, conjunction=True, answer="marker")
    pair = query_pair(x)
    for row, (j, k) in zip(x, pair.tolist()):
        letters, markers, query = blocks.parse(row)
        chars = blocks.text(row)
        assert chars[j] + chars[k] == query[:2]
        block = next(i for i, b in enumerate(letters) if set(query) <= set(b))
        start = chars.index(markers[block])
        assert start < j <= start + 5 and start < k <= start + 5


@pytest.mark.parametrize("kind", KINDS)
def test_the_couplings_between_the_pair_by_hand(kind):
    task, model = _model(kind)
    result = measure(model, task)
    x = task.data.test[0]
    pair = query_pair(x)
    j, k = pair[:, 0], pair[:, 1]
    layer = model.blocks[0].attn
    h = layer_input(model, layer, x)
    c = layer.couplings
    with torch.no_grad():
        if kind in ("keys", "query", "keys-step"):
            q, key = layer._heads(layer.query(h)), layer._heads(layer.key(h))
            J = c(key, q)[:, :, -1 if kind == "query" else 0]           # (B, H, S, S) at the answer query
            want = J[torch.arange(len(x)), :, j, k]
        elif kind == "relative":
            want = c(T)[:, j, k].T
        else:  # the window, by slot from the last position
            table = c()
            a, b = T - 1 - j, T - 1 - k
            inside = ((a < 8) & (b < 8))[:, None]
            want = torch.where(inside, table[:, a.clamp(max=7), b.clamp(max=7)].T, 0.0)
    got = result["pair"][0]
    assert got["mean"] == pytest.approx(want.mean(0).tolist(), abs=1e-6)
    assert got["positive"] == pytest.approx((want > 0).float().mean(0).tolist())
    assert len(result["pair"]) == 2


def test_j_zero_at_evaluation_is_the_same_model_as_sigmoid_attention_and_is_restored():
    task, model = _model("keys")
    before = task.evaluate(model, "test")
    result = measure(model, task)
    assert task.evaluate(model, "test") == before  # restored
    with without_couplings(model):
        assert all(layer.mode == "h" and layer.couplings is None for layer in (b.attn for b in model.blocks))
    for block in model.blocks:  # the same weights as an h model, by hand
        block.attn.mode, block.attn.couplings = "h", None
    assert result["uncoupled"]["test"] == task.evaluate(model, "test")
    assert result["uncoupled"]["test"]["error"] != before["error"] or result["uncoupled"]["test"]["loss"] != \
        before["loss"]


def test_a_run_with_content_couplings_records_the_analysis_and_no_couplings_table(tmp_path):
    from boltzmann_attention.experiments.conjunction import ANALYSIS
    from boltzmann_attention.experiments.train import train

    cfg = TrainConfig.build(**BASE, **KINDS["keys"], steps=2, warmup_steps=1, batch_size=4, eval_interval=2)
    result = train(cfg, progress=False, checkpoint=tmp_path / "ck.pt", analyses=(ANALYSIS,))
    assert all("couplings" not in layer and "field_bias" in layer for layer in result["layers"])
    assert set(result["conjunction"]) == {"uncoupled", "pair"} and len(result["conjunction"]["pair"]) == 2
    assert set(result["metrics"]["test"]) >= {"error", "error_decoy", "error_other", "error_not_a_marker"}
