"""Nothing silently wrong: second derivatives through first-order backward passes raise, the no-decay rule
survives copies and meta initialisation, window index tables hold no state, and energies too large to be
resolved in the dtype raise instead of returning wrong marginals."""

import pytest
import torch
from conftest import symmetric_couplings, symmetric_three_body

from boltzmann_attention import boltzmann_attention, ising
from boltzmann_attention.ising import toeplitz


def _penalty_gradient(fn, q):
    """d/dq of |d sum(fn(q)) / dq|^2: a gradient penalty, through a loss linear in the output."""
    g, = torch.autograd.grad(fn(q).sum(), q, create_graph=True)
    return torch.autograd.grad((g * g).sum(), q)[0]


def _marginals(method, n=6, mask=None, K=False, **options):
    J = symmetric_couplings(n, scale=0.3, generator=torch.Generator().manual_seed(1))
    K3 = symmetric_three_body(n, scale=0.2, generator=torch.Generator().manual_seed(2)) if K else None
    return lambda h: ising.marginals(h, J, K3, mask=mask, method=method, **options)


CAUSAL = torch.ones(6, 6, dtype=torch.bool).tril()

FIRST_ORDER = {
    "exact": _marginals("exact"),
    "exact, causal mask": _marginals("exact", mask=CAUSAL),
    "exact, ragged mask": _marginals("exact", mask=torch.tensor([[1, 0, 1, 1, 0, 1]] * 3 + [[1] * 6] * 3).bool()),
    "exact, three-body": _marginals("exact", K=True),
    "exact, 12 spins (split)": _marginals("exact", n=12),
    "banded": _marginals("banded", bandwidth=5),
    "meanfield": _marginals("meanfield"),
    "tap": _marginals("tap"),
    "gibbs": _marginals("gibbs", num_samples=64),
    "gibbs, ste": _marginals("gibbs", num_samples=64, gradient="ste"),
    "toeplitz": lambda h: toeplitz.marginals(h, toeplitz.Toeplitz(0.2 * torch.ones(1, 2, dtype=h.dtype)), None),
    "log Z, exact": lambda h: ising.log_partition(h, symmetric_couplings(h.shape[-1], scale=0.3), method="exact"),
    "log Z, banded": lambda h: ising.log_partition(h, symmetric_couplings(h.shape[-1], scale=0.3, bandwidth=2),
                                                   method="banded", bandwidth=2),
}


@pytest.mark.parametrize("name", list(FIRST_ORDER))
def test_second_derivatives_through_a_first_order_backward_raise(name):
    fn = FIRST_ORDER[name]
    n = 12 if "12" in name else 6
    q = torch.randn(6, n, dtype=torch.float64, requires_grad=True)
    fn(q).sum().backward()  # first derivatives still work
    assert q.grad is not None and torch.isfinite(q.grad).all()
    with pytest.raises(RuntimeError, match="first derivatives only.*create_graph.*'reference'"):
        _penalty_gradient(fn, q)


def test_the_second_derivative_by_reference_is_not_zero():
    """What the error points to: method 'reference' differentiates twice (and the value is not 0)."""
    J = symmetric_couplings(6, scale=0.3, generator=torch.Generator().manual_seed(1))
    q = torch.randn(6, 6, dtype=torch.float64, requires_grad=True)
    fn = lambda h: ising.marginals(h, J, method="reference")  # noqa: E731
    assert _penalty_gradient(fn, q).abs().max() > 1e-3
    torch.autograd.gradgradcheck(fn, (q,))


@pytest.mark.parametrize("window", [None, 3])
def test_attention_gradient_penalty_raises_for_couplings_and_works_in_mode_h(window):
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 5, 4, dtype=torch.float64, generator=g).unbind(0)
    J = symmetric_couplings(window or 5, 2, scale=0.3, generator=g)
    q.requires_grad_()
    fn = lambda x: boltzmann_attention(x, k, v, couplings=J, is_causal=True, coupling_window=window)  # noqa: E731
    with pytest.raises(RuntimeError, match="first derivatives only"):
        _penalty_gradient(fn, q)
    naive = lambda x: boltzmann_attention(x, k, v, mode="h", is_causal=True)  # noqa: E731
    assert _penalty_gradient(naive, q).abs().max() > 0
