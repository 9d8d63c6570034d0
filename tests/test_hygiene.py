"""Code states behaviour: no issue numbers, dated measurements, changelog dates or citations of documents the
repository does not ship in the package's source (history lives in git, protocols and measurements in the
studies' Markdown and the reports)."""

import re
from pathlib import Path

import boltzmann_attention

SOURCE = Path(boltzmann_attention.__file__).parent
FORBIDDEN = {
    "an issue number": re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w/])#\d{1,3}\b(?! *(?:noqa|type))"),
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a time of day": re.compile(r"\b\d\d:\d\d(?::\d\d)? UTC\b"),
    "a changelog date": re.compile(r"\b(?:before|since|until|after) (?:January|February|March|April|May|June|July|"
                                   r"August|September|October|November|December) 20\d\d"),
    "a document the repository does not ship": re.compile(r"\b(?:SCALING|SAMPLERS|BASELINES_AND_STACK|"
                                                          r"ANCHORS_CODE|BOLTZMANN_ATTENTION)\.md|shared/docs"),
}


def test_no_history_in_the_source():
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(SOURCE)}:{number}: {what}: {line.strip()}")
    assert found == []


def test_the_patterns_catch_what_they_are_for():
    for what, text in (("an issue number", "see issue 14 §3"), ("an issue number", "fixed in #27"),
                       ("a date", "measured on 2026-12-01"), ("a time of day", "at 13:12 UTC"),
                       ("a changelog date", "the recipe before December 2026"),
                       ("a document the repository does not ship", "(SAMPLERS.md §0)")):
        assert FORBIDDEN[what].search(text), (what, text)
    assert not FORBIDDEN["an issue number"].search("x = y  # noqa: E731")
