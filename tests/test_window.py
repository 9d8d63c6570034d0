"""The coupled window (SCALING.md §2a): exact marginals against the float64 brute force, closed forms,
masks, gradients, the module at lengths beyond the window, and the errors."""

import math

import numpy as np
import pytest
import torch
from conftest import assert_flash_rule, plain_marginals, symmetric_couplings
from torch.nn.attention.bias import causal_lower_right

from boltzmann_attention import BoltzmannAttention, boltzmann_attention
from boltzmann_attention.coupled_window import WindowCouplings, band_scores, band_times_value, window_attention
from boltzmann_attention.ising import reference
from boltzmann_attention.ising import window as window_ising


def _qkv(B=2, H=2, L=7, S=None, E=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = L if S is None else S
    return (torch.randn(B, H, L, E, dtype=dtype, generator=g), torch.randn(B, H, S, E, dtype=dtype, generator=g),
            torch.randn(B, H, S, 3, dtype=dtype, generator=g))


def _positional_reference(h, J, window, mask=None, marginals=None):
    """Weights of the window model by brute force: query i's spins are its keys j <= i (present under mask),
    with J_pos[j, k] = J[i - j, i - k] when both are in the window (i - W < j, k <= i), else 0.

    h: (B, H, L, S) float64; J: (H, W, W); mask: bool broadcastable to (B, H, L, S) or None. marginals: the
    function of (h, J, mask) that solves each query (default: the float64 reference).
    """
    B, H, L, S = h.shape
    i, j = torch.arange(L, device=h.device)[:, None], torch.arange(S, device=h.device)[None, :]
    d = i - j                                                   # slot of key j for query i
    in_window = (d >= 0) & (d < window)
    slot = d.clamp(0, window - 1)
    J_pos = J[:, slot[:, :, None], slot[:, None, :]]            # (H, L, S, S)
    J_pos = J_pos * (in_window[:, :, None] & in_window[:, None, :])
    present = (d >= 0).expand(B, H, L, S)
    if mask is not None:
        present = present & mask
    m = (marginals or (lambda h, J, mask: reference.marginals(h, J, mask=mask)))(h, J_pos[None], present)
    return (m + 1) / 2 * present


def _random_window_J(H, W, scale=0.8, seed=1):
    return symmetric_couplings(W, H, scale=scale, generator=torch.Generator().manual_seed(seed))


# --- the window system itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("W", [1, 2, 3, 5, 6])
def test_window_marginals_are_reference_marginals_with_absent_slots(W):
    g = torch.Generator().manual_seed(W)
    h = 1.5 * torch.randn(3, 11, W, dtype=torch.float64, generator=g)
    J = symmetric_couplings(W, 3, 1, scale=1.0, generator=g)     # one J per group, shared by its 11 queries
    present = torch.rand(3, 11, W, generator=g) > 0.35
    present[0, 0] = False                                        # no spin at all
    present[0, 1] = True                                         # every spin
    m = window_ising.marginals(h, J, present)
    expected = reference.marginals(h, J, mask=present)
    torch.testing.assert_close(m, expected, atol=1e-12, rtol=0)
    assert (m[~present] == 0).all()


def test_window_of_sixteen_matches_reference():
    """The target size (W = 16: two 256-configuration halves), a few queries, float64."""
    g = torch.Generator().manual_seed(16)
    h = torch.randn(2, 3, 16, dtype=torch.float64, generator=g)
    J = symmetric_couplings(16, 2, 1, scale=0.3, generator=g)
    present = torch.ones(2, 3, 16, dtype=torch.bool)
    present[1, 2, 10:] = False
    torch.testing.assert_close(window_ising.marginals(h, J, present), reference.marginals(h, J, mask=present),
                               atol=1e-12, rtol=0)


def test_window_underflow_is_recomputed_in_log_space():
    """Fields fighting strong couplings make Z underflow in float32: those rows go through the fallback."""
    g = torch.Generator().manual_seed(3)
    W = 6
    J = symmetric_couplings(W, 1, 1, scale=1.0, generator=g)
    J = 40.0 * J.sign() * (J != 0)                               # |J| = 40: the table spans e^±600
    h = 60.0 * torch.randn(1, 5, W, dtype=torch.float64, generator=g)
    present = torch.ones(1, 5, W, dtype=torch.bool)
    present[0, 4, :2] = False
    expected = reference.marginals(h, J, mask=present)
    m32 = window_ising.marginals(h.float(), J.float(), present)
    assert torch.isfinite(m32).all()
    torch.testing.assert_close(m32.double(), expected, atol=1e-5, rtol=0)


def test_window_gradcheck_h_and_J():
    g = torch.Generator().manual_seed(4)
    W = 5
    h = torch.randn(1, 3, W, dtype=torch.float64, generator=g).requires_grad_()
    A = torch.randn(1, W, W, dtype=torch.float64, generator=g).requires_grad_()
    present = torch.tensor([[[True] * W, [True, False, True, True, False], [False, True, True, False, True]]])

    upper = torch.ones(W, W, dtype=torch.float64).triu(1)  # once: tiny triu calls are slow on a busy CPU

    def f(h, A):
        J = A * upper + (A * upper).transpose(-1, -2)
        return window_ising.marginals(h, J, present)

    assert torch.autograd.gradcheck(f, (h, A))


# --- the attention layer --------------------------------------------------------------------------------

@pytest.mark.parametrize("W", [7, 9])
def test_window_covering_the_sequence_is_the_papers_model(W):
    """W >= T: every visible key is in the window, so this is the paper's model with J_pos[j, k] = J[i-j, i-k]."""
    q, k, v = _qkv(L=7)
    J = _random_window_J(2, W)
    bias = torch.tensor([-0.4, 0.3], dtype=torch.float64).view(2, 1, 1)
    out, w = boltzmann_attention(q, k, v, couplings=J, coupling_window=W, is_causal=True, bias=bias, scale=0.7,
                                 return_weights=True)
    h = q @ k.transpose(-1, -2) * 0.7 + bias
    expected = _positional_reference(h, J, W)
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected @ v, atol=1e-12, rtol=0)


