"""Shared factories for random Ising inputs (float64 unless asked), one torch thread per pytest-xdist worker
(workers share the cores: more threads than cores make torch's OpenMP threads spin against each other), and the
expectation that a report warns of the archives it reads that are missing."""

import contextlib
import itertools
import os
import re

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def symmetric_couplings(n, *batch, scale=1.0, bandwidth=None, dtype=torch.float64, generator=None):
    """A random symmetric J with zero diagonal, (*batch, n, n); zero beyond |j-k| > bandwidth if given."""
    W = torch.randn(*batch, n, n, dtype=dtype, generator=generator) * scale
    upper = W.triu(1)
    if bandwidth is not None:
        upper = upper.tril(bandwidth)
    return upper + upper.transpose(-1, -2)


def symmetric_three_body(n, *batch, scale=1.0, dtype=torch.float64, generator=None):
    """A random fully symmetric K, zero where indices coincide, (*batch, n, n, n)."""
    W = torch.randn(*batch, n, n, n, dtype=dtype, generator=generator) * scale
    i = torch.arange(n)
    ordered = (i[:, None, None] < i[None, :, None]) & (i[None, :, None] < i[None, None, :])
    upper = W * ordered
    lead = len(batch)
    return sum(upper.permute(*range(lead), *(lead + p for p in perm))
               for perm in itertools.permutations(range(3)))


def _devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]


DEVICES = _devices()


MISSING_ARCHIVE = r"reads the archive of profile '([^']+)' beside it, and .* does not exist"


@contextlib.contextmanager
def archives_missing(*profiles):
    """Expect the reports written inside to warn that the archive beside them of each of ``profiles`` is missing
    (the rows that come from it are left out), and of no other profile."""
    with pytest.warns(UserWarning, match=MISSING_ARCHIVE) as caught:
        yield
    named = {m.group(1) for w in caught if (m := re.search(MISSING_ARCHIVE, str(w.message)))}
    assert named == set(profiles)
