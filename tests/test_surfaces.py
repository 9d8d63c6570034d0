"""The newer surfaces as a hostile user meets them: recency modes at long lengths and with bad values, decoding
caches misused, the nested config written to by flat name, options a mode does not use."""

import pytest
import torch
import torch.nn.functional as F

from boltzmann_attention import BoltzmannAttention
from boltzmann_attention.recency import forgetting_attention

D = torch.float64


def _fox_by_prefix_sums(q, k, v, log_forget):
    """FoX's weights in float64 from the definition, with the prefix-sum difference c_i - c_j (exact enough in
    float64 at these sizes: |c| ~ 1e4 loses ~1e-12)."""
    L, S = q.shape[-2], k.shape[-2]
    c = log_forget.cumsum(-1)
    forget = c[..., S - L:, None] - c[..., None, :]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + forget
    scores = scores.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(S - L), float("-inf"))
    return torch.softmax(scores, -1)


@pytest.mark.parametrize("gate_shift", [None, -5.0])
def test_fox_in_float32_at_long_length_is_as_accurate_as_without_forgetting(gate_shift):
    """At S = 2048 with strongly forgetting gates (sum of log f about -1e4) the float32 weights stay within a
    small multiple of float32's error without forgetting (the prefix-sum difference was off by ~1e-4)."""
    S, E = 2048, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, S, E, dtype=D, generator=g) for _ in range(3))
    log_forget = torch.zeros(1, 1, S, dtype=D) if gate_shift is None else \
        F.logsigmoid(2 * torch.randn(1, 1, S, dtype=D, generator=g) + gate_shift)
    reference = _fox_by_prefix_sums(q, k, v, log_forget)
    weights = forgetting_attention(q.float(), k.float(), v.float(), log_forget.float(), return_weights=True)[1]
    assert (weights.double() - reference).abs().max() < 1e-6
    # and the float64 path is the definition (rows at every position, the last ones included)
    exact = forgetting_attention(q[..., -64:, :], k, v, log_forget, return_weights=True)[1]
    torch.testing.assert_close(exact, _fox_by_prefix_sums(q[..., -64:, :], k, v, log_forget), rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["fox", "stickbreaking"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_recency_modes_refuse_nan_and_inf_like_every_other_mode(mode, bad):
    layer = BoltzmannAttention(8, 2, max_len=6, mode=mode)
    x = torch.randn(1, 6, 8)
    x[0, 3, 1] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        layer(x)
    with pytest.raises(ValueError, match="NaN or inf"):
        layer(x, cache={})


CACHED = {"h+J": dict(mode="h+J"), "window": dict(mode="h+J", coupling="window", coupling_window=3),
          "h": dict(mode="h"), "softmax": dict(mode="softmax"), "fox": dict(mode="fox"),
          "stickbreaking": dict(mode="stickbreaking")}


@pytest.mark.parametrize("name", sorted(CACHED))
def test_a_cache_belongs_to_its_layer_and_batch(name):
    torch.manual_seed(0)
    layer, other = (BoltzmannAttention(8, 2, max_len=6, **CACHED[name]) for _ in range(2))
    x = torch.randn(2, 3, 8)
    cache = {}
    layer(x[:, :2], cache=cache)
    with pytest.raises(ValueError, match="another layer's keys"):
        other(x[:, 2:], cache=cache)                       # shared by two layers
    with pytest.raises(ValueError, match="batch size 1"):
        layer(x[:1, 2:], cache=cache)                      # another batch size
    partial = {k: v for k, v in cache.items() if k != "key"}
    with pytest.raises(ValueError, match="must hold exactly"):
        layer(x[:, 2:], cache=partial)                     # some keys only
    with pytest.raises(ValueError, match="another layer's keys"):
        layer(x[:, 2:], cache={"key": cache["key"], "value": cache["value"]})  # filled by hand
    # the refusals changed nothing: the cached rows are still the full forward's
    torch.testing.assert_close(layer(x[:, 2:], cache=cache)[0], layer(x)[0][:, 2:])


def test_a_cache_started_by_one_mode_is_refused_by_a_layer_of_another():
    torch.manual_seed(0)
    coupled, fox = BoltzmannAttention(8, 2, max_len=6, mode="h+J"), BoltzmannAttention(8, 2, max_len=6, mode="fox")
    cache = {}
    coupled(torch.randn(1, 2, 8), cache=cache)
    with pytest.raises(ValueError, match="another layer's keys"):
        fox(torch.randn(1, 1, 8), cache=cache)
