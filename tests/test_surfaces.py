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
          "stickbreaking": dict(mode="stickbreaking"), "mta": dict(mode="mta")}


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


# ------------------------------------------------------------------------------------------- the nested config

def test_a_flat_write_reaches_training_and_the_saved_config():
    from dataclasses import asdict

    from boltzmann_attention.experiments.config import TrainConfig

    cfg = TrainConfig()
    cfg.lr, cfg.mode, cfg.T, cfg.seed = 0.5, "h", 12, 3
    assert (cfg.optim.lr, cfg.attention.mode, cfg.data.T, cfg.seed) == (0.5, "h", 12, 3)
    saved = asdict(cfg)
    assert saved["optim"]["lr"] == 0.5 and TrainConfig.from_dict(saved).optim.lr == 0.5
    with pytest.raises(AttributeError, match="no field 'learning_rate'"):
        cfg.learning_rate = 0.1


@pytest.mark.parametrize("saved, message", [
    ({"lr": 0.1, "optim": {"lr": 0.2}}, r"\['lr'\] both flat and in section 'optim'"),
    ({"optim": None, "data": {}}, "section 'optim' must be a dict"),
    ({"optim": [0.1], "data": {}}, "section 'optim' must be a dict"),
    ({"optim": "fast"}, "section 'optim' must be a dict"),
    ("lr=0.1", "a saved config must be a dict, got str"),
    (["lr"], "a saved config must be a dict, got list"),
])
def test_a_saved_config_is_refused_in_one_sentence_naming_the_problem(saved, message):
    from boltzmann_attention.experiments.config import TrainConfig

    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(saved)


def test_the_same_value_flat_and_nested_is_read_and_sections_must_be_their_dataclasses():
    from boltzmann_attention.experiments.config import OptimConfig, TrainConfig

    assert TrainConfig.from_dict({"lr": 0.2, "optim": {"lr": 0.2}}).optim.lr == 0.2
    with pytest.raises(ValueError, match="section 'optim' must be an instance of OptimConfig, got dict"):
        TrainConfig(optim={"lr": 0.1})
    assert TrainConfig(optim=OptimConfig(lr=0.1)).lr == 0.1


def test_a_config_saved_with_the_arch_section_under_its_earlier_name_reads_the_same():
    from dataclasses import asdict

    from boltzmann_attention.experiments.config import TrainConfig

    cfg = TrainConfig.build(d_model=32, n_layers=2, lr=0.01)
    saved = asdict(cfg)
    earlier = {("model" if k == "arch" else k): v for k, v in saved.items()}
    assert "arch" in saved and "model" not in saved
    assert TrainConfig.from_dict(earlier) == cfg and TrainConfig.from_dict(earlier).arch.d_model == 32


# ---------------------------------------------------------------------------------- options a mode does not use

UNUSED = [
    ("softmax", dict(method="banded"), "method"), ("softmax", dict(field_bias_init=1.0), "field_bias_init"),
    ("softmax", dict(learn_field_bias=False), "learn_field_bias"),
    ("softmax", dict(coupling_init_std=0.1), "coupling_init_std"),
    ("h", dict(method="banded"), "method"), ("h", dict(coupling="relative"), "coupling"),
    ("h", dict(method_options={"max_spins": 5}), "method_options"),
    ("fox", dict(method="banded"), "method"), ("stickbreaking", dict(field_bias_init=1.0), "field_bias_init"),
    ("fox", dict(learn_field_bias=False), "learn_field_bias"),
    ("stickbreaking", dict(coupling="window", coupling_window=3), "coupling, coupling_window"),
]


