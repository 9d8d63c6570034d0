"""Data for the experiments: Tiny Shakespeare (character level) and bracket matching.

Everything random takes an explicit ``torch.Generator`` (CPU) and draws from nothing else, so runs are
reproducible and resumable (save ``generator.get_state()``). Tensors are returned on the CPU.

Tiny Shakespeare: :func:`load_shakespeare`, :class:`CharVocabulary`, :class:`ShakespeareData`.
Bracket matching: :func:`generate_brackets`, :class:`BracketData`.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import math
import os
import zlib
from importlib import resources

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "SHAKESPEARE_SHA256",
    "SHAKESPEARE_LENGTH",
    "load_shakespeare",
    "CharVocabulary",
    "ShakespeareData",
    "OPEN",
    "CLOSE",
    "IGNORE",
    "SIZES",
    "word_pairs",
    "generate_brackets",
    "depths",
    "BracketData",
]

SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_LENGTH = 1_115_394
_BUNDLED = "datasets/tinyshakespeare.txt.gz"

OPEN = 0
CLOSE = 1
IGNORE = -100


def _check_generator(generator) -> None:
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator, got device {generator.device}")


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------------------------------------
# Tiny Shakespeare
# ----------------------------------------------------------------------------------------------------------

def _verify_and_decode(raw: bytes, source: str, bundled: bool = False) -> str:
    """Gunzip ``raw`` if it is gzip, check the sha256 of the text and decode it; one ValueError for any fault."""
    what = f"the bundled Tiny Shakespeare {source}" if bundled else f"Tiny Shakespeare file {source}"
    remedy = ("the package data is corrupt: reinstall boltzmann-attention" if bundled
              else "use an intact copy (or path=None for the bundled one)")
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise ValueError(f"{what} is corrupt (its gzip stream does not decompress: {e}); {remedy}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise ValueError(f"{what} is corrupt (checksum mismatch: expected sha256 {SHAKESPEARE_SHA256}, "
                         f"got {digest}); {remedy}")
    return raw.decode("utf-8")


def _bundled_file():
    return resources.files("boltzmann_attention.experiments").joinpath(_BUNDLED)


@functools.lru_cache(maxsize=1)
def _load_bundled() -> str:
    bundled = _bundled_file()
    try:
        raw = bundled.read_bytes()
    except OSError as e:
        raise ValueError(f"the bundled Tiny Shakespeare {bundled} cannot be read ({e.strerror or e}); the "
                         "package data is missing: reinstall boltzmann-attention") from None
    return _verify_and_decode(raw, str(bundled), bundled=True)


def load_shakespeare(path: str | os.PathLike | None = None) -> str:
    """The Tiny Shakespeare text (1,115,394 characters), sha256-verified.

    ``path=None`` reads the copy bundled with the package (cached); otherwise a ``.txt`` or gzip file
    (detected by its magic bytes). Raises ``ValueError`` naming the file for a damaged gzip stream or a
    checksum mismatch (for the bundled copy: the package data is corrupt, reinstall).
    """
    if path is None:
        return _load_bundled()
    with open(path, "rb") as f:
        raw = f.read()
    return _verify_and_decode(raw, os.fspath(path))


class CharVocabulary:
    """Character vocabulary: symbol ``i`` is the i-th character of the sorted set of the text's characters."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text:
            raise ValueError("CharVocabulary needs a non-empty string")
        self.chars = "".join(sorted(set(text)))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        codes = np.frombuffer(self.chars.encode("utf-32-le"), dtype=np.uint32)
        self._lut = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
        self._lut[codes] = np.arange(len(self.chars))

    @property
    def size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return self.size

    def encode(self, text: str) -> Tensor:
        """``str`` of length N -> long tensor (N,). Raises ``ValueError`` on a character not in the vocabulary."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = np.full(codes.shape, -1, dtype=np.int64)
        known = codes < len(self._lut)
        ids[known] = self._lut[codes[known]]
        if (ids < 0).any():
            bad = text[int(np.flatnonzero(ids < 0)[0])]
            raise ValueError(f"character {bad!r} is not in the vocabulary")
        return torch.from_numpy(ids)

    def decode(self, ids) -> str:
        """Ids (tensor or sequence, 1-D) -> ``str``."""
        if isinstance(ids, Tensor):
            ids = ids.reshape(-1).tolist()
        return "".join(self.chars[i] for i in ids)


class ShakespeareData:
    """Encoded Tiny Shakespeare with a contiguous train/validation split.

    ``data`` (N,) long over the whole text; ``train = data[:n_train]`` (the first 90% of characters,
    ``n_train = int(N * (1 - val_fraction))``) and ``val = data[n_train:]`` (the last 10%). The vocabulary
    is built from the whole text (65 symbols). Windows never cross the split: inputs and targets of a
    train window lie in ``train``, those of a validation window in ``val``.
    """

    def __init__(self, text: str | None = None, val_fraction: float = 0.1):
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
        text = load_shakespeare() if text is None else text
        self.vocab = CharVocabulary(text)
        self.data = self.vocab.encode(text)
        self.n_train = int(len(self.data) * (1.0 - val_fraction))
        self.train = self.data[: self.n_train]
        self.val = self.data[self.n_train:]
        if len(self.train) < 2 or len(self.val) < 2:
            raise ValueError("text too short for this split")
        self._val_cache: dict[tuple[int, int | None], tuple[Tensor, Tensor]] = {}

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    def _check_T(self, T, split: Tensor) -> int:
        T = _positive_int("T", T)
        if T + 1 > len(split):
            raise ValueError(f"T={T} is too long for a split of {len(split)} characters")
        return T

    @staticmethod
    def _windows(split: Tensor, starts: Tensor, T: int) -> tuple[Tensor, Tensor]:
        w = split[starts[:, None] + torch.arange(T + 1)]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def train_batch(self, batch_size: int, T: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Random train windows: x (B, T) long, y (B, T) long with ``y[b, t] = train[i_b + t + 1]``.

        Start offsets ``i_b`` are uniform over ``0 .. n_train - T - 1`` (with replacement), drawn from
        ``generator`` only.
        """
        batch_size = _positive_int("batch_size", batch_size)
        T = self._check_T(T, self.train)
        _check_generator(generator)
        starts = torch.randint(0, len(self.train) - T, (batch_size,), generator=generator)
        return self._windows(self.train, starts, T)

    def val_offsets(self, T: int, max_windows: int | None = 2048) -> Tensor:
        """Start offsets (M,) into ``val`` of :meth:`val_windows`: evenly spaced over ``0 .. len(val) - T - 1``.

        ``M = min(max_windows, (len(val) - 1) // T)``, so the windows never overlap; ``None`` takes all
        ``(len(val) - 1) // T`` non-overlapping windows (the validation split tiled).
        """
        T = self._check_T(T, self.val)
        tiles = (len(self.val) - 1) // T
        m = tiles if max_windows is None else min(_positive_int("max_windows", max_windows), tiles)
        if m == 1:
            return torch.zeros(1, dtype=torch.long)
        return torch.linspace(0, len(self.val) - T - 1, m, dtype=torch.float64).round().long()

    def val_windows(self, T: int, max_windows: int | None = 2048) -> tuple[Tensor, Tensor]:
        """Fixed validation windows x (M, T), y (M, T) long at :meth:`val_offsets`; same every call."""
        T = self._check_T(T, self.val)
        key = (T, max_windows)
        if key not in self._val_cache:
            self._val_cache[key] = self._windows(self.val, self.val_offsets(T, max_windows), T)
        x, y = self._val_cache[key]
        return x.clone(), y.clone()