def test_short_window_is_sigmoid_before_the_window():
    """W < T: keys before the window are independent spins; the reference sees the same model by positions."""
    q, k, v = _qkv(L=9, E=3)
    W = 4
    J = _random_window_J(2, W)
    bias = 0.3 * torch.randn(1, 2, 9, 9, dtype=torch.float64)     # a bias per key: gathered into the band
    out, w = boltzmann_attention(q, k, v, couplings=J, coupling_window=W, is_causal=True, bias=bias,
                                 return_weights=True)
    h = q @ k.transpose(-1, -2) / math.sqrt(3) + bias
    expected = _positional_reference(h, J, W)
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected @ v, atol=1e-12, rtol=0)
    before = torch.ones(9, 9, dtype=torch.bool).tril(-W)
    torch.testing.assert_close(w[..., before], torch.sigmoid(2 * h)[..., before], atol=1e-14, rtol=0)


@pytest.mark.parametrize("W", [1, 3, 16])
def test_zero_couplings_give_sigmoid_attention(W):
    q, k, v = _qkv(L=10)
    J = torch.zeros(2, W, W, dtype=torch.float64)
    out, w = boltzmann_attention(q, k, v, couplings=J, coupling_window=W, is_causal=True, bias=-0.5,
                                 return_weights=True)
    expected = torch.sigmoid(2 * (q @ k.transpose(-1, -2) / 2 - 0.5)).tril()
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected @ v, atol=1e-12, rtol=0)


def test_masked_keys_are_absent_spins():
    q, k, v = _qkv(L=8)
    W = 5
    J = _random_window_J(2, W)
    mask = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(5)) > 0.3
    mask[0, 0, 6] = False                                         # a query that sees no key
    out, w = boltzmann_attention(q, k, v, couplings=J, coupling_window=W, is_causal=True, attn_mask=mask,
                                 return_weights=True)
    expected = _positional_reference(q @ k.transpose(-1, -2) / 2, J, W, mask)
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected @ v, atol=1e-12, rtol=0)
    assert (w[0, :, 6] == 0).all() and (out[0, :, 6] == 0).all()


