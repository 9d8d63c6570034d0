"""Find the block: a task that needs co-attention (Multi-Token Attention, Golovneva et al. 2025, arXiv:2504.00927).

A sequence holds ``num_blocks`` blocks of ``block_size`` (N) distinct letters, separated by '.', then '#', then
``query_size`` (L) distinct letters of one block, the target, chosen so that no other block holds all L of them,
then '=' and the target block's letters in order. To answer, a query must find the block whose letters are
all attended together: one query letter's match is not enough (another block may hold it). The loss and the
metrics are on the N answer letters only (teacher forcing: each answer letter is predicted from the sequence
before it). Sequences are left-padded to the context length T; the padding carries no loss.

Two options make the conjunction necessary and the answer one token (``conjunction``, ``answer="marker"``):

* ``conjunction``: every query letter is also held by another block, so that no single letter names the target;
  only the block that holds all L does. (In the plain task a query letter is often unique: with 2 blocks one of
  the two letters always names the block.) Needs L >= 2 and at least 3 blocks.
* ``answer="marker"``: each block starts with a marker, an upper-case letter drawn at random per sequence (so it
  does not tell the block's ordinal), there is no '.', and the answer after '=' is the target block's marker,
  one token. Finding the block is then scored apart from copying it; :func:`answer_classes` says what a wrong
  answer picked (a decoy block holding some query letters, another block, or no marker of the sequence).

Tokens: 0 padding, 1 '.', 2 '#', 3 '=', then the 26 letters a..z (4..29), then the 26 markers A..Z (30..55, used
with ``answer="marker"`` only). Training batches are drawn on the fly
from the run's generator; the validation and test sets are fixed: ``VALIDATION_SIZE`` sequences each, from
generators seeded from the split's name and the task's options alone, the same for every run seed (a study
chooses its settings on the validation set and reports the test set). This module writes its own generator from the
definition above; it is not the authors' code.
"""

from __future__ import annotations

import hashlib
import operator

import torch
from torch import Tensor

IGNORE = -100  # targets with no loss (cross_entropy's ignore_index)
PAD, SEPARATOR, QUERY, ANSWER = 0, 1, 2, 3
LETTERS = 26
FIRST_LETTER = 4
VOCAB_SIZE = FIRST_LETTER + LETTERS  # with answer="letters"
MARKERS = 26
FIRST_MARKER = FIRST_LETTER + LETTERS
MARKER_VOCAB_SIZE = FIRST_MARKER + MARKERS  # with answer="marker"
SYMBOLS = "_.#=" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # token id -> character
ANSWERS = ("letters", "marker")
VALIDATION_SIZE = 2000
MAX_REDRAWS = 1000

# MTA's toy setting: blocks of 5 letters, queries of 2
BLOCK_SIZE, QUERY_SIZE, NUM_BLOCKS = 5, 2, 10

__all__ = ["ANSWERS", "BLOCK_SIZE", "IGNORE", "NUM_BLOCKS", "QUERY_SIZE", "VALIDATION_SIZE", "VOCAB_SIZE", "BlockData",
           "answer_classes", "answer_metrics", "check_options", "generate", "length", "needs_conjunction", "parse",
           "solve", "text"]


def length(block_size: int = BLOCK_SIZE, query_size: int = QUERY_SIZE, num_blocks: int = NUM_BLOCKS,
           answer: str = "letters") -> int:
    """The window a sequence needs: its tokens less one (the model reads all but the last)."""
    if answer == "marker":  # marker and letters per block, '#', the query, '=', the marker
        return num_blocks * (block_size + 1) + 1 + query_size + 1 + 1 - 1
    return num_blocks * (block_size + 1) - 1 + 1 + query_size + 1 + block_size - 1


