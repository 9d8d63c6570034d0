"""Every bad input raises a clear ValueError before any work."""

import math

import pytest
import torch
from conftest import symmetric_couplings, symmetric_three_body

from boltzmann_attention import ising

METHODS = sorted(ising.METHODS)


def _valid(n=4):
    return torch.randn(3, n, dtype=torch.float64), symmetric_couplings(n)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_field_or_coupling(method, bad):
    h, J = _valid()
    h_bad = h.clone()
    h_bad[1, 2] = bad
    with pytest.raises(ValueError, match="h contains NaN or inf"):
        ising.marginals(h_bad, J, method=method)
    J_bad = J.clone()
    J_bad[0, 1] = J_bad[1, 0] = bad
    with pytest.raises(ValueError, match="J contains NaN or inf"):
        ising.marginals(h, J_bad, method=method)


@pytest.mark.parametrize("method", METHODS)
def test_asymmetric_or_diagonal_coupling(method):
    h, J = _valid()
    J_asym = J.clone()
    J_asym[0, 1] += 0.5
    with pytest.raises(ValueError, match="symmetric"):
        ising.marginals(h, J_asym, method=method)
    with pytest.raises(ValueError, match="zero diagonal"):
        ising.marginals(h, J + torch.eye(4, dtype=torch.float64), method=method)


def test_wrong_shapes_and_types():
    h, J = _valid()
    with pytest.raises(ValueError, match=r"J must have shape \(\.\.\., 4, 4\)"):
        ising.marginals(h, symmetric_couplings(5))
    with pytest.raises(ValueError, match="does not broadcast"):
        ising.marginals(h, symmetric_couplings(4, 2))
    with pytest.raises(ValueError, match="mask must be a bool"):
        ising.marginals(h, J, mask=torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"mask must have shape"):
        ising.marginals(h, J, mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="floating-point"):
        ising.marginals(torch.ones(3, 4, dtype=torch.long), None)
    with pytest.raises(ValueError, match="dtype"):
        ising.marginals(h, J.float())
    with pytest.raises(ValueError, match=r"K must have shape"):
        ising.marginals(h, J, symmetric_three_body(3))


def test_bad_three_body():
    h, J = _valid()
    K = symmetric_three_body(4)
    K_asym = K.clone()
    K_asym[0, 1, 2] += 1.0
    with pytest.raises(ValueError, match="K must be symmetric"):
        ising.marginals(h, J, K_asym)
    K_rep = K.clone()
    K_rep[0, 0, 1] = K_rep[0, 1, 0] = K_rep[1, 0, 0] = 1.0
    with pytest.raises(ValueError, match="coincide"):
        ising.marginals(h, J, K_rep)


def test_unknown_method():
    h, J = _valid()
    with pytest.raises(ValueError, match="unknown method .magic."):
        ising.marginals(h, J, method="magic")
    with pytest.raises(ValueError, match="unknown method"):
        ising.log_partition(h, J, method="nope")


def test_reference_size_limit():
    with pytest.raises(ValueError, match="n <= 20"):
        ising.marginals(torch.zeros(1, 21), None, method="reference")