# ----------------------------------------------------------------------------------------------------------
# Bracket matching
# ----------------------------------------------------------------------------------------------------------

# The bracket task's difficulty options and their defaults (the generator as first used by every study).
MIN_FILL = 0.0
MAX_FILL = 1.0
OPEN_PROBABILITY = 0.5
SIZES = (20000, 2000, 2000)
MAX_REDRAWS = 50  # de-duplication: rounds of redrawing a split before giving up (see BracketData)


def _fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def word_pairs(T: int, min_fill: float = MIN_FILL, max_fill: float = MAX_FILL) -> tuple[int, int]:
    """The range (lo, hi) of the number of bracket pairs p of a word at context length T for these fill fractions.

    A word of p pairs fills 2p of the 2 * (T // 2) slots the longest word fits; p is uniform over the integers
    with ``min_fill <= p / (T // 2) <= max_fill``, every word having at least one pair (a ``max_fill`` below
    1 / (T // 2) means p = 1). ValueError, naming both options, when no integer lies in the range.
    """
    T = _positive_int("T", T, minimum=2)
    min_fill, max_fill = _fraction("min_fill", min_fill), _fraction("max_fill", max_fill)
    if min_fill > max_fill:
        raise ValueError(f"min_fill ({min_fill:g}) must not exceed max_fill ({max_fill:g})")
    half = T // 2
    lo = max(1, math.ceil(min_fill * half - 1e-9))
    hi = max(1, math.floor(max_fill * half + 1e-9))
    if hi < lo:
        raise ValueError(f"no word length at T = {T}: min_fill = {min_fill:g} and max_fill = {max_fill:g} leave "
                         f"no whole number of pairs p (at least 1) with p / {half} in [{min_fill:g}, {max_fill:g}]; "
                         "widen the range")
    return lo, hi