def _integer(name: str, value, low: int, high: int | None = None) -> int:
    """value as an int (any integral type, numpy's too; not bool), or ValueError naming it and its range."""
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None or number < low or (high is not None and number > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return number


def check_options(T: int | None, block_size: int, query_size: int, num_blocks: int, conjunction: bool = False,
                  answer: str = "letters") -> None:
    """ValueError naming an option out of range, or a context length T too short for the sequences (T None: the
    options alone)."""
    _integer("block_size", block_size, 1, LETTERS)
    _integer("query_size", query_size, 1, block_size)
    _integer("num_blocks", num_blocks, 1, MARKERS if answer == "marker" else None)
    if T is not None:
        _integer("T", T, 1)
    if answer not in ANSWERS:
        raise ValueError(f"answer must be one of {ANSWERS}, got {answer!r}")
    if not isinstance(conjunction, bool):
        raise ValueError(f"conjunction must be True or False, got {conjunction!r}")
    if conjunction and (query_size < 2 or num_blocks < 3):
        raise ValueError(f"conjunction needs query_size >= 2 and num_blocks >= 3 (every query letter in another "
                         f"block, and no other block with all of them), got query_size = {query_size}, num_blocks = "
                         f"{num_blocks}")
    needed = length(block_size, query_size, num_blocks, answer)
    if T is not None and T < needed:
        raise ValueError(f"T = {T} is too short for {num_blocks} blocks of {block_size} letters and a query of "
                         f"{query_size} (answer {answer!r}): a sequence needs T >= {needed}")


def generate(count: int, generator: torch.Generator, T: int, block_size: int = BLOCK_SIZE,
             query_size: int = QUERY_SIZE, num_blocks: int = NUM_BLOCKS, conjunction: bool = False,
             answer: str = "letters") -> tuple[Tensor, Tensor]:
    """``count`` sequences as (inputs, targets), each (count, T) int64: the inputs are the sequence less its last
    token, left-padded; the targets are the next tokens at the answer positions (the N letters, or the marker)
    and IGNORE elsewhere.

    Each block's letters are distinct; the target block and the query's letters are drawn uniformly, and a
    sequence whose query another block also holds is drawn again (ValueError after MAX_REDRAWS rounds). With
    ``conjunction``, each query letter that only the target holds is written over a random letter of a random
    other block, and a sequence is kept only if every query letter is in at least two blocks and the target
    alone holds them all."""
    count = _integer("count", count, 0)
    T = _integer("T", T, 1)
    check_options(T, block_size, query_size, num_blocks, conjunction, answer)
    blocks = torch.empty(count, num_blocks, block_size, dtype=torch.long)
    query = torch.empty(count, query_size, dtype=torch.long)
    target = torch.empty(count, dtype=torch.long)
    todo = torch.arange(count)
    for _ in range(MAX_REDRAWS):
        if not len(todo):
            break
        n = len(todo)
        drawn = torch.rand(n, num_blocks, LETTERS, generator=generator).argsort(-1)[..., :block_size]
        chosen = torch.randint(num_blocks, (n,), generator=generator)
        picks = torch.rand(n, block_size, generator=generator).argsort(-1)[:, :query_size]
        letters = drawn[torch.arange(n), chosen].gather(1, picks)
        if conjunction:
            _spread(drawn, chosen, letters, generator)
        ok = _holders(drawn, letters).sum(-1) == 1  # the target block only
        if conjunction:
            ok &= (_letter_holders(drawn, letters) >= 2).all(-1)
        done = todo[ok]
        blocks[done], query[done], target[done] = drawn[ok], letters[ok], chosen[ok]
        todo = todo[~ok]
    else:
        if len(todo):
            raise ValueError(f"no sequence with a unique block after {MAX_REDRAWS} draws: with {num_blocks} blocks "
                             f"of {block_size} letters a query of {query_size} is rarely unique; use a longer query "
                             "or fewer blocks")
    rows = torch.arange(count)
    letters_in = blocks + FIRST_LETTER
    if answer == "marker":
        markers = torch.rand(count, MARKERS, generator=generator).argsort(-1)[:, :num_blocks] + FIRST_MARKER
        body = torch.cat([markers[..., None], letters_in], -1).flatten(1)
        answer_tokens = markers[rows, target][:, None]
    else:
        body = torch.cat([letters_in, torch.full((count, num_blocks, 1), SEPARATOR)], -1).flatten(1)[:, :-1]
        answer_tokens = letters_in[rows, target]
    sequence = torch.cat([body, torch.full((count, 1), QUERY), query + FIRST_LETTER, torch.full((count, 1), ANSWER),
                          answer_tokens], 1)
    sequence = torch.cat([torch.full((count, T + 1 - sequence.shape[1]), PAD), sequence], 1)
    answered = answer_tokens.shape[1]
    targets = torch.full((count, T), IGNORE)
    targets[:, T - answered:] = sequence[:, -answered:]
    return sequence[:, :-1].contiguous(), targets


def _spread(drawn: Tensor, chosen: Tensor, letters: Tensor, generator: torch.Generator) -> None:
    """In place: each query letter that only the chosen block holds overwrites a random letter of a random other
    block (which did not hold it, so the block's letters stay distinct)."""
    n, num_blocks, block_size = drawn.shape
    for q in range(letters.shape[1]):
        other = (chosen + torch.randint(1, num_blocks, (n,), generator=generator)) % num_blocks
        position = torch.randint(block_size, (n,), generator=generator)
        alone = (_letter_holders(drawn, letters[:, q:q + 1])[:, 0] == 1).nonzero().flatten()
        drawn[alone, other[alone], position[alone]] = letters[alone, q]


def _holders(blocks: Tensor, letters: Tensor) -> Tensor:
    """(count, num_blocks) bool: whether each block holds every one of the letters (count, k)."""
    return _membership(blocks, letters).all(-1)


def _letter_holders(blocks: Tensor, letters: Tensor) -> Tensor:
    """(count, k): how many blocks hold each of the letters (count, k)."""
    return _membership(blocks, letters).sum(1)


def _membership(blocks: Tensor, letters: Tensor) -> Tensor:
    """(count, num_blocks, k) bool: whether block b holds letter l."""
    member = torch.zeros(*blocks.shape[:2], LETTERS, dtype=torch.bool)
    member.scatter_(-1, blocks, True)
    return member.gather(-1, letters[:, None, :].expand(-1, blocks.shape[1], -1))


def parse(row: Tensor) -> tuple[list[str], list[str], str]:
    """A sequence read the slow way, from its characters: (its blocks' letters, their markers -- empty strings
    without markers --, the query letters)."""
    chars = text(row).lstrip("_")
    body, rest = chars.split("#")
    query = rest.split("=")[0]
    if body[:1].isupper():  # marker answers: a marker, then its block's letters
        starts = [i for i, c in enumerate(body) if c.isupper()] + [len(body)]
        parts = [body[a:b] for a, b in zip(starts, starts[1:])]
        return [p[1:] for p in parts], [p[0] for p in parts], query
    parts = body.split(".")
    return parts, [""] * len(parts), query


def solve(inputs: Tensor, block_size: int = BLOCK_SIZE) -> Tensor:
    """The answer of each sequence, read the slow way (:func:`parse`): the one block that holds every query letter
    (ValueError if none or several do); its letters (count, N), or its marker (count, 1) with marker answers."""
    out = []
    for row in inputs:
        letters, markers, query = parse(row)
        holders = [i for i, b in enumerate(letters) if all(c in b for c in query)]
        if len(holders) != 1:
            raise ValueError(f"{len(holders)} blocks hold the query {query!r} in {text(row)!r}")
        answer = markers[holders[0]] or letters[holders[0]]
        out.append([SYMBOLS.index(c) for c in answer])
    width = 1 if len(out) and len(out[0]) == 1 and out[0][0] >= FIRST_MARKER else block_size
    return torch.tensor(out, dtype=torch.long).reshape(-1, width)


def needs_conjunction(inputs: Tensor) -> Tensor:
    """(count,) bool, by brute force over each sequence's text: no single query letter names the target block,
    i.e. every query letter is held by at least two blocks."""
    out = []
    for row in inputs:
        letters, _, query = parse(row)
        out.append(all(sum(c in b for b in letters) >= 2 for c in query))
    return torch.tensor(out, dtype=torch.bool)


def answer_metrics(logits: Tensor, targets: Tensor, inputs: Tensor | None = None) -> dict:
    """Cross-entropy over the answer tokens ('loss', nats per token), the fraction of sequences with any answer
    token wrong by argmax ('error'), and the fraction of answer tokens right ('accuracy'). Given the inputs of
    marker-answer sequences, also the error split by what a wrong answer picked (:func:`answer_classes`)."""
    answered = targets != IGNORE
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE, reduction="sum")
    right = (logits.argmax(-1) == targets) & answered
    letters = int(answered.sum())
    whole = (right | ~answered).all(-1)
    out = {"loss": float(nll) / letters, "error": 1.0 - float(whole.float().mean()),
           "accuracy": float(right.sum()) / letters}
    if inputs is not None and bool((targets[:, -1] >= FIRST_MARKER).all()):
        classes = answer_classes(logits[:, -1].argmax(-1), inputs)
        out.update({f"error_{c}": float((classes == i).float().mean()) for i, c in enumerate(CLASSES) if i})
    return out


