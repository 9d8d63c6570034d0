"""Progress bars: tqdm's on a terminal when it is installed (the ``experiments`` extra), else a few plain lines.

A base install (no extras) trains and sweeps without tqdm; the bar is only a display. When stderr is not a
terminal (a log file, a pipe, a cluster job) the plain lines are used too: tqdm's carriage-return redraws would
fill the file with one long line per bar.
"""

from __future__ import annotations

import sys


class _Plain:
    """tqdm's interface as far as this package uses it; prints one line per tenth of the total."""

    def __init__(self, iterable=None, total=None, initial=0, desc="", unit="it", **_):
        self.iterable, self.total, self.n, self.desc, self.unit = iterable, total, initial, desc, unit
        if self.total is None and iterable is not None and hasattr(iterable, "__len__"):
            self.total = len(iterable)
        self._shown = -1

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.total:
            tenth = 10 * self.n // self.total
            if tenth > self._shown:
                self._shown = tenth
                unit = self.unit if self.total == 1 else f"{self.unit}s"
                print(f"{self.desc}: {self.n}/{self.total} {unit}", file=sys.stderr, flush=True)

    def set_postfix(self, **_) -> None:
        pass

    def close(self) -> None:
        pass


def progress(iterable=None, **kwargs):
    """``tqdm(iterable, **kwargs)`` if tqdm is installed and stderr is a terminal, else a plain stand-in with the
    same methods (one line per tenth of the total)."""
    if not sys.stderr.isatty():
        return _Plain(iterable, **kwargs)
    try:
        from tqdm import tqdm
    except ImportError:
        return _Plain(iterable, **kwargs)
    return tqdm(iterable, **kwargs)
