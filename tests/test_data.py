"""Tests for boltzmann_attention.data: Tiny Shakespeare and bracket matching."""

import gzip
import hashlib
import re

import pytest
import torch
from torch import Tensor

from boltzmann_attention.experiments import data as data_module
from boltzmann_attention.experiments.data import (
    CLOSE,
    IGNORE,
    OPEN,
    SHAKESPEARE_LENGTH,
    BracketData,
    CharVocabulary,
    ShakespeareData,
    _bundled_file,
    depths,
    generate_brackets,
    load_shakespeare,
    word_pairs,
)


@pytest.fixture(scope="module")
def shakespeare():
    return ShakespeareData()


# ---------------------------------------------------------------- Tiny Shakespeare

def test_bundled_text():
    text = load_shakespeare()
    assert len(text) == SHAKESPEARE_LENGTH == 1_115_394
    assert len(set(text)) == 65
    assert text.startswith("First Citizen:")
    assert load_shakespeare() is text  # cached


# the test's own oracle: a plain stack over each row
def _bracket_error(tokens, labels) -> str | None:
    if not isinstance(tokens, Tensor) or not isinstance(labels, Tensor):
        return "tokens and labels must be tensors"
    if tokens.dim() != 2 or tokens.shape != labels.shape:
        return f"tokens and labels must both be (N, T), got {tuple(tokens.shape)} and {tuple(labels.shape)}"
    if tokens.is_floating_point() or labels.is_floating_point():
        return "tokens and labels must be integer tensors"
    for r, (tok_row, lab_row) in enumerate(zip(tokens.tolist(), labels.tolist())):
        stack = []
        for i, (tok, lab) in enumerate(zip(tok_row, lab_row)):
            if tok == OPEN:
                stack.append(i)
                expected = IGNORE
            elif tok == CLOSE:
                if not stack:
                    return f"row {r}: closing bracket at {i} has no opening bracket"
                expected = stack.pop()
            elif tok > CLOSE:
                expected = IGNORE
            else:
                return f"row {r}: invalid token {tok} at {i}"
            if lab != expected:
                return f"row {r}: label {lab} at {i}, expected {expected}"
        if stack:
            return f"row {r}: unclosed opening brackets at {stack}"
    return None


def check_brackets(tokens: Tensor, labels: Tensor, raise_error: bool = False) -> bool:
    """True iff every row is well nested and labelled right, checked with a plain stack.

    tokens, labels (N, T) integer. Right means: each closing bracket's label is the slot of the opening
    bracket it pops, every other label is ``IGNORE``, no pop on an empty stack, the stack empty at the
    end, tokens >= 0. With ``raise_error`` a failure raises ``ValueError`` naming the first fault.
    """
    error = _bracket_error(tokens, labels)
    if error is not None and raise_error:
        raise ValueError(error)
    return error is None



def test_load_from_path_txt_and_gz(tmp_path):
    text = load_shakespeare()
    txt, gz = tmp_path / "s.txt", tmp_path / "s.txt.gz"
    txt.write_bytes(text.encode())
    gz.write_bytes(gzip.compress(text.encode()))
    assert load_shakespeare(txt) == text
    assert load_shakespeare(str(gz)) == text


def test_corrupted_copy_fails_checksum(tmp_path):
    raw = bytearray(load_shakespeare().encode())
    raw[1000] = ord("X") if raw[1000] != ord("X") else ord("Y")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum mismatch.*expected.*got"):
        load_shakespeare(bad)
    (tmp_path / "bad.txt.gz").write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_shakespeare(tmp_path / "bad.txt.gz")


