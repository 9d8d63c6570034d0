"""The explorer: one self-contained HTML page of what a model learned, to open offline, with no server.

:func:`explore` (and ``boltzmann-attention explore``) reads a source and writes one HTML file of Plotly figures,
Plotly's JavaScript inlined once. Sources:

- a run's result JSON (``<results>/runs/<name>.json``) with its kept model (``<results>/final/<name>.pt``, which a
  sweep keeps, or ``<name>.ckpt.pt`` beside it, which ``train --checkpoint`` keeps); without either, the couplings
  the result recorded and its training curves;
- a checkpoint file alone (a sweep's ``final/<name>.pt``, a ``train --checkpoint`` file);
- a Hugging Face decoder converted by :func:`boltzmann_attention.integrations.transformers.convert` (the text as
  token ids, or a tokenizer), or the folder it was saved to with ``save_pretrained`` (its tokenizer read from the
  folder when one is saved there);
- a bare :class:`~boltzmann_attention.BoltzmannAttention` layer (which has no embedding: each character of the
  text is a fixed random vector, drawn from a generator seeded by its code point, or pass ``x``), or a module
  holding such layers, such as the experiments' model (the text as token ids);
- a report's run archive (``report/<study>/runs.jsonl.gz``, or that folder) or a results folder: a short table of
  the study's arms and their headline metric.

For a model, per attention layer and head:

- J as a heat map and J against distance (mean J_jk over the pairs at |j - k| = d), for every kind of pairwise
  couplings: the coupled window's J by slot (slot a: the key a positions before the query), relative and full
  couplings over the text's keys, and couplings from content for the given text (``coupling="keys"``: the J of
  the sequence; ``coupling="query"``: the J of its last query);
- the attention weights for the text with the couplings and with J = 0 (the layer as sigmoid attention on its
  own fields, its bias and position priors kept), both on the same layer input (the coupled model's), and their
  difference;
- the marginals, as weights (<s_j> + 1) / 2, against sigmoid(2 h_j), the weights with J = 0: on the diagonal
  the couplings change nothing;
- the training curves of a run's history.

J and the weights come from the layers' own API (``BoltzmannAttention.coupling_matrix`` and
``need_weights=True``; a converted model's ``output_attentions``); J = 0 is
:func:`.conjunction.without_couplings`. plotly is imported only when a page is written (``pip install
"boltzmann-attention[explore]"``).
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
import string
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..attention import BoltzmannAttention
from ..couplings import ContentCouplings, FullCouplings, RelativeCouplings, WindowCouplings
from . import blocks, tasks
from .config import TrainConfig
from .conjunction import without_couplings
from .results import ARCHIVE, Results, load_runs, mode_rank, variant_rank
from .stats import distance_profile, stat
from .tables import fmt_stat
from .train import default_checkpoint, load_final, read_checkpoint

__all__ = ["EXPLORE_EXTRA", "TRAINING", "LayerView", "Page", "explore", "read_source", "titles", "write_page"]

EXPLORE_EXTRA = 'pip install "boltzmann-attention[explore]"'
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")  # a saved tokenizer
DEFAULT_TEXT = "to be, or not to be, that is the question"  # a bare layer's text when none is given
INTEGRATION = "boltzmann_attention.integrations.transformers"  # where a converted model's parameters come from
MAX_FINDINGS = 40       # rows of an archive's table
MAX_POINTS = 4000       # points per head in a scatter (evenly spaced beyond)
MAX_TICK_LABELS = 48    # keys labelled by their characters up to this length
TRAINING = "Training curves"
KINDS = {"full": "full couplings, by key", "relative": "relative couplings f(|j - k|), by key",
         "window": "coupled window, by slot", "keys": "from the keys of this text",
         "query": "from the keys and the last query of this text"}


@dataclass
class LayerView:
    """What the page shows of one attention layer (numpy arrays, the layer's dtype).

    J: (H, n, n), by key over the text or by slot for the window (``slots``), None without pairwise couplings;
    distance: (H, D), the mean J at distance 1 .. D; weights: (H, L, S) with the couplings, None without a model;
    uncoupled: (H, L, S) with J = 0, None without couplings."""

    name: str
    mode: str
    kind: str | None
    J: np.ndarray | None
    slots: bool
    distance: np.ndarray | None
    weights: np.ndarray | None
    uncoupled: np.ndarray | None
    notes: list[str] = field(default_factory=list)


@dataclass
class Page:
    """Everything a page shows: a title, facts (label, value), the text's tokens, the layers, the run's history,
    an archive's findings (header, rows) and notes."""

    title: str
    facts: list[tuple[str, str]]
    tokens: list[str]
    layers: list[LayerView]
    history: list[dict] = field(default_factory=list)
    findings: tuple[list[str], list[list[str]]] | None = None
    notes: list[str] = field(default_factory=list)


def explore(source, *, text: str | list[int] | None = None, out: str | Path = "explore.html", tokenizer=None,
            x: Tensor | None = None) -> Path:
    """Write the explorer page of ``source`` (see the module docstring) to ``out``; returns its path.

    text: the text whose attention weights (and content couplings) are shown: a string in the model's alphabet
    (a run's task: its characters; a converted model: with ``tokenizer``, a callable or an object with
    ``encode``), or token ids; by default a run's first validation sequence, a bare layer's
    ``DEFAULT_TEXT``. x: a bare layer's input (L, embed_dim) or (1, L, embed_dim), instead of a text."""
    _plotly()  # before any work: a missing extra is said first
    return write_page(read_source(source, text=text, tokenizer=tokenizer, x=x), out)


# ------------------------------------------------------------------------------------------------- sources

def read_source(source, *, text=None, tokenizer=None, x: Tensor | None = None) -> Page:
    """The :class:`Page` of ``source`` (see :func:`explore`)."""
    if x is not None and not isinstance(source, BoltzmannAttention):
        raise ValueError("x is the input of a bare BoltzmannAttention layer; a model reads a text")
    if isinstance(source, BoltzmannAttention):
        if tokenizer is not None:
            raise ValueError("a bare layer has no vocabulary: give it text (each character a fixed vector) or x, "
                             "not a tokenizer")
        return _bare_layer(source, text, x)
    if isinstance(source, nn.Module):
        if _converted_modules(source):
            return _converted(source, text, tokenizer)
        return _module(source, text, tokenizer)
    if not isinstance(source, (str, Path)):
        raise ValueError(f"source must be a path (a result JSON, a checkpoint, a run archive or a results folder), "
                         f"a BoltzmannAttention layer or a model, got {type(source).__name__}")
    path = Path(source)
    if not path.exists():
        raise ValueError(f"{path} does not exist; give a result JSON, a checkpoint, a run archive ({ARCHIVE}) or "
                         "a report or results folder")
    if path.is_dir():
        if _saved_converted(path):
            return _saved_model(path, text, tokenizer)
        if (path / ARCHIVE).is_file():
            return _findings(path / ARCHIVE)
        if (path / "runs").is_dir():
            return _findings(path)
        raise ValueError(f"{path} is a folder without {ARCHIVE} or runs/: give a report folder, a results folder, "
                         "or a file")
    if path.name.endswith(".jsonl.gz"):
        return _findings(path)
    if tokenizer is not None:
        raise ValueError("a tokenizer is for a converted Hugging Face model; a run's model reads its task's characters")
    if path.suffix == ".json":
        return _result(path, text)
    return _checkpoint(path, text)


def _result(path: Path, text) -> Page:
    """A run's result JSON, with its kept model when there is one."""
    try:
        raw = json.loads(path.read_text())
        cfg = TrainConfig.from_dict(raw["config"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a run's result JSON: {e}") from None
    kept = [path.parent.parent / "final" / f"{path.stem}.pt", default_checkpoint(path)]
    found = next((p for p in kept if p.is_file()), None)
    history = raw.get("history") or []
    if found is None:
        if text is not None:
            raise ValueError(f"the attention weights for a text need the trained model, and {path} has none kept "
                             f"({' or '.join(map(str, kept))}); leave out the text for its recorded couplings")
        layers = [_recorded_view(i, recorded, cfg) for i, recorded in enumerate(raw.get("layers") or [])]
        return Page(f"{raw.get('run', path.stem)}", _run_facts(cfg, raw, path), [], layers, history,
                    notes=[f"No trained model is kept ({' or '.join(map(str, kept))}): the couplings the result "
                           "recorded and its training curves only."])
    if TrainConfig.from_dict(read_checkpoint(found)["config"]).flat() != cfg.flat():
        raise ValueError(f"{found} was written for another config than {path}")
    page = _trained(found, text, _run_facts(cfg, raw, path) + [("model", str(found))])
    page.title, page.history = str(raw.get("run", path.stem)), history
    return page


def _checkpoint(path: Path, text) -> Page:
    state = read_checkpoint(path)
    cfg = TrainConfig.from_dict(state["config"])
    page = _trained(path, text, _run_facts(cfg, {}, path) + [("checkpoint", f"step {state['step']} of {cfg.steps}")])
    page.history = state["history"]
    return page


def _trained(path: Path, text, facts: list) -> Page:
    """The views of a kept model, on ``text`` in its task's alphabet."""
    task, model = load_final(path)
    ids, tokens = _task_tokens(task, text)
    layers = [m for m in model.modules() if isinstance(m, BoltzmannAttention)]
    views = _library_views(model, layers, lambda: model(torch.tensor([ids])))
    return Page(path.stem, facts + [("text", _shown_text(tokens))], tokens, views)


def _module(model: nn.Module, text, tokenizer) -> Page:
    """A module holding BoltzmannAttention layers (the experiments' model), called on (1, L) token ids."""
    layers = [m for m in model.modules() if isinstance(m, BoltzmannAttention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} holds no BoltzmannAttention layer and is no converted Hugging Face "
                         "model")
    ids = _ids(text, tokenizer, getattr(getattr(model, "cfg", None), "vocab_size", None))
    device = next(model.parameters()).device
    views = _library_views(model, layers, lambda: model(torch.tensor([ids], device=device)))
    tokens = _token_labels(ids, tokenizer)
    return Page(type(model).__name__, [("model", type(model).__name__), ("text", _shown_text(tokens))], tokens, views)


def _bare_layer(layer: BoltzmannAttention, text, x) -> Page:
    dtype, device = layer.value.weight.dtype, layer.value.weight.device
    if x is not None:
        if text is not None:
            raise ValueError("give a bare layer text or x, not both")
        if not isinstance(x, Tensor) or x.dim() not in (2, 3) or (x.dim() == 3 and x.shape[0] != 1):
            raise ValueError(f"x must be a tensor (L, embed_dim) or (1, L, embed_dim), got "
                             f"{tuple(getattr(x, 'shape', ()))}")
        x = x.reshape(1, *x.shape[-2:])
        tokens = [str(i) for i in range(x.shape[1])]
        told = ("input", f"x given, {x.shape[1]} positions")
    else:
        text = DEFAULT_TEXT[:layer.max_len] if text is None else text
        if not isinstance(text, str) or not text:
            raise ValueError(f"a bare layer's text must be a non-empty string, got {text!r}")
        tokens = list(text)
        x = torch.stack([torch.randn(layer.embed_dim, generator=torch.Generator().manual_seed(ord(c)),
                                     dtype=torch.float64) for c in text])[None]
        told = ("text", _shown_text(tokens) + " (each character a fixed random vector, seeded by its code point)")
    x = x.to(dtype=dtype, device=device)
    with _eval(layer), torch.no_grad():
        view = _layer_view("Layer 0", layer, x)
    facts = [("layer", f"BoltzmannAttention({layer.embed_dim}, {layer.num_heads} heads, max_len={layer.max_len})"),
             ("mode, method", f"{layer.mode}, {layer.method}"), told]
    return Page("a BoltzmannAttention layer", facts, tokens, [view])


def _converted_modules(model: nn.Module) -> list:
    """The attention modules of a converted Hugging Face model, each with its Boltzmann parameters; [] for any
    other module. Those parameters are instances of a class of the integration module, which is therefore
    imported wherever a converted model exists: without it, nothing is converted (and transformers, which it
    imports, is not loaded for nothing)."""
    bt = sys.modules.get(INTEGRATION)
    if bt is None:
        return []
    return [m for _, m in bt.attention_modules(model) if isinstance(getattr(m, bt.ATTRIBUTE, None),
                                                                    bt.BoltzmannParameters)]


def _saved_converted(path: Path) -> bool:
    """Whether the folder holds a Hugging Face model saved after ``convert()`` (its config names the options)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and "boltzmann_attention" in config


def _saved_model(path: Path, text, tokenizer) -> Page:
    """A converted model saved with ``save_pretrained``, loaded by ``integrations.transformers.from_pretrained``;
    its tokenizer from the folder when one is saved there and none is given."""
    if importlib.util.find_spec("transformers") is None:
        raise ValueError(f"{path} holds a converted Hugging Face model; loading it needs transformers: "
                         'pip install "boltzmann-attention[transformers]"')
    import transformers

    from ..integrations import transformers as bt

    names = json.loads((path / "config.json").read_text()).get("architectures") or []
    model_class = getattr(transformers, names[0], None) if names else None
    if model_class is None:
        raise ValueError(f"{path}/config.json names no model class of transformers (architectures: {names}); load "
                         "the model in Python with integrations.transformers.from_pretrained and pass it")
    model = bt.from_pretrained(model_class, str(path))
    if tokenizer is None and isinstance(text, str):
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"{path} holds no tokenizer for the text {text!r}: give token ids (--ids) or save the "
                             "tokenizer beside the model")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return _converted(model, text, tokenizer)


def _converted(model: nn.Module, text, tokenizer) -> Page:
    """A converted Hugging Face decoder: weights from ``output_attentions``, J = 0 one layer at a time."""
    from ..integrations import transformers as bt

    if text is None:
        raise ValueError("a converted Hugging Face model needs text: token ids, or a string and a tokenizer")
    ids = _ids(text, tokenizer, getattr(model.config, "vocab_size", None))
    tokens = _token_labels(ids, tokenizer)
    modules = _converted_modules(model)
    inputs = torch.tensor([ids], device=next(model.parameters()).device)
    views = []
    with _eval(model), torch.no_grad():
        coupled = model(inputs, output_attentions=True).attentions
        if coupled is None or len(coupled) != len(modules):
            raise ValueError(f"{type(model).__name__} gave {0 if coupled is None else len(coupled)} attention weights "
                             f"for its {len(modules)} attention modules")
        for i, module in enumerate(modules):
            params = getattr(module, bt.ATTRIBUTE)
            uncoupled = None
            if params.couplings is not None:
                with _uncoupled(params):
                    uncoupled = model(inputs, output_attentions=True).attentions[i][0]
            J = None if params.couplings is None else params.couplings(len(ids))
            view = _view(f"Layer {i}", params.mode, params.couplings, J, coupled[i][0], uncoupled)
            views.append(view)
    options = getattr(model.config, bt.CONFIG_KEY, {})
    facts = [("model", f"{type(model).__name__}, {len(modules)} attention modules, converted"),
             ("options", ", ".join(f"{k}={v!r}" for k, v in options.items())), ("text", _shown_text(tokens))]
    return Page(type(model).__name__, facts, tokens, views)


@contextmanager
def _uncoupled(params):
    """A converted module's Boltzmann parameters as sigmoid attention (mode 'h', no couplings) within the block."""
    saved = (params.mode, params.couplings, params.coupling_window, params.method, params.method_options)
    try:
        params.mode, params.couplings, params.coupling_window, params.method, params.method_options = \
            "h", None, None, "exact", {}
        yield
    finally:
        params.mode, params.couplings, params.coupling_window, params.method, params.method_options = saved


@contextmanager
def _eval(module: nn.Module):
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


# ---------------------------------------------------------------------------------------------- the layers

@torch.no_grad()
def _library_views(model: nn.Module, layers: list[BoltzmannAttention], run) -> list[LayerView]:
    """Each layer's view on the input it got in ``run()`` (a forward of the model)."""
    inputs = {}
    hooks = [layer.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
             for i, layer in enumerate(layers)]
    try:
        with _eval(model):
            run()
            return [_layer_view(f"Layer {i}", layer, inputs[i]) for i, layer in enumerate(layers)]
    finally:
        for hook in hooks:
            hook.remove()


def _layer_view(name: str, layer: BoltzmannAttention, x: Tensor) -> LayerView:
    """One library layer on its input x (1, L, embed_dim)."""
    weights = layer(x, need_weights=True)[1][0]
    uncoupled = None
    if layer.couplings is not None:
        with without_couplings(layer):
            uncoupled = layer(x, need_weights=True)[1][0]
    view = _view(name, layer.mode, layer.couplings, layer.coupling_matrix(x), weights, uncoupled)
    if layer.three_body is not None:
        view.notes.append("Three-body couplings K are not shown" + ("; J = 0 removes them too." if uncoupled is not None
                                                                    else "."))
    return view


def _kind(couplings) -> str | None:
    if isinstance(couplings, ContentCouplings):
        return "query" if couplings.query_conditioned else "keys"
    for kind, cls in (("full", FullCouplings), ("relative", RelativeCouplings), ("window", WindowCouplings)):
        if isinstance(couplings, cls):
            return kind
    return None


def _view(name: str, mode: str, couplings, J: Tensor | None, weights: Tensor | None,
          uncoupled: Tensor | None) -> LayerView:
    """A layer's view from its couplings module, the dense J of this input (as ``coupling_matrix`` gives it) and
    its weights (H, L, S) with the couplings and without."""
    kind = _kind(couplings)
    notes = []
    if kind in ("keys", "query"):  # (1, H, 1 or L, S, S): the sequence's J, or the last query's
        J = J[0, :, -1]
        notes.append("J from content: " + ("the sequence's, shared by its queries." if kind == "keys" else
                                           "that of the last query (each query has its own)."))
    numpy = lambda t: None if t is None else t.detach().cpu().numpy()  # noqa: E731
    J = numpy(J)
    distance = None
    if J is not None:
        if kind == "relative":  # f(1) .. f(range), read off the couplings over range + 1 keys
            reach = couplings.max_distance
            distance = np.array([distance_profile(m) for m in numpy(couplings(reach + 1))]) if reach else None
        else:
            distance = np.array([distance_profile(m) for m in J])
            if kind in ("keys", "query"):
                distance = distance[:, :couplings.max_distance]
        if distance is not None and distance.shape[1] == 0:
            distance = None
    if couplings is None:
        notes.append(f"Mode {mode!r}: no pairwise couplings.")
    return LayerView(name, mode, kind, J, kind == "window", distance, numpy(weights), numpy(uncoupled), notes)


def _recorded_view(i: int, recorded: dict, cfg: TrainConfig) -> LayerView:
    """A layer's couplings as its result recorded them (static couplings only), without weights."""
    a = cfg.attention
    J = recorded.get("couplings") if isinstance(recorded, dict) else None
    J = None if J is None else np.asarray(J, dtype=np.float32)
    kind = a.coupling if J is not None else None
    distance = None if J is None else np.array([distance_profile(m) for m in J])
    notes = [] if J is not None else ["No couplings recorded (none, or computed from content: those need the model)."]
    return LayerView(f"Layer {i}", a.mode, kind, J, kind == "window", distance, None, None, notes)


# ------------------------------------------------------------------------------------------------- tokens

def _alphabet(task) -> str | None:
    """Token i's character for a run's task (None: a bracket task with more fillers than letters)."""
    name = task.cfg.data.task
    if name == "shakespeare":
        return task.data.vocab.chars
    if name == "blocks":
        return blocks.SYMBOLS[:task.vocab_size]
    fillers = task.cfg.data.num_fillers
    return "()" + string.ascii_lowercase[:fillers] if fillers <= 26 else None


def _task_tokens(task, text) -> tuple[list[int], list[str]]:
    """The ids and characters of ``text`` in a run's alphabet, or of its first validation sequence."""
    alphabet, T = _alphabet(task), task.cfg.data.T
    if text is None:
        ids = task.val[0][0].tolist()
    elif isinstance(text, str):
        if alphabet is None:
            raise ValueError("this task's tokens have no characters: give text as token ids")
        unknown = sorted(set(text) - set(alphabet))
        if unknown:
            raise ValueError(f"the text has characters that task {task.cfg.data.task!r} does not know: {unknown}; "
                             f"its alphabet: {alphabet!r}")
        ids = [alphabet.index(c) for c in text]
    else:
        ids = _ids(text, None, task.vocab_size)
    if not 1 <= len(ids) <= T:
        raise ValueError(f"the text has {len(ids)} tokens; the model reads 1 to T = {T}")
    return ids, [alphabet[i] if alphabet else str(i) for i in ids]


def _ids(text, tokenizer, vocab_size: int | None) -> list[int]:
    """Token ids from ids, or from a string through a tokenizer (a callable, or an object with ``encode``)."""
    if isinstance(text, str):
        if tokenizer is None:
            raise ValueError("this model's tokens are not characters: give text as token ids, or a tokenizer")
        ids = tokenizer.encode(text) if hasattr(tokenizer, "encode") else tokenizer(text)
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    else:
        ids = list(text) if text is not None else []
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids) or (
            vocab_size is not None and max(ids) >= vocab_size):
        raise ValueError(f"token ids must be a non-empty list of integers in [0, {vocab_size or 'vocab size'}), "
                         f"got {ids[:8]!r}{' ...' if len(ids) > 8 else ''}")
    return ids


def _token_labels(ids: list[int], tokenizer) -> list[str]:
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        return [tokenizer.decode([i]) for i in ids]
    return [str(i) for i in ids]


def _visible(token: str) -> str:
    """A token as a tick label: spaces and line breaks made visible."""
    return token.replace(" ", "␣").replace("\n", "↵") or "∅"


def _shown_text(tokens: list[str]) -> str:
    return f"{''.join(_visible(t) for t in tokens)!s} ({len(tokens)} tokens)"


def _run_facts(cfg: TrainConfig, raw: dict, path: Path) -> list[tuple[str, str]]:
    """A run's config and measurements, in a few lines."""
    d, m, a = cfg.data, cfg.arch, cfg.attention
    coupling = a.coupling
    if a.coupling == "window":
        coupling += f" (W = {a.coupling_window}{', relative' if a.coupling_window_relative else ''})"
    elif a.coupling in ("relative", "keys", "query"):
        coupling += f" (range {d.T - 1 if a.coupling_range is None else a.coupling_range})"
    facts = [("source", str(path)), ("task", f"{d.task}, T = {d.T}"),
             ("attention", f"mode {a.mode}, method {a.method}, coupling {coupling}, position {m.position}"),
             ("model", f"{m.n_layers} layers, {m.n_heads} heads, d_model {m.d_model}, d_ff {m.d_ff}"),
             ("training", f"{cfg.steps} steps" + (f" (this segment: {raw['steps_run']})" if "steps_run" in raw
                                                   else "") + f", batch {cfg.batch_size}, lr {cfg.optim.lr:g}, "
                                                              f"seed {cfg.seed}")]
    for split, values in (raw.get("metrics") or {}).items():
        if isinstance(values, dict):
            facts.append((f"metrics ({split})", ", ".join(f"{k} {v:.4g}" for k, v in values.items()
                                                          if isinstance(v, (int, float)))))
    if raw.get("wall_time_s") is not None:
        facts.append(("provenance", f"{raw['wall_time_s']:.0f} s of training; torch {raw.get('torch')}, commit "
                                    f"{raw.get('commit')}, {raw.get('machine')}"))
    return facts


# ------------------------------------------------------------------------------------------------ findings

def _findings(path: Path) -> Page:
    """A run archive's or results folder's arms: seeds, the task's headline metric and the validation loss."""
    res = Results(load_runs(path))
    groups = sorted(res.groups.values(), key=lambda g: (g.task, variant_rank(g.variant), g.T, mode_rank(g.mode),
                                                        g.mode, g.method))
    rows = []
    for g in groups:
        split, metric = tasks.REGISTRY[g.task].headline if g.task in tasks.REGISTRY else ("val", "loss")
        s, loss = stat(g.values(metric, split).values()), stat(g.values("loss").values())
        rows.append([g.task, g.variant, str(g.T), g.mode, g.method, ", ".join(map(str, sorted(g.runs))),
                     f"{split} {metric} {fmt_stat(s, 4, show_n=False)}", fmt_stat(loss, 4, show_n=False)])
    notes = []
    if len(rows) > MAX_FINDINGS:
        notes.append(f"The first {MAX_FINDINGS} of {len(rows)} arms; the report has them all.")
        rows = rows[:MAX_FINDINGS]
    if res.excluded:
        notes.append(f"{len(res.excluded)} runs left out for unusable metrics, as the report does.")
    report = (path.parent if path.is_file() else path) / "README.md"
    facts = [("source", str(path)), ("runs", f"{len(res.runs)} in {len(groups)} arms (grid point and variant), "
                                             f"seeds {sorted({r.seed for r in res.runs})}")]
    if report.is_file():
        facts.append(("the report", str(report)))
    header = ["task", "variant", "T", "mode", "method", "seeds", "headline (mean ± std over seeds)",
              "validation loss"]
    return Page(f"findings of {path.parent.name if path.is_file() else path.name}", facts, [], [],
                findings=(header, rows), notes=notes)


# --------------------------------------------------------------------------------------------- the figures

def _plotly():
    """plotly's graph_objects, make_subplots and its JavaScript; a one-line error naming the extra without it."""
    if importlib.util.find_spec("plotly") is None:
        raise ValueError(f"the explorer writes Plotly figures and needs plotly: {EXPLORE_EXTRA}")
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    return go, make_subplots


def titles(view: LayerView) -> list[str]:
    """The titles of a layer's figures, in the page's order."""
    out = []
    if view.J is not None:
        out.append(f"{view.name}: J ({KINDS[view.kind]})")
    if view.distance is not None:
        out.append(f"{view.name}: J by distance")
    if view.weights is not None:
        out.append(f"{view.name}: attention weights")
    if view.weights is not None and view.uncoupled is not None:
        out.append(f"{view.name}: marginals (⟨s⟩+1)/2 against sigmoid(2h)")
    return out


def _layout(go, title: str, height: int) -> dict:
    return dict(title=dict(text=title, x=0.01, font=dict(size=15)), height=height, margin=dict(l=60, r=30, t=70, b=50),
                template=go.layout.Template(layout=dict(font=dict(size=11), paper_bgcolor="white",
                                                        plot_bgcolor="white")))


def _axis(fig, tokens: list[str] | None, n: int, title: str, axis: str, **where) -> None:
    """A matrix axis: positions 0 .. n-1, labelled by their tokens when they are few; y reads top to bottom."""
    options = dict(title_text=title, showgrid=False, zeroline=False)
    if tokens is not None and n <= MAX_TICK_LABELS:
        options.update(tickmode="array", tickvals=list(range(n)), ticktext=[_visible(t) for t in tokens[:n]],
                       tickangle=0)
    if axis == "y":
        fig.update_yaxes(autorange="reversed", **options, **where)
    else:
        fig.update_xaxes(**options, **where)


def _J_figure(go, make_subplots, view: LayerView, tokens: list[str]):
    H, n = view.J.shape[0], view.J.shape[-1]
    cols = min(H, 4)
    rows = math.ceil(H / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"head {h}" for h in range(H)],
                        horizontal_spacing=0.08, vertical_spacing=0.12)
    label = "slot" if view.slots else "key"
    for h in range(H):
        row, col = h // cols + 1, h % cols + 1
        fig.add_trace(go.Heatmap(z=view.J[h], coloraxis="coloraxis", name=f"head {h}",
                                 hovertemplate=f"{label} %{{y}}, {label} %{{x}}: J = %{{z:.4f}}<extra>head {h}"
                                               "</extra>"), row=row, col=col)
        ticks = None if view.slots else tokens
        _axis(fig, ticks, n, f"{label} k" if not view.slots else "slot b", "x", row=row, col=col)
        _axis(fig, ticks, n, f"{label} j" if not view.slots else "slot a", "y", row=row, col=col)
    vmax = float(np.abs(view.J).max()) or 1.0
    fig.update_layout(**_layout(go, titles(view)[0], 90 + 300 * rows),
                      coloraxis=dict(colorscale="RdBu_r", cmin=-vmax, cmax=vmax, colorbar=dict(title="J")))
    return fig


def _distance_figure(go, view: LayerView):
    fig = go.Figure()
    d = np.arange(1, view.distance.shape[1] + 1)
    for h, profile in enumerate(view.distance):
        fig.add_trace(go.Scatter(x=d, y=profile, mode="lines+markers", name=f"head {h}"))
    fig.add_hline(y=0, line=dict(color="#999999", width=1))
    xlabel = "slot distance |a - b|" if view.slots else "distance |j - k|"
    fig.update_layout(**_layout(go, f"{view.name}: J by distance", 340))
    fig.update_xaxes(title_text=xlabel, dtick=1 if len(d) <= 24 else None, gridcolor="#eee")
    fig.update_yaxes(title_text="mean J", gridcolor="#eee")
    return fig


def _weights_figure(go, make_subplots, view: LayerView, tokens: list[str]):
    """With the couplings, with J = 0, and the difference, side by side; a menu picks the head."""
    H, L, S = view.weights.shape
    panels = [("with the couplings", view.weights, "coloraxis")]
    if view.uncoupled is not None:
        panels += [("J = 0: sigmoid(2h)", view.uncoupled, "coloraxis"),
                   ("difference", view.weights - view.uncoupled, "coloraxis2")]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.12)
    for h in range(H):
        for c, (name, values, axis) in enumerate(panels):
            fig.add_trace(go.Heatmap(z=values[h], coloraxis=axis, visible=h == 0, name=f"head {h}: {name}",
                                     hovertemplate=f"query %{{y}}, key %{{x}}: %{{z:.4f}}<extra>head {h}: {name}"
                                                   "</extra>"), row=1, col=c + 1)
    for c in range(len(panels)):
        _axis(fig, tokens, S, "key j", "x", row=1, col=c + 1)
        _axis(fig, tokens, L, "query i", "y", row=1, col=c + 1)
    layout = _layout(go, f"{view.name}: attention weights", 470)
    layout["coloraxis"] = dict(colorscale="Viridis", cmin=0.0, colorbar=dict(
        title="a", len=0.8, thickness=14, **({} if len(panels) == 1 else {"x": 0.635, "xanchor": "left"})))
    if len(panels) > 1:
        vmax = float(np.abs(view.weights - view.uncoupled).max()) or 1e-9
        layout["coloraxis2"] = dict(colorscale="RdBu_r", cmin=-vmax, cmax=vmax, colorbar=dict(title="Δa", len=0.8,
                                                                                              thickness=14))
    if H > 1:
        n = len(panels)
        layout["updatemenus"] = [dict(type="dropdown", x=1.0, xanchor="right", y=1.16, yanchor="top", buttons=[
            dict(label=f"head {h}", method="update",
                 args=[{"visible": [g == h for g in range(H) for _ in range(n)]}]) for h in range(H)])]
    fig.update_layout(**layout)
    return fig