@pytest.mark.parametrize("mode, options, names", UNUSED)
def test_an_option_the_mode_does_not_use_is_refused_by_the_layer_and_the_config(mode, options, names):
    from boltzmann_attention.experiments.config import TrainConfig

    with pytest.raises(ValueError, match=f"mode '{mode}' does not use {names}"):
        BoltzmannAttention(8, 2, max_len=6, mode=mode, **options)
    with pytest.raises(ValueError, match=f"mode '{mode}' does not use {names}"):
        TrainConfig.build(mode=mode, d_model=8, n_heads=2, T=6, **options).validate()


@pytest.mark.parametrize("name, value", [("learn_field_bias", "no"), ("learn_field_bias", 1), ("bias", "yes"),
                                         ("causal", None)])
def test_boolean_options_of_the_layer_are_checked(name, value):
    with pytest.raises(ValueError, match=f"{name} must be True or False"):
        BoltzmannAttention(8, 2, max_len=6, mode="h", **{name: value})


def test_the_options_every_mode_uses_are_still_accepted():
    for mode, options in [("h+J", dict(method="banded", coupling="relative", coupling_range=2)),
                          ("J", dict(coupling_init_std=0.1, field_bias_init=0.5, learn_field_bias=False)),
                          ("h+K", dict(coupling_init_std=0.1)), ("h", dict(field_bias_init=-1.0)),
                          ("fox", dict(slot_bias=2, position="alibi"))]:
        BoltzmannAttention(8, 2, max_len=6, mode=mode, **options)


def test_field_bias_variants_apply_to_the_modes_that_have_a_field_bias_only():
    from boltzmann_attention.experiments.recipes import field_bias
    from boltzmann_attention.experiments.sweep import Grid

    grid = Grid(("shakespeare",), (8,), modes=("softmax", "h+J"), seeds=(0,), field_bias=field_bias("fixed-0"))
    runs = dict(grid.runs())
    by_mode = {cfg.attention.mode: cfg for cfg in runs.values()}
    assert by_mode["h+J"].attention.field_bias_init == 0.0 and not by_mode["h+J"].attention.learn_field_bias
    assert by_mode["softmax"].attention.field_bias_init is None and by_mode["softmax"].attention.learn_field_bias
    for cfg in runs.values():
        cfg.validate()
    with pytest.raises(TypeError, match="FieldBias"):
        Grid(("shakespeare",), (8,), field_bias="fixed-0")


# ------------------------------------------------------------------------------------------- the study registry

GOOD_STUDY = '''
PROFILES = {"%s": lambda field_bias, decisions: []}
HELP = {"%s": "a study written by the test"}


def owns(res):
    return False


def report(res, context):
    return []
'''

BROKEN = {
    "an import error": ("import no_such_module_here\n", "cannot be imported: ModuleNotFoundError"),
    "PROFILES not a dict": (GOOD_STUDY.replace('PROFILES = {"%s": lambda field_bias, decisions: []}',
                                               'PROFILES = ["%s"]'), "PROFILES must be a dict"),
    "no report": (GOOD_STUDY.split("def report")[0], r"report\(\) is missing"),
    "a duplicate profile": (GOOD_STUDY.replace("%s", "priors"), "profile 'priors' is defined by two studies"),
}


def _add_study(tmp_path, monkeypatch, source, name="broken", decisions=None):
    from boltzmann_attention.experiments import studies

    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text(source.replace("%s", f"{name}-profile"))
    if decisions is not None:
        (folder / "decisions.json").write_text(decisions)
    monkeypatch.setattr(studies, "__path__", [*studies.__path__, str(tmp_path)])
    monkeypatch.delitem(__import__("sys").modules, f"{studies.__name__}.{name}", raising=False)
    return folder


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_study_is_named_in_one_line_and_train_still_runs(case, tmp_path, monkeypatch, capsys):
    from boltzmann_attention.experiments import cli, studies

    source, message = BROKEN[case]
    folder = _add_study(tmp_path, monkeypatch, source)
    with pytest.raises(studies.StudyError, match=message) as error:
        studies.profiles()
    text = str(error.value)
    assert "\n" not in text and "'broken'" in text  # one line, naming the study
    assert str(folder) in text  # and its file
    assert cli.main(["reproduce", "--profile", "quick", "--out", str(tmp_path / "r")]) == 2
    assert message.split(":")[0].replace("\\", "") in capsys.readouterr().err
    out = tmp_path / "run.json"
    assert cli.main(["train", "--task", "brackets", "--T", "4", "--steps", "1", "--batch-size", "2", "--d-model", "8",
                     "--d-ff", "8", "--eval-interval", "1", "--train-sequences", "8", "--mode", "softmax",
                     "--warmup-steps", "0",
                     "--out", str(out)]) == 0
    assert out.exists()


