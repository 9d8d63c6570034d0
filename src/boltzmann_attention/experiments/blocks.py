"""Find the block: a task that needs co-attention (Multi-Token Attention, Golovneva et al. 2025, arXiv:2504.00927).

A sequence holds ``num_blocks`` blocks of ``block_size`` (N) distinct letters, separated by '.', then '#', then
``query_size`` (L) distinct letters of one block, the target, chosen so that no other block holds all L of them,
then '=' and the target block's letters in order. To answer, a query must find the block whose letters are
all attended together: one query letter's match is not enough (another block may hold it). The loss and the
metrics are on the N answer letters only (teacher forcing: each answer letter is predicted from the sequence
before it). Sequences are left-padded to the context length T; the padding carries no loss.

Tokens: 0 padding, 1 '.', 2 '#', 3 '=', then the 26 letters a..z (4..29). Training batches are drawn on the fly
from the run's generator; the validation and test sets are fixed: ``VALIDATION_SIZE`` sequences each, from
generators seeded from the split's name and the task's options alone, the same for every run seed (a study
chooses its settings on the validation set and reports the test set). This module writes its own generator from the
definition above; it is not the authors' code.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

IGNORE = -100  # targets with no loss (cross_entropy's ignore_index)
PAD, SEPARATOR, QUERY, ANSWER = 0, 1, 2, 3
LETTERS = 26
FIRST_LETTER = 4
VOCAB_SIZE = FIRST_LETTER + LETTERS
SYMBOLS = "_.#=" + "abcdefghijklmnopqrstuvwxyz"  # token id -> character, for reading sequences
VALIDATION_SIZE = 2000
MAX_REDRAWS = 1000

# MTA's toy setting: blocks of 5 letters, queries of 2
BLOCK_SIZE, QUERY_SIZE, NUM_BLOCKS = 5, 2, 10

__all__ = ["BLOCK_SIZE", "IGNORE", "NUM_BLOCKS", "QUERY_SIZE", "VALIDATION_SIZE", "VOCAB_SIZE", "BlockData",
           "answer_metrics", "check_options", "generate", "length", "solve", "text"]


def length(block_size: int = BLOCK_SIZE, query_size: int = QUERY_SIZE, num_blocks: int = NUM_BLOCKS) -> int:
    """The window a sequence needs: its tokens less one (the model reads all but the last)."""
    return num_blocks * (block_size + 1) - 1 + 1 + query_size + 1 + block_size - 1


def check_options(T: int, block_size: int, query_size: int, num_blocks: int) -> None:
    """ValueError naming an option out of range, or a context length T too short for the sequences."""
    for name, value, low, high in (("block_size", block_size, 1, LETTERS), ("query_size", query_size, 1, block_size),
                                   ("num_blocks", num_blocks, 1, None), ("T", T, 1, None)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    needed = length(block_size, query_size, num_blocks)
    if T < needed:
        raise ValueError(f"T = {T} is too short for {num_blocks} blocks of {block_size} letters and a query of "
                         f"{query_size}: a sequence needs T >= {needed}")


def generate(count: int, generator: torch.Generator, T: int, block_size: int = BLOCK_SIZE,
             query_size: int = QUERY_SIZE, num_blocks: int = NUM_BLOCKS) -> tuple[Tensor, Tensor]:
    """``count`` sequences as (inputs, targets), each (count, T) int64: the inputs are the sequence less its last
    token, left-padded; the targets are the next tokens at the N answer positions and IGNORE elsewhere.

    Each block's letters are distinct; the target block and the query's letters are drawn uniformly, and a
    sequence whose query another block also holds is drawn again (ValueError after MAX_REDRAWS rounds)."""
    check_options(T, block_size, query_size, num_blocks)
    blocks = torch.empty(count, num_blocks, block_size, dtype=torch.long)
    query = torch.empty(count, query_size, dtype=torch.long)
    target = torch.empty(count, dtype=torch.long)
    todo = torch.arange(count)
    for _ in range(MAX_REDRAWS):
        n = len(todo)
        drawn = torch.rand(n, num_blocks, LETTERS, generator=generator).argsort(-1)[..., :block_size]
        chosen = torch.randint(num_blocks, (n,), generator=generator)
        picks = torch.rand(n, block_size, generator=generator).argsort(-1)[:, :query_size]
        letters = drawn[torch.arange(n), chosen].gather(1, picks)
        holders = _holders(drawn, letters)
        ok = holders.sum(-1) == 1  # the target block only
        done = todo[ok]
        blocks[done], query[done], target[done] = drawn[ok], letters[ok], chosen[ok]
        todo = todo[~ok]
        if not len(todo):
            break
    else:
        raise ValueError(f"no sequence with a unique block after {MAX_REDRAWS} draws: with {num_blocks} blocks of "
                         f"{block_size} letters a query of {query_size} is rarely unique; use a longer query or "
                         "fewer blocks")
    answer = blocks[torch.arange(count), target]
    body = torch.cat([blocks + FIRST_LETTER, torch.full((count, num_blocks, 1), SEPARATOR)], -1).flatten(1)[:, :-1]
    sequence = torch.cat([body, torch.full((count, 1), QUERY), query + FIRST_LETTER, torch.full((count, 1), ANSWER),
                          answer + FIRST_LETTER], 1)
    sequence = torch.cat([torch.full((count, T + 1 - sequence.shape[1]), PAD), sequence], 1)
    targets = torch.full((count, T), IGNORE)
    targets[:, -block_size:] = sequence[:, -block_size:]
    return sequence[:, :-1].contiguous(), targets


def _holders(blocks: Tensor, letters: Tensor) -> Tensor:
    """(count, num_blocks) bool: whether each block holds every one of the letters (count, k)."""
    member = torch.zeros(*blocks.shape[:2], LETTERS, dtype=torch.bool)
    member.scatter_(-1, blocks, True)
    return member.gather(-1, letters[:, None, :].expand(-1, blocks.shape[1], -1)).all(-1)


def solve(inputs: Tensor, block_size: int = BLOCK_SIZE) -> Tensor:
    """The answer letters (count, N) of each sequence, read the slow way: split the text at '.', '#' and '=',
    and return the one block that holds every query letter (ValueError if none or several do)."""
    out = []
    for row in inputs.tolist():
        chars = "".join(SYMBOLS[t] for t in row).lstrip("_")
        blocks_text, rest = chars.split("#")
        query = rest.split("=")[0]
        holders = [b for b in blocks_text.split(".") if all(c in b for c in query)]
        if len(holders) != 1:
            raise ValueError(f"{len(holders)} blocks hold the query {query!r} in {chars!r}")
        out.append([SYMBOLS.index(c) for c in holders[0]])
    return torch.tensor(out, dtype=torch.long).reshape(-1, block_size)


def answer_metrics(logits: Tensor, targets: Tensor) -> dict:
    """Cross-entropy over the answer letters ('loss', nats per letter), the fraction of sequences with any answer
    letter wrong by argmax ('error'), and the fraction of answer letters right ('accuracy')."""
    answered = targets != IGNORE
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE, reduction="sum")
    right = (logits.argmax(-1) == targets) & answered
    letters = int(answered.sum())
    whole = (right | ~answered).all(-1)
    return {"loss": float(nll) / letters, "error": 1.0 - float(whole.float().mean()),
            "accuracy": float(right.sum()) / letters}


def text(row: Tensor) -> str:
    """A sequence as characters (padding '_')."""
    return "".join(SYMBOLS[t] for t in row.tolist())


class BlockData:
    """The task at context length T with its options: ``train_batch`` draws fresh sequences from a generator;
    ``val`` and ``test`` are the fixed validation and test sets (inputs, targets) of ``val_size`` sequences each."""

    def __init__(self, T: int, block_size: int = BLOCK_SIZE, query_size: int = QUERY_SIZE,
                 num_blocks: int = NUM_BLOCKS, val_size: int = VALIDATION_SIZE):
        check_options(T, block_size, query_size, num_blocks)
        if isinstance(val_size, bool) or not isinstance(val_size, int) or val_size < 1:
            raise ValueError(f"val_size must be an integer >= 1, got {val_size!r}")
        self.T, self.options = T, {"block_size": block_size, "query_size": query_size, "num_blocks": num_blocks}
        self.vocab_size = VOCAB_SIZE
        self.val, self.test = (generate(val_size, torch.Generator().manual_seed(self._seed(split)), T, **self.options)
                               for split in ("val", "test"))

    def _seed(self, split: str) -> int:
        """The fixed seed of a split: from its name and the task's options (the validation set's key has no name)."""
        o = self.options
        key = f"blocks {o['block_size']} {o['query_size']} {o['num_blocks']} {self.T}"
        key = key if split == "val" else f"{key} {split}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return generate(batch_size, generator, self.T, **self.options)
