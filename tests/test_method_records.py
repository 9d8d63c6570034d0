"""The method records: a new method is one record plus its function, the registry is read-only, and the limits
that the config and the adapter enforce are the records' numbers."""

import itertools
import math

import pytest
import torch

from boltzmann_attention import BoltzmannAttention, ising
from boltzmann_attention.experiments.config import TrainConfig
from boltzmann_attention.ising.methods import REGISTRY
from boltzmann_attention.ising.record import Method, keyword_options


def _rows(h, J, mask):
    """Each query's (h, J, present spins), the inputs broadcast to one batch shape and flattened; the shape."""
    n = h.shape[-1]
    J = torch.zeros(n, n, dtype=h.dtype) if J is None else J
    mask = torch.ones(n, dtype=torch.bool) if mask is None else mask
    batch = torch.broadcast_shapes(h.shape[:-1], J.shape[:-2], mask.shape[:-1])
    h, J = h.detach().expand(*batch, n).reshape(-1, n), J.detach().expand(*batch, n, n).reshape(-1, n, n)
    mask = mask.expand(*batch, n).reshape(-1, n)
    return [(h[r].tolist(), J[r].tolist(), [j for j in range(n) if mask[r, j]]) for r in range(h.shape[0])], batch


def _states(h, J, present):
    """Every state of the present spins (the others 0), with -E(s) of each, by loops."""
    n = len(h)
    for bits in itertools.product((-1.0, 1.0), repeat=len(present)):
        s = [0.0] * n
        for j, b in zip(present, bits, strict=True):
            s[j] = b
        yield s, sum(h[j] * s[j] for j in range(n)) + sum(
            J[j][k] * s[j] * s[k] for j in range(n) for k in range(j + 1, n))


def loop_marginals(h, J, K, mask, *, temperature=1.0):
    """<s_j> by loops over states at a temperature (1 is the package's Boltzmann distribution)."""
    rows, batch = _rows(h, J, mask)
    out = []
    for hr, Jr, present in rows:
        states = list(_states(hr, Jr, present))
        top = max(e for _, e in states)
        w = [math.exp((e - top) / temperature) for _, e in states]
        out.append([sum(wi * s[j] for wi, (s, _) in zip(w, states, strict=True)) / sum(w) for j in range(len(hr))])
    return torch.tensor(out, dtype=h.dtype).reshape(*batch, h.shape[-1])


def loop_log_partition(h, J, K, mask, *, temperature=1.0):
    rows, batch = _rows(h, J, mask)
    out = []
    for hr, Jr, present in rows:
        energies = [e for _, e in _states(hr, Jr, present)]
        top = max(energies)
        out.append(top / temperature + math.log(sum(math.exp((e - top) / temperature) for e in energies)))
    return torch.tensor(out, dtype=h.dtype).reshape(batch)


def _check(options):
    if options.get("temperature", 1.0) <= 0:
        raise ValueError("temperature must be > 0")


LOOPS = Method("loops", loop_marginals, loop_log_partition, keyword_options(loop_marginals), "exact",
               "n <= 8 spins (loops)", _check, max_spins=8)


def test_a_method_is_one_record_plus_its_function():
    torch.manual_seed(0)
    h = torch.randn(3, 5, dtype=torch.float64)
    J = torch.randn(5, 5, dtype=torch.float64)
    J = (J + J.T) / 2 * (1 - torch.eye(5, dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(ising.marginals(h, J, mask=mask, method=LOOPS),
                               ising.reference.marginals(h, J, None, mask), atol=1e-12, rtol=0)
    torch.testing.assert_close(ising.log_partition(h, J, mask=mask, method=LOOPS),
                               ising.reference.log_partition(h, J, None, mask), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['beta'\] for method 'loops'; known options: "
                                         r"\['temperature'\]"):
        ising.marginals(h, J, method=LOOPS, beta=2.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        ising.marginals(h, J, method=LOOPS, temperature=0.0)


def test_the_layer_takes_a_record_as_its_method_and_checks_its_options_at_construction():
    torch.manual_seed(0)
    exact = BoltzmannAttention(8, 2, max_len=6, coupling_init_std=0.3).double()
    loops = BoltzmannAttention(8, 2, max_len=6, coupling_init_std=0.3, method=LOOPS).double()
    loops.load_state_dict(exact.state_dict())
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    out, weights = loops(x, need_weights=True)
    torch.testing.assert_close(out, exact(x)[0], atol=1e-10, rtol=0)
    assert weights.shape == (2, 2, 6, 6)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        BoltzmannAttention(8, 2, max_len=6, method=LOOPS, method_options={"temperature": -1.0})


def test_the_registry_and_its_views_are_read_only():
    for table in (REGISTRY, ising.METHODS, ising.OPTIONS):
        with pytest.raises(TypeError):
            table["banded"] = LOOPS
        with pytest.raises(TypeError):
            del table["banded"]
    assert ising.resolve_method(LOOPS) is LOOPS and ising.resolve_method("exact") is REGISTRY["exact"]


def test_a_record_refuses_a_kind_it_does_not_know_and_log_z_for_a_sampler():
    with pytest.raises(ValueError, match="kind is one of"):
        Method("x", loop_marginals, loop_log_partition, frozenset(), "heuristic", "", _check)
    with pytest.raises(ValueError, match="sampled method has no log_partition"):
        Method("x", loop_marginals, loop_log_partition, frozenset(), "sampled", "", _check)
    with pytest.raises(ValueError, match="sampled method has no log_partition"):
        Method("x", loop_marginals, None, frozenset(), "exact", "", _check)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_config_enforces_each_records_spin_limit(name):
    record = REGISTRY[name]
    limit = record.spin_limit({})
    if limit is None:
        assert name not in ("exact", "reference", "dqa")
        return
    options = {"num_samples": 4} if record.sampled else {}
    TrainConfig.build(T=min(limit, 12), mode="h+J", method=name, method_options=options).validate()
    if limit < 64:
        with pytest.raises(ValueError, match=f"beyond the limit of method '{name}', {limit} spins per query"):
            TrainConfig.build(T=limit + 1, mode="h+J", method=name, method_options=options).validate()


def test_an_option_moves_the_limit_it_names():
    assert REGISTRY["exact"].spin_limit({"max_spins": 10}) == 10 and REGISTRY["exact"].spin_limit({}) == 24
    assert REGISTRY["banded"].bandwidth_limit({"max_bandwidth": 5}) == 5
    assert REGISTRY["dqa"].spin_limit({"max_spins": 99}) == 16  # dqa takes no such option
    with pytest.raises(ValueError, match=r"'exact', 10 spins per query \(option max_spins\); use coupling='window'"):
        TrainConfig.build(T=12, mode="h+J", method="exact", method_options={"max_spins": 10}).validate()
    with pytest.raises(ValueError, match="beyond its max_bandwidth 5; set coupling_range <= 5"):
        TrainConfig.build(T=12, mode="h+J", method="banded", coupling="relative", coupling_range=6,
                          method_options={"max_bandwidth": 5}).validate()
