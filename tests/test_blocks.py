"""The find-the-block task: every answer is unique and a brute-force solver scores 100% on the validation set;
loss and metrics cover the answer letters only; the validation set is fixed; bad options are refused."""

import math

import pytest
import torch

from boltzmann_attention.experiments import blocks
from boltzmann_attention.experiments.blocks import IGNORE, BlockData, answer_metrics, generate, solve, text


def test_a_brute_force_solver_scores_100_percent_on_the_validation_set():
    data = BlockData(blocks.length())
    x, y = data.val
    assert x.shape == y.shape == (blocks.VALIDATION_SIZE, blocks.length())
    answers = solve(x)  # raises unless exactly one block holds every query letter
    assert torch.equal(answers, y[:, -blocks.BLOCK_SIZE:])
    fed = torch.cat([x[:, 1:], y[:, -1:]], 1)  # the answer letters are also the inputs after '='
    assert torch.equal(fed[:, -blocks.BLOCK_SIZE:], answers)


@pytest.mark.parametrize("N,L,B,extra", [(5, 2, 10, 0), (4, 1, 3, 7), (6, 3, 20, 0), (3, 3, 2, 2)])
def test_each_sequence_is_well_formed(N, L, B, extra):
    T = blocks.length(N, L, B) + extra
    x, y = generate(300, torch.Generator().manual_seed(1), T, N, L, B)
    assert x.shape == y.shape == (300, T)
    for row, target in zip(x, y):
        chars = text(row)
        assert chars[:extra] == "_" * extra and "_" not in chars[extra:]
        body, rest = chars[extra:].split("#")
        query, answer_start = rest.split("=")
        parts = body.split(".")
        assert len(parts) == B and all(len(p) == N == len(set(p)) for p in parts)
        assert len(query) == L == len(set(query))
        holders = [p for p in parts if set(query) <= set(p)]
        assert len(holders) == 1
        answer = "".join(blocks.SYMBOLS[t] for t in target[target != IGNORE].tolist())
        assert answer == holders[0] and answer.startswith(answer_start)
        assert (target[:-N] == IGNORE).all()  # no loss outside the answer


def test_the_metrics_are_on_the_answer_letters_only():
    x, y = generate(8, torch.Generator().manual_seed(2), blocks.length())
    logits = torch.randn(8, blocks.length(), blocks.VOCAB_SIZE)
    perfect = logits.clone()
    answered = y != IGNORE
    perfect[answered] = -10.0
    perfect[answered, y[answered]] = 10.0
    m = answer_metrics(perfect, y)
    assert m["error"] == 0.0 and m["accuracy"] == 1.0
    one_wrong = perfect.clone()
    row, col = 3, blocks.length() - 2
    one_wrong[row, col, y[row, col]] = -20.0
    m = answer_metrics(one_wrong, y)
    assert m["error"] == pytest.approx(1 / 8) and m["accuracy"] == pytest.approx(1 - 1 / (8 * blocks.BLOCK_SIZE))
    # the loss is the mean cross-entropy over the answer letters, by hand
    log_p = torch.log_softmax(logits, -1)
    by_hand = -sum(float(log_p[i, j, y[i, j]]) for i in range(8) for j in range(blocks.length()) if y[i, j] != IGNORE)
    assert answer_metrics(logits, y)["loss"] == pytest.approx(by_hand / (8 * blocks.BLOCK_SIZE), rel=1e-5)
    changed = logits.clone()
    changed[~answered] = torch.randn(int((~answered).sum()), blocks.VOCAB_SIZE)  # outside the answer
    assert answer_metrics(changed, y) == answer_metrics(logits, y)


def test_the_validation_set_is_fixed_and_training_batches_follow_their_generator():
    torch.manual_seed(123)
    a = BlockData(blocks.length()).val
    torch.manual_seed(456)
    b = BlockData(blocks.length()).val
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    data = BlockData(blocks.length(), val_size=10)
    first = data.train_batch(16, torch.Generator().manual_seed(0))
    again = data.train_batch(16, torch.Generator().manual_seed(0))
    other = data.train_batch(16, torch.Generator().manual_seed(1))
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])


