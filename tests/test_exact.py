"""Split enumeration ('exact') against the float64 brute-force reference."""

import itertools

import pytest
import torch
from conftest import symmetric_couplings, symmetric_three_body

from boltzmann_attention import ising
from boltzmann_attention.ising import reference


def _compare(h, J, K, mask, atol, device="cpu", method="exact"):
    """The method on ``device`` against the float64 reference on the CPU."""
    moved = [None if x is None else x.to(device) for x in (h, J, K, mask)]
    m = ising.marginals(*moved[:3], mask=moved[3], method=method)
    logz = ising.log_partition(*moved[:3], mask=moved[3], method=method)
    assert m.shape == h.shape and logz.shape == h.shape[:-1] and m.device == torch.device(device)
    torch.testing.assert_close(m.cpu(), reference.marginals(h, J, K, mask), atol=atol, rtol=0)
    torch.testing.assert_close(logz.cpu(), reference.log_partition(h, J, K, mask), atol=atol, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_K", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_half_precision_is_as_close_to_the_reference_as_its_dtype_resolves(dtype, with_K, with_mask):
    """Inputs in half precision give the float64 marginals of those same inputs, rounded to the dtype: the sums of
    2^n Boltzmann weights are not done in half precision."""
    g = torch.Generator().manual_seed(3)
    n = 12
    h = torch.randn(2, 4, n, dtype=torch.float64, generator=g).to(dtype)
    J = symmetric_couplings(n, 2, 1, scale=0.5, generator=g).to(dtype)
    K = symmetric_three_body(n, scale=0.2, generator=g).to(dtype) if with_K else None
    mask = torch.rand(2, 4, n, generator=g) > 0.3 if with_mask else None
    h.requires_grad_()
    m = ising.marginals(h, J, K, mask=mask, method="exact")
    expected = reference.marginals(h.double(), J.double(), None if K is None else K.double(), mask)
    assert m.dtype == dtype
    torch.testing.assert_close(m.double(), expected, atol=torch.finfo(dtype).eps, rtol=0)
    logz = ising.log_partition(h, J, K, mask=mask, method="exact")
    assert logz.dtype == dtype
    torch.testing.assert_close(logz.double(), reference.log_partition(h.double(), J.double(), None if K is None
                                                                      else K.double(), mask),
                               atol=0, rtol=torch.finfo(dtype).eps)
    m.sum().backward()
    assert h.grad.dtype == dtype and torch.isfinite(h.grad).all()


@pytest.mark.parametrize("n", [1, 2, 5, 7, 8, 13])
@pytest.mark.parametrize("with_K", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_matches_reference(n, with_K, with_mask, device):
    g = torch.Generator().manual_seed(n)
    queries = 3 if n == 13 else 4
    h = torch.randn(2, queries, n, dtype=torch.float64, generator=g)
    J = symmetric_couplings(n, 2, 1, generator=g)  # one J per leading batch entry, shared over queries
    K = symmetric_three_body(n, scale=0.3, generator=g) if with_K else None
    mask = torch.rand(2, queries, n, generator=g) > 0.3 if with_mask else None
    _compare(h, J, K, mask, atol=1e-12, device=device)


@pytest.mark.parametrize("method", ["exact", "configurations"])
def test_prefix_masks_match_reference(method, device):
    n = 9
    h = torch.randn(5, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    J = symmetric_couplings(n, generator=torch.Generator().manual_seed(10))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    _compare(h, J, None, causal, atol=1e-12, device=device, method=method)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 11])
@pytest.mark.parametrize("with_mask", [False, True])
def test_configurations_method_matches_reference(n, with_mask, device):
    """Method 'configurations' (softmax attention over the 2^n states) on full couplings: the reference's marginals
    and log Z, with a J per group, absent spins as free spins."""
    g = torch.Generator().manual_seed(n)
    h = torch.randn(3, 4, n, dtype=torch.float64, generator=g)
    J = symmetric_couplings(n, 3, 1, generator=g)
    mask = torch.rand(3, 4, n, generator=g) > 0.3 if with_mask else None
    _compare(h, J, None, mask, atol=1e-12, device=device, method="configurations")


def test_configurations_method_gradcheck_and_limits():
    g = torch.Generator().manual_seed(5)
    n = 4
    h = torch.randn(2, 3, n, dtype=torch.float64, generator=g, requires_grad=True)
    A = torch.randn(n, n, dtype=torch.float64, generator=g, requires_grad=True)
    mask = torch.rand(2, 3, n, generator=g) > 0.3
    for fn in (ising.marginals, ising.log_partition):
        assert torch.autograd.gradcheck(lambda h, A, fn=fn: fn(h, A.triu(1) + A.triu(1).T, mask=mask,
                                                               method="configurations"), (h, A))
    with pytest.raises(ValueError, match=r"n <= 16 spins per query \(got 17; option max_spins\)\. Use method"):
        ising.marginals(torch.zeros(17, dtype=torch.float64), method="configurations")
    with pytest.raises(ValueError, match="pairwise couplings only"):
        ising.marginals(torch.zeros(3, dtype=torch.float64), None, torch.zeros(3, 3, 3, dtype=torch.float64),
                        method="configurations")
    m = ising.marginals(h.detach().to(torch.bfloat16), (A.triu(1) + A.triu(1).T).detach().to(torch.bfloat16),
                        method="configurations")
    assert m.dtype == torch.bfloat16


def test_fully_masked_query_gives_zero():
    h = torch.randn(3, 4, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True], [False] * 4, [True] * 4])
    m = ising.marginals(h, symmetric_couplings(4), mask=mask)
    assert torch.equal(m[1], torch.zeros(4, dtype=torch.float64))
    assert ising.log_partition(h, symmetric_couplings(4), mask=mask)[1] == 0