def _scatter_figure(go, view: LayerView):
    """Each present pair's weight with the couplings against its weight with J = 0, sigmoid(2h)."""
    fig = go.Figure()
    present = view.uncoupled > 0  # an absent key has weight 0 in both; a present one sigmoid(2h) > 0
    thinned = False
    for h in range(view.weights.shape[0]):
        x, y = view.uncoupled[h][present[h]], view.weights[h][present[h]]
        if len(x) > MAX_POINTS:
            keep = np.linspace(0, len(x) - 1, MAX_POINTS).round().astype(int)
            x, y, thinned = x[keep], y[keep], True
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=f"head {h}", marker=dict(size=4, opacity=0.6)))
    top = 1.05 * float(max(view.weights[present].max(), view.uncoupled[present].max())) if present.any() else 1.0
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="no change",
                             line=dict(color="#999999", dash="dot")))
    title = f"{view.name}: marginals (⟨s⟩+1)/2 against sigmoid(2h)"
    fig.update_layout(**_layout(go, title + (f" ({MAX_POINTS} evenly spaced pairs per head)" if thinned else ""),
                                440))
    fig.update_xaxes(title_text="sigmoid(2h): the weight with J = 0", range=[0, top], gridcolor="#eee")
    fig.update_yaxes(title_text="(⟨s⟩+1)/2: the weight with the couplings", range=[0, top], gridcolor="#eee")
    return fig


