"""The pairs-parametrised slot bias (the coupled window's field term without its interaction term) and the
slot-bias learning-rate multiplier, against definitions written out by loops in float64."""

import pytest
import torch

from boltzmann_attention import BoltzmannAttention
from boltzmann_attention.experiments.coattention import without_couplings
from boltzmann_attention.experiments.config import TrainConfig
from boltzmann_attention.experiments.model import Model
from boltzmann_attention.experiments.train import build_optimizer, learned_priors, model_config
from boltzmann_attention.positions import SlotBias

D = torch.float64
W, E, HEADS, L = 4, 8, 2, 9


def _symmetric(H, W, seed):
    g = torch.Generator().manual_seed(seed)
    P = torch.randn(H, W, W, dtype=D, generator=g).triu(1)
    return P + P.transpose(-1, -2)


def _pairs_module(seed=0, H=HEADS, window=W):
    module = SlotBias(H, window, "pairs").double()
    with torch.no_grad():
        module.weight.copy_(torch.randn(H, window, dtype=D, generator=torch.Generator().manual_seed(seed + 100)))
        module.pairs.weight.copy_(_symmetric(H, window, seed))
    return module


def _by_loops(module, L, S):
    """bias[h, r, j] at query position i = S - L + r: w_a - sum_{b != a, i - b >= 0} P_ab for a = i - j in 0..W-1."""
    P = module.pairs()
    out = torch.zeros(module.weight.shape[0], L, S, dtype=D)
    for h in range(out.shape[0]):
        for r in range(L):
            i = S - L + r
            for j in range(S):
                a = i - j
                if 0 <= a < module.window:
                    out[h, r, j] = module.weight[h, a] - sum(P[h, a, b] for b in range(module.window)
                                                             if b != a and i - b >= 0)
    return out


@pytest.mark.parametrize("L_, S", [(9, 9), (1, 9), (3, 7), (2, 2), (6, 6)])
def test_pairs_bias_by_loops(L_, S):
    module = _pairs_module()
    torch.testing.assert_close(module(L_, S), _by_loops(module, L_, S), rtol=0, atol=1e-12)
    torch.testing.assert_close(module.full_window(), _by_loops(module, 1, 9)[:, 0, 8 - torch.arange(W)])


def test_pairs_table_is_parametrised_as_the_window_couplings():
    from boltzmann_attention.couplings import WindowCouplings
    module = SlotBias(3, 5, "pairs")
    assert isinstance(module.pairs, WindowCouplings) and module.pairs.weight.shape == (3, 5, 5)
    assert torch.count_nonzero(module(7, 7)) == 0  # starts at zero
    P = module.pairs()
    assert torch.equal(P, P.transpose(-1, -2)) and torch.count_nonzero(P.diagonal(dim1=-2, dim2=-1)) == 0


def test_pairs_bias_gradcheck():
    module = _pairs_module()
    inputs = (module.weight.detach().clone().requires_grad_(), module.pairs.weight.detach().clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda w, p: _functional(module, w, p, 3, 7), inputs)


def _functional(module, w, p, L, S):
    return torch.func.functional_call(module, {"weight": w, "pairs.weight": p}, (L, S))


def _layers(seed=0):
    """The coupled window with J, a free slot bias and the rest random; and its twin: mode h with the pairs slot
    bias, P = J, the same free slot bias and every other parameter shared."""
    torch.manual_seed(seed)
    coupled = BoltzmannAttention(E, HEADS, max_len=L, mode="h+J", coupling="window", coupling_window=W,
                                 slot_bias=W).double()
    twin = BoltzmannAttention(E, HEADS, max_len=L, mode="h", slot_bias=W, slot_bias_parametrization="pairs").double()
    with torch.no_grad():
        coupled.couplings.weight.copy_(_symmetric(HEADS, W, seed + 1))
        coupled.slot_bias.weight.normal_()
        coupled.field_bias.normal_()
    state = {k: v for k, v in coupled.state_dict().items() if not k.startswith("couplings")}
    twin.load_state_dict({**state, "slot_bias.pairs.weight": coupled.couplings.weight}, strict=True)
    return coupled, twin


