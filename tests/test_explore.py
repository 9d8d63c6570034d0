"""The explorer's page: the J it shows is the layer's J (read off each couplings module's parameters), the J = 0
panel is sigmoid(2h) computed by hand, the curves are the run's history, for a bare layer of every coupling kind, a
run trained here, its checkpoint, a converted tiny GPT-2 and a committed run archive; its errors; the command."""

import base64
import gzip
import importlib.util
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("plotly")

from boltzmann_attention import BoltzmannAttention  # noqa: E402
from boltzmann_attention.experiments import cli  # noqa: E402
from boltzmann_attention.experiments import explore as ex  # noqa: E402
from boltzmann_attention.experiments.train import load_final  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r'<script type="application/json" class="figure" data-plot="plot-\d+">(.*?)</script>', re.S)
COUPLED, UNCOUPLED, DIFFERENCE = "with the couplings", "J = 0: sigmoid(2h)", "difference"


def figures(path) -> list[dict]:
    """Every figure's JSON in a page, in order."""
    return [json.loads(block) for block in FIGURE.findall(Path(path).read_text())]


def title(fig: dict) -> str:
    return fig["layout"]["title"]["text"]


def array(value) -> np.ndarray:
    """A figure's array: a plain list, or Plotly's typed array (base64 bytes of a dtype, with a shape)."""
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return data.reshape([int(n) for n in str(shape).split(",")]) if shape else data
    return np.asarray(value, dtype=float)


def trace(fig: dict, name: str) -> dict:
    (found,) = [t for t in fig["data"] if t.get("name") == name]
    return found


def layer_titles(name: str, kind: str, coupled: bool = True) -> list[str]:
    return [f"{name}: J ({ex.KINDS[kind]})", f"{name}: J by distance", f"{name}: attention weights"] + \
        ([f"{name}: marginals (⟨s⟩+1)/2 against sigmoid(2h)"] if coupled else [])