def _curves_figure(go, make_subplots, history: list[dict]):
    """Training and validation loss against the step, and the validation metrics besides the loss."""
    steps = [h["step"] for h in history]
    others = [k for k in ("ppl", "accuracy", "error") if all(k in h for h in history)]
    fig = make_subplots(rows=1, cols=1 + bool(others), subplot_titles=["loss"] + (["validation"] if others else []))
    for key, name in (("train_loss", "training loss (the step's batch)"), ("loss", "validation loss")):
        if all(key in h for h in history):
            fig.add_trace(go.Scatter(x=steps, y=[h[key] for h in history], mode="lines+markers", name=name),
                          row=1, col=1)
    for key in others:
        fig.add_trace(go.Scatter(x=steps, y=[h[key] for h in history], mode="lines+markers", name=key), row=1, col=2)
    fig.update_layout(**_layout(go, TRAINING, 360))
    fig.update_xaxes(title_text="step", gridcolor="#eee")
    fig.update_yaxes(gridcolor="#eee")
    return fig


# ----------------------------------------------------------------------------------------------- the page

STYLE = """body{font-family:system-ui,sans-serif;margin:1.2em 2em;color:#222222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}.note{color:#555555;font-size:13px}.plot{width:100%;min-height:200px}"""
# The only hand-written JavaScript: each figure's JSON, drawn by Plotly into its div.
GLUE = """for (const s of document.querySelectorAll("script.figure")) {
  const f = JSON.parse(s.textContent);
  Plotly.newPlot(s.dataset.plot, f.data, f.layout, {responsive: true, displaylogo: false});
}"""