def test_long_sequence_in_blocks_matches_the_band_computed_directly():
    """L = 150 (three blocks of 64, the last partial) and S > L: the blocked band products against a plain
    gather, and the layer against reference marginals of each query's window plus sigmoid before it."""
    q, k, v = _qkv(B=1, H=2, L=150, S=157, E=3)
    W = 4
    i = torch.arange(150)[:, None] - torch.arange(W)[None, :]
    valid, index = i >= 0, i.clamp(0)
    direct = (q[:, :, :, None, :] * k[:, :, index]).sum(-1) * valid
    torch.testing.assert_close(band_scores(q, k, W), direct, atol=1e-12, rtol=0)
    a = torch.randn(1, 2, 150, W, dtype=torch.float64) * valid
    torch.testing.assert_close(band_times_value(a, v), (a[..., None] * v[:, :, index]).sum(-2), atol=1e-12, rtol=0)

    J = _random_window_J(2, W)
    out, w = boltzmann_attention(q, k, v, couplings=J, coupling_window=W, is_causal=True, return_weights=True)
    h = q @ k.transpose(-1, -2) / math.sqrt(3)
    m_band = reference.marginals(h.gather(-1, index.expand(1, 2, 150, W)), J[:, None], mask=valid.expand(1, 2, 150, W))
    expected = torch.sigmoid(2 * h) * torch.ones(150, 157, dtype=torch.bool).tril(-W)
    rows = torch.arange(150)
    for a in range(W):                                          # slot a of query i is key i - a
        ok = rows >= a
        expected[:, :, rows[ok], rows[ok] - a] = (m_band[:, :, ok, a] + 1) / 2
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected @ v, atol=1e-12, rtol=0)


def test_gradcheck_through_q_k_v_and_J_with_a_mask():
    q, k, v = (x.clone().requires_grad_() for x in _qkv(B=1, H=1, L=5, E=2))
    A = torch.randn(1, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(6)).requires_grad_()
    mask = torch.rand(1, 1, 5, 5, generator=torch.Generator().manual_seed(7)) > 0.25

    upper = torch.ones(3, 3, dtype=torch.float64).triu(1)

    def f(q, k, v, A):
        J = A * upper + (A * upper).transpose(-1, -2)
        return boltzmann_attention(q, k, v, couplings=J, coupling_window=3, is_causal=True, attn_mask=mask,
                                   bias=-0.2)

    assert torch.autograd.gradcheck(f, (q, k, v, A))


def test_mode_J_uses_the_bias_alone():
    q, k, v = _qkv(L=6)
    J = _random_window_J(2, 3)
    bias = torch.randn(2, 1, 6, dtype=torch.float64)              # a field per key and head
    out, w = boltzmann_attention(q, k, v, couplings=J, coupling_window=3, mode="J", is_causal=True, bias=bias,
                                 return_weights=True)
    expected = _positional_reference(bias.expand(2, 2, 6, 6).clone(), J, 3)
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected @ v, atol=1e-12, rtol=0)


# --- the module -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("relative", [False, True])
def test_module_window_at_a_length_beyond_the_window_and_max_len(relative):
    torch.manual_seed(0)
    layer = BoltzmannAttention(8, 2, max_len=4, coupling="window", coupling_window=3, coupling_init_std=0.5,
                               coupling_window_relative=relative).double()
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    padding = torch.zeros(2, 11, dtype=torch.bool)
    padding[1, 8:] = True
    out, w = layer(x, key_padding_mask=padding, need_weights=True)
    J = layer.couplings()
    assert J.shape == (2, 3, 3)
    if relative:
        assert J[:, 0, 1].equal(J[:, 1, 2]) and J[:, 0, 2].ne(J[:, 0, 1]).all()
    q, k = layer._heads(layer.query(x)), layer._heads(layer.key(x))
    h = q @ k.transpose(-1, -2) / 2 + layer.field_bias.view(-1, 1, 1)
    expected = _positional_reference(h.detach(), J.detach(), 3, ~padding[:, None, None, :])
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    out.sum().backward()
    assert layer.couplings.weight.grad.abs().sum() > 0
    assert layer.couplings.weight._no_weight_decay


