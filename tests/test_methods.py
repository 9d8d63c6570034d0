"""Closed forms that every method must reproduce, through the public dispatcher."""

import math

import pytest
import torch

from boltzmann_attention import ising

DETERMINISTIC = ["exact", "configurations", "reference", "banded", "meanfield", "tap"]
EXACT = ["exact", "configurations", "reference", "banded"]


@pytest.mark.parametrize("method", DETERMINISTIC)
def test_zero_couplings_give_tanh(method):
    h = torch.randn(4, 7, dtype=torch.float64)
    for J in (None, torch.zeros(7, 7, dtype=torch.float64)):
        torch.testing.assert_close(ising.marginals(h, J, method=method), torch.tanh(h), atol=1e-12, rtol=0)


@pytest.mark.parametrize("method", EXACT)
def test_two_spins_sign_convention(method):
    """p(s) ∝ exp(h1 s1 + J s1 s2): <s2> = tanh(J) tanh(h1), and <s1 s2> = d log Z / dJ = tanh(J) at h = 0."""
    for coupling in (0.7, -1.3):
        J = torch.tensor([[0.0, coupling], [coupling, 0.0]], dtype=torch.float64)
        m = ising.marginals(torch.tensor([0.9, 0.0], dtype=torch.float64), J, method=method)
        assert abs(m[1].item() - math.tanh(coupling) * math.tanh(0.9)) < 1e-12
        x = torch.tensor(coupling, dtype=torch.float64, requires_grad=True)
        J = torch.stack([torch.stack([x * 0, x]), torch.stack([x, x * 0])])
        band = {"bandwidth": 1} if method == "banded" else {}  # banded needs the band of a trained J
        logz = ising.log_partition(torch.zeros(2, dtype=torch.float64), J, method=method, **band)
        assert abs(logz.item() - math.log(4 * math.cosh(coupling))) < 1e-12
        (correlation,) = torch.autograd.grad(logz, x)
        assert abs(correlation.item() - math.tanh(coupling)) < 1e-12


@pytest.mark.parametrize("method", EXACT)
def test_odd_sizes_agree_with_reference(method):
    from conftest import symmetric_couplings

    for n in (7, 13):
        h = torch.randn(3, n, dtype=torch.float64)
        J = symmetric_couplings(n, bandwidth=3)
        torch.testing.assert_close(ising.marginals(h, J, method=method), ising.marginals(h, J, method="reference"),
                                   atol=1e-11, rtol=0)


@pytest.mark.slow
def test_scaling_benchmark_rows_table_and_plot(tmp_path):
    """The time-against-n benchmark runs every scalable method (exact only while it can) and plots."""
    from boltzmann_attention.experiments.benchmarks import approximations as benchmark

    rows = benchmark.scaling_rows(sizes=(6, 30), queries=3, bandwidth=2, budget_s=0.0)
    methods = {(r["method"], r["n"]) for r in rows}
    assert ("exact", 6) in methods and ("exact", 30) not in methods
    for m in ("banded", "meanfield", "tap", "gibbs", "pt", "sqa"):
        assert {(m, 6), (m, 30)} <= methods
    assert all(r["seconds"] > 0 for r in rows)
    table = benchmark.scaling_table(rows).splitlines()
    assert table[0] == "| method | n = 6 | n = 30 |" and table[2].startswith("| exact | ") and table[2].endswith("|  |")
    accuracy = [{"n": 12, "method": "exact", "options": "defaults", "seconds": 0.01, "max_error": 0.0,
                 "mean_error": 0.0}]
    assert "| 12 | exact | defaults | 0.010 | 0.00e+00 | 0.00e+00 |" in benchmark.accuracy_table(accuracy)
    benchmark.plot_rows(accuracy, rows, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000
