"""Match3, causal, answered once per sequence: a task that needs a pair of keys by its definition.

Match3 (Sanford et al. 2023) asks, for a query x_i, whether two other elements x_j, x_k of the sequence complete
it to a multiple of M: x_i + x_j + x_k = 0 (mod M). One-layer softmax attention provably cannot solve it, and
Strassen attention (Kozachinskiy et al. 2025, arXiv:2501.19215), which scores a query against pairs of keys, can.

Here a sequence is T residues modulo M (``modulus``), drawn uniformly; the query is the last one, x_T, and the
pairs are those of the keys before it: the label is whether some j < k < T has x_T + x_j + x_k = 0 (mod M). The
model reads the T residues and answers at the last position with one of two tokens, NO (M) or YES (M + 1); the
other positions carry no loss. No single key decides a label: whether key j helps depends on whether another key
holds -x_T - x_j. The classes are balanced by construction: sequence k of a draw is positive when k is odd, and
each is drawn uniformly among the sequences of its class (rejection sampling), then the draw is shuffled.

Training batches are drawn from the run's generator; the validation and test sets are fixed, ``SPLIT_SIZE``
sequences each, from generators seeded from the split's name, T and M alone.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from .record import IGNORE, TaskRecord, token_losses

SPLIT_SIZE = 2000
MAX_ROUNDS = 200  # rounds of rejection sampling before a class is declared too rare at this T and M
MAX_MODULUS = 4096


def labels(x: Tensor, modulus: int) -> Tensor:
    """(B,) bool: for each sequence of residues x (B, T), whether some j < k < T - 1 has
    x[T-1] + x[j] + x[k] = 0 (mod modulus) (0-based positions)."""
    keys = x[:, :-1]
    sums = (keys[:, :, None] + keys[:, None, :]) % modulus  # (B, T - 1, T - 1)
    pairs = torch.ones(keys.shape[1], keys.shape[1], dtype=torch.bool, device=x.device).triu(1)
    need = (-x[:, -1]) % modulus
    return ((sums == need[:, None, None]) & pairs).any(dim=(1, 2))


def answer_pair(x: Tensor, modulus: int) -> tuple[Tensor, Tensor]:
    """The positive sequences of x (B, T) and, in each, the first pair of keys (in order of j, then k) that
    completes the query: (rows (count,) long, pair (count, 2) long, 0-based positions j < k < T - 1)."""
    keys = x[:, :-1]
    n = keys.shape[1]
    hits = ((keys[:, :, None] + keys[:, None, :]) % modulus == ((-x[:, -1]) % modulus)[:, None, None]) \
        & torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    rows = hits.flatten(1).any(-1).nonzero().squeeze(-1)
    first = hits[rows].flatten(1).to(torch.uint8).argmax(-1)  # the first True in row-major order
    return rows, torch.stack([first // n, first % n], -1)


def check_options(T: int, modulus: int) -> None:
    """ValueError naming T or the modulus out of range."""
    if isinstance(T, bool) or not isinstance(T, int) or T < 3:
        raise ValueError(f"match3 needs T >= 3 (the query and a pair of keys before it), got T = {T!r}")
    if isinstance(modulus, bool) or not isinstance(modulus, int) or not 2 <= modulus <= MAX_MODULUS:
        raise ValueError(f"modulus must be an integer in [2, {MAX_MODULUS}], got {modulus!r}")


def generate(n: int, generator: torch.Generator, T: int, modulus: int) -> tuple[Tensor, Tensor]:
    """n sequences (n, T) and their targets (n, T): YES or NO at the last position, IGNORE elsewhere. Half the
    sequences (n // 2, the odd ones before the shuffle) are positive. ValueError when a class stays unfilled
    after MAX_ROUNDS rounds of drawing (the class is too rare at this T and modulus)."""
    check_options(T, modulus)
    want = {True: n // 2, False: n - n // 2}  # by class: positive, negative
    found: dict[bool, list[Tensor]] = {True: [], False: []}
    have = {True: 0, False: 0}
    for _ in range(MAX_ROUNDS):
        if have == want:
            break
        x = torch.randint(0, modulus, (max(4 * n, 256), T), generator=generator)
        positive = labels(x, modulus)
        for c in (True, False):
            chosen = x[positive == c][: want[c] - have[c]]
            found[c].append(chosen)
            have[c] += len(chosen)
    if have != want:
        rare = have[True] < want[True]
        raise ValueError(f"match3 at T = {T}, modulus = {modulus}: {'positive' if rare else 'negative'} sequences "
                         f"are too rare to draw ({have[rare]} of {want[rare]} in {MAX_ROUNDS} rounds); the "
                         "(T - 1)(T - 2) / 2 pairs should cover about a fraction ln 2 of the residues: a modulus "
                         "near (T - 1)(T - 2) / 1.4")
    x = torch.empty(n, T, dtype=torch.long)
    x[1::2], x[0::2] = torch.cat(found[True]), torch.cat(found[False])
    x = x[torch.randperm(n, generator=generator)]
    y = torch.full_like(x, IGNORE)
    y[:, -1] = modulus + labels(x, modulus).long()  # NO = modulus, YES = modulus + 1
    return x, y


class Match3Data:
    """Match3's data for one T and modulus: fixed ``val`` and ``test``, training batches from a generator."""

    def __init__(self, T: int, modulus: int):
        check_options(T, modulus)
        self.T, self.modulus = T, modulus
        self.vocab_size = modulus + 2
        self.val, self.test = (generate(SPLIT_SIZE, torch.Generator().manual_seed(self._seed(split)), T, modulus)
                               for split in ("val", "test"))

    def _seed(self, split: str) -> int:
        key = f"match3 {split} T={self.T} modulus={self.modulus}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return generate(batch_size, generator, self.T, self.modulus)


def shortcut_accuracy(data: Match3Data) -> tuple[float, float]:
    """The premise, measured: test accuracy of the majority-class rule learned on the validation set from the
    query's residue alone, and the best such rule from the query and any one key (by position). Both are at
    chance (1/2) when no single token decides a label."""
    (xv, yv), (xt, yt) = data.val, data.test
    yes_v, yes_t = yv[:, -1] == data.modulus + 1, yt[:, -1] == data.modulus + 1

    def holdout(fv: Tensor, ft: Tensor) -> float:  # features as integer codes
        size = int(max(fv.max(), ft.max())) + 1
        positives = torch.zeros(size).index_add_(0, fv, yes_v.float())
        counts = torch.zeros(size).index_add_(0, fv, torch.ones(len(fv)))
        rule = 2 * positives > counts  # majority per code; unseen codes: negative
        return float((rule[ft] == yes_t).float().mean())

    M = data.modulus
    alone = holdout(xv[:, -1], xt[:, -1])
    pairs = max(holdout(xv[:, -1] * M + xv[:, j], xt[:, -1] * M + xt[:, j]) for j in range(data.T - 1))
    return alone, pairs


def evaluate(model, x: Tensor, y: Tensor, batch_size: int) -> dict:
    """The loss over the answers, their accuracy, the error (1 - accuracy) that a run is judged by, and the error
    on the positive and on the negative sequences ('error_yes', 'error_no': the share of each class answered
    wrong; YES is the vocabulary's last token, modulus + 1)."""
    nll_sum, wrong, yes = 0.0, [], []
    for out, yb, nll in token_losses(model, x, y, batch_size):
        nll_sum += float(nll[yb != IGNORE].sum())  # the answers only: the last position
        wrong.append(out[:, -1].argmax(-1) != yb[:, -1])
        yes.append(yb[:, -1] == out.shape[-1] - 1)
    wrong, yes = torch.cat(wrong), torch.cat(yes)
    accuracy = (len(x) - int(wrong.sum())) / len(x)
    out = {"loss": nll_sum / len(x), "accuracy": accuracy, "error": 1.0 - accuracy}
    for name, chosen in (("yes", yes), ("no", ~yes)):
        if chosen.any():
            out[f"error_{name}"] = int(wrong[chosen].sum()) / int(chosen.sum())
    return out


MATCH3 = TaskRecord(name="match3", build=lambda cfg: Match3Data(cfg.data.T, cfg.data.modulus), evaluate=evaluate,
                    headline=("test", "error"), options=("modulus",),
                    check=lambda d: check_options(d.T, d.modulus))