def test_window_couplings_are_symmetric_with_zero_diagonal():
    free, rel = WindowCouplings(3, 5, init_std=1.0), WindowCouplings(3, 5, relative=True, init_std=1.0)
    for J in (free(), rel()):
        assert J.shape == (3, 5, 5)
        assert J.equal(J.transpose(-1, -2)) and (J.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert sum(p.numel() for p in rel.parameters()) == 3 * 4


# --- errors ---------------------------------------------------------------------------------------------

def test_errors_name_the_problem():
    q, k, v = _qkv(L=5)
    J = _random_window_J(2, 3)
    with pytest.raises(ValueError, match=r"W <= 24.*banded"):
        boltzmann_attention(q, k, v, couplings=torch.zeros(2, 25, 25, dtype=torch.float64), coupling_window=25,
                            is_causal=True)
    with pytest.raises(ValueError, match="W <= 12"):
        boltzmann_attention(q, k, v, couplings=torch.zeros(2, 13, 13, dtype=torch.float64), coupling_window=13,
                            is_causal=True, method_options={"max_spins": 12})
    for bad in (0, -2, True, 2.0):
        with pytest.raises(ValueError, match="integer >= 1"):
            boltzmann_attention(q, k, v, couplings=J, coupling_window=bad, is_causal=True)
    with pytest.raises(ValueError, match=r"shape \(H, 4, 4\)"):
        boltzmann_attention(q, k, v, couplings=J, coupling_window=4, is_causal=True)
    with pytest.raises(ValueError, match="symmetric"):
        boltzmann_attention(q, k, v, couplings=J + torch.eye(3, dtype=torch.float64).roll(1, 0), coupling_window=3,
                            is_causal=True)
    with pytest.raises(ValueError, match="is_causal=True"):
        boltzmann_attention(q, k, v, couplings=J, coupling_window=3)
    with pytest.raises(ValueError, match="'exact' and 'configurations' only"):
        boltzmann_attention(q, k, v, couplings=J, coupling_window=3, is_causal=True, method="meanfield")
    with pytest.raises(ValueError, match="needs `couplings`"):
        boltzmann_attention(q, k, v, coupling_window=3, is_causal=True)
    with pytest.raises(ValueError, match="go together"):
        BoltzmannAttention(8, 2, max_len=8, coupling="window")
    with pytest.raises(ValueError, match="go together"):
        BoltzmannAttention(8, 2, max_len=8, coupling_window=3)
    with pytest.raises(ValueError, match="W <= 24"):
        BoltzmannAttention(8, 2, max_len=8, coupling="window", coupling_window=30)
    with pytest.raises(ValueError, match="three-body"):
        BoltzmannAttention(8, 2, max_len=8, mode="h+J+K", coupling="window", coupling_window=3)
    with pytest.raises(ValueError, match="is_causal=True"):
        BoltzmannAttention(8, 2, max_len=8, causal=False, coupling="window", coupling_window=3)


def test_couplings_for_more_heads_than_the_queries_are_refused_by_name():
    """Couplings of 3 heads for 2 query heads: the dense path's ValueError (before: a torch broadcast error)."""
    q, k, v = _qkv(H=2, L=5)
    with pytest.raises(ValueError, match=r"window couplings must have shape \(H, 3, 3\) with H = 1 or 2"):
        boltzmann_attention(q, k, v, couplings=_random_window_J(3, 3), coupling_window=3, is_causal=True)
    field = q @ k.mT
    with pytest.raises(ValueError, match=r"window couplings must have shape \(H, 3, 3\) with H = 1 or 2 heads"):
        window_attention(field, v, _random_window_J(3, 3), 3, None)


@pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")  # SDPA's softmax; not here
@pytest.mark.parametrize("empty", ["B", "L", "S", "L and S"])
def test_empty_batch_queries_or_keys_give_empty_results(empty):
    """B, L or S = 0: empty (or, for S = 0, zero) outputs of the right shapes and a working backward, as the dense
    path gives (before: min() of an empty tensor, ZeroDivisionError or index -1)."""
    B, L, S = (0 if empty == "B" else 2), (0 if "L" in empty else 4), (0 if "S" in empty else 4)
    q, k, v = _qkv(B=B, L=L, S=S)
    J = _random_window_J(2, 3).requires_grad_()
    for mask in (None, causal_lower_right(L, S)):
        kwargs = {"is_causal": True} if mask is None else {"attn_mask": mask}
        out, w = boltzmann_attention(q, k, v, couplings=J, coupling_window=3, return_weights=True, **kwargs)
        dense, w_dense = boltzmann_attention(q, k, v, couplings=torch.zeros(2, S, S, dtype=torch.float64),
                                             return_weights=True, **kwargs)
        assert out.shape == dense.shape == (B, 2, L, 3) and w.shape == w_dense.shape == (B, 2, L, S)
        assert (out == 0).all()
        out.sum().backward()
    layer = BoltzmannAttention(8, 2, max_len=4, coupling="window", coupling_window=3)
    assert layer(torch.randn(B, L, 8))[0].shape == (B, L, 8)


def test_window_size_of_any_integral_type():
    """coupling_window=np.int64(3) is accepted like every other integer argument (check_int: any
    numbers.Integral; before, the window alone refused it); bools, floats and tensors are not integers there."""
    q, k, v = _qkv(L=5)
    J = _random_window_J(2, 3)
    expected = boltzmann_attention(q, k, v, couplings=J, coupling_window=3, is_causal=True)
    out = boltzmann_attention(q, k, v, couplings=J, coupling_window=np.int64(3), is_causal=True)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(window_attention(q @ k.mT / 2.0, v, J, np.int32(3), None)[0], expected, atol=1e-12,
                               rtol=0)
    layer = BoltzmannAttention(8, 2, max_len=4, coupling="window", coupling_window=np.int64(3))
    assert layer.coupling_window == 3 and type(layer.coupling_window) is int
    assert layer(torch.randn(1, 6, 8))[0].shape == (1, 6, 8)
    for bad in (True, 3.0, torch.tensor(3)):
        with pytest.raises(ValueError, match="coupling_window must be an integer >= 1"):
            boltzmann_attention(q, k, v, couplings=J, coupling_window=bad, is_causal=True)


def test_full_windows_differentiate_twice_against_the_reference():
    """The full windows' contraction is plain tensor operations: first and second derivatives both match."""
    from boltzmann_attention.ising import reference, window

    g = torch.Generator().manual_seed(11)
    h = torch.randn(2, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    W = 0.4 * torch.randn(2, 4, 4, dtype=torch.float64, generator=g)
    J = (W.triu(1) + W.triu(1).transpose(-1, -2)).requires_grad_()
    torch.testing.assert_close(window.marginals(h, J[:, None]), reference.marginals(h, J[:, None], None, None))
    assert torch.autograd.gradgradcheck(lambda h, J: window.marginals(h, J[:, None]), (h, J))


@pytest.mark.parametrize("L,S,offset", [(7, 7, 0), (3, 9, 6), (2, 2, 0)])
def test_slot_field_is_the_couplings_log_odds_when_no_other_key_is_attended(L, S, offset):
    """2 x slot_field at window key i - a is log p(s_a = +1) - log p(s_a = -1) with every other slot of the
    query's window at s = -1 and no field: read from the energy of those two states, slot by slot."""
    from boltzmann_attention.coupled_window import slot_field

    W, H = 4, 2
    J = symmetric_couplings(W, H, scale=0.7, generator=torch.Generator().manual_seed(3))
    got = slot_field(J, L, S, offset)
    for head, r in np.ndindex(H, L):
        i = r + offset
        slots = [a for a in range(W) if i - a >= 0]
        for j in range(S):
            a = i - j
            if a not in slots:
                assert got[head, r, j] == 0
                continue
            s = -torch.ones(len(slots), dtype=torch.float64)
            minus_energy = []
            for spin in (1.0, -1.0):
                s[slots.index(a)] = spin
                Jw = J[head][slots][:, slots].double()
                minus_energy.append(float(s @ Jw @ s / 2))
            assert 2 * float(got[head, r, j]) == pytest.approx(minus_energy[0] - minus_energy[1], abs=1e-12)


# --- the configurations path: softmax attention over the window's 2^W configurations --------------------

def _sym(A):
    return A.triu(1) + A.triu(1).transpose(-1, -2)


@pytest.mark.parametrize("W", [1, 2, 3, 5, 8])
def test_configurations_path_is_the_reference_with_absent_slots(W, device):
    """Both paths against the float64 brute force, absent slots (free spins there) included, on every device."""
    g = torch.Generator().manual_seed(W)
    h = 1.5 * torch.randn(3, 11, W, dtype=torch.float64, generator=g)
    J = symmetric_couplings(W, 3, 1, scale=1.0, generator=g)
    present = torch.rand(3, 11, W, generator=g) > 0.35
    present[0, 0], present[0, 1] = False, True                   # no spin at all; every spin
    expected = reference.marginals(h, J, mask=present)
    for mask in (present, None):
        expected = reference.marginals(h, J, mask=mask)
        m = window_ising.marginals(h.to(device), J.to(device), None if mask is None else mask.to(device),
                                   path="configurations")
        torch.testing.assert_close(m.cpu(), expected, atol=1e-12, rtol=0)
    assert (m.cpu()[~present] == 0).all() if mask is not None else True


def test_configurations_path_equals_the_split_at_ten_forward_and_gradients(device):
    """W = 10, float64: the two paths' marginals and their gradients in h and in J (through the symmetric
    parametrisation, which is what a layer's couplings are) agree to float64 precision."""
    g = torch.Generator().manual_seed(10)
    W = 10
    h0 = torch.randn(2, 40, W, dtype=torch.float64, generator=g)
    A0 = 0.4 * torch.randn(2, 1, W, W, dtype=torch.float64, generator=g)
    weight = torch.randn(2, 40, W, dtype=torch.float64, generator=g)
    present = torch.ones(2, 40, W, dtype=torch.bool).tril(W - 1)[..., :W]  # the first rows' windows partial
    results = {}
    for path in ("split", "configurations"):
        for mask in (None, present):
            h, A = h0.to(device).requires_grad_(), A0.to(device).requires_grad_()
            m = window_ising.marginals(h, _sym(A), None if mask is None else mask.to(device), path=path)
            (m * weight.to(device)).sum().backward()
            results[path, mask is None] = (m.detach().cpu(), h.grad.cpu(), A.grad.cpu())
    for full in (True, False):
        for a, b in zip(results["split", full], results["configurations", full], strict=True):
            torch.testing.assert_close(b, a, atol=1e-13, rtol=0)


def test_configurations_path_gradcheck_h_and_J():
    g = torch.Generator().manual_seed(4)
    W = 5
    h = torch.randn(1, 3, W, dtype=torch.float64, generator=g).requires_grad_()
    A = torch.randn(1, W, W, dtype=torch.float64, generator=g).requires_grad_()
    present = torch.tensor([[[True] * W, [True, False, True, True, False], [False, True, True, False, True]]])
    for mask in (present, None):
        assert torch.autograd.gradcheck(
            lambda h, A, mask=mask: window_ising.marginals(h, _sym(A), mask, path="configurations"), (h, A))


def test_configurations_path_solves_float32_rows_beyond_its_resolution_in_float64():
    """Energies of scale 1e4 in float32 (beyond numerics.FLOAT32_SCALE_LIMIT): rescued as the split rescues them."""
    g = torch.Generator().manual_seed(3)
    W = 6
    J = 1e3 * symmetric_couplings(W, 1, 1, generator=g)
    h = 3e3 * torch.randn(1, 5, W, dtype=torch.float64, generator=g)
    present = torch.ones(1, 5, W, dtype=torch.bool)
    present[0, 4, :2] = False
    expected = reference.marginals(h.float().double(), J.float().double(), mask=present)
    m32 = window_ising.marginals(h.float(), J.float(), present, path="configurations")
    torch.testing.assert_close(m32.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["top-left", "bottom-right", "masked"])
def test_the_layer_gives_the_same_numbers_on_either_path(case, device):
    """The window attention with window_path 'split' and 'configurations' (and method 'configurations'): the same
    outputs, weights and gradients in q, k, v and J, top-left and bottom-right causal, and with a mask."""
    L, S = (5, 12) if case == "bottom-right" else (12, 12)
    q0, k0, v0 = _qkv(L=L, S=S, E=3)
    W = 6
    A0 = 0.6 * torch.randn(2, W, W, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    causal = {"attn_mask": causal_lower_right(L, S)} if case == "bottom-right" else {"is_causal": True}
    if case == "masked":
        causal["attn_mask"] = (torch.rand(2, 1, L, S, generator=torch.Generator().manual_seed(3)) > 0.25).to(device)
    results = []
    for options in (dict(method_options={"window_path": "split"}), dict(method_options={"window_path":
                                                                                      "configurations"}),
                    dict(method="configurations")):
        q, k, v, A = (x.to(device).requires_grad_() for x in (q0, k0, v0, A0))
        out, w = boltzmann_attention(q, k, v, couplings=_sym(A), coupling_window=W, return_weights=True, bias=-0.3,
                                     **causal, **options)
        (out.square().sum() + w.sum()).backward()
        results.append([x.detach().cpu() for x in (out, w, q.grad, k.grad, v.grad, A.grad)])
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            torch.testing.assert_close(b, a, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["split", "configurations"])
def test_low_precision_window_follows_the_flash_rule(dtype, path, device):
    """In float32 and bfloat16 (the layer computes in float32, returns the dtype) each path's output is within
    twice plain PyTorch's error in the same dtype (the window model by a softmax over states, every operation in
    the dtype) against the float64 definition."""
    q, k, v = (x.to(dtype) for x in _qkv(L=9, E=4))
    W = 4
    J = _random_window_J(2, W).to(dtype)
    out = boltzmann_attention(q.to(device), k.to(device), v.to(device), couplings=J.to(device), coupling_window=W,
                              is_causal=True, method_options={"window_path": path})
    assert out.dtype == dtype
    h64 = q.double() @ k.double().transpose(-1, -2) / 2
    expected = _positional_reference(h64, J.double(), W) @ v.double()
    plain = _positional_reference(q.to(device) @ k.to(device).transpose(-1, -2) / 2, J.to(device), W,
                                  marginals=plain_marginals) @ v.to(device)
    assert_flash_rule(out, plain, expected)


def test_the_rule_picks_the_path_and_the_layer_says_which():
    """choose_path reads W and the device type only; 'auto' applies it, a named path or method 'configurations'
    overrides it, and BoltzmannAttention.window_path says the one its forward takes."""
    from boltzmann_attention.ising import configurations

    up_to = window_ising.CONFIGURATIONS_UP_TO.get("cpu", 0)
    if up_to >= 1:
        assert window_ising.choose_path(up_to, "cpu") == "configurations"
    assert window_ising.choose_path(up_to + 1, torch.device("cpu")) == "split"
    assert window_ising.choose_path(4, "some-unmeasured-device") == "split"
    for W in (up_to, up_to + 1):
        if W < 1:
            continue
        layer = BoltzmannAttention(8, 2, max_len=8, coupling="window", coupling_window=W)
        assert layer.window_path == window_ising.choose_path(W, "cpu")
    named = BoltzmannAttention(8, 2, max_len=8, coupling="window", coupling_window=3,
                               method_options={"window_path": "configurations"})
    assert named.window_path == "configurations"
    assert BoltzmannAttention(8, 2, max_len=8, coupling="window", coupling_window=3,
                              method="configurations").window_path == "configurations"
    assert BoltzmannAttention(8, 2, max_len=8).window_path is None

    calls = []
    original = configurations.solve

    def spy(*args):
        calls.append(args[0].shape)
        return original(*args)

    x = torch.randn(1, 7, 8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(configurations, "solve", spy)
        patch.setitem(window_ising.CONFIGURATIONS_UP_TO, "cpu", 3)
        for W, used in ((3, True), (4, False)):
            calls.clear()
            layer = BoltzmannAttention(8, 2, max_len=8, coupling="window", coupling_window=W, coupling_init_std=0.1)
            assert layer.window_path == ("configurations" if used else "split")
            layer(x)
            assert bool(calls) == used


def test_window_path_errors_name_the_choices():
    q, k, v = _qkv(L=5)
    J = _random_window_J(2, 3)
    with pytest.raises(ValueError, match=r"window_path must be one of \('auto', 'split', 'configurations'\)"):
        boltzmann_attention(q, k, v, couplings=J, coupling_window=3, is_causal=True,
                            method_options={"window_path": "fast"})
    with pytest.raises(ValueError, match="method 'configurations' always runs the coupled window's 'configurations' "
                                         "path; window_path applies to method 'exact'"):
        BoltzmannAttention(8, 2, max_len=8, coupling="window", coupling_window=3, method="configurations",
                           method_options={"window_path": "split"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['window_path'\] for method 'exact'"):
        BoltzmannAttention(8, 2, max_len=8, method_options={"window_path": "split"})
    with pytest.raises(ValueError, match="W <= 16"):
        BoltzmannAttention(8, 2, max_len=8, coupling="window", coupling_window=17, method="configurations")
    with pytest.raises(ValueError, match="path must be one of"):
        window_ising.marginals(torch.zeros(2, 3), torch.zeros(3, 3), path="auto")
