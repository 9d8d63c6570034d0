"""Match3: labels against brute force, balanced fixed splits, the premise that no single token decides, and a
small setting learned end to end."""

import itertools

import pytest
import torch

from boltzmann_attention.experiments.config import TrainConfig
from boltzmann_attention.experiments.tasks import IGNORE, match3
from boltzmann_attention.experiments.train import Task, train


def brute_force(sequence: list[int], modulus: int) -> bool:
    *keys, query = sequence
    return any((query + a + b) % modulus == 0 for a, b in itertools.combinations(keys, 2))


@pytest.mark.parametrize("T, modulus", [(3, 2), (5, 7), (8, 32), (11, 64)])
def test_labels_are_the_brute_force_answer(T, modulus):
    x = torch.randint(0, modulus, (500, T), generator=torch.Generator().manual_seed(T))
    expected = torch.tensor([brute_force(row, modulus) for row in x.tolist()])
    assert torch.equal(match3.labels(x, modulus), expected)
    assert 0 < int(expected.sum()) < len(x)  # both classes occur, so the comparison can fail


@pytest.mark.parametrize("T, modulus", [(8, 32), (16, 128)])
def test_splits_are_fixed_balanced_and_answered_at_the_last_position(T, modulus):
    data = match3.Match3Data(T, modulus)
    again = match3.Match3Data(T, modulus)
    assert torch.equal(data.val[0], again.val[0]) and torch.equal(data.test[1], again.test[1])
    assert not torch.equal(data.val[0], data.test[0])
    for x, y in (data.val, data.test):
        assert x.shape == y.shape == (match3.SPLIT_SIZE, T) and int(x.min()) >= 0 and int(x.max()) < modulus
        assert (y[:, :-1] == IGNORE).all()
        yes = y[:, -1] == modulus + 1
        assert torch.equal(yes, torch.tensor([brute_force(row, modulus) for row in x.tolist()]))
        assert int(yes.sum()) == match3.SPLIT_SIZE // 2
    x, y = data.batch(64, torch.Generator().manual_seed(0))
    assert int((y[:, -1] == modulus + 1).sum()) == 32


def holdout_accuracy(feature_val, yes_val, feature_test, yes_test) -> float:
    """Accuracy on the test split of the majority class per feature value, learned on the validation split."""
    rule = {}
    for value in set(feature_val):
        chosen = [y for f, y in zip(feature_val, yes_val) if f == value]
        rule[value] = 2 * sum(chosen) > len(chosen)
    return sum(rule.get(f, False) == y for f, y in zip(feature_test, yes_test)) / len(yes_test)


@pytest.mark.parametrize("T, modulus", [(8, 32), (16, 128)])
def test_the_query_alone_or_with_one_key_is_at_chance(T, modulus):
    """The premise: a label needs a pair of keys. Rules from the query's residue, or from the query and any one
    key, learned on the validation split, are at chance on the test split (within 4 standard errors)."""
    data = match3.Match3Data(T, modulus)
    (xv, yv), (xt, yt) = data.val, data.test
    yes_val, yes_test = (yv[:, -1] == modulus + 1).tolist(), (yt[:, -1] == modulus + 1).tolist()
    bound = 0.5 + 4 * (0.25 / match3.SPLIT_SIZE) ** 0.5
    assert holdout_accuracy(xv[:, -1].tolist(), yes_val, xt[:, -1].tolist(), yes_test) < bound
    for j in range(T - 1):
        pair_val = [(q, k) for q, k in zip(xv[:, -1].tolist(), xv[:, j].tolist())]
        pair_test = [(q, k) for q, k in zip(xt[:, -1].tolist(), xt[:, j].tolist())]
        assert holdout_accuracy(pair_val, yes_val, pair_test, yes_test) < bound


def test_bad_options_and_rare_classes_are_refused():
    with pytest.raises(ValueError, match="match3 needs T >= 3"):
        match3.Match3Data(2, 8)
    with pytest.raises(ValueError, match=r"modulus must be an integer in \[2, 4096\]"):
        match3.Match3Data(8, 1)
    with pytest.raises(ValueError, match="positive sequences are too rare to draw.*modulus near"):
        match3.generate(1000, torch.Generator().manual_seed(0), 3, 4096)
    with pytest.raises(ValueError, match="modulus is an option of task 'match3' only"):
        TrainConfig.build(task="shakespeare", modulus=7).validate()


def test_a_model_trains_on_it():
    cfg = TrainConfig.build(task="match3", T=6, modulus=8, steps=4, batch_size=16, d_model=16, n_heads=2,
                            eval_interval=4, warmup_steps=0, mode="softmax")
    cfg.validate()
    assert Task(cfg).vocab_size == 10
    result = train(cfg, progress=False)
    assert set(result["metrics"]) == {"val", "test"}
    test = result["metrics"]["test"]
    assert test["error"] == pytest.approx(1 - test["accuracy"]) and 0 <= test["error"] <= 1


@pytest.mark.slow
def test_a_small_match3_is_learned_end_to_end():
    # T = 4, M = 4: no single token decides a label (the premise, measured as at the study's settings), yet the
    # 256 sequences are few enough for a small softmax model to learn the pairs: the labels, the answer position and
    # the loss carry the task's signal, so a study's model at chance is the mechanism's failure, not the pipeline's
    alone, pairs = match3.shortcut_accuracy(match3.Match3Data(4, 4))
    assert abs(alone - 0.5) < 0.05 and abs(pairs - 0.5) < 0.05
    cfg = TrainConfig.build(task="match3", T=4, modulus=4, steps=1000, batch_size=32, d_model=16, n_heads=2,
                            n_layers=4, eval_interval=1000, warmup_steps=50, mode="softmax", lr=1e-3, position="rope")
    torch.manual_seed(0)
    result = train(cfg, progress=False)
    assert result["metrics"]["val"]["error"] < 0.2  # chance: 0.5