CLASSES = ("right", "decoy", "other", "not_a_marker")


def answer_classes(predicted: Tensor, inputs: Tensor) -> Tensor:
    """(count,) int, the index in :data:`CLASSES` of each predicted marker token: 'right' (the target block's),
    'decoy' (a block that holds some query letters but not all), 'other' (a block that holds none) or
    'not_a_marker' (no block of the sequence starts with it). By the sequences' text (:func:`parse`)."""
    out = []
    for token, row in zip(predicted.tolist(), inputs):
        letters, markers, query = parse(row)
        symbol = SYMBOLS[token] if 0 <= token < len(SYMBOLS) else ""
        if symbol not in markers or not symbol:
            out.append(3)
            continue
        held = sum(c in letters[markers.index(symbol)] for c in query)
        out.append(0 if held == len(query) else 1 if held else 2)
    return torch.tensor(out, dtype=torch.long)


def text(row: Tensor) -> str:
    """A sequence as characters (padding '_')."""
    return "".join(SYMBOLS[t] for t in row.tolist())


class BlockData:
    """The task at context length T with its options: ``train_batch`` draws fresh sequences from a generator;
    ``val`` and ``test`` are the fixed validation and test sets (inputs, targets) of ``val_size`` sequences each."""

    def __init__(self, T: int, block_size: int = BLOCK_SIZE, query_size: int = QUERY_SIZE,
                 num_blocks: int = NUM_BLOCKS, val_size: int = VALIDATION_SIZE, conjunction: bool = False,
                 answer: str = "letters"):
        check_options(T, block_size, query_size, num_blocks, conjunction, answer)
        if isinstance(val_size, bool) or not isinstance(val_size, int) or val_size < 1:
            raise ValueError(f"val_size must be an integer >= 1, got {val_size!r}")
        self.T, self.options = T, {"block_size": block_size, "query_size": query_size, "num_blocks": num_blocks,
                                   "conjunction": conjunction, "answer": answer}
        self.vocab_size = MARKER_VOCAB_SIZE if answer == "marker" else VOCAB_SIZE
        self.val, self.test = (generate(val_size, torch.Generator().manual_seed(self._seed(split)), T, **self.options)
                               for split in ("val", "test"))

    def _seed(self, split: str) -> int:
        """The fixed seed of a split: from its name and the task's options (the validation set's key has no name;
        the options at their plain-task values are left out of it)."""
        o = self.options
        key = f"blocks {o['block_size']} {o['query_size']} {o['num_blocks']} {self.T}"
        key += " conjunction" if o["conjunction"] else ""
        key += f" answer={o['answer']}" if o["answer"] != "letters" else ""
        key = key if split == "val" else f"{key} {split}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return generate(batch_size, generator, self.T, **self.options)
