"""Tests for boltzmann_attention.data: Tiny Shakespeare and bracket matching."""

import gzip
import re

import pytest
import torch

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
    check_brackets,
    generate_brackets,
    load_shakespeare,
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
    step = (tokens == OPEN).long() - (tokens == CLOSE).long()
    return step.cumsum(dim=1).max(dim=1).values


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
