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


# ---- energies too large for the dtype: never a wrong number (against a 700-digit brute force) ----

def _brute_force(h, J, present=None, K=None):
    """<s_j> by enumeration in 700-digit arithmetic from the exact values of the float inputs (one system;
    K: the three-body couplings, summed over j < k < l)."""
    mpmath = pytest.importorskip("mpmath")
    ctx = mpmath.mp.clone()
    ctx.dps = 700
    n = len(h)
    spins = [j for j in range(n) if present is None or present[j]]
    h = [ctx.mpf(float(x)) for x in h]
    J = [[ctx.mpf(float(x)) for x in row] for row in J]
    weights, states = [], []
    for index in range(2 ** len(spins)):
        s = {j: 1 if index >> b & 1 else -1 for b, j in enumerate(spins)}
        energy = ctx.fsum(h[j] * s[j] for j in spins)
        energy += ctx.fsum(J[j][k] * s[j] * s[k] for j in spins for k in spins if j < k)
        if K is not None:
            energy += ctx.fsum(ctx.mpf(float(K[j, k, m])) * s[j] * s[k] * s[m]
                               for j in spins for k in spins for m in spins if j < k < m)
        weights.append(energy)
        states.append(s)
    top = max(weights)
    weights = [ctx.exp(w - top) for w in weights]
    z = ctx.fsum(weights)
    return torch.tensor([float(ctx.fsum(w * s[j] for w, s in zip(weights, states)) / z) if j in spins else 0.0
                         for j in range(n)], dtype=torch.float64)


def _ferromagnet(n, coupling, dtype):
    J = torch.full((n, n), coupling, dtype=dtype)
    return J.fill_diagonal_(0)


@pytest.mark.parametrize("dtype, coupling", [(torch.float32, 1e5), (torch.float32, 3e30), (torch.float64, 1e12),
                                             (torch.float64, 1e17), (torch.float64, 1e300)])
def test_window_rows_with_absent_slots_do_not_lose_their_fields_to_huge_couplings(dtype, coupling):
    """Row 0 of a window (one present slot) is sigmoid attention whatever J; so is every partial window's law
    that of its present slots only (absent slots' couplings never enter)."""
    from boltzmann_attention.ising import window

    W = 4
    J = _ferromagnet(W, coupling, dtype)
    J[0, 3] = J[3, 0] = -coupling  # some frustration
    h = torch.tensor([0.3, -0.1, 0.2, 0.4], dtype=dtype)
    one = torch.tensor([True, False, False, False])
    m = window.marginals(h[None], J[None], one[None])[0]
    torch.testing.assert_close(m.double(), _brute_force(h, J, one), atol=1e-6 if dtype == torch.float32 else 1e-12,
                               rtol=0)
    assert abs(float(m[0]) - torch.tanh(h[0].double()).item()) < (1e-6 if dtype == torch.float32 else 1e-12)


