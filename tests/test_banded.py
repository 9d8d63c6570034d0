"""Transfer-matrix marginals for banded couplings against the brute-force reference (float64)."""

import pytest
import torch

from boltzmann_attention import ising
from boltzmann_attention.ising import banded, reference

TOL = 1e-10


def band_mask(n: int, w: int) -> torch.Tensor:
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
    return (distance > 0) & (distance <= w)


def banded_couplings(free: torch.Tensor, w: int) -> torch.Tensor:
    """Symmetric, zero-diagonal, bandwidth-w J from any (..., n, n) tensor (differentiable)."""
    return (free + free.transpose(-1, -2)) / 2 * band_mask(free.shape[-1], w)


def random_problem(seed: int, n: int, w: int, queries: int = 5, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    h = scale * torch.randn(queries, n, generator=g, dtype=torch.float64)
    J = banded_couplings(scale * torch.randn(n, n, generator=g, dtype=torch.float64), w)
    return h, J, g


def make_mask(kind: str, queries: int, n: int, g: torch.Generator):
    if kind == "none":
        return None
    if kind == "prefix":  # query i sees spins 0 .. L_i - 1 (L_i = 0 included)
        lengths = torch.randint(0, n + 1, (queries,), generator=g)
        return torch.arange(n) < lengths[:, None]
    return torch.rand(queries, n, generator=g) < 0.7  # holes anywhere


@pytest.fixture
def log_domain(monkeypatch):
    """Force the log-domain recursion (normally used only for large couplings or masks with holes)."""
    monkeypatch.setattr(banded, "_linear_limit", lambda *args: -1.0)


def check_against_reference(h, J, mask, device="cpu", **options):
    """banded on ``device`` against the float64 reference on the CPU."""
    moved = [None if x is None else x.to(device) for x in (h, J, mask)]
    assert torch.allclose(banded.marginals(moved[0], moved[1], None, moved[2], **options).cpu(),
                          reference.marginals(h, J, None, mask), rtol=0, atol=TOL)
    assert torch.allclose(banded.log_partition(moved[0], moved[1], None, moved[2], **options).cpu(),
                          reference.log_partition(h, J, None, mask), rtol=0, atol=TOL)


@pytest.mark.parametrize("n,w", [(7, 1), (7, 2), (8, 3), (12, 3), (9, 4), (6, 5), (12, 6), (12, 8)])
@pytest.mark.parametrize("mask_kind", ["none", "prefix", "random"])
def test_matches_reference(n, w, mask_kind, device):
    h, J, g = random_problem(n * 10 + w, n, w)
    check_against_reference(h, J, make_mask(mask_kind, h.shape[0], n, g), device)


@pytest.mark.parametrize("block", [1, 2, 3])
def test_block_sizes(block, monkeypatch):
    """k spins per block (a state then spans several blocks); the default is k = 4."""
    monkeypatch.setattr(banded, "LINEAR_BLOCK", block)
    h, J, g = random_problem(block, 12, 6)
    for kind in ("none", "prefix"):
        check_against_reference(h, J, make_mask(kind, h.shape[0], 12, g))


@pytest.mark.parametrize("n,w", [(7, 2), (9, 4)])
@pytest.mark.parametrize("mask_kind", ["none", "prefix"])
def test_log_domain_matches_reference(n, w, mask_kind, log_domain, device):
    h, J, g = random_problem(n + w, n, w)
    check_against_reference(h, J, make_mask(mask_kind, h.shape[0], n, g), device)


def test_full_bandwidth_is_enumeration():
    h, J, _ = random_problem(0, 6, 5)
    check_against_reference(h, J, None)
    check_against_reference(h, J, None, bandwidth=5)


def test_explicit_bandwidth_larger_than_needed():
    h, J, g = random_problem(1, 10, 2)
    check_against_reference(h, J, make_mask("prefix", 5, 10, g), bandwidth=4)


def test_absent_spins_have_zero_marginals():
    h, J, g = random_problem(2, 9, 3)
    mask = make_mask("random", 5, 9, g)
    m = banded.marginals(h, J, None, mask)
    assert (m[~mask] == 0).all()


def test_grouped_and_broadcast_couplings():
    g = torch.Generator().manual_seed(3)
    n, w = 10, 2
    h = torch.randn(3, 4, n, generator=g, dtype=torch.float64)
    J = banded_couplings(torch.randn(3, 1, n, n, generator=g, dtype=torch.float64), w)  # one J per row
    mask = torch.rand(4, n, generator=g) < 0.8
    check_against_reference(h, J, mask)
    single = torch.randn(n, generator=g, dtype=torch.float64)  # h broadcast against J's batch
    assert banded.marginals(single, J, None, None).shape == (3, 1, n)
    check_against_reference(single, J, None)


def test_chunks_and_checkpoints_agree(monkeypatch):
    g = torch.Generator().manual_seed(4)
    n, w = 24, 8
    h = torch.randn(4, n, generator=g, dtype=torch.float64, requires_grad=True)
    free = torch.randn(n, n, generator=g, dtype=torch.float64, requires_grad=True)
    mask = make_mask("prefix", 4, n, g)
    weights = torch.randn(4, n, generator=g, dtype=torch.float64)

    def run(**options):
        J = banded_couplings(free, w)
        m = banded.marginals(h, J, None, mask, bandwidth=w, **options)
        z = banded.log_partition(h, J, None, mask, bandwidth=w, **options)
        grads = torch.autograd.grad((m * weights).sum() + z.sum(), (h, free))
        return (m, z, *grads)

    expected = run()
    monkeypatch.setattr(banded, "MESSAGE_BUDGET", 2**14)  # forces checkpointing (recomputed messages)
    for chunk_size in (None, 2):
        for a, b in zip(run(chunk_size=chunk_size), expected):
            assert torch.allclose(a, b, rtol=0, atol=TOL)


def test_chunks_fit_the_message_budget(monkeypatch):
    """Default chunks (queries sorted longest first) hold as many queries as keep their forward messages
    within MESSAGE_BUDGET (at least one), and no more than the cache-sized width; chunk_size overrides."""
    w, k = 8, 4
    last = torch.tensor([9, 9, 7, 5, 5, 2, 0])              # last block of each query
    monkeypatch.setattr(banded, "MESSAGE_BUDGET", 12 * 2**w * 4)  # 12 blocks of float32 messages
    chunks = banded._chunks(last, 40, w, k, torch.float32, False, None)
    assert chunks == [(0, 1), (1, 2), (2, 3), (3, 5), (5, 7)]
    assert banded._chunks(last, 40, w, k, torch.float32, True, None)[:2] == [(0, 1), (1, 2)]  # 10 > 6 blocks
    assert banded._chunks(last, 40, w, k, torch.float32, False, 3) == [(0, 3), (3, 6), (6, 7)]
    monkeypatch.setattr(banded, "CHUNK_ENTRIES", 2 * 2**w)  # width 2 at most
    assert banded._chunks(last, 40, w, k, torch.float32, False, None)[-1] == (5, 7)
    monkeypatch.setattr(banded, "MESSAGE_BUDGET", 2**30)
    assert banded._chunks(last, 40, w, k, torch.float32, False, None) == [(0, 2), (2, 4), (4, 6), (6, 7)]


@pytest.mark.parametrize("mask_kind", ["none", "prefix", "random"])
@pytest.mark.parametrize("domain", ["scaled", "log"])
def test_gradcheck(mask_kind, domain, request):
    if domain == "log":
        request.getfixturevalue("log_domain")
    g = torch.Generator().manual_seed(5)
    n, w = 6, 2
    h = torch.randn(2, n, generator=g, dtype=torch.float64, requires_grad=True)
    free = torch.randn(n, n, generator=g, dtype=torch.float64, requires_grad=True)
    mask = make_mask(mask_kind, 2, n, g)
    fast = not (mask_kind == "prefix" and domain == "scaled")  # one full check; random projections elsewhere
    torch.autograd.gradcheck(lambda h, f: banded.marginals(h, banded_couplings(f, w), None, mask, bandwidth=w),
                             (h, free), fast_mode=fast)
    torch.autograd.gradcheck(lambda h, f: banded.log_partition(h, banded_couplings(f, w), None, mask, bandwidth=w),
                             (h, free), fast_mode=fast)


def test_gradients_match_reference_autograd():
    h, J, g = random_problem(6, 9, 3)
    mask = make_mask("random", 5, 9, g)
    weights = torch.randn(5, 9, generator=g, dtype=torch.float64)
    band = band_mask(9, 3)
    for fn, ref in ((banded.marginals, reference.marginals), (banded.log_partition, reference.log_partition)):
        grads = []
        for f in (fn, ref):
            hh, JJ = h.clone().requires_grad_(), J.clone().requires_grad_()
            out = f(hh, JJ, None, mask, **({"bandwidth": 3} if f is fn else {}))
            (out * weights[..., : out.shape[-1]] if out.dim() == 2 else out * weights[:, 0]).sum().backward()
            grads.append((hh.grad, JJ.grad * band))  # the J gradient lives on the band (1 <= |j - k| <= w)
        assert torch.allclose(grads[0][0], grads[1][0], rtol=0, atol=TOL)
        assert torch.allclose(grads[0][1], grads[1][1], rtol=0, atol=TOL)


def test_lanes_swept_together_match_reference(monkeypatch):
    """Under a causal mask every head's queries, in every end alignment with the same chain lengths, run
    as lanes of one sweep (several lanes per _Scaled): marginals, log Z and both gradients as the reference."""
    g = torch.Generator().manual_seed(14)
    heads, n, w = 3, 11, 4
    h = torch.randn(2, heads, n, n, generator=g, dtype=torch.float64)
    J = banded_couplings(torch.randn(heads, 1, n, n, generator=g, dtype=torch.float64), w)
    mask = torch.ones(n, n, dtype=torch.bool).tril()  # query i sees spins 0 .. i
    lanes = []
    original = banded._Scaled.__init__
    monkeypatch.setattr(banded._Scaled, "__init__",
                        lambda self, c, *args: lanes.append(c.shape[0]) or original(self, c, *args))
    check_against_reference(h, J, mask)
    assert max(lanes) == 3 * heads  # three of the four alignments share their chain lengths (n = 11, k = 4)
    weights = torch.randn(2, heads, n, n, generator=g, dtype=torch.float64)
    for fn, ref in ((banded.marginals, reference.marginals), (banded.log_partition, reference.log_partition)):
        grads = []
        for f in (fn, ref):
            hh, JJ = h.clone().requires_grad_(), J.clone().requires_grad_()
            out = f(hh, JJ, None, mask, **({"bandwidth": w} if f is fn else {}))
            (out * (weights if out.dim() == 4 else weights[..., 0])).sum().backward()
            grads.append((hh.grad, JJ.grad * band_mask(n, w)))
        assert torch.allclose(grads[0][0], grads[1][0], rtol=0, atol=TOL)
        assert torch.allclose(grads[0][1], grads[1][1], rtol=0, atol=TOL)


def test_log_partition_gradient_is_half_the_correlations():
    h, J, _ = random_problem(7, 8, 2)
    J.requires_grad_()
    banded.log_partition(h, J, None, None, bandwidth=2).sum().backward()
    expected = 0.5 * reference.correlations(h, J.detach(), None, None).sum(0) * band_mask(8, 2)
    assert torch.allclose(J.grad, expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("mask_kind", ["none", "random"])
def test_no_couplings_gives_tanh(mask_kind):
    g = torch.Generator().manual_seed(8)
    h = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = make_mask(mask_kind, 4, 6, g)
    keep = torch.ones_like(h) if mask is None else mask.double()
    for J in (None, torch.zeros(6, 6, dtype=torch.float64)):
        assert torch.allclose(banded.marginals(h, J, None, mask), torch.tanh(h) * keep, rtol=0, atol=TOL)
        assert torch.allclose(banded.log_partition(h, J, None, mask),
                              (torch.log(2 * torch.cosh(h)) * keep).sum(-1), rtol=0, atol=TOL)
    # J = 0 with an explicit bandwidth runs the chain, and J still gets its (band) gradient
    J = torch.zeros(6, 6, dtype=torch.float64, requires_grad=True)
    check_against_reference(h, J.detach(), mask, bandwidth=2)
    banded.log_partition(h, J, None, mask, bandwidth=2).sum().backward()
    expected = 0.5 * reference.correlations(h, J.detach(), None, mask).sum(0) * band_mask(6, 2)
    assert torch.allclose(J.grad, expected, rtol=0, atol=TOL)


def test_errors():
    h, J, _ = random_problem(9, 8, 3)
    with pytest.raises(ValueError, match="not banded with bandwidth 2.*exact.*meanfield"):
        banded.marginals(h, J, None, None, bandwidth=2)
    with pytest.raises(ValueError, match="max_bandwidth=2.*exact.*meanfield"):
        banded.log_partition(h, J, None, None, max_bandwidth=2)
    with pytest.raises(ValueError, match="pairwise couplings only.*exact"):
        banded.marginals(h, J, torch.zeros(8, 8, 8, dtype=torch.float64), None)
    with pytest.raises(ValueError, match="not banded"):
        ising.marginals(h, J, method="banded", bandwidth=1)
    with pytest.raises(ValueError, match="explicit `bandwidth` when J is trained"):
        banded.marginals(h, J.clone().requires_grad_(), None, None)  # inferring w would starve J's gradient


@pytest.mark.parametrize("mask_kind", ["none", "random"])
def test_large_values(mask_kind):
    """|h|, |J| ~ 1e4: finite, in [-1, 1], and equal to the reference (itself fine in float64)."""
    h, J, g = random_problem(10, 10, 3, scale=1e4)
    mask = make_mask(mask_kind, 5, 10, g)
    check_against_reference(h, J, mask)
    hh, JJ = h.clone().requires_grad_(), J.clone().requires_grad_()
    (banded.marginals(hh, JJ, None, mask, bandwidth=3).sum()
     + banded.log_partition(hh, JJ, None, mask, bandwidth=3).sum()).backward()
    assert torch.isfinite(hh.grad).all() and torch.isfinite(JJ.grad).all()
    m32 = banded.marginals(h.float(), J.float(), None, mask)
    z32 = banded.log_partition(h.float(), J.float(), None, mask)
    assert m32.dtype == torch.float32 and torch.isfinite(m32).all() and m32.abs().max() <= 1
    assert torch.allclose(m32.double(), reference.marginals(h, J, None, mask), rtol=0, atol=1e-5)
    assert torch.allclose(z32.double(), reference.log_partition(h, J, None, mask), rtol=1e-6, atol=0)


def test_float32_with_sharp_fields_and_weak_couplings():
    """Large fields alone keep the scaled recursion, in float32 (subnormals flushed, exp floored); exact."""
    h, J, _ = random_problem(11, 12, 3, scale=1.0)
    h = 30 * h
    m = banded.marginals(h.float(), J.float(), None, None)
    assert m.dtype == torch.float32
    assert torch.allclose(m.double(), reference.marginals(h, J, None, None), rtol=0, atol=1e-5)


def check_float32(monkeypatch, h, J, mask, w) -> set:
    """Run float32 copies of float64 h, J: float32 marginals within float32 rounding of the float64 reference
    (marginals 1e-5, log Z 1e-6 relative, field gradients 1e-4). Returns the dtypes _Scaled ran in."""
    dtypes = set()
    original = banded._Scaled.__init__
    monkeypatch.setattr(banded._Scaled, "__init__",
                        lambda self, c, *args: dtypes.add(c.dtype) or original(self, c, *args))
    h32 = h.float().requires_grad_()
    m = banded.marginals(h32, J.float(), None, mask, bandwidth=w)
    m.sum().backward()
    assert m.dtype == torch.float32
    assert torch.allclose(m.double(), reference.marginals(h, J, None, mask), rtol=0, atol=1e-5)
    assert torch.allclose(banded.log_partition(h.float(), J.float(), None, mask).double(),
                          reference.log_partition(h, J, None, mask), rtol=1e-6, atol=0)
    hh = h.clone().requires_grad_()
    reference.marginals(hh, J, None, mask).sum().backward()
    assert torch.allclose(h32.grad.double(), hh.grad, rtol=0, atol=1e-4)
    return dtypes


def test_float32_attention_fields_run_in_float32(monkeypatch):
    """Sigmoid-attention fields (near -log(n) / 2, which once sent float32 to float64): float32 messages,
    marginals, log Z and gradients within float32 rounding of the float64 reference."""
    g = torch.Generator().manual_seed(13)
    n, w = 16, 8
    h = torch.randn(6, n, generator=g, dtype=torch.float64) - 4.0
    J = banded_couplings(0.1 * torch.randn(n, n, generator=g, dtype=torch.float64), w)
    mask = make_mask("prefix", 6, n, g)
    assert check_float32(monkeypatch, h, J, mask, w) == {torch.float32}


def test_float32_past_its_bound_runs_scaled_in_float64(monkeypatch):
    """Couplings past float32's bound for the scaled recursion but within float64's run it in float64, not
    in the log domain: float32 results within float32 rounding of the float64 reference, gradients too."""
    g = torch.Generator().manual_seed(15)
    n, w = 16, 8
    h = torch.randn(4, n, generator=g, dtype=torch.float64)
    J = banded_couplings(1.0 * torch.randn(n, n, generator=g, dtype=torch.float64), w)
    range_ = banded._window_max(banded._band(J, w).abs().sum(1), w + banded._block_size(w))
    assert banded._linear_limit(w, n, torch.float32) < range_ < banded._linear_limit(w, n, torch.float64)
    mask = make_mask("prefix", 4, n, g)
    monkeypatch.setattr(banded, "_LogDomain", None)  # any use of the log domain fails
    assert check_float32(monkeypatch, h, J, mask, w) == {torch.float64}


def test_long_chain_against_independent_pieces():
    """n = 200 (beyond the reference): couplings that vanish between two halves factorise the problem."""
    g = torch.Generator().manual_seed(12)
    n, w = 200, 4
    h = torch.randn(3, n, generator=g, dtype=torch.float64)
    J = banded_couplings(0.5 * torch.randn(n, n, generator=g, dtype=torch.float64), w)
    J[:100, 100:] = 0
    J[100:, :100] = 0
    m = banded.marginals(h, J, None, None)
    z = banded.log_partition(h, J, None, None)
    left = banded.marginals(h[:, :100], J[:100, :100], None, None)
    right = banded.marginals(h[:, 100:], J[100:, 100:], None, None)
    assert torch.allclose(m, torch.cat([left, right], -1), rtol=0, atol=TOL)
    parts = (banded.log_partition(h[:, :100], J[:100, :100], None, None)
             + banded.log_partition(h[:, 100:], J[100:, 100:], None, None))
    assert torch.allclose(z, parts, rtol=0, atol=1e-9)


@pytest.mark.parametrize("case", ["large fields, scaled recursion", "large couplings, log domain",
                                  "large couplings, mask with holes"])
def test_float32_large_local_scales_run_in_float64(case):
    """float32 log-weights are rounded relative to their size: fields of 3e4 next to O(1) ones (scaled
    recursion) were 1e-3 off, couplings of 1e5 (log domain) 4e-3; such inputs run in float64, as in exact."""
    g = torch.Generator().manual_seed(0)
    n = 12
    J = torch.zeros(n, n, dtype=torch.float64)
    scale = 0.3 if case.startswith("large fields") else 1e5
    for i in range(n - 1):
        J[i, i + 1] = J[i + 1, i] = (scale * torch.randn(1, generator=g, dtype=torch.float64)).round(decimals=1)
    h = torch.randn(5, n, generator=g, dtype=torch.float64)
    if case.startswith("large fields"):
        h[:, ::4] += 3e4 * torch.sign(h[:, ::4])
    mask = torch.rand(5, n, generator=g) > 0.3 if case.endswith("holes") else None
    w = 5 if case.startswith("large fields") else 1
    m = ising.marginals(h.float(), J.float(), mask=mask, method="banded", bandwidth=w)
    truth = reference.marginals(h.float().double(), J.float().double(), mask=mask)
    torch.testing.assert_close(m.double(), truth, atol=1e-6, rtol=0)