def heads(layer, x):
    B, L, D = x.shape
    H = layer.num_heads
    return [t.view(B, L, H, D // H).transpose(1, 2) for t in (layer.query(x), layer.key(x))]


def by_distance(J: np.ndarray) -> np.ndarray:
    """Mean J_jk over the pairs at |j - k| = d, d = 1 .. n-1, by a loop over the pairs."""
    n = J.shape[0]
    return np.array([np.mean([J[j, k] for j in range(n) for k in range(n) if abs(j - k) == d]) for d in range(1, n)])


# --------------------------------------------------------------------------------------------- bare layers

def _reference_J(layer, kind, x) -> np.ndarray:
    """J (H, n, n) from the couplings module's parameters, by each kind's definition."""
    w = layer.couplings.weight.detach().numpy() if kind not in ("keys", "query") else None
    L = x.shape[1]
    if kind == "window":
        upper = np.triu(w, 1)
        return upper + upper.transpose(0, 2, 1)
    if kind == "full":
        upper = np.triu(w[:, :L, :L], 1)
        return upper + upper.transpose(0, 2, 1)
    if kind == "relative":
        f = np.concatenate([np.zeros((w.shape[0], 1)), w, np.zeros((w.shape[0], L))], axis=1)
        d = np.abs(np.arange(L)[:, None] - np.arange(L)[None, :])
        return f[:, d]
    c = layer.couplings
    q, k = (t[0].detach().numpy() for t in heads(layer, x))                  # (H, L, E)
    a = np.einsum("hse,her->hsr", k, c.left.detach().numpy())
    b = np.einsum("hse,her->hsr", k, c.right.detach().numpy())
    d = np.abs(np.arange(L)[:, None] - np.arange(L)[None, :])
    band = (d > 0) & (d <= c.max_distance)
    if kind == "keys":
        pair = np.einsum("hjr,hkr->hjk", a, b)
    else:  # the last query's
        u = np.einsum("he,her->hr", q[:, -1], c.query_weight.detach().numpy())
        pair = np.einsum("hr,hjr,hkr->hjk", u, a, b)
    return (pair + pair.transpose(0, 2, 1)) / (2 * c.rank ** 0.5) * band


KINDS = {"window": dict(coupling="window", coupling_window=5), "full": dict(coupling="full"),
         "relative": dict(coupling="relative", coupling_range=3),
         "keys": dict(coupling="keys", coupling_range=3, coupling_rank=4, method="chain"),
         "query": dict(coupling="query", coupling_range=3, coupling_rank=4, method="chain")}


@pytest.mark.parametrize("kind", KINDS)
def test_a_bare_layer_shows_its_J_its_weights_and_sigmoid_2h(kind, tmp_path):
    torch.manual_seed(0)
    layer = BoltzmannAttention(16, 2, max_len=12, coupling_init_std=0.5, **KINDS[kind]).double()
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    page = ex.explore(layer, x=x, out=tmp_path / "layer.html")
    figs = figures(page)
    assert [title(f) for f in figs] == layer_titles("Layer 0", kind)
    J_fig, distance_fig, weights_fig, scatter_fig = figs

    want = _reference_J(layer, kind, x)
    assert want.shape == ((2, 5, 5) if kind == "window" else (2, 9, 9)) and np.abs(want).max() > 0.05
    for h in range(2):
        assert np.abs(array(J_fig["data"][h]["z"]) - want[h]).max() < 1e-12
        shown = array(distance_fig["data"][h]["y"])
        expected = layer.couplings.weight[h].detach().numpy() if kind == "relative" else by_distance(want[h])
        if kind in ("keys", "query"):
            expected = expected[:3]  # zero beyond the range
        assert np.abs(shown - expected).max() < 1e-12

    # the weights: the layer's own, and with J = 0 sigmoid(2h) by hand (causal; absent keys 0)
    _, weights = layer(x, need_weights=True)
    q, k = heads(layer, x)
    field = q @ k.transpose(-1, -2) / 8 ** 0.5 + layer.field_bias.view(-1, 1, 1)
    sigmoid = (torch.sigmoid(2 * field) * torch.ones(9, 9).tril())[0].detach().numpy()
    for h in range(2):
        coupled = array(trace(weights_fig, f"head {h}: {COUPLED}")["z"])
        uncoupled = array(trace(weights_fig, f"head {h}: {UNCOUPLED}")["z"])
        assert np.abs(coupled - weights[0, h].detach().numpy()).max() < 1e-12
        assert np.abs(uncoupled - sigmoid[h]).max() < 1e-12
        assert np.abs(array(trace(weights_fig, f"head {h}: {DIFFERENCE}")["z"]) - (coupled - uncoupled)).max() < 1e-15
        assert np.abs(coupled - uncoupled).max() > 1e-3  # the couplings change the weights
        # the scatter: every present pair (sigmoid(2h), weight with J)
        points = trace(scatter_fig, f"head {h}")
        got = sorted(zip(array(points["x"]).round(12), array(points["y"]).round(12)))
        present = np.tril(np.ones((9, 9), dtype=bool))
        assert got == sorted(zip(uncoupled[present].round(12), coupled[present].round(12)))
    assert [trace(weights_fig, f"head 1: {COUPLED}").get("visible"),
            trace(weights_fig, f"head 0: {COUPLED}").get("visible")] == [False, True]  # a menu picks the head


def test_a_bare_layer_reads_a_text_and_a_layer_without_couplings_shows_its_weights(tmp_path):
    layer = BoltzmannAttention(16, 2, max_len=12, coupling="window", coupling_window=4)
    html = ex.explore(layer, text="to be, or", out=tmp_path / "a.html").read_text()
    weights = figures(tmp_path / "a.html")[2]
    assert weights["layout"]["xaxis"]["ticktext"] == list("to␣be,␣or")
    assert "each character a fixed random vector" in html
    softmax = BoltzmannAttention(16, 2, max_len=12, mode="softmax")
    figs = figures(ex.explore(softmax, out=tmp_path / "s.html"))
    assert [title(f) for f in figs] == ["Layer 0: attention weights"]
    assert len(figs[0]["data"]) == 2  # one panel per head: no J = 0 to compare with
    rows = array(figs[0]["data"][0]["z"]).sum(-1)
    assert np.abs(rows - 1).max() < 1e-5  # softmax's rows sum to 1


# ------------------------------------------------------------------------------------------ a trained run

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny model trained here for a few steps by the train command, laid out as a sweep keeps it:
    results/runs/<name>.json and results/final/<name>.pt."""
    folder = tmp_path_factory.mktemp("results")
    result, final = folder / "runs" / "run.json", folder / "final" / "run.pt"
    assert cli.main(["train", "--task", "shakespeare", "--T", "12", "--coupling", "window", "--coupling-window", "4",
                     "--n-heads", "2", "--n-layers", "2", "--d-model", "16", "--d-ff", "16", "--steps", "4",
                     "--eval-interval", "2", "--eval-windows", "16", "--batch-size", "4", "--warmup-steps", "1",
                     "--coupling-init-std", "0.3", "--threads", "1", "--out", str(result),
                     "--checkpoint", str(final)]) == 0
    return result, final


def test_a_trained_run_shows_its_curves_and_every_layers_J(run, tmp_path):
    result, final = run
    raw = json.loads(result.read_text())
    figs = figures(ex.explore(result, out=tmp_path / "run.html"))
    assert [title(f) for f in figs] == [ex.TRAINING] + layer_titles("Layer 0", "window") + \
        layer_titles("Layer 1", "window")
    curves = figs[0]
    for name, key in (("training loss (the step's batch)", "train_loss"), ("validation loss", "loss")):
        assert array(trace(curves, name)["y"]).tolist() == [h[key] for h in raw["history"]]
    assert array(trace(curves, "validation loss")["x"]).tolist() == [2, 4]
    task, model = load_final(final)
    for i, block in enumerate(model.blocks):
        w = block.attn.couplings.weight.detach().numpy()
        want = np.triu(w, 1) + np.triu(w, 1).transpose(0, 2, 1)
        J_fig = figs[1 + 4 * i]
        shown = np.stack([array(J_fig["data"][h]["z"]) for h in range(2)])
        assert np.array_equal(shown, want) and np.abs(want).max() > 0.05
        assert np.abs(shown - np.array(raw["layers"][i]["couplings"])).max() < 1e-6  # what the result recorded
    # the default text: the first validation window, its characters on the axes
    first = task.data.vocab.decode(task.val[0][0])
    assert figs[3]["layout"]["xaxis"]["ticktext"] == [ex._visible(c) for c in first]


def test_the_model_itself_reads_token_ids(run, tmp_path):
    _, final = run
    task, model = load_final(final)
    ids = task.val[0][1, :7].tolist()
    page = ex.read_source(model, text=ids)
    assert page.tokens == [str(i) for i in ids] and [v.weights.shape for v in page.layers] == [(2, 7, 7)] * 2
    w = model.blocks[1].attn.couplings.weight.detach().numpy()
    assert np.array_equal(page.layers[1].J, np.triu(w, 1) + np.triu(w, 1).transpose(0, 2, 1))
    with pytest.raises(ValueError, match="give text as token ids, or a tokenizer"):
        ex.read_source(model, text="ROMEO")
    with pytest.raises(ValueError, match=r"integers in \[0, 65\)"):
        ex.read_source(model, text=[0, 65])


def test_a_run_reads_a_text_and_refuses_one_it_cannot(run, tmp_path):
    result, _ = run
    figs = figures(ex.explore(result, text="ROMEO: ay", out=tmp_path / "t.html"))
    assert array(figs[3]["data"][0]["z"]).shape == (9, 9)
    with pytest.raises(ValueError, match="the text has 13 tokens; the model reads 1 to T = 12"):
        ex.explore(result, text="ROMEO: ay me!", out=tmp_path / "long.html")
    with pytest.raises(ValueError, match=r"does not know: \['ж'\]"):
        ex.explore(result, text="ROMEOж", out=tmp_path / "bad.html")
    assert not (tmp_path / "long.html").exists() and not (tmp_path / "bad.html").exists()


def test_a_checkpoint_alone_and_a_result_without_its_model(run, tmp_path):
    result, final = run
    raw = json.loads(result.read_text())
    figs = figures(ex.explore(final, out=tmp_path / "c.html"))
    assert [title(f) for f in figs][:2] == [ex.TRAINING, "Layer 0: J (coupled window, by slot)"]
    assert array(trace(figs[0], "validation loss")["y"]).tolist() == [h["loss"] for h in raw["history"]]
    # without the kept model: the couplings the result recorded, and the curves
    alone = tmp_path / "elsewhere" / "runs" / "run.json"
    alone.parent.mkdir(parents=True)
    shutil.copy(result, alone)
    html = ex.explore(alone, out=tmp_path / "r.html").read_text()
    figs = figures(tmp_path / "r.html")
    assert [title(f) for f in figs] == [ex.TRAINING, "Layer 0: J (coupled window, by slot)", "Layer 0: J by distance",
                                        "Layer 1: J (coupled window, by slot)", "Layer 1: J by distance"]
    assert "No trained model is kept" in html
    assert np.array_equal(array(figs[1]["data"][1]["z"]), np.array(raw["layers"][0]["couplings"][1], np.float32))
    with pytest.raises(ValueError, match="need the trained model"):
        ex.explore(alone, text="ROMEO", out=tmp_path / "x.html")


def test_the_command_writes_the_page_and_names_a_missing_extra(run, tmp_path, monkeypatch, capsys):
    result, _ = run
    out = tmp_path / "page.html"
    assert cli.main(["explore", str(result), "--text", "ROMEO:", "--out", str(out)]) == 0
    assert f"explorer -> {out}" in capsys.readouterr().out and len(figures(out)) == 9
    assert cli.main(["explore", str(tmp_path / "nothing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    with pytest.raises(SystemExit, match=r'needs plotly; install the extra: pip install "boltzmann-attention\[explore'):
        cli.main(["explore", str(result), "--out", str(tmp_path / "none.html")])
    with pytest.raises(ValueError, match=r"boltzmann-attention\[explore\]"):
        ex.explore(result, out=tmp_path / "none.html")
    assert not (tmp_path / "none.html").exists()


# -------------------------------------------------------------------------------------------- in a browser

def _chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.mark.slow
def test_the_page_draws_every_plot_in_a_browser_without_an_error(run, tmp_path):
    """Chromium (the system's: .ci/run installs Debian's) driven by Playwright opens the page from the file: no
    console error, every figure drawn with its title, and a screenshot that is not blank."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium installed (.ci/run installs Debian's chromium package)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra has it)")
    image = pytest.importorskip("PIL.Image")
    path = ex.explore(run[0], text="ROMEO: ay", out=tmp_path / "page.html")
    expected = [title(f) for f in figures(path)]
    assert len(expected) == 9
    errors = []
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=browser, args=["--no-sandbox"])
        try:
            page = chromium.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(path.as_uri())
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .gtitle').length >= {len(expected)}",
                                   timeout=20000)
            drawn = page.eval_on_selector_all(".js-plotly-plot .gtitle", "titles => titles.map(t => t.textContent)")
            plots = page.eval_on_selector_all("div.plot", "divs => divs.length")
            shot = page.screenshot(full_page=True)
        finally:
            chromium.close()
    assert errors == []
    assert drawn == expected and plots == len(expected)
    pixels = np.asarray(image.open(io.BytesIO(shot)).convert("RGB"), dtype=float)
    assert pixels.std() > 10  # not one colour
    coloured = (pixels.max(-1) - pixels.min(-1)) > 60  # the heat maps' and lines' colours, not grey text
    assert coloured.mean() > 0.02


