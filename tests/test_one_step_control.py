"""Mode 'h+J-step', the control of the relative couplings: one mean-field step from the free spins,
a_j = sigmoid(2 (h_j + sum_k J_jk tanh h_k)), against a float64 loop over keys, with gradcheck; the receptive
field and the parameters of h+J with the same couplings, and no Ising inference."""

import math

import pytest
import torch

from boltzmann_attention import BoltzmannAttention, boltzmann_attention


def _loops(h, J, mask):
    """The definition, key by key: h (L, S), J (S, S), mask (L, S) bool."""
    L, S = h.shape
    out = torch.zeros(L, S, dtype=torch.float64)
    for i in range(L):
        for j in range(S):
            if mask[i, j]:
                total = float(h[i, j]) + sum(float(J[j, k]) * math.tanh(float(h[i, k]))
                                             for k in range(S) if k != j and mask[i, k])
                out[i, j] = 1 / (1 + math.exp(-2 * total))
    return out


def _symmetric(H, S, scale=0.4, seed=0):
    W = torch.randn(H, S, S, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * scale
    return W.triu(1) + W.triu(1).transpose(-1, -2)


def test_the_functional_form_is_the_definition():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 6, 4, dtype=torch.float64, generator=g) for _ in range(3))
    J = _symmetric(3, 6)
    out, weights = boltzmann_attention(q, k, v, couplings=J, is_causal=True, mode="h+J-step", bias=-0.3,
                                       return_weights=True)
    h = q @ k.transpose(-1, -2) / 2.0 - 0.3
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    for b in range(2):
        for head in range(3):
            torch.testing.assert_close(weights[b, head], _loops(h[b, head], J[head], causal), atol=1e-12, rtol=0)
    torch.testing.assert_close(out, weights @ v)
    padded = torch.ones(6, dtype=torch.bool)
    padded[4] = False  # an absent key neither weighs nor feeds its neighbours
    w = boltzmann_attention(q, k, v, couplings=J, attn_mask=padded, mode="h+J-step", return_weights=True)[1]
    full_mask = padded.expand(6, 6)
    torch.testing.assert_close(w[1, 2], _loops((q @ k.transpose(-1, -2) / 2.0)[1, 2], J[2], full_mask), atol=1e-12,
                               rtol=0)


def test_gradcheck():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 5, 3, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    J = _symmetric(2, 5, seed=3).requires_grad_()
    # J through its upper triangle: gradcheck's perturbations keep it symmetric with a zero diagonal
    torch.autograd.gradcheck(lambda q, k, v, J: boltzmann_attention(q, k, v, couplings=J.triu(1) + J.triu(1).mT,
                                                                    is_causal=True, mode="h+J-step"), (q, k, v, J))


def test_the_layer_has_the_parameters_and_receptive_field_of_relative_couplings():
    torch.manual_seed(0)
    step = BoltzmannAttention(16, 2, max_len=10, mode="h+J-step", coupling="relative", coupling_range=3,
                              coupling_init_std=0.3).double()
    coupled = BoltzmannAttention(16, 2, max_len=10, mode="h+J", coupling="relative", coupling_range=3,
                                 method="banded").double()
    assert {n: p.shape for n, p in step.named_parameters()} == {n: p.shape for n, p in coupled.named_parameters()}
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    w = step(x, need_weights=True)[1]
    assert (w.triu(1) == 0).all()  # causal
    y = x.clone()
    y[0, 9] += 1.0  # the last position changes no earlier row
    torch.testing.assert_close(step(y, need_weights=True)[1][..., :9, :], w[..., :9, :], atol=0, rtol=0)
    with torch.no_grad():
        step.couplings.weight.zero_()
    h = BoltzmannAttention(16, 2, max_len=10, mode="h").double()
    h.load_state_dict({n: p for n, p in step.state_dict().items() if not n.startswith("couplings")})
    torch.testing.assert_close(step(x, need_weights=True)[1], h(x, need_weights=True)[1])  # J = 0: sigmoid(2h)


def test_it_takes_no_method_and_no_window():
    with pytest.raises(ValueError, match="does not use method"):
        BoltzmannAttention(16, 2, max_len=8, mode="h+J-step", method="banded")
    with pytest.raises(ValueError, match="coupling_window needs a mode"):
        BoltzmannAttention(16, 2, max_len=8, mode="h+J-step", coupling="window", coupling_window=4)


def test_convert_takes_full_couplings_of_any_length_for_the_control():
    """h+J-step solves no Ising system, so method exact's 24-spin limit does not apply to its full couplings."""
    transformers = pytest.importorskip("transformers")
    from boltzmann_attention.integrations import transformers as bt

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=20, bos_token_id=0,
                                     eos_token_id=0)
    model = bt.convert(transformers.GPT2LMHeadModel(config), mode="h+J-step", coupling="full",
                       coupling_init_std=0.1)
    assert torch.isfinite(model(torch.randint(0, 20, (1, 40))).logits).all()
    with pytest.raises(ValueError, match="beyond the limit of method 'exact', 24 spins per query"):
        bt.convert(transformers.GPT2LMHeadModel(config), mode="h+J", coupling="full")


def test_convert_names_the_couplings_the_control_takes_instead_of_its_default_window():
    transformers = pytest.importorskip("transformers")
    from boltzmann_attention.integrations import transformers as bt

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=20, bos_token_id=0,
                                     eos_token_id=0)
    default = r"mode 'h\+J-step' takes no coupled window, coupling='window' \(convert\(\)'s default: a window of 16 " \
        r"keys\)"
    with pytest.raises(ValueError, match=default + r"; pass coupling='relative' .* or coupling='full'"):
        bt.convert(transformers.GPT2LMHeadModel(config), mode="h+J-step")
    with pytest.raises(ValueError, match=r"takes no coupled window, coupling='window'; pass coupling='relative'"):
        bt.convert(transformers.GPT2LMHeadModel(config), mode="h+J-step", coupling="window", coupling_window=4)
    model = bt.convert(transformers.GPT2LMHeadModel(config), mode="h+J-step", coupling="relative", coupling_range=8)
    assert torch.isfinite(model(torch.randint(0, 20, (1, 40))).logits).all()