def test_the_chance_level_is_far_below_a_solution():
    """Guessing the block uniformly gets it right 1 / num_blocks of the time: the task has headroom."""
    x, y = BlockData(blocks.length(), val_size=500).val
    guess = torch.randint(blocks.NUM_BLOCKS, (500,), generator=torch.Generator().manual_seed(0))
    starts = [text(r).lstrip("_").split("#")[0].split(".") for r in x]
    picked = torch.tensor([[blocks.SYMBOLS.index(c) for c in s[g]] for s, g in zip(starts, guess.tolist())])
    hit = (picked == y[:, -blocks.BLOCK_SIZE:]).all(-1).float().mean()
    assert abs(float(hit) - 1 / blocks.NUM_BLOCKS) < 4 * math.sqrt(0.1 * 0.9 / 500)


@pytest.mark.parametrize("kwargs,message", [
    (dict(T=10), r"T = 10 is too short .* needs T >= 67"),
    (dict(block_size=0), "block_size must be an integer in"), (dict(block_size=27), "block_size"),
    (dict(query_size=6), r"query_size must be an integer in \[1, 5\]"), (dict(num_blocks=0), "num_blocks"),
    (dict(val_size=0), "val_size"), (dict(T=67.0), "T must be an integer"),
])
def test_bad_options_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlockData(**{"T": blocks.length(), **kwargs})


def test_a_query_no_block_holds_alone_is_an_error():
    with pytest.raises(ValueError, match="no sequence with a unique block"):
        generate(4, torch.Generator().manual_seed(0), blocks.length(26, 1, 3), 26, 1, 3)  # each block: every letter


def test_the_task_trains_through_the_config_and_records_its_metrics():
    from boltzmann_attention.experiments.config import TrainConfig
    from boltzmann_attention.experiments.train import train

    cfg = TrainConfig.build(task="blocks", T=blocks.length(3, 1, 3), block_size=3, query_size=1, num_blocks=3,
                            mode="h", steps=30, batch_size=16, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                            eval_interval=15, warmup_steps=0, lr=1e-2)
    result = train(cfg, progress=False)
    first, last = result["history"][0], result["history"][-1]
    assert set(last) >= {"loss", "error", "accuracy"} and last["loss"] < first["loss"]
    assert set(result["metrics"]) == {"val", "test"} and set(result["metrics"]["test"]) == {"loss", "error", "accuracy"}
    assert result["config"]["data"]["num_blocks"] == 3
    with pytest.raises(ValueError, match="needs T >= 67"):
        TrainConfig.build(task="blocks", T=20).validate()
    with pytest.raises(ValueError, match="num_blocks is an option of task 'blocks' only"):
        TrainConfig.build(task="shakespeare", num_blocks=4).validate()


def test_the_test_set_is_fixed_and_apart_from_the_validation_set_and_a_run_reports_it():
    data, again = BlockData(blocks.length(), val_size=200), BlockData(blocks.length(), val_size=200)
    assert torch.equal(data.test[0], again.test[0]) and torch.equal(solve(data.test[0]), data.test[1][:, -5:])
    val = {tuple(r) for r in data.val[0].tolist()}
    assert not any(tuple(r) in val for r in data.test[0].tolist())


@pytest.mark.parametrize("N,L,B", [(5, 2, 3), (5, 2, 8), (4, 3, 5), (5, 2, 26)])
@pytest.mark.parametrize("answer", blocks.ANSWERS)
def test_with_conjunction_no_single_letter_names_the_block(N, L, B, answer):
    """By brute force over each sequence's text: one block holds every query letter, and every query letter is
    held by at least two blocks."""
    T = blocks.length(N, L, B, answer)
    x, y = generate(300, torch.Generator().manual_seed(3), T, N, L, B, conjunction=True, answer=answer)
    for row in x:
        letters, markers, query = blocks.parse(row)
        assert len(letters) == B and all(len(b) == N == len(set(b)) for b in letters)
        assert sum(set(query) <= set(b) for b in letters) == 1
        assert all(sum(c in b for b in letters) >= 2 for c in query)
    assert blocks.needs_conjunction(x).all()
    assert torch.equal(solve(x, N).flatten(), y[y != IGNORE])