# --------------------------------------------------------------------------------------- a converted GPT-2

@pytest.mark.slow
def test_a_converted_gpt2_shows_its_couplings_and_sigmoid_attention_at_J_0(tmp_path):
    pytest.importorskip("transformers")
    import copy

    from transformers import GPT2Config, GPT2LMHeadModel

    from boltzmann_attention.integrations import transformers as bt

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=16, vocab_size=50, bos_token_id=0,
                                      eos_token_id=0)).double().eval()
    model = bt.convert(copy.deepcopy(base), coupling="window", coupling_window=4, coupling_init_std=0.5)
    ids = list(range(3, 13))
    figs = figures(ex.explore(model, text=ids, out=tmp_path / "gpt2.html"))
    assert [title(f) for f in figs] == layer_titles("Layer 0", "window") + layer_titles("Layer 1", "window")
    attentions = model(torch.tensor([ids]), output_attentions=True).attentions
    # J = 0 in layer 0 is the same model converted to sigmoid attention (the same field bias: both at their init)
    sigmoid = bt.convert(copy.deepcopy(base), mode="h").eval()(torch.tensor([ids]), output_attentions=True)
    for i, (_, module) in enumerate(bt.attention_modules(model)):
        w = module.boltzmann.couplings.weight.detach().numpy()
        J = np.triu(w, 1) + np.triu(w, 1).transpose(0, 2, 1)
        weights = figs[2 + 4 * i]
        for h in range(2):
            assert np.array_equal(array(figs[4 * i]["data"][h]["z"]), J[h])
            coupled = array(trace(weights, f"head {h}: {COUPLED}")["z"])
            assert np.abs(coupled - attentions[i][0, h].detach().numpy()).max() < 1e-12
            if i == 0:
                uncoupled = array(trace(weights, f"head {h}: {UNCOUPLED}")["z"])
                assert np.abs(uncoupled - sigmoid.attentions[0][0, h].detach().numpy()).max() < 1e-12
                assert np.abs(coupled - uncoupled).max() > 1e-3
    with pytest.raises(ValueError, match="needs text: token ids, or a string and a tokenizer"):
        ex.explore(model, out=tmp_path / "x.html")
    with pytest.raises(ValueError, match="give text as token ids, or a tokenizer"):
        ex.explore(model, text="hello", out=tmp_path / "x.html")
    words = {"a": 3, "b": 4}
    page = ex.read_source(model, text="a b a", tokenizer=lambda s: [words[w] for w in s.split()])
    assert page.layers[0].weights.shape == (2, 3, 3)
    # the command, on the folder the converted model was saved to: the same weights
    model.save_pretrained(tmp_path / "saved")
    out = tmp_path / "saved.html"
    assert cli.main(["explore", str(tmp_path / "saved"), "--ids", ",".join(map(str, ids)), "--out", str(out)]) in (
        0, None)
    saved = figures(out)
    for i in range(2):
        for h in range(2):
            a, b = (array(trace(f[2 + 4 * i], f"head {h}: {COUPLED}")["z"]) for f in (figs, saved))
            assert np.abs(a - b).max() < 1e-6  # the saved model loads in float32
    with pytest.raises(ValueError, match="holds no tokenizer for the text"):
        ex.explore(tmp_path / "saved", text="hello", out=tmp_path / "x.html")


