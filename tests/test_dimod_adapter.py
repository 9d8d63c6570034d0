"""Tests for ising.dimod_adapter: sign conversion, sample-set validation, and dwave-samplers end to end."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from boltzmann_attention.ising import reference
from boltzmann_attention.ising.dimod_adapter import DimodSampler

dimod = pytest.importorskip("dimod")

DT = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class FixedSampler:
    """Records the problems it is given and returns every read as ``value`` (or a custom sample set)."""

    def __init__(self, make=None):
        self.calls = []
        self.make = make

    def sample_ising(self, h, J, num_reads=1, **kwargs):
        self.calls.append((dict(h), dict(J), num_reads, kwargs))
        if self.make is not None:
            return self.make(h, J, num_reads)
        labels = list(h)
        samples = np.ones((num_reads, len(labels)), dtype=np.int8)
        return dimod.SampleSet.from_samples((samples, labels), vartype="SPIN", energy=np.zeros(num_reads))


def test_signs_and_present_spins_at_the_boundary():
    h = torch.tensor([[0.5, -1.5, 2.0, 0.0]], dtype=DT)
    J = torch.zeros(4, 4, dtype=DT)
    J[0, 2] = J[2, 0] = 0.7
    J[0, 1] = J[1, 0] = -0.2
    J[2, 3] = J[3, 2] = 0.3
    mask = torch.tensor([[True, False, True, True]])
    sampler = FixedSampler()
    spins = DimodSampler(sampler, beta_range=[1, 1]).draw(h, J[None], mask, 5, gen(0))
    h_dimod, J_dimod, num_reads, kwargs = sampler.calls[0]
    assert h_dimod == {0: -0.5, 2: -2.0, 3: -0.0}  # h' = -h, absent spin 1 left out, spin 3 kept
    assert J_dimod == {(0, 2): -0.7, (2, 3): -0.3}  # J' = -J over j < k, present pairs only
    assert num_reads == 5 and kwargs == {"beta_range": [1, 1]}
    assert spins.shape == (1, 5, 4) and spins.dtype == DT
    assert (spins[0][:, [0, 2, 3]] == 1).all() and ((spins[0, :, 1] == 1) | (spins[0, :, 1] == -1)).all()
    # and the dimod energy of a configuration equals ours
    s = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=DT)
    ours = -float(reference.negative_energies(h[0] * mask[0], J * mask[0, :, None] * mask[0, None, :], None, s[None]))
    bqm = dimod.BinaryQuadraticModel.from_ising(h_dimod, J_dimod)
    assert bqm.energy({0: 1, 2: -1, 3: 1}) == pytest.approx(ours)


def test_sign_round_trip_simulated_annealing():
    samplers = pytest.importorskip("dwave.samplers")
    sa = samplers.SimulatedAnnealingSampler()
    adapter = DimodSampler(sa, num_reads=50, seed=1)
    h = torch.tensor([[2.0, -2.0], [1.0, 0.0], [1.0, 0.0]], dtype=DT)
    J = torch.zeros(3, 2, 2, dtype=DT)
    J[1, 0, 1] = J[1, 1, 0] = 2.0  # ferromagnetic (ours): s_1 follows s_0
    J[2, 0, 1] = J[2, 1, 0] = -2.0  # antiferromagnetic (ours)
    ground = [[1, -1], [1, 1], [1, -1]]  # in our convention
    for i in range(3):
        sampleset = sa.sample_ising(*adapter.problem(h[i], J[i]), num_reads=50, seed=1)
        assert [sampleset.first.sample[j] for j in range(2)] == ground[i]
    m = adapter.marginals(h, J)
    # a cold anneal lands in the ground state in most reads (it can stop in the local minimum -ground)
    assert (m * torch.tensor(ground, dtype=DT) > 0.5).all()


def test_beta_one_marginals_match_reference():
    samplers = pytest.importorskip("dwave.samplers")
    g = gen(0)
    n = 4
    h = torch.randn(2, n, generator=g, dtype=DT) * 0.5
    W = torch.randn(n, n, generator=g, dtype=DT).triu(1) * 0.5
    J = W + W.T
    mask = torch.tensor([[True] * n, [True, False, True, True]])
    reads = 2000
    adapter = DimodSampler(samplers.SimulatedAnnealingSampler(), num_reads=reads, beta_range=[1, 1],
                           num_sweeps=100, seed_from_generator=True)
    m = adapter.marginals(h, J, mask=mask, generator=gen(1))
    exact = reference.marginals(h, J, None, mask)
    assert m.shape == h.shape and m[1, 1] == 0
    assert (m - exact).abs().max() < 5 / math.sqrt(reads)


def test_aggregated_sample_sets_are_expanded():
    def make(h, J, num_reads):
        labels = list(h)
        samples = np.array([[1] * len(labels), [-1] * len(labels)])
        return dimod.SampleSet.from_samples((samples, labels), vartype="SPIN", energy=[0.0, 0.0],
                                            num_occurrences=[num_reads - 1, 1])
    m = DimodSampler(FixedSampler(make), num_reads=10).marginals(torch.zeros(3, dtype=DT))
    assert torch.allclose(m, torch.full((3,), 0.8, dtype=DT))


def test_sampler_errors():
    h = torch.zeros(1, 3, dtype=DT)

    def wrong_labels(h, J, num_reads):
        labels = [j + 1 for j in h]
        return dimod.SampleSet.from_samples((np.ones((num_reads, len(labels))), labels), "SPIN",
                                            energy=np.zeros(num_reads))

    def binary(h, J, num_reads):
        return dimod.SampleSet.from_samples((np.zeros((num_reads, len(h))), list(h)), "BINARY",
                                            energy=np.zeros(num_reads))

    def too_few(h, J, num_reads):
        return dimod.SampleSet.from_samples((np.ones((1, len(h))), list(h)), "SPIN", energy=[0.0])

    with pytest.raises(ValueError, match="expected exactly"):
        DimodSampler(FixedSampler(wrong_labels)).draw(h, None, None, 4, None)
    with pytest.raises(ValueError, match="-1 and \\+1"):
        DimodSampler(FixedSampler(binary)).draw(h, None, None, 4, None)
    with pytest.raises(ValueError, match="reads"):
        DimodSampler(FixedSampler(too_few)).draw(h, None, None, 4, None)
    with pytest.raises(ValueError, match="NaN"):
        DimodSampler(FixedSampler()).draw(torch.tensor([[0.0, float("inf")]], dtype=DT), None, None, 4, None)
    with pytest.raises(ValueError, match="pairwise"):
        DimodSampler(FixedSampler()).marginals(h, None, torch.zeros(1, 3, 3, 3, dtype=DT))
    with pytest.raises(ValueError, match="sample_ising"):
        DimodSampler(object())
    with pytest.raises(ValueError, match="num_reads"):
        DimodSampler(FixedSampler(), num_reads=0)


@pytest.mark.slow
def test_package_imports_without_dimod():
    code = ("import sys; sys.modules['dimod'] = None\n"
            "import boltzmann_attention.ising.dimod_adapter, boltzmann_attention.ising.annealing\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_dimod_sampler_drives_the_layer():
    """A DimodSampler passed as `method` runs the attention layer, with covariance gradients."""
    samplers = pytest.importorskip("dwave.samplers")
    from boltzmann_attention import BoltzmannAttention

    torch.manual_seed(0)
    sampler = DimodSampler(samplers.SimulatedAnnealingSampler(), num_reads=64, seed_from_generator=True,
                           beta_range=[1, 1], num_sweeps=50)
    layer = BoltzmannAttention(8, 1, max_len=4, method=sampler, coupling_init_std=0.2)
    out, weights = layer(torch.randn(2, 4, 8), need_weights=True)
    out.sum().backward()
    assert torch.isfinite(layer.couplings.weight.grad).all() and layer.couplings.weight.grad.abs().sum() > 0
    assert (weights[..., 1:][torch.ones(4, 3, dtype=torch.bool).triu().expand(2, 1, 4, 3)] == 0).all()