def generate_brackets(num_sequences: int, T: int, generator: torch.Generator, num_fillers: int = 8, *,
                      min_fill: float = MIN_FILL, max_fill: float = MAX_FILL,
                      open_probability: float = OPEN_PROBABILITY) -> tuple[Tensor, Tensor]:
    """Sequences holding one Dyck-1 word among filler tokens.

    Returns tokens (N, T) long (``OPEN``=0, ``CLOSE``=1, fillers ``2 .. 1 + num_fillers``) and labels
    (N, T) long: for a closing bracket at slot i, the slot of its matching opening bracket (< i); else
    ``IGNORE``. Each word has length 2p, p uniform over :func:`word_pairs` (by default ``1 .. T // 2``); it
    is built left to right (open if depth is 0, close if the remaining length equals the depth, otherwise
    open with probability ``open_probability``) and placed at a uniformly random sorted set of 2p slots; the
    other slots get uniform random fillers.

    Difficulty: the word fills a fraction 2p / T of the window, so at a fixed T the filler density is
    1 - 2p / T and ``min_fill``/``max_fill`` set both (``min_fill = 1``: no filler at even T). A larger
    ``open_probability`` nests deeper (1: every word is ``((...))``; 0: ``()()...``). The defaults are the
    generator of every study before these options existed, draw for draw.
    """
    n = _positive_int("num_sequences", num_sequences)
    T = _positive_int("T", T, minimum=2)
    num_fillers = _positive_int("num_fillers", num_fillers)
    lo, hi = word_pairs(T, min_fill, max_fill)
    open_probability = _fraction("open_probability", open_probability)
    _check_generator(generator)
    half = T // 2
    m = 2 * half
    rows = torch.arange(n)

    # Draws, in a fixed order, all from `generator`.
    length = 2 * torch.randint(lo, hi + 1, (n,), generator=generator)
    coins = torch.rand(n, m, generator=generator) < open_probability
    keys = torch.rand(n, T, generator=generator)
    fillers = torch.randint(2, 2 + num_fillers, (n, T), generator=generator)

    # The word, left to right.
    word = torch.full((n, m), CLOSE, dtype=torch.long)
    depth = torch.zeros(n, dtype=torch.long)
    for t in range(m):
        remaining = length - t
        active = remaining > 0
        opens = active & ((depth == 0) | ((remaining != depth) & coins[:, t]))
        word[:, t] = torch.where(opens, OPEN, CLOSE)
        depth += opens.long() - (active & ~opens).long()

    # A uniform random subset of `length` slots, filled in order.
    rank = keys.argsort(dim=1).argsort(dim=1)
    chosen = rank < length[:, None]
    index = (chosen.long().cumsum(dim=1) - 1).clamp(min=0)
    tokens = torch.where(chosen, word.gather(1, index), fillers)

    # Labels with a per-row stack.
    labels = torch.full((n, T), IGNORE, dtype=torch.long)
    stack = torch.zeros(n, half + 1, dtype=torch.long)
    top = torch.zeros(n, dtype=torch.long)
    for t in range(T):
        is_open = tokens[:, t] == OPEN
        stack[rows[is_open], top[is_open]] = t
        top += is_open.long()
        is_close = tokens[:, t] == CLOSE
        top -= is_close.long()
        labels[is_close, t] = stack[rows[is_close], top[is_close]]
    return tokens, labels