# ----------------------------------------------------------------------------------------- a run archive

def test_a_committed_archive_shows_each_arms_headline(tmp_path):
    archive = ROOT / "report" / "blocks" / "runs.jsonl.gz"
    html = ex.explore(archive, out=tmp_path / "blocks.html").read_text()
    assert figures(tmp_path / "blocks.html") == [] and "<h2>Findings</h2>" in html
    runs = [json.loads(line) for line in gzip.open(archive, "rt") if line.strip()]
    arms: dict = {}
    for r in runs:
        a, d = r["config"]["attention"], r["config"]["data"]
        arms.setdefault((r["variant"], d["T"], a["mode"], a["method"]), []).append(r["metrics"]["test"]["error"])
    table = html.split("<h2>Findings</h2>")[1]
    assert table.count("<tr>") == 1 + min(len(arms), ex.MAX_FINDINGS)
    (variant, T, mode, method), errors = max(arms.items(), key=lambda item: len(item[1]))
    row = next(r for r in table.split("<tr>") if f"<td>{variant}</td><td>{T}</td><td>{mode}</td>" in r)
    assert f"test error {np.mean(errors):.4f} ± {np.std(errors, ddof=1):.4f}" in row
    assert ex.read_source(archive.parent).findings == ex.read_source(archive).findings  # the report folder too


def test_sources_that_cannot_be_shown_are_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ex.read_source(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="without runs.jsonl.gz or runs/"):
        ex.read_source(tmp_path)
    with pytest.raises(ValueError, match="holds no BoltzmannAttention layer"):
        ex.read_source(torch.nn.Linear(2, 2), text=[0])
    with pytest.raises(ValueError, match="x is the input of a bare BoltzmannAttention layer"):
        ex.read_source(tmp_path, x=torch.zeros(2, 2))