def test_coupled_window_attention_partial_windows_ignore_couplings_of_absent_slots():
    """Two queries, window 3, J couples only slots 0 and 2 (at 1e300): slot 2 is absent in both rows, so the
    weights are sigmoid attention's (before: 0.44 off)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 1, 2, 4, dtype=torch.float64, generator=g).unbind(0)
    J = torch.zeros(1, 3, 3, dtype=torch.float64)
    J[0, 0, 2] = J[0, 2, 0] = 1e300
    _, weights = boltzmann_attention(q, k, v, couplings=J, coupling_window=3, is_causal=True, return_weights=True)
    field = (q @ k.transpose(-1, -2)) / 2.0  # scale 1 / sqrt(E)
    expected = torch.sigmoid(2 * field).tril()
    torch.testing.assert_close(weights, expected, atol=1e-12, rtol=0)


def test_exact_refuses_couplings_whose_rounding_swamps_the_fields():
    """|J| ~ 1e17 with O(1) fields: ulp(1e17) = 16 swamps the fields, which decide the marginals (about 0.46
    here); float64 enumeration gave 0. Refused, naming the limit, on every path that reaches it."""
    from boltzmann_attention.ising import window

    h = torch.tensor([0.5, -0.3, 0.2, 0.1], dtype=torch.float64)
    J = _ferromagnet(4, 1e17, torch.float64)
    truth = _brute_force(h, J)
    assert truth.abs().min() > 0.4  # what the right answer is
    for call in (lambda: ising.marginals(h, J),
                 lambda: ising.marginals(h.float(), J.float()),
                 lambda: ising.marginals(h[None].expand(3, 4), J, mask=torch.ones(3, 4, dtype=torch.bool).tril()),
                 lambda: ising.marginals(h, J, mask=torch.tensor([True, True, True, False])),
                 lambda: window.marginals(h[None, None], J[None])):
        with pytest.raises(ValueError, match="cannot be resolved in float64.*Rescale"):
            call()


def test_the_reference_refuses_what_float64_cannot_resolve_and_keeps_what_is_determined():
    """The oracle itself: the ferromagnet of 1e17 (marginals about 0.46; float64 enumeration gave 0) is refused,
    while its correlations, +1 in both ground states, are kept; so are frozen and exactly summed inputs."""
    from boltzmann_attention.ising import reference

    h = torch.tensor([0.5, -0.3, 0.2, 0.1], dtype=torch.float64)
    J = _ferromagnet(4, 1e17, torch.float64)
    with pytest.raises(ValueError, match="'reference'.*cannot be resolved in float64.*up to 2.*e\\+03.*Rescale"):
        reference.marginals(h, J)
    with pytest.raises(ValueError, match="'reference'.*cannot be resolved"):
        ising.marginals(h, J, method="reference")
    assert torch.equal(reference.correlations(h, J), torch.ones(4, 4, dtype=torch.float64))
    J = _ferromagnet(4, 1.0, torch.float64)
    torch.testing.assert_close(reference.marginals(h, J), _brute_force(h, J), atol=1e-12, rtol=0)


@pytest.mark.parametrize("scales", [(1.0, 1.0), (1e15, 0.1), (2.0**40, 2.0**-3), (1e30, 1e29)])
def test_the_reference_rounding_bound_holds_against_exact_arithmetic(scales):
    """Every configuration's float64 energy is within the bound of its exact value (rational arithmetic on the
    inputs' exact values); where the bound is 0 (every sum exact), the energies are exact."""
    from fractions import Fraction

    from boltzmann_attention.ising import reference

    g = torch.Generator().manual_seed(3)
    n, rows = 5, 20
    h = torch.randn(rows, n, dtype=torch.float64, generator=g) * scales[0]
    J = symmetric_couplings(n, generator=g, scale=scales[1]).expand(rows, n, n).clone()
    if scales[0] == 2.0**40:  # dyadic values whose sums are exact
        h, J = h.round(), (J * 8).round() / 8
    spins = reference.configurations(n)
    computed = reference.negative_energies(h, J, None, spins)
    bound = reference._rounding_bound(h, J, None)
    for r in range(rows):
        for c in range(2**n):
            s = [int(x) for x in spins[c]]
            exact = sum(Fraction(float(h[r, j])) * s[j] for j in range(n))
            exact += sum(Fraction(float(J[r, j, k])) * s[j] * s[k] for j in range(n) for k in range(j + 1, n))
            error = abs(Fraction(float(computed[r, c])) - exact)
            assert error <= Fraction(float(bound[r]))
    if scales[0] == 2.0**40:
        assert (bound == 0).all()
    assert (bound > 0).any() == (scales[0] != 2.0**40)


@pytest.mark.parametrize("coupling", [1e8, 1e10])
def test_exact_in_the_resolvable_range_matches_the_brute_force(coupling):
    """Past the scale where rounding could matter, the states that carry the distribution are checked and the
    result is kept when the rounding moves no marginal by more than the tolerance."""
    h = torch.tensor([0.5, -0.3, 0.2, 0.1, 0.05], dtype=torch.float64)
    J = _ferromagnet(5, coupling, torch.float64)
    J[1, 4] = J[4, 1] = -coupling / 2
    if coupling > 1e9:  # rounding of 1e10-scale energies (ulp 2e-6) moves the marginals by more than 1e-6
        with pytest.raises(ValueError, match="cannot be resolved"):
            ising.marginals(h, J)
        return
    torch.testing.assert_close(ising.marginals(h, J), _brute_force(h, J), atol=1e-6, rtol=0)


def test_huge_but_exactly_representable_energies_are_not_refused():
    h = torch.tensor([1.5e15, -1e15, 0.5, 0.5], dtype=torch.float64)
    J = torch.zeros(4, 4, dtype=torch.float64)
    J[0, 1] = J[1, 0] = 2e15
    torch.testing.assert_close(ising.marginals(h, J), _brute_force(h, J), atol=1e-12, rtol=0)
    g = torch.Generator().manual_seed(5)
    h = torch.randn(6, dtype=torch.float64, generator=g) * 1e30
    J = symmetric_couplings(6, generator=g, scale=1e30)
    torch.testing.assert_close(ising.marginals(h, J), _brute_force(h, J), atol=1e-12, rtol=0)