def test_masked_system_equals_smaller_system():
    n = 6
    h = torch.randn(4, n, dtype=torch.float64)
    J = symmetric_couplings(n)
    keep = torch.tensor([0, 2, 3, 5])
    mask = torch.zeros(n, dtype=torch.bool)
    mask[keep] = True
    m = ising.marginals(h, J, mask=mask)
    small = ising.marginals(h[:, keep], J[keep][:, keep])
    torch.testing.assert_close(m[:, keep], small, atol=1e-13, rtol=0)
    assert (m[:, ~mask] == 0).all()


@pytest.mark.parametrize("scale", [30.0, 1e4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_fields_and_couplings_stay_finite_and_exact(scale, dtype):
    """Z underflows in the shifted GEMM here; the float64 log-space fallback must take over."""
    g = torch.Generator().manual_seed(1)
    n = 10
    h = torch.randn(6, n, dtype=torch.float64, generator=g) * scale
    J = symmetric_couplings(n, generator=g, scale=scale)
    m = ising.marginals(h.to(dtype), J.to(dtype))
    logz = ising.log_partition(h.to(dtype), J.to(dtype))
    assert torch.isfinite(m).all() and torch.isfinite(logz).all()
    atol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(m.double(), reference.marginals(h, J), atol=atol, rtol=0)
    torch.testing.assert_close(logz.double(), reference.log_partition(h, J), atol=0, rtol=1e-6)


@pytest.mark.parametrize("seed, n, field_scale, coupling_scale", [(2, 16, 2.0, 0.3), (10, 14, 6.0, 0.5)])
def test_float32_accuracy(seed, n, field_scale, coupling_scale):
    """Typical values, and strong fields whose weights mostly underflow (the floored, denormal-free path):
    float32 agrees with the float64 reference, and the denormal mode is restored afterwards."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(32, n, dtype=torch.float64, generator=g) * field_scale
    J = symmetric_couplings(n, generator=g, scale=coupling_scale)
    m = ising.marginals(h.float(), J.float())
    assert (m.double() - reference.marginals(h, J)).abs().max() < 1e-5
    assert bool(torch.tensor(1e-30) * torch.tensor(1e-10) != 0)  # denormals are back on


def test_gradcheck_h_J_K_with_mask():
    g = torch.Generator().manual_seed(3)
    n = 5
    h = torch.randn(2, 2, n, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(n, n, dtype=torch.float64, generator=g, requires_grad=True)
    V = torch.randn(n, n, n, dtype=torch.float64, generator=g, requires_grad=True)
    mask = torch.rand(2, 2, n, generator=g) > 0.2
    i = torch.arange(n)
    ordered = (i[:, None, None] < i[None, :, None]) & (i[None, :, None] < i[None, None, :])

    def couplings(W, V):
        J = W.triu(1) + W.triu(1).T
        U = V * ordered
        K = sum(U.permute(*p) for p in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
        return J, K

    def f(h, W, V):
        J, K = couplings(W, V)
        return ising.marginals(h, J, K, mask=mask), ising.log_partition(h, J, K, mask=mask)

    assert torch.autograd.gradcheck(f, (h, W, V), fast_mode=True)
    assert torch.autograd.gradcheck(lambda h, W: f(h, W, V.detach()), (h, W))
    # and the gradient equals the reference's
    J, K = couplings(W, V)
    grads = torch.autograd.grad(ising.marginals(h, J, K, mask=mask).pow(2).sum(), (h, W, V))
    ref = torch.autograd.grad(reference.marginals(h, *couplings(W, V), mask).pow(2).sum(), (h, W, V))
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_size_limit_names_alternatives():
    with pytest.raises(ValueError, match=r"n <= 24.*banded.*meanfield"):
        ising.marginals(torch.zeros(1, 25), symmetric_couplings(25, dtype=torch.float32))
    with pytest.raises(ValueError, match="n <= 6"):
        ising.marginals(torch.zeros(1, 7), symmetric_couplings(7, dtype=torch.float32), max_spins=6)
    # the limit counts present spins: 30 keys with 10 present is fine
    mask = torch.zeros(30, dtype=torch.bool)
    mask[:10] = True
    m = ising.marginals(torch.randn(2, 30, dtype=torch.float64), symmetric_couplings(30), mask=mask)
    assert (m[:, 10:] == 0).all()


def _symmetrised(x):
    return sum(x.permute(*range(x.dim() - 3), *(x.dim() - 3 + p for p in perm))
               for perm in itertools.permutations(range(3)))


@pytest.mark.parametrize("with_K", [False, True])
def test_every_bucketing_matches_reference(monkeypatch, with_K):
    """Causal masks go through size buckets padded with free spins; every bucketing (all patterns in one
    padded call, one call per size, the cost model's choice) gives the reference's values and gradients."""
    from boltzmann_attention.ising import planner

    n = 6
    g = torch.Generator().manual_seed(4)
    h = torch.randn(2, 3, n, n, dtype=torch.float64, generator=g, requires_grad=True)
    J = symmetric_couplings(n, 3, 1, generator=g).requires_grad_()
    K = symmetric_three_body(n, 3, 1, scale=0.3, generator=g).requires_grad_() if with_K else None
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    inputs = (h, J) + ((K,) if with_K else ())

    def values_and_gradients(marginals, log_partition):
        m, logz = marginals(h, J, K, causal), log_partition(h, J, K, causal)
        grads = torch.autograd.grad((m**2).sum() + logz.sum(), inputs)
        # J and K are symmetric: only the gradient summed over the equal entries is path independent
        return (m, logz, grads[0], grads[1] + grads[1].mT, *(grads[2:] and [_symmetrised(grads[2])]))

    expected = values_and_gradients(reference.marginals, reference.log_partition)
    sizes = set()
    for overhead in (planner.CALL_OVERHEAD, 1e30, 0):
        monkeypatch.setattr(planner, "CALL_OVERHEAD", overhead)
        plan = planner.plan(*planner.mask_patterns(causal.expand(3, n, n).reshape(3, n, n))[::2], torch.float64)
        sizes.add(len(plan.buckets))
        result = values_and_gradients(lambda *a: ising.marginals(*a[:3], mask=a[3]),
                                      lambda *a: ising.log_partition(*a[:3], mask=a[3]))
        for a, b in zip(result, expected):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    assert {1, n} <= sizes  # one padded call (huge overhead) and one call per size (no overhead) both ran


@pytest.mark.parametrize("with_K", [False, True])
def test_bucketed_patterns_with_an_empty_one_match_reference(with_K):
    """Every group holding each pattern equally often (the bucketed path), one pattern without any present
    spin (marginals 0, log Z 0): values and gradients against the float64 reference."""
    n = 5
    g = torch.Generator().manual_seed(11)
    patterns = torch.tensor([[False] * n, [True, False, True, False, False], [True] * n,
                             [False, True, True, True, False]])
    mask = patterns[torch.tensor([2, 0, 1, 3, 1, 2, 0, 3])].view(1, 8, n).expand(2, 8, n)  # 2 of each per group
    h = torch.randn(2, 8, n, dtype=torch.float64, generator=g, requires_grad=True)
    J = symmetric_couplings(n, 2, 1, generator=g).requires_grad_()
    K = symmetric_three_body(n, 2, 1, scale=0.3, generator=g).requires_grad_() if with_K else None
    inputs = (h, J) + ((K,) if with_K else ())
    from boltzmann_attention.ising import planner
    assert planner.mask_patterns(mask.contiguous())[2] is not None  # the bucketed path, not pattern by pattern
    results = []
    for module in (ising, reference):
        if module is ising:
            m, logz = ising.marginals(h, J, K, mask=mask), ising.log_partition(h, J, K, mask=mask)
        else:
            m, logz = reference.marginals(h, J, K, mask), reference.log_partition(h, J, K, mask)
        grads = torch.autograd.grad((m**2).sum() + logz.sum(), inputs)
        results.append((m, logz, grads[0], grads[1] + grads[1].mT, *(grads[2:] and [_symmetrised(grads[2])])))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    assert (results[0][0][:, 1] == 0).all() and (results[0][1][:, 1] == 0).all()