def write_page(page: Page, out: str | Path) -> Path:
    """Write ``page`` as one self-contained HTML file; returns its path."""
    go, make_subplots = _plotly()
    from plotly.offline import get_plotlyjs

    out = Path(out)
    if out.is_dir():
        raise ValueError(f"the explorer's output {out} is a folder; give a file path (.html)")
    body = [f"<h1>Boltzmann attention explorer: {html.escape(page.title)}</h1>",
            _table([[k, v] for k, v in page.facts])]
    body += [f'<p class="note">{html.escape(n)}</p>' for n in page.notes]
    figures = []

    def plot(fig) -> str:
        n = len(figures)
        figures.append(fig)
        data = fig.to_json().replace("</", "<\\/")  # nothing in it can close the script element
        return f'<div class="plot" id="plot-{n}"></div>\n<script type="application/json" class="figure" ' \
               f'data-plot="plot-{n}">{data}</script>'

    if page.findings is not None:
        body += ["<h2>Findings</h2>", _table(page.findings[1], page.findings[0])]
    if page.history:
        body += ["<h2>Training</h2>", plot(_curves_figure(go, make_subplots, page.history))]
    for view in page.layers:
        body.append(f"<h2>{html.escape(view.name)}: mode {html.escape(view.mode)}"
                    f"{', couplings ' + html.escape(KINDS[view.kind]) if view.kind else ''}</h2>")
        body += [f'<p class="note">{html.escape(n)}</p>' for n in view.notes]
        if view.J is not None:
            body.append(plot(_J_figure(go, make_subplots, view, page.tokens)))
        if view.distance is not None:
            body.append(plot(_distance_figure(go, view)))
        if view.weights is not None:
            if view.uncoupled is not None:
                body.append('<p class="note">J = 0: the same layer input, the layer as sigmoid attention on its own '
                            "fields (bias and position priors kept).</p>")
            body.append(plot(_weights_figure(go, make_subplots, view, page.tokens)))
            if view.uncoupled is not None:
                body.append(plot(_scatter_figure(go, view)))
    document = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
                f"<title>Boltzmann attention explorer: {html.escape(page.title)}</title>\n<style>{STYLE}</style>\n"
                + (f'<script type="text/javascript">{get_plotlyjs()}</script>\n' if figures else "")
                + "</head>\n<body>\n" + "\n".join(body)
                + (f"\n<script>{GLUE}</script>" if figures else "") + "\n</body>\n</html>\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(document, encoding="utf-8")
    return out


def _table(rows: list[list[str]], header: list[str] | None = None) -> str:
    """An HTML table, every cell escaped; ``header``: its first row, in bold."""
    lines = ["<table>"]
    if header:
        lines.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
    lines += ["<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows]
    return "\n".join(lines + ["</table>"])
