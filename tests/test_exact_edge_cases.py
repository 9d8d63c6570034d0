"""exact at the edges: huge and near-overflow values, empty inputs, closed forms, the hand-written
backward on every path (no mask, buckets, blocks, chunks, fallback), and CUDA (skipped without a GPU)."""

import math

import pytest
import torch
from conftest import symmetric_couplings

from boltzmann_attention import ising, value_checks
from boltzmann_attention.ising import numerics, reference


@pytest.fixture(autouse=True)
def host_checks():
    """These edges are the float64 rescue, which runs where checks read the host: the default on CPU, asked for
    on CUDA (whose default refuses such rows by an asynchronous assert, tests/test_host_sync.py)."""
    with value_checks("host"):
        yield


def _sym(W):
    return W.triu(1) + W.triu(1).mT


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fields_fighting_huge_couplings_stay_normalised(dtype, device):
    """Fields of 1e15 against couplings of 2e15: the marginals stay normalised in the log-domain fallback."""
    h = torch.tensor([1.5e15, -1e15, 0.5, 0.5], dtype=dtype, device=device)
    J = torch.zeros(4, 4, dtype=dtype, device=device)
    J[0, 1] = J[1, 0] = 2e15
    m = ising.marginals(h, J)
    expected = torch.tensor([1, 1, math.tanh(0.5), math.tanh(0.5)], dtype=torch.float64, device=device)
    torch.testing.assert_close(m.double(), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(m.double(), reference.marginals(h.double(), J.double()), atol=1e-6, rtol=0)


@pytest.mark.parametrize("scale", [1e17, 1e30])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("masking", ["random", "causal"])
def test_huge_masked_values_match_reference(scale, dtype, masking, device):
    """Fields and couplings of 1e17 and 1e30, masked at random or causally: marginals within [-1, 1], equal to
    the reference's."""
    g = torch.Generator().manual_seed(5)
    n = 7
    h = torch.randn(3, n, n, dtype=torch.float64, generator=g) * scale
    J = symmetric_couplings(n, generator=g, scale=scale)
    mask = (torch.rand(3, n, n, generator=g) > 0.3) if masking == "random" else torch.ones(n, n).tril().bool()
    h, J, mask = h.to(device), J.to(device), mask.to(device)
    m = ising.marginals(h.to(dtype), J.to(dtype), mask=mask)
    assert m.abs().max() <= 1
    truth = reference.marginals(h.to(dtype).double(), J.to(dtype).double(), mask=mask)
    torch.testing.assert_close(m.double(), truth, atol=1e-6, rtol=0)


@pytest.mark.parametrize("scale", [1.0, 1e17, 1e30])
def test_reference_masked_equals_the_reduced_system(scale):
    """The oracle itself: absent spins get marginal 0 and leave the others' marginals and log Z those of the
    system without them, at any scale. (At 1e17 the GEMM of the energies rounded the two configurations of an
    absent spin differently on an AMD CPU, which made it +-1.)"""
    g = torch.Generator().manual_seed(5)
    n = 7
    h = torch.randn(3, n, n, dtype=torch.float64, generator=g) * scale  # the shapes of the test above
    J = symmetric_couplings(n, generator=g, scale=scale)
    mask = torch.rand(3, n, n, generator=g) > 0.3
    m, logz = reference.marginals(h, J, mask=mask), reference.log_partition(h, J, mask=mask)
    assert (m[~mask] == 0).all()
    for b in range(3):
        for q in range(n):
            present = mask[b, q].nonzero().squeeze(-1)
            sub_h, sub_J = h[b, q, present], J[present][:, present]
            torch.testing.assert_close(m[b, q, present], reference.marginals(sub_h, sub_J), atol=1e-12, rtol=0)
            torch.testing.assert_close(logz[b, q], reference.log_partition(sub_h, sub_J), atol=1e-9, rtol=1e-15)


def test_float32_near_its_maximum_is_solved_in_float64(device):
    g = torch.Generator().manual_seed(6)
    n = 6
    h = (torch.randn(4, n, generator=g) * 2e38 / 3).clamp(-3e38, 3e38)
    J = _sym(torch.randn(n, n, generator=g)).clamp(-1, 1) * 2e38
    h, J = h.to(device), J.to(device)
    causal = torch.ones(4, n, dtype=torch.bool, device=device).tril()[:, :n]
    for mask in (None, causal):
        m = ising.marginals(h, J, mask=mask)
        assert torch.isfinite(m).all() and m.abs().max() <= 1
        truth = reference.marginals(h.double(), J.double(), mask=mask)
        torch.testing.assert_close(m.double(), truth, atol=1e-6, rtol=0)
        with pytest.raises(ValueError, match="log Z.*float32"):  # log Z ~ 1e39 is beyond float32
            ising.log_partition(h, J, mask=mask)
        assert torch.isfinite(ising.log_partition(h.double(), J.double(), mask=mask)).all()


def test_float64_energies_beyond_its_range_raise(device):
    h = torch.full((2, 4), 1e308, dtype=torch.float64, device=device)
    J = _sym(torch.full((4, 4), 1e308, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="overflow float64"):
        ising.marginals(h, J)


def test_float32_small_fields_next_to_huge_ones_are_not_rounded_away(device):
    """float32 log-weights of 2^45 + 0.5 lose the 0.5: such rows are solved in float64 (dyadic values,
    so that float64 is exact here)."""
    h = torch.tensor([[2.0**45, 0.5, 0.5, -0.25]], device=device)
    J = torch.zeros(4, 4, device=device)
    J[0, 1] = J[1, 0] = 0.125
    J[2, 3] = J[3, 2] = -0.375
    m = ising.marginals(h, J)
    torch.testing.assert_close(m.double(), reference.marginals(h.double(), J.double()), atol=1e-6, rtol=0)
    assert abs(float(m[0, 1]) - math.tanh(0.625)) < 1e-6  # s_0 = +1 frozen: spin 1 sees 0.5 + 0.125


@pytest.mark.parametrize("h1, coupling", [(0.7, 0.4), (3.0, -2.0), (-40.0, 25.0)])
def test_two_spins_closed_form(h1, coupling, device):
    """h = (h1, 0), J_12 = J: <s_1> = tanh h1, <s_2> = tanh J tanh h1, Z = 4 cosh h1 cosh J."""
    h = torch.tensor([h1, 0.0], dtype=torch.float64, device=device)
    J = torch.tensor([[0.0, coupling], [coupling, 0.0]], dtype=torch.float64, device=device)
    m = ising.marginals(h, J)
    torch.testing.assert_close(m, torch.tensor([math.tanh(h1), math.tanh(coupling) * math.tanh(h1)],
                                               dtype=torch.float64, device=device), atol=1e-14, rtol=0)
    logz = math.log(4) + math.log(math.cosh(h1)) + math.log(math.cosh(coupling))
    assert abs(float(ising.log_partition(h, J)) - logz) < 1e-12


def test_empty_inputs_give_empty_results(device):
    for h, J, mask in [(torch.zeros(3, 0), torch.zeros(0, 0), None),
                       (torch.zeros(0, 5), symmetric_couplings(5, dtype=torch.float32), None),
                       (torch.zeros(0, 5), symmetric_couplings(5, dtype=torch.float32), torch.ones(0, 5).bool()),
                       (torch.zeros(2, 0, 4), symmetric_couplings(4, dtype=torch.float32), torch.ones(4).bool())]:
        h = h.to(device).requires_grad_()
        m = ising.marginals(h, J.to(device), mask=mask.to(device) if mask is not None else None)
        logz = ising.log_partition(h, J.to(device), mask=mask.to(device) if mask is not None else None)
        assert m.shape == h.shape and logz.shape == h.shape[:-1]
        assert (logz == 0).all()
        (m.sum() + logz.sum()).backward()
        assert h.grad.shape == h.shape


def _pairwise_function(mask):
    def f(h, W):
        J = _sym(W)
        return ising.marginals(h, J, mask=mask), ising.log_partition(h, J, mask=mask)
    return f


@pytest.mark.parametrize("masking", ["none", "causal", "random", "padding+causal"])
def test_gradcheck_pairwise_paths(masking, device):
    """The hand-written backward (h and J, marginals and log Z) on the unmasked, bucketed and
    per-pattern paths."""
    g = torch.Generator().manual_seed(7)
    n = 5
    h = torch.randn(2, n, n, dtype=torch.float64, generator=g).to(device).requires_grad_()
    W = torch.randn(n, n, dtype=torch.float64, generator=g).to(device).requires_grad_()
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    lengths = torch.tensor([[3], [5]], device=device)  # right padding: keys beyond each item's length
    mask = {"none": None, "causal": causal, "random": (torch.rand(2, n, n, generator=g) > 0.4).to(device),
            "padding+causal": causal & (torch.arange(n, device=device) < lengths)[:, None]}[masking]
    assert torch.autograd.gradcheck(_pairwise_function(mask), (h, W), fast_mode=True)
    if masking == "causal":  # the training path: the J gradient in full
        assert torch.autograd.gradcheck(lambda W: _pairwise_function(mask)(h[:1].detach(), W), (W,))


@pytest.mark.parametrize("block", [48, 300])
def test_blocked_table_and_chunked_queries_match_reference(monkeypatch, block):
    """Tables above BLOCK_ELEMENTS are rebuilt block by block (48: rows of one group per block; 300: two
    whole groups of 8 x 16 entries per block, the last block one), queries above CHUNK_ELEMENTS split: force
    both at small n and check values and gradients."""
    monkeypatch.setattr(numerics, "BLOCK_ELEMENTS", block)
    monkeypatch.setattr(numerics, "CHUNK_ELEMENTS", 64)
    assert len(numerics.row_blocks(5, 8, 16)) == (15 if block == 48 else 3)
    g = torch.Generator().manual_seed(8)
    n = 7
    h = torch.randn(5, 10, n, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(5, 1, n, n, dtype=torch.float64, generator=g, requires_grad=True)
    causal = torch.ones(10, n, dtype=torch.bool).tril()
    for mask in (None, causal):
        m, logz = _pairwise_function(mask)(h, W)
        J = _sym(W)
        torch.testing.assert_close(m, reference.marginals(h, J, mask=mask), atol=1e-12, rtol=0)
        torch.testing.assert_close(logz, reference.log_partition(h, J, mask=mask), atol=1e-12, rtol=0)
        grads = torch.autograd.grad((m ** 3).sum() + logz.sum(), (h, W))
        ref = torch.autograd.grad((reference.marginals(h, J, mask=mask) ** 3).sum()
                                  + reference.log_partition(h, J, mask=mask).sum(), (h, W))
        for a, b in zip(grads, ref):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    small = (h[:1, :3].detach().requires_grad_(), W[:1].detach().requires_grad_())
    assert torch.autograd.gradcheck(_pairwise_function(None), small, fast_mode=True)
    raw = torch.randn(5, 1, n, n, n, dtype=torch.float64, generator=g, requires_grad=True)

    def three_body(raw):  # symmetric, zero wherever two indices agree
        K = sum(raw.permute(0, 1, *p) for p in ((2, 3, 4), (2, 4, 3), (3, 2, 4), (3, 4, 2), (4, 2, 3), (4, 3, 2)))
        eye = torch.eye(n, dtype=torch.float64)
        return K * (1 - eye[:, :, None]) * (1 - eye[:, None]) * (1 - eye[None]) / 6

    got = ising.marginals(h, _sym(W), three_body(raw), method="exact")  # the three-body path reads the same blocks
    expected = reference.marginals(h, _sym(W), three_body(raw))
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    for a, b in zip(torch.autograd.grad((got ** 3).sum(), (h, W, raw)),
                    torch.autograd.grad((expected ** 3).sum(), (h, W, raw))):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("masking", [False, True])
def test_float64_fallback_values_and_gradients(monkeypatch, masking):
    """Rows routed to the float64 fallback (here: every float32 row) keep the reference's values and
    gradients."""
    monkeypatch.setattr(numerics, "FLOAT32_SCALE_LIMIT", 0.0)
    g = torch.Generator().manual_seed(9)
    n = 6
    h64 = torch.randn(3, n, dtype=torch.float64, generator=g)
    W64 = torch.randn(n, n, dtype=torch.float64, generator=g)
    mask = torch.rand(3, n, generator=g) > 0.3 if masking else None
    h, W = h64.float().requires_grad_(), W64.float().requires_grad_()
    m = ising.marginals(h, _sym(W), mask=mask)
    logz = ising.log_partition(h, _sym(W), mask=mask)
    h64, W64 = h.detach().double().requires_grad_(), W.detach().double().requires_grad_()
    m_ref = reference.marginals(h64, _sym(W64), mask=mask)
    logz_ref = reference.log_partition(h64, _sym(W64), mask=mask)
    torch.testing.assert_close(m.double(), m_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(logz.double(), logz_ref, atol=1e-5, rtol=0)
    grads = torch.autograd.grad((m ** 2).sum() + logz.sum(), (h, W))
    ref = torch.autograd.grad((m_ref ** 2).sum() + logz_ref.sum(), (h64, W64))
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("with_mask", [False, True])
def test_matches_reference_on_device(n, with_mask, device):
    """The float64 reference checks on every device (CUDA where present)."""
    g = torch.Generator().manual_seed(n)
    h = torch.randn(2, 4, n, dtype=torch.float64, generator=g).to(device)
    J = symmetric_couplings(n, 2, 1, generator=g).to(device)
    mask = (torch.rand(2, 4, n, generator=g) > 0.3).to(device) if with_mask else None
    causal = torch.ones(4, n, dtype=torch.bool, device=device).tril()
    for msk in (mask, causal):
        m = ising.marginals(h, J, mask=msk)
        assert m.device.type == device.type
        torch.testing.assert_close(m, reference.marginals(h, J, mask=msk), atol=1e-12, rtol=0)
        torch.testing.assert_close(ising.log_partition(h, J, mask=msk), reference.log_partition(h, J, mask=msk),
                                   atol=1e-12, rtol=0)
