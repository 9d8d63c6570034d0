"""The match3 study's analysis of a trained model: the pair of keys that completes the query, by brute force, the
couplings between them by hand, and the J = 0 evaluation against the same model made sigmoid attention."""

import itertools

import pytest
import torch
from conftest import layer_input

from boltzmann_attention.experiments.config import TrainConfig
from boltzmann_attention.experiments.conjunction import MATCH3, measure_match3
from boltzmann_attention.experiments.studies.match3 import grids
from boltzmann_attention.experiments.tasks.match3 import answer_pair, labels
from boltzmann_attention.experiments.train import setup_run

T, M = 8, 30
BASE = dict(task="match3", T=T, modulus=M, n_layers=2, n_heads=2, d_model=16, d_ff=32, position="rope",
            coupling_init_std=0.3)
KINDS = {
    "relative": dict(mode="h+J", coupling="relative", method="exact"),
    "keys": dict(mode="h+J", coupling="keys", coupling_rank=4, method="exact"),
    "query": dict(mode="h+J", coupling="query", coupling_rank=4, method="exact"),
}


def test_the_pair_is_the_first_pair_that_completes_the_query_by_brute_force():
    x = torch.randint(0, M, (300, T), generator=torch.Generator().manual_seed(0))
    rows, pair = answer_pair(x, M)
    want_rows, want_pairs = [], []
    for r, seq in enumerate(x.tolist()):
        first = next(((j, k) for j, k in itertools.combinations(range(T - 1), 2)
                      if (seq[-1] + seq[j] + seq[k]) % M == 0), None)
        if first is not None:
            want_rows.append(r)
            want_pairs.append(first)
    assert rows.tolist() == want_rows and [tuple(p) for p in pair.tolist()] == want_pairs
    assert rows.tolist() == labels(x, M).nonzero().squeeze(-1).tolist()
    assert 0.3 < len(rows) / len(x) < 0.7


def _model(kind):
    task, model, *_ = setup_run(TrainConfig.build(**BASE, **KINDS[kind]))
    task.val = tuple(t[:64] for t in task.val)
    task.data.test = tuple(t[:64] for t in task.data.test)
    return task, model


@pytest.mark.parametrize("kind", KINDS)
def test_the_couplings_between_the_pair_by_hand(kind):
    task, model = _model(kind)
    result = measure_match3(model, task)
    x = task.data.test[0]
    rows, pair = answer_pair(x, M)
    j, k = pair[:, 0], pair[:, 1]
    layer = model.blocks[1].attn
    h, c = layer_input(model, layer, x)[rows], layer.couplings
    with torch.no_grad():
        if kind == "relative":
            want = c(T)[:, j, k].T
        else:
            q, key = layer._heads(layer.query(h)), layer._heads(layer.key(h))
            J = c(key, q)[:, :, -1 if kind == "query" else 0]  # (count, H, S, S) at the answer query
            want = J[torch.arange(len(rows)), :, j, k]
    got = result["pair"][1]
    assert got["mean"] == pytest.approx(want.mean(0).tolist(), abs=1e-6)
    assert got["positive"] == pytest.approx((want > 0).float().mean(0).tolist())
    assert got["negative"] == pytest.approx((want < 0).float().mean(0).tolist())
    assert got["within_range"] == 1.0 and len(result["pair"]) == 2


def test_j_zero_at_evaluation_is_the_same_model_as_sigmoid_attention():
    task, model = _model("keys")
    before = task.evaluate(model, "test")
    result = measure_match3(model, task)
    assert task.evaluate(model, "test") == before  # restored
    for block in model.blocks:  # the same weights as an h model, by hand
        block.attn.mode, block.attn.couplings = "h", None
    assert result["uncoupled"]["test"] == task.evaluate(model, "test")


def test_the_study_asks_it_of_its_coupled_arms_only():
    s = grids.SETTINGS[0]
    for arm in grids.ARMS:
        grid = grids.grid(arm, s, grids.REFERENCE_LR, (0,))
        (_, cfg), = grid.runs()
        assert MATCH3 in grid.analyses
        assert MATCH3.applies(cfg) == grids.ARMS[arm].coupled
