"""Markdown tables and number formatting, shared by every report.

Blank means "not measured": every formatter returns "" for None or a non-finite number.
"""

from __future__ import annotations

import math
from collections import Counter

from .stats import Paired, Stat, holm


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; a "|" inside a cell is escaped."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)])


def fmt_num(v: float | None, digits: int = 2, signed: bool = False) -> str:
    """A table cell: blank for None or a non-finite value (prose wants :func:`fmt_or`)."""
    if v is None or not math.isfinite(v):
        return ""
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def fmt_or(v: float | None, missing: str, digits: int = 2, signed: bool = False) -> str:
    """A number inside a sentence: ``missing`` (which says why) where a cell would be blank."""
    return fmt_num(v, digits, signed) or missing


def fmt_pm(v: float, e: float) -> str:
    """A fitted value and its error, "?" where the error is undetermined."""
    err = f"{e:.3g}" if math.isfinite(e) else "?"
    return f"{v:.4g} ± {err}"


def fmt_p(p: float) -> str:
    return "p < 0.0001" if p < 1e-4 else f"p = {p:.2g}"


def fmt_stat(s: Stat | None, digits: int = 3, scale: float = 1.0, show_n: bool = True) -> str:
    """mean ± std (n=seeds); the std only with 2 seeds or more."""
    if s is None:
        return ""
    text = f"{s.mean * scale:.{digits}f}"
    if s.n > 1:
        text += f" ± {s.std * scale:.{digits}f}"
    return text + (f" (n={s.n})" if show_n else "")


def fmt_comparison(c: Paired | None, digits: int = 2, expected_n: int | None = None) -> str:
    """mean ± std of a paired difference; † when computed from the means (no shared seed), "(k paired)" when
    fewer seeds are paired than expected."""
    if c is None:
        return ""
    text = f"{c.mean:+.{digits}f}"
    if c.n > 1:
        text += f" ± {c.std:.{digits}f}"
    if c.n == 0:
        text += " †"
    elif expected_n is not None and c.n < expected_n:
        text += f" ({c.n} paired)"
    return text


def fmt_direction(c: Paired, unit: str, positive: str, negative: str, zero: str = "level with") -> str:
    """A paired difference as its size and a word for its direction, e.g. "1.34 ± 0.17 % below": the words
    carry the sign, so a sentence never reads "above ... by -1.34 %"."""
    size = fmt_comparison(Paired(abs(c.mean), c.std, c.n, c.per_seed)).lstrip("+")
    word = positive if c.mean > 0 else negative if c.mean < 0 else zero
    return f"{size} {unit} {word}"


def significance_mark(c: Paired, holm_survives: bool = False) -> str:
    """"*" for p < ALPHA, "**" when it also survives the Holm correction of its table."""
    if not c.significant():
        return ""
    return "**" if holm_survives else "*"


def fmt_interval(c: Paired, digits: int = 2, holm_survives: bool = False) -> str:
    """mean [low, high] of the 95% interval, with its significance mark; "(n=1)" for a single pair."""
    if c.n < 2:
        return f"{c.mean:+.{digits}f} (n={c.n})"
    return f"{c.mean:+.{digits}f} [{c.low:+.{digits}f}, {c.high:+.{digits}f}]{significance_mark(c, holm_survives)}"


def table_with_holm(header: list[str], cells: list[list], families: dict[int, str] | None = None) -> str:
    """A Markdown table whose :class:`Paired` cells are shown as intervals, marked with the Holm correction
    over all the comparisons of the table, or with ``families`` (column index -> family name, e.g. one per
    metric) over those of each family's columns; None cells are blank."""
    by_family: dict[str, list[Paired]] = {}
    for row in cells:
        for j, c in enumerate(row):
            if isinstance(c, Paired):
                by_family.setdefault((families or {}).get(j, ""), []).append(c)
    survives = {}
    for found in by_family.values():
        survives.update(zip(map(id, found), holm([c.p for c in found])))
    rows = [[fmt_interval(c, holm_survives=survives[id(c)]) if isinstance(c, Paired) else (c or "") for c in row]
            for row in cells]
    return md_table(header, rows)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """ "1 seed", "3 seeds"."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{int(minutes)} min {int(seconds % 60):02d} s"
    return f"{int(minutes // 60)} h {int(minutes % 60):02d} min"


def counted(counter: Counter) -> str:
    """The one value, or each value with its count of runs."""
    if len(counter) == 1:
        return str(next(iter(counter)))
    return ", ".join(f"{v} ({plural(n, 'run')})" for v, n in counter.most_common())


def label(mode: str, method: str) -> str:
    """A mode's column label: the mode, with its method unless exact enumeration."""
    return mode if method == "exact" else f"{mode} [{method}]"