def _damaged(kind: str) -> bytes:
    """The bundled gzip file, damaged inside the stream, truncated, or recompressed with one character changed."""
    good = _bundled_file().read_bytes()
    if kind == "bit flip":
        raw = bytearray(good)
        raw[len(raw) // 2] ^= 0x01
        return bytes(raw)
    if kind == "truncated":
        return good[: len(good) // 2]
    text = bytearray(gzip.decompress(good))
    text[1000] = ord("X") if text[1000] != ord("X") else ord("Y")
    return gzip.compress(bytes(text))


@pytest.mark.parametrize("kind", ["bit flip", "truncated", "changed text"])
def test_corrupted_bundled_data_gives_one_clear_error(kind, tmp_path, monkeypatch):
    copy = tmp_path / "tinyshakespeare.txt.gz"
    copy.write_bytes(_damaged(kind))
    monkeypatch.setattr(data_module, "_bundled_file", lambda: copy)
    data_module._load_bundled.cache_clear()
    try:
        with pytest.raises(ValueError, match=f"bundled Tiny Shakespeare {re.escape(str(copy))} is corrupt.*"
                                             "package data is corrupt: reinstall"):
            load_shakespeare()
        with pytest.raises(ValueError, match=f"Tiny Shakespeare file {re.escape(str(copy))} is corrupt"):
            load_shakespeare(copy)  # the same check for a file given by path
    finally:
        data_module._load_bundled.cache_clear()


def test_vocabulary_round_trip(shakespeare):
    vocab = shakespeare.vocab
    assert vocab.size == len(vocab) == shakespeare.vocab_size == 65
    assert list(vocab.chars) == sorted(vocab.chars)
    sample = load_shakespeare()[5000:7000]
    ids = vocab.encode(sample)
    assert ids.dtype == torch.long and ids.shape == (2000,)
    assert vocab.decode(ids) == sample
    assert vocab.decode(shakespeare.data) == load_shakespeare()
    with pytest.raises(ValueError, match="not in the vocabulary"):
        vocab.encode("abc\u00e9")
    small = CharVocabulary("cab")
    assert small.chars == "abc" and small.encode("cab").tolist() == [2, 0, 1]


def test_split_is_contiguous_90_10(shakespeare):
    n = len(shakespeare.data)
    assert n == SHAKESPEARE_LENGTH
    assert shakespeare.n_train == int(0.9 * n) == len(shakespeare.train)
    assert len(shakespeare.train) + len(shakespeare.val) == n
    assert abs(len(shakespeare.val) / n - 0.1) < 1e-5
    assert torch.equal(torch.cat([shakespeare.train, shakespeare.val]), shakespeare.data)
    assert torch.equal(shakespeare.val, shakespeare.data[shakespeare.n_train:])


def test_train_batch(shakespeare):
    B, T = 32, 10
    x, y = shakespeare.train_batch(B, T, torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    train_text = load_shakespeare()[: shakespeare.n_train]
    for row_x, row_y in zip(x, y):  # each row is a train window followed by its next characters
        assert shakespeare.vocab.decode(torch.cat([row_x, row_y[-1:]])) in train_text
    x2, y2 = shakespeare.train_batch(B, T, torch.Generator().manual_seed(3))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = shakespeare.train_batch(B, T, torch.Generator().manual_seed(4))
    assert not torch.equal(x, x3)


def test_train_batch_is_resumable(shakespeare):
    g = torch.Generator().manual_seed(7)
    shakespeare.train_batch(4, 6, g)
    state = g.get_state()
    a = shakespeare.train_batch(4, 6, g)
    g.set_state(state)
    b = shakespeare.train_batch(4, 6, g)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("T", [4, 14])
def test_val_windows(shakespeare, T):
    x, y = shakespeare.val_windows(T)
    x2, y2 = shakespeare.val_windows(T)
    assert x.shape == y.shape == (2048, T)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    starts = shakespeare.val_offsets(T)
    assert starts.min() >= 0 and starts.max() + T + 1 <= len(shakespeare.val)
    assert (starts.diff() >= T).all()  # non-overlapping
    idx = starts[:, None] + torch.arange(T)
    assert torch.equal(x, shakespeare.val[idx]) and torch.equal(y, shakespeare.val[idx + 1])
    assert torch.equal(x, shakespeare.data[shakespeare.n_train + idx])  # inside the val split
    tiled, _ = shakespeare.val_windows(T, max_windows=None)
    assert tiled.shape[0] == (len(shakespeare.val) - 1) // T


def test_shakespeare_invalid_arguments(shakespeare):
    g = torch.Generator().manual_seed(0)
    for bad in [(0, 4, g), (4, 0, g), (4, 4, None), (4.0, 4, g)]:
        with pytest.raises(ValueError):
            shakespeare.train_batch(*bad)
    with pytest.raises(ValueError):
        shakespeare.val_windows(0)
    with pytest.raises(ValueError):
        ShakespeareData(val_fraction=1.5)


# ---------------------------------------------------------------- brackets

def _depths(tokens):
    """Each row's nesting depth with a plain counter (the reference for data.depths)."""
    out = []
    for row in tokens.tolist():
        depth = deepest = 0
        for tok in row:
            depth += (tok == OPEN) - (tok == CLOSE)
            deepest = max(deepest, depth)
        out.append(deepest)
    return torch.tensor(out)


@pytest.mark.parametrize("T", [4, 7, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_sets_check(T, seed):
    data = BracketData(T, seed, sizes=(500, 100, 100))
    for name in ("train", "val", "test"):
        tokens, labels = getattr(data, name)
        assert tokens.shape == labels.shape == (data.sizes[("train", "val", "test").index(name)], T)
        assert tokens.dtype == labels.dtype == torch.long
        assert tokens.min() >= 0 and tokens.max() < data.vocab_size == 10
        assert check_brackets(tokens, labels)
        closing = tokens == CLOSE
        assert closing.any(dim=1).all()  # every sequence has a closing bracket
        assert ((labels != IGNORE) == closing).all()
        assert torch.equal((tokens == OPEN).sum(1), closing.sum(1))


def test_checker_fails_on_corruption():
    tokens, labels = generate_brackets(300, 16, torch.Generator().manual_seed(0))
    assert check_brackets(tokens, labels)
    closing = tokens == CLOSE
    fillers = tokens >= 2
    r = int(((closing.sum(1) >= 2) & fillers.any(1)).nonzero()[0])
    i, j = closing[r].nonzero().flatten()[:2].tolist()

    swapped = labels.clone()
    swapped[r, i], swapped[r, j] = labels[r, j], labels[r, i]
    assert not check_brackets(tokens, swapped)
    with pytest.raises(ValueError, match=f"row {r}"):
        check_brackets(tokens, swapped, raise_error=True)

    f = int(fillers[r].nonzero()[0])
    moved = labels.clone()
    moved[r, f], moved[r, i] = labels[r, i], IGNORE
    assert not check_brackets(tokens, moved)

    extra = labels.clone()
    extra[r, f] = 0  # a label on a filler, the right ones kept
    assert not check_brackets(tokens, extra)

    off_by_one = labels.clone()
    off_by_one[r, i] += 1
    assert not check_brackets(tokens, off_by_one)

    unbalanced = tokens.clone()
    unbalanced[r, i] = 2  # drop a closing bracket (and its label)
    dropped = labels.clone()
    dropped[r, i] = IGNORE
    assert not check_brackets(unbalanced, dropped)

    early = torch.tensor([[CLOSE, OPEN, 2]])
    assert not check_brackets(early, torch.tensor([[IGNORE, IGNORE, IGNORE]]))
    assert not check_brackets(tokens.float(), labels)
    assert not check_brackets(tokens, labels[:, :-1])


def test_checker_accepts_hand_made_example():
    #            0     1     2  3      4      5     6
    tokens = torch.tensor([[OPEN, OPEN, 5, CLOSE, OPEN, CLOSE, CLOSE]])
    labels = torch.tensor([[IGNORE, IGNORE, IGNORE, 1, IGNORE, 4, 0]])
    assert check_brackets(tokens, labels)
    tokens, labels = generate_brackets(1, 2, torch.Generator().manual_seed(0))
    assert tokens.tolist() == [[OPEN, CLOSE]] and labels.tolist() == [[IGNORE, 0]]


def test_fixed_sets_per_seed():
    sizes = (200, 50, 50)
    a, b, c = BracketData(8, 0, sizes=sizes), BracketData(8, 0, sizes=sizes), BracketData(8, 1, sizes=sizes)
    for name in ("train", "val", "test"):
        assert torch.equal(getattr(a, name)[0], getattr(b, name)[0])
        assert torch.equal(getattr(a, name)[1], getattr(b, name)[1])
        assert not torch.equal(getattr(a, name)[0], getattr(c, name)[0])
    assert not torch.equal(a.val[0], a.test[0])
    # a split does not depend on the other splits' sizes
    d = BracketData(8, 0, sizes=(333, 50, 50))
    assert torch.equal(a.val[0], d.val[0]) and torch.equal(a.test[1], d.test[1])


@pytest.mark.parametrize("T", [7, 16])
def test_lengths_and_depths_vary(T):
    tokens, _ = generate_brackets(4000, T, torch.Generator().manual_seed(1))
    lengths = (tokens <= CLOSE).sum(1)
    assert set(lengths.tolist()) == set(range(2, T + 1, 2))
    depths = _depths(tokens)
    assert set(range(1, min(T // 2, 5) + 1)) <= set(depths.tolist()) and depths.max() <= T // 2
    if T == 16:
        assert (depths > 2).float().mean() > 0.2
    fillers = tokens[tokens > CLOSE]
    assert set(fillers.tolist()) == set(range(2, 10))


def test_train_batch_and_sizes():
    data = BracketData(6, 3, num_fillers=4, sizes=(100, 20, 30))
    assert data.vocab_size == 6
    assert data.val[0].shape == (20, 6) and data.test[0].shape == (30, 6)
    tokens, labels = data.train_batch(64, torch.Generator().manual_seed(0))
    assert tokens.shape == labels.shape == (64, 6)
    assert check_brackets(tokens, labels)
    train_rows = {tuple(r) for r in data.train[0].tolist()}
    assert all(tuple(r) in train_rows for r in tokens.tolist())
    again = data.train_batch(64, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, again[0]) and torch.equal(labels, again[1])


def test_default_sizes_and_speed():
    data = BracketData(16, 0)
    assert data.sizes == (20000, 2000, 2000)
    assert data.train[0].shape == (20000, 16)
    assert check_brackets(*data.val)


def test_bracket_invalid_arguments():
    g = torch.Generator().manual_seed(0)
    for args in [(10, 1, g), (0, 8, g), (10, 8, None), (10, 8.0, g)]:
        with pytest.raises(ValueError):
            generate_brackets(*args)
    with pytest.raises(ValueError):
        generate_brackets(10, 8, g, num_fillers=0)
    with pytest.raises(ValueError):
        BracketData(1, 0)
    with pytest.raises(ValueError):
        BracketData(8, 0, sizes=(10, 10))
    with pytest.raises(ValueError):
        BracketData(8, -1)


# ---------------------------------------------------------------- brackets: the difficulty options

def _sha256(*tensors):
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()


# Computed with the generator as it was before the difficulty options existed (commit a3d2fa2): the defaults
# must reproduce every study's data bit for bit.
OLD_DATA = {
    (4, 0): "ec854a9643df3917a2f8be054c9bb671e80b453032432d45ff09c348b47d5df1",
    (8, 1): "a86d6ff65f138c8d2084ae5ab7fc423fa9576b99f3fcb69bc55a58d465d5e726",
    (16, 0): "86916d8be63ca25fd32e7e91ee60336dbd1bef622d5d7ae6818a55f6e442a984",
}
# 500 rows at T = 11 with 3 fillers, seed 123:
OLD_GENERATED = "57c7e0742fb7aa2f5d7f3fb2aeed007e00c3bf95ef8009cbd4981a423377543a"


@pytest.mark.parametrize("T, seed", sorted(OLD_DATA))
def test_default_options_reproduce_the_old_data(T, seed):
    data = BracketData(T, seed)
    assert _sha256(*data.train, *data.val, *data.test) == OLD_DATA[(T, seed)]
    explicit = BracketData(T, seed, sizes=(20000, 2000, 2000), min_fill=0.0, max_fill=1.0, open_probability=0.5,
                           deduplicate=False)
    assert _sha256(*explicit.train, *explicit.val, *explicit.test) == OLD_DATA[(T, seed)]
    tokens, labels = generate_brackets(500, 11, torch.Generator().manual_seed(123), num_fillers=3)
    assert _sha256(tokens, labels) == OLD_GENERATED


OPTIONS = [dict(min_fill=0.5), dict(min_fill=1.0), dict(max_fill=0.25), dict(min_fill=0.5, max_fill=0.7),
           dict(open_probability=0.0), dict(open_probability=1.0), dict(open_probability=0.8, min_fill=0.75),
           dict(deduplicate=True), dict(deduplicate=True, open_probability=0.75, min_fill=0.5)]


@pytest.mark.parametrize("T", [7, 12])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_stack_checker_proves_every_label_under_every_option(T, options):
    data = BracketData(T, 3, sizes=(1500, 300, 300), **options)
    lo, hi = word_pairs(T, options.get("min_fill", 0.0), options.get("max_fill", 1.0))
    for name in ("train", "val", "test"):
        tokens, labels = getattr(data, name)
        assert tokens.shape == (data.sizes[BracketData.SPLITS.index(name)], T)
        check_brackets(tokens, labels, raise_error=True)
        pairs = (tokens == CLOSE).sum(1)
        assert ((tokens == OPEN).sum(1) == pairs).all()
        assert pairs.min() >= lo and pairs.max() <= hi


def test_word_pairs_by_hand():
    assert word_pairs(16) == (1, 8)
    assert word_pairs(17) == (1, 8)
    assert word_pairs(16, 0.5) == (4, 8)
    assert word_pairs(16, 0.5, 0.5) == (4, 4)
    assert word_pairs(12, 0.5, 0.75) == (3, 4)  # 3/6 and 4/6 lie in [0.5, 0.75]; 5/6 does not
    assert word_pairs(8, 0.0, 0.1) == (1, 1)  # at least one pair
    assert word_pairs(20, 1.0) == (10, 10)


def test_fill_sets_the_word_length_and_filler_density():
    """p is uniform over word_pairs: the mean filler fraction is 1 - 2 E[p] / T, measured on a seeded sample."""
    g = torch.Generator().manual_seed(5)
    for T, options, pairs in [(16, {}, range(1, 9)), (16, dict(min_fill=0.5), range(4, 9)),
                              (16, dict(max_fill=0.25), range(1, 3)), (12, dict(min_fill=0.5, max_fill=0.75), (3, 4)),
                              (16, dict(min_fill=1.0), (8,))]:
        tokens, _ = generate_brackets(6000, T, g, **options)
        found = (tokens == CLOSE).sum(1)
        assert set(found.tolist()) == set(pairs)
        expected = 1 - 2 * sum(pairs) / len(pairs) / T
        filler = (tokens > CLOSE).float().mean().item()
        assert abs(filler - expected) < 0.01, (options, filler, expected)
    tokens, _ = generate_brackets(100, 16, g, min_fill=1.0)
    assert (tokens <= CLOSE).all()  # no filler at all


def test_open_probability_sets_the_depth():
    g = torch.Generator().manual_seed(6)
    mean_depth = {}
    for q in (0.0, 0.25, 0.5, 0.75, 1.0):
        tokens, _ = generate_brackets(4000, 16, g, open_probability=q)
        d = depths(tokens)
        assert torch.equal(d, _depths(tokens))
        mean_depth[q] = d.float().mean().item()
        pairs = (tokens == CLOSE).sum(1)
        if q == 0.0:
            assert (d == 1).all()  # ()()...: it opens only at depth 0
        if q == 1.0:
            assert torch.equal(d, pairs)  # ((...)): every word fully nested
    assert mean_depth[0.0] < mean_depth[0.25] < mean_depth[0.5] < mean_depth[0.75] < mean_depth[1.0]
    assert 2.3 < mean_depth[0.5] < 2.8  # the old generator: 2.54 at T = 16


def test_deduplicate_leaves_no_eval_sequence_in_train():
    T, sizes = 6, (3000, 1000, 1000)
    plain = BracketData(T, 1, sizes=sizes)
    dedup = BracketData(T, 1, sizes=sizes, deduplicate=True)
    assert torch.equal(plain.train[0], dedup.train[0]) and torch.equal(plain.train[1], dedup.train[1])
    train_rows = {tuple(r) for r in plain.train[0].tolist()}
    for name in ("val", "test"):
        before = [tuple(r) for r in getattr(plain, name)[0].tolist()]
        overlap = sum(r in train_rows for r in before) / len(before)
        assert overlap > 0.2 and plain.in_train[name] == dedup.in_train[name] == pytest.approx(overlap)
        tokens, labels = getattr(dedup, name)
        assert tokens.shape == (1000, T)
        assert not any(tuple(r) in train_rows for r in tokens.tolist())
        check_brackets(tokens, labels, raise_error=True)
        # the first round's fresh sequences come first, in the order drawn
        kept = [r for r in before if r not in train_rows]
        assert [tuple(r) for r in tokens[: len(kept)].tolist()] == kept
    assert dedup.val[0].tolist() == BracketData(T, 1, sizes=sizes, deduplicate=True).val[0].tolist()


def test_deduplicate_refuses_a_window_too_small():
    with pytest.raises(ValueError, match="deduplicate: only .* not in the training set.*set deduplicate to false"):
        BracketData(4, 0, deduplicate=True)  # every T = 4 sequence occurs in 20000 training sequences


@pytest.mark.parametrize("options, message", [
    (dict(min_fill=-0.1), "min_fill must be a number in"), (dict(max_fill=1.5), "max_fill must be a number in"),
    (dict(min_fill=0.8, max_fill=0.2), r"min_fill \(0.8\) must not exceed max_fill"),
    (dict(min_fill=0.6, max_fill=0.7), "no word length at T = 8: min_fill = 0.6 and max_fill = 0.7"),
    (dict(open_probability=1.01), "open_probability must be"), (dict(open_probability=True), "open_probability"),
    (dict(min_fill="0.5"), "min_fill")])
def test_bad_difficulty_options_raise(options, message):
    with pytest.raises(ValueError, match=message):
        generate_brackets(10, 8, torch.Generator().manual_seed(0), **options)
    with pytest.raises(ValueError, match=message):
        BracketData(8, 0, sizes=(10, 10, 10), **options)


def test_bad_deduplicate_raises():
    with pytest.raises(ValueError, match="deduplicate must be true or false"):
        BracketData(8, 0, sizes=(10, 10, 10), deduplicate="yes")