def test_float32_full_windows_with_large_couplings_are_solved_in_float64_like_exact():
    """Full windows took no float32 scale check (exact does): integer couplings of ~3e4 were 5e-3 off."""
    from boltzmann_attention.ising import reference, window

    g = torch.Generator().manual_seed(0)
    W = 6
    J = symmetric_couplings(W, scale=3e4, generator=g).round()
    h = torch.randn(50, W, generator=g, dtype=torch.float64) * 2
    m = window.marginals(h.float()[None], J.float()[None])[0]
    truth = reference.marginals(h.float().double(), J.float().double())
    torch.testing.assert_close(m.double(), truth, atol=1e-6, rtol=0)


def _chain(n, coupling, dtype=torch.float64):
    J = torch.zeros(n, n, dtype=dtype)
    for i in range(n - 1):
        J[i, i + 1] = J[i + 1, i] = coupling
    return J


@pytest.mark.parametrize("case", ["chain of 1e17", "chain of 1e12", "ferromagnet of 1e17"])
def test_banded_refuses_energies_it_cannot_resolve(case):
    """Before: a chain of 1e17 gave [-0.46, 0, 0, ...] (true: -0.29 everywhere), 1e12 7e-5 off and the
    ferromagnet 0 (true 0.46)."""
    h = torch.tensor([-0.5, -0.3, -0.1, 0.1, 0.2, 0.4], dtype=torch.float64)
    J = _ferromagnet(6, 1e17, torch.float64) if case.startswith("ferromagnet") else \
        _chain(6, 1e17 if "17" in case else 1e12)
    assert _brute_force(h, J).abs().min() > 0.19  # what the right answer is: tanh(-0.2) everywhere
    with pytest.raises(ValueError, match="banded.*cannot be resolved in float64.*Rescale"):
        ising.marginals(h, J, method="banded")


@pytest.mark.parametrize("case", ["fields fighting couplings", "all fields huge", "large but resolvable"])
def test_banded_keeps_huge_but_resolved_energies(case):
    """Frozen spins (fields or pairs that win in any context) round nothing that matters; moderate scales
    stay within the tolerance: these are solved, and match the 700-digit brute force."""
    if case == "fields fighting couplings":
        h = torch.tensor([1.5e15, -1e15, 0.5, 0.5, -0.2], dtype=torch.float64)
        J = torch.zeros(5, 5, dtype=torch.float64)
        J[0, 1] = J[1, 0] = 2e15
        J[3, 4] = J[4, 3] = 0.7
    elif case == "all fields huge":
        h = torch.tensor([1e30, -1e30, 2e29, -5e29, 3e28], dtype=torch.float64)
        J = _chain(5, 0.8)
    else:
        h = torch.tensor([-0.5, -0.3, -0.1, 0.1, 0.2], dtype=torch.float64)
        J = _chain(5, 1e5)
    m = ising.marginals(h, J, method="banded", bandwidth=2)
    torch.testing.assert_close(m, _brute_force(h, J), atol=1e-6, rtol=0)


def test_exact_refuses_three_body_couplings_whose_rounding_swamps_the_fields():
    """K of 1e17 with O(1) fields gave [-0.001, -0.005, 0.197, 0.100, 0.050], far from the truth."""
    import itertools

    h = torch.tensor([0.5, -0.3, 0.2, 0.1, 0.05], dtype=torch.float64)
    J = torch.zeros(5, 5, dtype=torch.float64)
    J[0, 4] = J[4, 0] = 0.3
    for scale, resolved in ((1e6, True), (1e17, False)):
        K = torch.zeros(5, 5, 5, dtype=torch.float64)
        for t in itertools.permutations((0, 1, 2)):
            K[t] = scale
        for t in itertools.permutations((1, 3, 4)):
            K[t] = -scale / 2
        truth = _brute_force(h, J, K=K)
        if resolved:
            torch.testing.assert_close(ising.marginals(h, J, K), truth, atol=1e-9, rtol=0)
        else:
            with pytest.raises(ValueError, match="cannot be resolved in float64"):
                ising.marginals(h, J, K)