def test_without_conjunction_two_blocks_never_need_both_letters():
    """The plain task's share, measured: with 2 blocks either letter alone always names the block."""
    T = blocks.length(5, 2, 2)
    x, _ = generate(2000, torch.Generator().manual_seed(4), T, 5, 2, 2)
    assert not blocks.needs_conjunction(x).any()
    assert not blocks.needs_conjunction(BlockData(T, num_blocks=2).val[0]).any()  # the blocks study's validation set
    x, _ = generate(2000, torch.Generator().manual_seed(4), blocks.length(5, 2, 10), 5, 2, 10)
    assert 0.55 < float(blocks.needs_conjunction(x).float().mean()) < 0.72  # about 64% with 10 blocks


def test_marker_answers_are_one_token_the_target_blocks_random_marker():
    N, L, B = 5, 2, 6
    T = blocks.length(N, L, B, "marker") + 3
    x, y = generate(500, torch.Generator().manual_seed(5), T, N, L, B, conjunction=True, answer="marker")
    assert ((y != IGNORE).sum(1) == 1).all() and (y[:, -1] >= blocks.FIRST_MARKER).all()
    first = []
    for row, target in zip(x, y[:, -1].tolist()):
        chars = text(row)
        assert chars[:3] == "___" and "." not in chars
        letters, markers, query = blocks.parse(row)
        assert len(set(markers)) == B and all(m.isupper() for m in markers)
        holder = next(i for i, b in enumerate(letters) if set(query) <= set(b))
        assert markers[holder] == blocks.SYMBOLS[target]
        first.append(markers[0])
    assert len(set(first)) > 20  # the marker says nothing of the block's place


def test_a_wrong_marker_is_classified_by_the_block_it_picked():
    x, y = generate(200, torch.Generator().manual_seed(6), blocks.length(5, 2, 5, "marker"), 5, 2, 5,
                    conjunction=True, answer="marker")
    kinds = {"right": [], "decoy": [], "other": [], "not_a_marker": []}
    for row, target in zip(x, y[:, -1].tolist()):
        letters, markers, query = blocks.parse(row)
        held = [sum(c in b for c in query) for b in letters]
        decoy = next(markers[i] for i, h in enumerate(held) if 0 < h < len(query))
        other = next((markers[i] for i, h in enumerate(held) if h == 0), None)
        absent = next(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in markers)
        picks = {"right": target, "decoy": blocks.SYMBOLS.index(decoy), "not_a_marker": blocks.SYMBOLS.index(absent)}
        if other is not None:
            picks["other"] = blocks.SYMBOLS.index(other)
        for kind, token in picks.items():
            kinds[kind].append((row, token))
    for i, kind in enumerate(blocks.CLASSES):
        rows, tokens = zip(*kinds[kind])
        assert (blocks.answer_classes(torch.tensor(tokens), torch.stack(rows)) == i).all(), kind
    logits = torch.full((len(x), x.shape[1], blocks.MARKER_VOCAB_SIZE), -5.0)
    logits[torch.arange(len(x)), -1, y[:, -1]] = 5.0
    m = answer_metrics(logits, y, x)
    assert m["error"] == 0.0 and m["error_decoy"] == m["error_other"] == m["error_not_a_marker"] == 0.0


@pytest.mark.parametrize("count", [-1, 2.5, "3", True])
def test_a_bad_count_is_refused_by_name(count):
    with pytest.raises(ValueError, match="count"):
        generate(count, torch.Generator(), blocks.length())


def test_a_numpy_integer_T_is_accepted():
    import numpy as np
    x, _ = generate(4, torch.Generator().manual_seed(0), np.int64(blocks.length()))
    assert x.shape == (4, blocks.length())


@pytest.mark.parametrize("L,B", [(1, 5), (2, 2)])
def test_a_conjunction_that_cannot_hold_is_refused(L, B):
    with pytest.raises(ValueError, match="conjunction needs"):
        blocks.check_options(100, 5, L, B, conjunction=True)