def test_twin_is_the_coupled_window_with_its_interaction_term_removed():
    coupled, twin = _layers()
    x = torch.randn(3, L, E, dtype=D, generator=torch.Generator().manual_seed(2))
    with without_couplings(coupled, "field only"):
        field_only = coupled(x, need_weights=True)[1]
    weights = twin(x, need_weights=True)[1]
    torch.testing.assert_close(weights, field_only, rtol=0, atol=1e-12)  # every row, the first W - 1 too
    # and by hand: sigmoid(2 (h + b_a - R_a)) on the causal keys
    B = x.shape[0]
    heads = lambda t: t.view(B, L, HEADS, E // HEADS).transpose(1, 2)  # noqa: E731
    h = heads(twin.query(x)) @ heads(twin.key(x)).transpose(-1, -2) / (E // HEADS) ** 0.5
    h = h + twin.field_bias.view(-1, 1, 1) + _by_loops(twin.slot_bias, L, L)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    torch.testing.assert_close(weights, torch.sigmoid(2 * h) * causal, rtol=0, atol=1e-12)
    assert not torch.allclose(weights, coupled(x, need_weights=True)[1], atol=1e-3)  # J's co-attention differs


def test_twin_gradcheck_and_cached_decoding():
    _, twin = _layers(seed=3)
    x = torch.randn(1, 6, E, dtype=D, generator=torch.Generator().manual_seed(4))
    params = (twin.slot_bias.weight, twin.slot_bias.pairs.weight)
    assert torch.autograd.gradcheck(lambda xx, *ps: twin(xx)[0], (x.clone().requires_grad_(), *params))
    full = twin(x)[0]
    cache, rows = {}, []
    for t in range(6):
        rows.append(twin(x[:, t:t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("options, message", [
    (dict(mode="h", slot_bias_parametrization="pairs"), "set slot_bias = W"),
    (dict(mode="h", slot_bias=3, slot_bias_parametrization="table"), "unknown slot_bias_parametrization 'table'"),
    (dict(mode="h", slot_bias=3, slot_bias_parametrization=None), "unknown slot_bias_parametrization None"),
])
def test_layer_refuses_bad_parametrizations(options, message):
    with pytest.raises(ValueError, match=message):
        BoltzmannAttention(8, 2, max_len=6, **options)


TINY = dict(T=8, d_model=8, n_heads=2, n_layers=2, d_ff=16, batch_size=2, steps=2, warmup_steps=0, weight_decay=0.1,
            grad_clip=float("inf"))


def test_config_refuses_a_slot_bias_multiplier_without_a_slot_bias():
    with pytest.raises(ValueError, match="slot_bias_lr_multiplier = 4 .* has none"):
        TrainConfig.build(mode="h", slot_bias_lr_multiplier=4.0, **TINY).validate()
    with pytest.raises(ValueError, match="slot_bias_lr_multiplier must be a finite number > 0"):
        TrainConfig.build(mode="h", slot_bias=3, slot_bias_lr_multiplier=0.0, **TINY).validate()
    with pytest.raises(ValueError, match="unknown slot_bias_parametrization"):
        TrainConfig.build(mode="h", slot_bias=3, slot_bias_parametrization="x", **TINY).validate()
    TrainConfig.build(mode="h", slot_bias=3, slot_bias_parametrization="pairs", slot_bias_lr_multiplier=4.0,
                      **TINY).validate()


@pytest.mark.parametrize("mode", ["h", "softmax", "mta", "fox", "stickbreaking"])
def test_config_refuses_a_coupling_multiplier_without_couplings(mode):
    """Modes without J or K have no parameter the multiplier would scale: a value would be ignored."""
    with pytest.raises(ValueError, match=f"coupling_lr_multiplier = 4 .* mode '{mode}' has none"):
        TrainConfig.build(mode=mode, coupling_lr_multiplier=4.0, **TINY).validate()
    TrainConfig.build(mode=mode, **TINY).validate()


@pytest.mark.parametrize("mode", ["J", "h+J", "h+K", "h+J-step"])
def test_config_takes_a_coupling_multiplier_with_couplings(mode):
    TrainConfig.build(mode=mode, coupling_lr_multiplier=4.0, **TINY).validate()


@pytest.mark.parametrize("parametrization", ["direct", "pairs"])
@pytest.mark.parametrize("multiplier", [1.0, 16.0])
def test_adam_moves_the_slot_bias_at_its_own_learning_rate(parametrization, multiplier):
    """Adam's first step moves every parameter with a nonzero gradient by lr x its group's multiplier (up to eps):
    the slot bias (and its pair table) by lr x slot_bias_lr_multiplier, J by lr x coupling_lr_multiplier, the
    rest by lr."""
    lr = 1e-3
    cfg = TrainConfig.build(mode="h+J", coupling="window", coupling_window=3, slot_bias=3, lr=lr,
                            slot_bias_parametrization=parametrization, slot_bias_lr_multiplier=multiplier,
                            coupling_lr_multiplier=0.25, coupling_init_std=0.3, **TINY)
    cfg.validate()
    torch.manual_seed(0)
    model = Model(model_config(cfg, 11))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.slot_bias.weight.normal_()
            if block.attn.slot_bias.pairs is not None:
                block.attn.slot_bias.pairs.weight.normal_()
    optimizer = build_optimizer(model, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randint(0, 11, (2, 8))
    logits = model(x)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    optimizer.step()
    seen = set()
    for n, p in model.named_parameters():
        moved = (p.detach() - before[n])[grads[n].abs() > 1e-4]  # eps / |g| <= 1e-4
        if "slot_bias" in n:
            expected = lr * multiplier
        elif "couplings" in n:
            expected = lr * 0.25
        elif p.dim() < 2 or "field_bias" in n:
            expected = lr
        else:
            continue  # decayed matrices: lr plus the decay
        seen.add(n.split(".")[-2] if "pairs" in n else n.split(".")[-1])
        torch.testing.assert_close(moved.abs(), torch.full_like(moved, expected), rtol=1e-3, atol=0)
    assert "weight" in seen
    assert ("pairs" in seen) == (parametrization == "pairs")


def test_the_pair_table_is_recorded():
    cfg = TrainConfig.build(mode="h", slot_bias=3, slot_bias_parametrization="pairs", **TINY)
    torch.manual_seed(0)
    model = Model(model_config(cfg, 11))
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.slot_bias.pairs.weight.normal_()
    record = learned_priors(attn, 8)
    assert torch.equal(torch.tensor(record["slot_bias_pairs"], dtype=torch.float32), attn.slot_bias.pairs())
    assert torch.equal(torch.tensor(record["slot_bias"], dtype=torch.float32), attn.slot_bias.weight)


@pytest.mark.parametrize("mode", ["h", "softmax", "h+J", "J", "fox", "stickbreaking", "mta"])
def test_the_pairs_slot_bias_runs_under_autocast(mode):
    """After a Linear under autocast (bfloat16 activations), forward, backward and cached decoding give what the
    float32 layer gives, to bfloat16's precision; the pair table gets its gradient."""
    torch.manual_seed(0)
    layer = BoltzmannAttention(E, HEADS, max_len=L, mode=mode, slot_bias=W, slot_bias_parametrization="pairs")
    with torch.no_grad():
        layer.slot_bias.pairs.weight.normal_()
    linear = torch.nn.Linear(E, E)
    x = torch.randn(2, L, E)
    expected = layer(linear(x))[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(linear(x))[0]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=0.05, rtol=0.05)
    out.float().square().sum().backward()
    assert layer.slot_bias.pairs.weight.grad.abs().sum() > 0
    cache = {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rows = [layer(linear(x[:, :4]), cache=cache)[0]] + [layer(linear(x[:, i:i + 1]), cache=cache)[0]
                                                            for i in range(4, L)]
    torch.testing.assert_close(torch.cat(rows, dim=1).float(), expected, atol=0.05, rtol=0.05)
