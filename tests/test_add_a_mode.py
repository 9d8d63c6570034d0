"""Adding a mode is adding its record: one entry in modes.RECORDS, and the layer, the training config, the CLI
and convert() take it, with no other change."""

import json

import pytest
import torch

from boltzmann_attention import BoltzmannAttention, modes
from boltzmann_attention.experiments import cli
from boltzmann_attention.experiments.config import TrainConfig

NAME = "h-half"  # sigmoid(h): the free spin at twice the temperature


@pytest.fixture
def added(monkeypatch):
    monkeypatch.setitem(modes.RECORDS, NAME, modes.Mode(NAME, "sigmoid(h)", field_bias=True,
                                                               weights=lambda h, J, mask: torch.sigmoid(h)))
    return NAME


def test_the_mode_lists_and_the_layer_take_it(added):
    assert added in modes.LAYER_MODES and added in modes.MODES and added not in modes.WINDOW_MODES
    torch.manual_seed(0)
    half = BoltzmannAttention(16, 2, max_len=8, mode=added).double()
    h = BoltzmannAttention(16, 2, max_len=8, mode="h").double()
    h.load_state_dict(half.state_dict())
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    w_h = h(x, need_weights=True)[1]  # sigmoid(2 f) on the causal triangle: f = logit(w_h) / 2
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    expected = torch.where(causal, torch.sigmoid(torch.logit(w_h) / 2), 0.0)
    torch.testing.assert_close(half(x, need_weights=True)[1], expected, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=f"mode '{added}' does not use method"):
        BoltzmannAttention(16, 2, max_len=8, mode=added, method="banded")


def test_the_config_trains_it(added, tmp_path):
    from boltzmann_attention.experiments.train import train
    cfg = TrainConfig.build(T=8, mode=added, steps=2, batch_size=4, d_model=16, n_heads=2, eval_interval=2,
                            eval_windows=8, warmup_steps=0)
    result = train(cfg, progress=False)
    assert result["config"]["attention"]["mode"] == added and result["steps_run"] == 2
    assert 0 < result["metrics"]["val"]["loss"] < 10


def test_the_cli_offers_it(added, capsys):
    parser, _ = cli.build_parser()
    args = parser.parse_args(["train", "--mode", added, "--steps", "1"])
    assert args.mode == added
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--mode", "h-third"])
    assert added in capsys.readouterr().err  # the choices named in the error


def test_convert_takes_it(added):
    transformers = pytest.importorskip("transformers")
    from boltzmann_attention.integrations import transformers as bt
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=20)
    model = transformers.GPT2LMHeadModel(config).double().eval()
    ids = torch.randint(0, 20, (1, 8))
    converted = bt.convert(model, mode=added)
    assert json.loads(converted.config.to_json_string())["boltzmann_attention"]["mode"] == added
    out = converted(ids, output_attentions=True)
    weights = out.attentions[0]
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    assert torch.isfinite(out.logits).all() and (weights[..., ~causal] == 0).all() and (weights[..., causal] > 0).all()