def _split_generator(seed: int, split: int) -> torch.Generator:
    state = np.random.SeedSequence([seed, split]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def depths(tokens: Tensor) -> Tensor:
    """The nesting depth of each row's word (the largest number of open brackets at any slot), (N,) long."""
    step = (tokens == OPEN).long() - (tokens == CLOSE).long()
    return step.cumsum(dim=1).max(dim=1).values.clamp(min=0)


def _row_keys(tokens: Tensor) -> list[bytes]:
    array = np.ascontiguousarray(tokens.numpy(), dtype=np.int64)
    return [row.tobytes() for row in array]


class BracketData:
    """Fixed bracket-matching sets for one seed: ``train``, ``val``, ``test``, each (tokens, labels) (N, T).

    Split k (0 train, 1 val, 2 test) is generated by :func:`generate_brackets` from its own generator seeded
    from ``(seed, k)``, with the difficulty options ``min_fill``, ``max_fill`` and ``open_probability``
    passed on. Without ``deduplicate`` a split depends only on (T, seed, the options, its own size), and
    validation and test sequences may also occur in the training set (at T = 16 about 10% of validation
    sequences do, at T = 4 all of them).

    ``deduplicate=True`` drops every validation and test sequence whose tokens occur in the training set and
    draws more from the split's own generator (rounds of ``sizes[k]`` sequences, the first round the same as
    without it) until the split is full; ValueError after ``MAX_REDRAWS`` rounds (the window holds too few
    distinct sequences for this training set: lower ``sizes[0]``, or turn de-duplication off).
    ``in_train['val']`` and ``in_train['test']``: the fraction of the split's first round of sequences that
    occur in the training set (with or without de-duplication, which then drops them).
    """

    SPLITS = ("train", "val", "test")

    def __init__(self, T: int, seed: int, num_fillers: int = 8, sizes: tuple[int, int, int] = SIZES, *,
                 min_fill: float = MIN_FILL, max_fill: float = MAX_FILL,
                 open_probability: float = OPEN_PROBABILITY, deduplicate: bool = False):
        self.T = _positive_int("T", T, minimum=2)
        self.seed = _positive_int("seed", seed, minimum=0)
        self.num_fillers = _positive_int("num_fillers", num_fillers)
        if len(sizes) != 3:
            raise ValueError(f"sizes must be (train, val, test), got {sizes!r}")
        self.sizes = tuple(_positive_int(f"sizes[{k}]", s) for k, s in enumerate(sizes))
        word_pairs(self.T, min_fill, max_fill)  # checks both before any drawing
        self.options = {"min_fill": float(min_fill), "max_fill": float(max_fill),
                        "open_probability": _fraction("open_probability", open_probability)}
        if not isinstance(deduplicate, bool):
            raise ValueError(f"deduplicate must be true or false, got {deduplicate!r}")
        self.deduplicate = deduplicate
        self.train = self._draw(0, self.sizes[0])
        train_keys = set(_row_keys(self.train[0]))
        self.in_train = {}
        for k in (1, 2):
            generator = _split_generator(self.seed, k)
            tokens, labels = self._draw(k, self.sizes[k], generator)
            seen = torch.tensor([key in train_keys for key in _row_keys(tokens)], dtype=torch.bool)
            self.in_train[self.SPLITS[k]] = int(seen.sum()) / len(seen)
            if deduplicate:
                tokens, labels = self._fresh(k, tokens[~seen], labels[~seen], generator, train_keys)
            setattr(self, self.SPLITS[k], (tokens, labels))

    def _draw(self, k: int, size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        generator = _split_generator(self.seed, k) if generator is None else generator
        return generate_brackets(size, self.T, generator, self.num_fillers, **self.options)

    def _fresh(self, k: int, tokens: Tensor, labels: Tensor, generator: torch.Generator,
               train_keys: set) -> tuple[Tensor, Tensor]:
        """Split k topped up with sequences not in the training set, in the order drawn."""
        size = self.sizes[k]
        parts = [(tokens, labels)]
        found = len(tokens)
        for _ in range(MAX_REDRAWS):
            if found >= size:
                break
            more, more_labels = self._draw(k, size, generator)
            fresh = torch.tensor([key not in train_keys for key in _row_keys(more)], dtype=torch.bool)
            parts.append((more[fresh], more_labels[fresh]))
            found += int(fresh.sum())
        if found < size:
            raise ValueError(f"deduplicate: only {found} of {size} {self.SPLITS[k]} sequences at T = {self.T} are "
                             f"not in the training set of {self.sizes[0]} after {MAX_REDRAWS} rounds of drawing; "
                             "the window holds too few distinct sequences: lower the number of training "
                             "sequences or set deduplicate to false")
        return torch.cat([t for t, _ in parts])[:size], torch.cat([lab for _, lab in parts])[:size]

    @property
    def vocab_size(self) -> int:
        return 2 + self.num_fillers

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Rows of the train set drawn uniformly with replacement: tokens (B, T), labels (B, T)."""
        batch_size = _positive_int("batch_size", batch_size)
        _check_generator(generator)
        rows = torch.randint(0, self.sizes[0], (batch_size,), generator=generator)
        tokens, labels = self.train
        return tokens[rows], labels[rows]
