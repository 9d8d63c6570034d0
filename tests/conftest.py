"""Shared factories for random Ising inputs (float64 unless asked), one torch thread per pytest-xdist worker
(workers share the cores: more threads than cores make torch's OpenMP threads spin against each other), the
``device`` fixture (CPU always, CUDA when a GPU is there), the low-precision tolerance rule, and the expectation
that a report warns of the archives it reads that are missing."""

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


def layer_input(model, layer, x):
    """What ``layer`` receives when ``model`` runs on x, captured by a forward pre-hook, without gradients."""
    inputs = []
    hook = layer.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    try:
        with torch.no_grad():
            model(x)
    finally:
        hook.remove()
    return inputs[0]


def _devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]


DEVICES = _devices()


@pytest.fixture(params=DEVICES)
def device(request):
    """The device a numerical test runs on: 'cpu' always, 'cuda' where torch sees a GPU (skipped elsewhere).
    Inputs are drawn on the CPU (seeded generators) and moved; references are computed on the CPU in float64."""
    return torch.device(request.param)


def plain_marginals(h, J=None, mask=None):
    """<s> by a softmax over all 2^n states, every operation in h's dtype and on its device: the plain PyTorch
    computation whose error sets a low-precision kernel's tolerance (:func:`assert_flash_rule`). Absent spins
    (mask False) are free (no field, no coupling) and reported as 0."""
    n = h.shape[-1]
    index = torch.arange(2**n, device=h.device)
    S = (2 * ((index[:, None] >> torch.arange(n, device=h.device)) & 1) - 1).to(h.dtype)
    present = torch.ones_like(h) if mask is None else mask.to(h.dtype)
    h = h * present
    logits = h @ S.T
    if J is not None:
        J = J * present[..., :, None] * present[..., None, :]
        logits = logits + 0.5 * ((S @ J) * S).sum(-1)
    return (torch.softmax(logits, dim=-1) @ S) * present


def assert_flash_rule(out, plain, reference, factor=2.0):
    """The FlashAttention rule for low-precision results: the error of ``out`` against the float64 ``reference``
    is at most ``factor`` times the error of ``plain`` (plain PyTorch in the same dtype) against it, plus one ulp
    of the dtype at 1 (so that a plain result that happens to be exact does not demand an exact kernel)."""
    reference = reference.double().cpu()
    error = (out.double().cpu() - reference).abs().max().item()
    plain_error = (plain.double().cpu() - reference).abs().max().item()
    bound = factor * plain_error + torch.finfo(out.dtype).eps
    assert error <= bound, f"error {error:.3g} > {factor} x plain PyTorch's {plain_error:.3g} + eps"


MISSING_ARCHIVE = r"reads the archive of profile '([^']+)' beside it, and .* does not exist"


@contextlib.contextmanager
def archives_missing(*profiles):
    """Expect the reports written inside to warn that the archive beside them of each of ``profiles`` is missing
    (the rows that come from it are left out), and of no other profile."""
    with pytest.warns(UserWarning, match=MISSING_ARCHIVE) as caught:
        yield
    named = {m.group(1) for w in caught if (m := re.search(MISSING_ARCHIVE, str(w.message)))}
    assert named == set(profiles)
