"""The QPU path (ising.qpu) on D-Wave's MockDWaveSampler with this package's physics standing in for the device:
marginals against exact enumeration within a bound derived from the reads, the temperature calibration, embeddings
found once per shape, chain breaks, scaling into the device's ranges, tiling, the cost model, and the errors.

Skipped without the [qpu] extra; tests/test_imports.py checks that the package imports without it."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

pytest.importorskip("dwave.system")
pytest.importorskip("minorminer")
pytest.importorskip("dwave.graphs")

import dimod  # noqa: E402
import dwave.graphs as dg  # noqa: E402
import networkx as nx  # noqa: E402
from dwave.embedding import verify_embedding  # noqa: E402
from dwave.system.testing import MockDWaveSampler  # noqa: E402

from boltzmann_attention import BoltzmannAttention  # noqa: E402
from boltzmann_attention.experiments.benchmarks import qpu as bench  # noqa: E402
from boltzmann_attention.ising import qpu, reference  # noqa: E402
from boltzmann_attention.ising.qpu import QPUSampler, SimulatedPhysics, disjoint_embeddings  # noqa: E402

DT = torch.float64
DEVICE_BETA = 4.0  # the stand-in device's inverse temperature, in device units


def mock(physics=None, shape=(2, 4), **kwargs):
    """A Zephyr mock QPU whose samples come from ``physics`` (default: exact Boltzmann draws at DEVICE_BETA)."""
    physics = physics or SimulatedPhysics("boltzmann", beta=DEVICE_BETA, seed=0)
    return MockDWaveSampler(topology_type="zephyr", topology_shape=list(shape), substitute_sampler=physics,
                            parameter_warnings=False, **kwargs)


def systems(n, num, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = -1.3 + 0.4 * torch.randn(num, n, dtype=DT, generator=g)
    W = 0.25 * torch.randn(num, n, n, dtype=DT, generator=g)
    return h, W.triu(1) + W.triu(1).transpose(-1, -2)


def bound(exact, reads, calls):
    """5 sigma of the binomial error of a magnetisation from ``reads`` independent reads, sqrt((1 - m^2) / R), plus
    what chain breaks can move it: a broken chain is resolved by majority vote, at most 2 x the break rate."""
    breaks = max(c.chain_break_rate for c in calls)
    return 5 * ((1 - exact**2) / reads).sqrt() + 2 * breaks


def test_layer_marginals_through_the_mock_agree_with_exact():
    """The layer with method=QPUSampler (causal masks: each query on its present keys, a sub-embedding of K_5) gives
    the weights of method='exact' within the derived bound, at the energy scale 1 / beta of the stand-in device."""
    torch.manual_seed(0)
    reads = 2000
    sampler = QPUSampler(mock(), num_reads=reads, energy_scale=1 / DEVICE_BETA)
    exact_layer = BoltzmannAttention(8, 1, max_len=5, method="exact", coupling_init_std=0.3)
    qpu_layer = BoltzmannAttention(8, 1, max_len=5, method=sampler, coupling_init_std=0.3)
    qpu_layer.load_state_dict(exact_layer.state_dict())
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        _, want = exact_layer(x, need_weights=True)
        _, got = qpu_layer(x, need_weights=True)
    m = (2 * want - 1).double()  # weights are (m + 1) / 2 on present keys
    present = torch.ones(5, 5, dtype=torch.bool).tril().expand_as(want)
    error = (got - want).abs().double()[present]
    assert sampler.calls and all(c.queries > 1 for c in sampler.calls)  # tiled: several queries per call
    assert (error <= bound(m[present], reads, sampler.calls) / 2).all(), error.max()
    assert (got[~present] == 0).all()


def test_calibration_finds_the_device_temperature_and_exact_marginals_there():
    """calibrate() fits beta_eff by KL against exp(-E): on a device at beta 4 the scale is about 1/4, and the
    marginals at the calibrated scale are exp(-beta' E)'s, beta' = c x 4, within the derived bound."""
    reads = 2000
    sampler = QPUSampler(mock(), num_reads=reads)
    cal = sampler.calibrate(sizes=(4,), num_systems=8)
    beta = cal.energy_scale * DEVICE_BETA
    assert sampler.energy_scale == cal.energy_scale and abs(beta - 1) < 0.1, cal.history
    assert abs(float(cal.beta.median()) - 1) <= 0.05 and 0 <= cal.chain_break_rate <= 1
    assert len(cal.history) >= 2 and cal.history[0][0] == 1.0  # started at 1, where beta_eff was about 4
    h, J = systems(6, 12, seed=1)
    first = len(sampler.calls)
    m = sampler.marginals(h, J)
    exact = reference.marginals(beta * h, beta * J, None, None)
    assert ((m - exact).abs() <= bound(exact, reads, sampler.calls[first:])).all()


def test_an_embedding_is_found_once_per_shape_and_reused():
    sampler = QPUSampler(mock(), num_reads=50, energy_scale=0.25)
    h, J = systems(5, 3)
    sampler.marginals(h, J)
    tiling = sampler.tiling(5)
    sampler.marginals(h, J)
    sampler.marginals(h[:1], J[:1])
    assert sampler.embedding_searches == 1 and sampler.tiling(5) is tiling
    sampler.marginals(*systems(4, 2))
    assert sampler.embedding_searches == 2
    band = QPUSampler(mock(), num_reads=50, energy_scale=0.25, graph=("band", 2))
    Jb = J * ((torch.arange(5)[:, None] - torch.arange(5)[None, :]).abs() <= 2)
    band.marginals(h, Jb)
    band.marginals(h, Jb)
    assert band.embedding_searches == 1
    source = nx.Graph(qpu.ProblemGraph("band", 5, 2).edges())
    assert all(verify_embedding(e, source, band.target) for e in band.tiling(5))


def test_chain_break_rate_is_counted_and_reported():
    """The rate is the fraction of (read, chain) pairs whose qubits disagree, weighted by num_occurrences; weak
    chains (the torque rule on a scaled-down problem) break where the device's strongest coupling does not."""
    chains = {"a": (0, 1), "b": (2,), "c": (3, 4, 5)}
    samples = np.array([[1, 1, -1, 1, 1, 1],     # no chain broken
                        [1, -1, 1, 1, -1, 1],    # a and c broken
                        [-1, -1, 1, -1, -1, 1]])  # c broken
    response = dimod.SampleSet.from_samples((samples, list(range(6))), "SPIN", energy=np.zeros(3),
                                            num_occurrences=[2, 1, 1])
    assert qpu._chain_break_rate(response, chains) == pytest.approx((0 * 2 + 2 + 1) / (4 * 3))
    h, J = systems(6, 8)
    strong = QPUSampler(mock(), num_reads=500, energy_scale=0.25)
    weak = QPUSampler(mock(), num_reads=500, energy_scale=0.25, chain_strength="torque")
    strong.marginals(h, J)
    weak.marginals(h, J)
    assert strong.chain_break_rate == strong.calls[-1].chain_break_rate
    for s in (strong, weak):
        assert all(0 <= c.chain_break_rate <= 1 for c in s.calls)
    assert weak.calls[-1].chain_strength < 1 == strong.calls[-1].chain_strength
    assert weak.chain_break_rate > 10 * strong.chain_break_rate + 1e-3


def test_problems_are_scaled_into_the_device_ranges():
    """The programmed problem is c h, c J in dimod's sign, split over chains and couplers, chains at -1, every bias
    inside h_range and j_range; a scale that leaves them raises, naming the largest that fits."""
    device = mock()
    sampler = QPUSampler(device, num_reads=10, energy_scale=0.5, max_copies=1)
    h, J = systems(6, 1)
    sampler.draw(h, J, None, 10)
    bqm, chains = sampler.last_embedded_bqm, sampler.tiling(6)[0]
    p = device.properties
    assert all(p["h_range"][0] <= v <= p["h_range"][1] for v in bqm.linear.values())
    assert all(p["j_range"][0] <= v <= p["j_range"][1] for v in bqm.quadratic.values())
    for j, chain in chains.items():
        assert sum(bqm.linear[q] for q in chain) == pytest.approx(-0.5 * float(h[0, j]))
        assert all(bqm.quadratic.get((a, b), bqm.quadratic.get((b, a))) == -1.0
                   for a, b in itertools.combinations(chain, 2) if device.to_networkx_graph().has_edge(a, b))
    for j, k in itertools.combinations(range(6), 2):
        between = sum(v for (a, b), v in bqm.quadratic.items()
                      if {a, b} & set(chains[j]) and {a, b} & set(chains[k]) and not {a, b} <= set(chains[j])
                      and not {a, b} <= set(chains[k]))
        assert between == pytest.approx(-0.5 * float(J[0, j, k]))
    big = h * 10
    sampler.energy_scale = 1.0
    with pytest.raises(ValueError, match="largest energy_scale that fits this problem is") as e:
        sampler.draw(big, J, None, 10)
    fits = float(str(e.value).rsplit(" ", 1)[1])
    sampler.energy_scale = 0.999 * fits
    sampler.draw(big, J, None, 10)  # just inside: no error
    sampler.energy_scale = 1.001 * fits
    with pytest.raises(ValueError, match="outside the device's h_range"):
        sampler.draw(big, J, None, 10)


@pytest.mark.parametrize("graph, defects", [("zephyr", False), ("zephyr", True), ("pegasus", False)])
def test_tiling_places_disjoint_valid_embeddings(graph, defects):
    target = dg.zephyr_graph(2, 4) if graph == "zephyr" else dg.pegasus_graph(3)
    removed = set(list(target.nodes)[::7]) if defects else set()
    target.remove_nodes_from(removed)
    source = nx.complete_graph(6)
    placed = disjoint_embeddings(source, target, seed=0)
    qubits = [q for e in placed for chain in e.values() for q in chain]
    assert len(placed) >= 3 and len(qubits) == len(set(qubits)) and not set(qubits) & removed
    assert all(verify_embedding(e, source, target) for e in placed)
    assert len(disjoint_embeddings(source, target, seed=0, max_copies=2)) == 2


def test_cost_model_against_its_formula_by_hand():
    t = bench.QPUTiming("a QPU", "a graph", programming_us=18000.0, readout_us=(20.0, 100.0), delay_us=20.0,
                        anneal_us=20.0)
    assert bench.access_time_us(t, 1000, 100.0) == 18000 + 1000 * (20 + 100 + 20)  # 158 ms
    assert bench.seconds_per_query(t, 1000, 50, 100.0) == pytest.approx(0.158 / 50)
    assert bench.reads_for_error(0.01) == pytest.approx(10000)          # 1 / eps^2, m = 0
    assert bench.reads_for_error(0.01, 0.25) == pytest.approx(2500)     # (1 - m^2) / eps^2
    assert bench.reads_for_error(0.01, 0.25, 0.006) == pytest.approx(0.25 / (1e-4 - 3.6e-5))
    assert bench.reads_for_error(0.01, 0.25, 0.01) == math.inf
    published = bench.TIMINGS["pegasus"]
    assert bench.access_time_us(published, 100, published.readout_us[1]) == pytest.approx(17700 + 100 * 305.6)


def test_unsupported_shapes_and_settings_raise_clearly():
    device = mock(shape=(1, 4))  # 48 qubits
    with pytest.raises(ValueError, match="graph must be 'clique'"):
        QPUSampler(device, graph="ring")
    with pytest.raises(ValueError, match="no embedding of K_60 was found"):
        QPUSampler(device, energy_scale=0.25).tiling(60)
    with pytest.raises(ValueError, match="beyond the band width 1"):
        QPUSampler(device, energy_scale=0.25, graph=("band", 1)).draw(*systems(4, 1), None, 10)
    with pytest.raises(ValueError, match="calibrate"):
        QPUSampler(device).draw(*systems(4, 1), None, 10)
    with pytest.raises(ValueError, match="structured sampler"):
        QPUSampler(dimod.ExactSolver())
    with pytest.raises(ValueError, match="num_reads_range"):
        QPUSampler(device, energy_scale=0.25).draw(*systems(4, 1), None, 20000)
    with pytest.raises(ValueError, match="chain strength 2 is outside the device's j_range"):
        QPUSampler(device, energy_scale=0.25, chain_strength=2.0).draw(*systems(4, 1), None, 10)
    with pytest.raises(ValueError, match="at most 16 qubits"):
        SimulatedPhysics("boltzmann", beta=1.0).sample(dimod.BQM.from_ising({}, {(i, i + 1): 1.0 for i in range(20)}))


def test_the_physics_stand_ins_sample_each_component():
    """SQA and DQA run on the mock like the exact draws: components sampled independently, reads +-1."""
    h, J = systems(4, 2)
    for physics in (SimulatedPhysics("sqa", beta=DEVICE_BETA, sweeps=20, trotter_slices=4, seed=0),
                    SimulatedPhysics("dqa", seed=0)):
        sampler = QPUSampler(mock(physics), num_reads=64, energy_scale=0.05)
        m = sampler.marginals(h, J)
        assert m.shape == h.shape and (m.abs() <= 1).all() and sampler.calls[-1].queries == 2


@pytest.mark.slow
def test_bench_quick_report(tmp_path):
    bench.write_qpu_report(str(tmp_path), quick=True)
    text = (tmp_path / "README.md").read_text()
    assert "Generated by `boltzmann-attention-bench qpu report/qpu`" in text and "torch" in text
    assert "QPU window W=8" in text and "| boltzmann |" in text
    assert (tmp_path / "qpu.json").stat().st_size > 0