def test_broken_decisions_and_owns_are_named(tmp_path, monkeypatch):
    from dataclasses import dataclass
    from types import SimpleNamespace

    from boltzmann_attention.experiments import studies

    _add_study(tmp_path, monkeypatch, GOOD_STUDY.replace("return False", "raise KeyError('variant')"), "raising")
    with pytest.raises(studies.StudyError, match=r"study 'raising' .*owns\(\) raised KeyError"):
        studies.study_of(studies.Results([]))

    @dataclass(frozen=True)
    class Decisions:
        best_lr: dict = None

    folder = tmp_path / "decided"
    folder.mkdir()
    (folder / "decisions.json").write_text('{"BEST_LR": {"h": 0.003,}}')
    fake = SimpleNamespace(__name__="x.decided", __file__=str(folder / "__init__.py"), Decisions=Decisions)
    with pytest.raises(studies.StudyError, match=r"study 'decided': .*decisions.json is not JSON"):
        studies.load_decisions(fake)


def test_a_finfo_min_mask_entry_with_couplings_is_refused_as_the_docstring_says():
    from boltzmann_attention import boltzmann_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 1, 5, 4, generator=g).unbind(0)
    W = 0.3 * torch.randn(1, 5, 5, generator=g)
    J = W.triu(1) + W.triu(1).transpose(-1, -2)
    mask = torch.zeros(5, 5)
    mask[:, 2] = torch.finfo(torch.float32).min
    with pytest.raises(ValueError, match="cannot be resolved"):
        boltzmann_attention(q, k, v, couplings=J, attn_mask=mask)
    with pytest.raises(ValueError, match="cannot be resolved"):
        boltzmann_attention(q, k, v, couplings=J[:, :3, :3], coupling_window=3, is_causal=True, attn_mask=mask)
    weights = boltzmann_attention(q, k, v, mode="h", attn_mask=mask, return_weights=True)[1]
    assert (weights[..., 2] == 0).all() and (weights[..., [0, 1, 3, 4]] > 0).all()
    absent = mask.masked_fill(mask < 0, float("-inf"))  # the way out: -inf (or a bool mask) removes the key
    torch.testing.assert_close(boltzmann_attention(q, k, v, couplings=J, attn_mask=absent),
                               boltzmann_attention(q, k, v, couplings=J, attn_mask=mask == 0))


def test_a_saved_config_with_options_its_mode_ignored_reads_back_as_the_model_it_trained():
    """Results written before unused options were refused (softmax under a field-bias variant) still load: the
    options their training ignored read back at their defaults, and the config validates."""
    from dataclasses import asdict

    from boltzmann_attention.experiments.config import TrainConfig

    saved = asdict(TrainConfig.build(mode="h+J"))
    saved["attention"].update(mode="softmax", field_bias_init=0.0, learn_field_bias=False, coupling_init_std=0.1)
    cfg = TrainConfig.from_dict(saved)
    assert (cfg.field_bias_init, cfg.learn_field_bias, cfg.coupling_init_std) == (None, True, 0.0)
    cfg.validate()
    kept = TrainConfig.from_dict(asdict(TrainConfig.build(mode="h", field_bias_init=0.0)))
    assert kept.field_bias_init == 0.0  # used by mode h: kept
