"""A D-Wave QPU as the layer's sampler: fixed embeddings, chains, the device's ranges, tiling and temperature.

What a user with QPU access meets between "one anneal per query" and marginals at beta = 1:

* **Embedding.** A query's Ising problem lives on a problem graph: the complete graph K_n of its n keys (the
  coupled window's K_W, or ``coupling='full'``) or a band (J_jk = 0 for |j - k| > w, relative couplings). The
  QPU's qubits form a sparse graph (Zephyr on Advantage2, Pegasus on Advantage), so each spin becomes a *chain*
  of qubits. The embedding depends on the shape only (graph kind, n, w) and the target graph, never on h and J:
  it is found once per shape (minorminer, seeded) and kept (:meth:`QPUSampler.tiling`; ``embedding_searches``
  counts the searches).
* **Tiling.** Many queries go into one QPU call: disjoint copies of the embedding, placed side by side
  (:func:`disjoint_embeddings`). On a Chimera, Pegasus or Zephyr graph a copy is embedded in a small sub-lattice
  (a *tile*, minorminer) and the tile is moved over the whole graph by ``dwave.graphs``' sublattice mappings;
  every image whose qubits are free and present (and whose chains and couplings exist: defects) is kept,
  greedily; then minorminer embeds further copies one by one in the qubits left (on any graph), with chains no
  longer than the tiles'. The count is what was placed, a lower bound on what fits, never an estimate. One call
  with k copies and R reads gives R samples of each of k queries.
* **Chain strength** (a rule, ``chain_strength``): ``'range'`` (default) couples each chain with the strongest
  ferromagnetic coupling the device allows, -j_range[0] (1 on Advantage and Advantage2), independent of the
  problem. Sampling at beta = 1 scales the problem *down* (energy scale c well below 1 on a cold device), so a
  chain strength proportional to the problem, such as ``'torque'`` (D-Wave's uniform torque compensation,
  prefactor 1.414, on the scaled problem), is as hot as the problem and breaks chains; intact chains do not
  change the logical distribution whatever their strength. A float gives the strength in device units.
* **Chain breaks.** Reads are unembedded by majority vote (``dwave.embedding.majority_vote``); each call records
  the fraction of (read, chain) pairs whose qubits disagree (:attr:`QPUSampler.calls`, ``chain_break_rate``).
* **Ranges.** The device takes h in ``h_range`` and J in ``j_range`` (its ``properties``), and the sum of the
  couplings on a qubit in ``per_qubit_coupling_range`` where it lists one. The problem is sent as c h, c J with
  c = ``energy_scale`` (split over the chains' qubits and couplers by ``dwave.embedding.embed_bqm``), with the
  device's own rescaling off (``auto_scale=False``); a problem outside the ranges raises, naming the largest c
  that fits it.
* **Temperature.** A QPU samples at an effective inverse temperature beta_eff that depends on the device, the
  anneal, the problem and c. :meth:`QPUSampler.calibrate` measures it as the DQA study does
  (``annealing.fit_beta``: the beta minimising KL(p_reads || exp(-beta E) / Z), by exact enumeration of small
  random systems, ``annealing.calibration_systems``) and sets c so that the median beta_eff is the target
  (beta = 1: Boltzmann attention's exp(-E)). Samples at beta_eff = 1 are still not exp(-E) samples where the
  device's distribution is not Boltzmann at all (the KL left at beta_eff says how far).

Test doubles. ``dwave.system.testing.MockDWaveSampler`` has a real topology and properties but samples
classically (steepest descent by default): its temperatures and break rates are not QPU physics.
:class:`SimulatedPhysics` is a ``substitute_sampler`` for it whose physics is this package's: exact Boltzmann
draws at a device inverse temperature, simulated quantum annealing (``ising.sqa``) or simulated diabatic
annealing (``ising.annealing``), on each connected component of the programmed problem. With
``MockDWaveSampler(substitute_sampler=SimulatedPhysics(...))`` everything above runs as on hardware, and a user
with a token passes ``DWaveSampler()`` instead and changes nothing else.

Sign convention: the package's E(s) = -h.s - sum_{j<k} J_jk s_j s_k; dimod's is the opposite, converted by
``DimodSampler.problem`` (h' = -h, J' = -J), which this class reuses.

This module imports D-Wave's packages on first use only: without the ``[qpu]`` extra the package imports and
:class:`QPUSampler` raises an ImportError naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from . import annealing, sqa
from ._inputs import check_inputs, check_int, check_real
from .dimod_adapter import DimodSampler
from .enumeration import configurations, negative_energies
from .record import Method, keyword_options

QPU_EXTRA = 'pip install "boltzmann-attention[qpu]"'
GRAPH_KINDS = ("clique", "band")
CHAIN_RULES = ("range", "torque")
TORQUE_PREFACTOR = 1.414  # dwave.embedding.chain_strength.uniform_torque_compensation's default
MAX_CALIBRATION_SPINS = 16  # the calibration histograms 2^n states per system
MAX_ENUMERATED_QUBITS = 16  # SimulatedPhysics('boltzmann') enumerates each connected component


def _ocean():
    """D-Wave's packages, imported on first use: (dimod, dwave.embedding, dwave.graphs, minorminer)."""
    try:
        import dimod
        import dwave.embedding
        import dwave.graphs
        import minorminer
    except ImportError as e:
        raise ImportError(f"the QPU path needs D-Wave's Ocean packages (dimod, dwave-system, minorminer, "
                          f"dwave-graphs): {QPU_EXTRA} ({e})") from e
    return dimod, dwave.embedding, dwave.graphs, minorminer


# ------------------------------------------------------------------------------------------------- shapes

class ProblemGraph(NamedTuple):
    """The graph of one query's problem: kind 'clique' (K_n) or 'band' (edges j, k with 0 < |j - k| <= width)."""

    kind: str
    n: int
    width: int | None

    def edges(self) -> list[tuple[int, int]]:
        if self.kind == "clique":
            return [(j, k) for j in range(self.n) for k in range(j + 1, self.n)]
        return [(j, k) for j in range(self.n) for k in range(j + 1, min(self.n, j + self.width + 1))]

    def describe(self) -> str:
        return f"K_{self.n}" if self.kind == "clique" else f"a band of {self.n} spins, width {self.width}"


def check_graph(graph) -> tuple[str, int | None]:
    """('clique', None) or ('band', w) from ``graph`` ('clique' or ('band', w), w >= 1); ValueError otherwise."""
    if graph == "clique":
        return "clique", None
    if isinstance(graph, tuple) and len(graph) == 2 and graph[0] == "band":
        return "band", check_int("the band width w of graph=('band', w)", graph[1], 1)
    raise ValueError(f"graph must be 'clique' (every pair of spins may couple: the coupled window's K_W, "
                     f"coupling='full') or ('band', w) (J_jk = 0 for |j - k| > w: relative couplings), got {graph!r}")


def _source_graph(shape: ProblemGraph):
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(range(shape.n))
    g.add_edges_from(shape.edges())
    return g


# ------------------------------------------------------------------------------------------------- tiling

def _tile_graph(family: str, size: int, target):
    """A ``size`` x ``size`` sub-lattice of the target's family, or None where the family has none that small."""
    _, _, graphs, _ = _ocean()
    if family == "zephyr":
        return graphs.zephyr_graph(size, target.graph["tile"]) if size <= target.graph["rows"] else None
    if family == "pegasus":
        return graphs.pegasus_graph(size) if 2 <= size <= target.graph["rows"] else None
    if family == "chimera":
        t = target.graph["tile"]
        ok = size <= min(target.graph["rows"], target.graph["columns"])
        return graphs.chimera_graph(size, size, t) if ok else None
    return None


def _mappings(tile, target):
    _, _, graphs, _ = _ocean()
    family = target.graph["family"]
    return {"zephyr": graphs.zephyr_sublattice_mappings, "pegasus": graphs.pegasus_sublattice_mappings,
            "chimera": graphs.chimera_sublattice_mappings}[family](tile, target)


def _embed(source_edges, target, seed: int, tries: int) -> dict:
    """minorminer.find_embedding, seeded; {} when none is found."""
    _, _, _, minorminer = _ocean()
    return minorminer.find_embedding(list(source_edges), list(target.edges), random_seed=seed, tries=tries)


def _copies(source, count: int):
    """``count`` disjoint copies of ``source``, labelled (copy, node)."""
    import networkx as nx

    g = nx.Graph()
    for c in range(count):
        g.add_nodes_from((c, v) for v in source.nodes)
        g.add_edges_from(((c, u), (c, v)) for u, v in source.edges)
    return g


def _tile_candidates(source, target, seed: int, tries: int) -> list[tuple[object, list[dict]]]:
    """(tile graph, embeddings of one copy each in it), the smallest tiles that hold a copy: one copy alone, and
    as many copies side by side as minorminer packs (a few sizes tried). Sorted by qubits per copy."""
    family = target.graph.get("family")
    candidates, size, found = [], 1, 0
    while found < 2:
        tile = _tile_graph(family, size, target)
        if tile is None:
            if size > max(target.graph.get("rows", 0), 2):
                break
            size += 1
            continue
        single = _embed(source.edges, tile, seed, tries) if source.number_of_edges() else \
            {v: [q] for v, q in zip(source.nodes, tile.nodes)}
        if single:
            found += 1
            candidates.append((tile, [single]))
            per_copy = sum(len(c) for c in single.values())
            most = tile.number_of_nodes() // per_copy
            for count in sorted({most, (3 * most) // 4, most // 2}, reverse=True):
                if count < 2:
                    continue
                packed = _embed(_copies(source, count).edges, tile, seed, tries) if source.number_of_edges() else {}
                if packed:
                    candidates.append((tile, [{v: packed[(c, v)] for v in source.nodes} for c in range(count)]))
                    break
        size += 1
    return sorted(candidates, key=lambda c: sum(len(ch) for e in c[1] for ch in e.values()) / len(c[1]))


def valid_embedding(chains: Mapping, source, target) -> bool:
    """Whether ``chains`` embeds ``source`` in ``target``: every chain non-empty and connected in the target, the
    chains disjoint, and every source edge carried by at least one target edge between the two chains."""
    import networkx as nx

    seen = set()
    for v in source.nodes:
        chain = chains.get(v, ())
        if not chain or any(q not in target for q in chain) or not seen.isdisjoint(chain):
            return False
        seen.update(chain)
        if len(chain) > 1 and not nx.is_connected(target.subgraph(chain)):
            return False
    return all(any(target.has_edge(p, q) for p in chains[u] for q in chains[v]) for u, v in source.edges)


def disjoint_embeddings(source, target, *, max_copies: int | None = None, seed: int = 0,
                        tries: int = 4) -> list[dict]:
    """Disjoint embeddings of the networkx graph ``source`` on ``target`` (a ``dwave.graphs``/``DWaveSampler``
    graph), as many as are placed, each {source node: tuple of qubits}.

    Chimera, Pegasus and Zephyr targets (``target.graph['family']``): embeddings of one copy and of several
    copies in the smallest sub-lattices that hold one (minorminer, ``seed``, ``tries``) are moved over the target
    by the family's sublattice mappings, and every image that is disjoint from those kept and valid on the target
    (:func:`valid_embedding`: defects are checked) is kept, most qubit-frugal candidate first. Then (and on any
    other target) minorminer embeds further copies in the qubits left, one at a time, until it finds none or,
    after tiles, one whose longest chain is longer than theirs (copies of a shape keep chains alike). Every
    returned embedding is valid; their number is measured by placing them, and is a lower bound on what fits.
    """
    if max_copies is not None:
        check_int("max_copies", max_copies, 1)
    placed, used = [], set()

    def keep(chains: dict) -> bool:
        qubits = [q for chain in chains.values() for q in chain]
        if not used.isdisjoint(qubits) or not valid_embedding(chains, source, target):
            return False
        placed.append(chains)
        used.update(qubits)
        return max_copies is not None and len(placed) >= max_copies

    if target.graph.get("family") in ("chimera", "pegasus", "zephyr"):
        for tile, embeddings in _tile_candidates(source, target, seed, tries):
            for f in _mappings(tile, target):
                for embedding in embeddings:
                    if keep({v: tuple(f(q) for q in chain) for v, chain in embedding.items()}):
                        return placed
    # then copies one by one in the qubits left, until minorminer finds none, or (after tiles) only one with a
    # chain longer than the tiles' longest: copies of one shape should have chains alike
    longest = max((len(c) for e in placed for c in e.values()), default=None)
    remaining = target.copy()
    remaining.remove_nodes_from(used)
    while len(remaining) >= len(source):
        embedding = _embed(source.edges, remaining, seed, tries) if source.number_of_edges() else \
            {v: [q] for v, q in zip(source.nodes, remaining.nodes)}
        if len(embedding) < len(source):
            break
        chains = {v: tuple(c) for v, c in embedding.items()}
        if longest is not None and max(map(len, chains.values())) > longest:
            break
        if keep(chains):
            break
        remaining.remove_nodes_from(q for c in chains.values() for q in c)
    return placed


# ------------------------------------------------------------------------------------------------- sampler

class CallRecord(NamedTuple):
    """One QPU call: queries solved side by side, qubits programmed, reads, the chain-break rate (the fraction
    of (read, chain) pairs whose qubits disagree, in [0, 1]), the energy scale and chain strength (device units),
    and the device's timing (``sampleset.info['timing']``, microseconds; None where the sampler reports none)."""

    queries: int
    qubits: int
    reads: int
    chain_break_rate: float
    energy_scale: float
    chain_strength: float
    timing: dict | None


class QPUCalibration(NamedTuple):
    """:meth:`QPUSampler.calibrate`'s result. energy_scale: c at which the median beta_eff was target_beta;
    beta, kl_at_beta, kl_to_target: per calibration system at that c (float64; KL in nats, estimated from the
    reads' histogram, so it includes a finite-sample part of about (states seen - 1) / (2 reads)); sizes: n of
    each system; chain_break_rate: over the last round's calls; history: (c, median beta_eff) per round."""

    energy_scale: float
    target_beta: float
    beta: Tensor
    kl_at_beta: Tensor
    kl_to_target: Tensor
    sizes: tuple[int, ...]
    chain_break_rate: float
    history: tuple[tuple[float, float], ...]


class BetaMeasurement(NamedTuple):
    """:meth:`QPUSampler.measure`: per system, beta_eff (``annealing.fit_beta`` on the reads' histogram), the KL
    left at beta_eff and the KL to exp(-target_beta E) (nats; each includes a finite-sample part of about
    (states_seen - 1) / (2 reads), what a perfect sampler would show), and the number of states seen."""

    beta: Tensor
    kl_at_beta: Tensor
    kl_to_target: Tensor
    states_seen: Tensor


class QPUSampler(DimodSampler):
    """Marginals from a D-Wave QPU (or a stand-in with its topology): one anneal per query, many queries per call.

    sampler: a structured dimod sampler with the device's graph and properties: ``dwave.system.DWaveSampler()``,
    or ``dwave.system.testing.MockDWaveSampler(...)`` (with :class:`SimulatedPhysics` as its substitute_sampler
    for physics). num_reads: reads per call (each query gets all of them). graph: the queries' problem graph,
    'clique' or ('band', w) (module docstring). energy_scale: c, device units per unit of the package's energy
    (None until :meth:`calibrate` sets it; sampling without it raises). chain_strength: 'range' (default),
    'torque' or a float (module docstring). max_copies: the most queries per call (default: every copy placed).
    embedding_seed, embedding_tries: minorminer's. sample_kwargs: passed to every call (``annealing_time``, ...).

    Use it like a :class:`DimodSampler`: ``method=`` of ``ising.marginals`` or of the layer, or
    :meth:`marginals`; gradients from the samples (``gradient='covariance'``, 'ste' or 'nudged').
    """

    def __init__(self, sampler, num_reads: int = 1000, *, graph="clique", energy_scale: float | None = None,
                 chain_strength="range", max_copies: int | None = None, embedding_seed: int = 0,
                 embedding_tries: int = 4, **sample_kwargs):
        _ocean()
        super().__init__(sampler, num_reads, **sample_kwargs)
        missing = [a for a in ("properties", "nodelist", "edgelist", "sample") if not hasattr(sampler, a)]
        if missing:
            raise ValueError(f"QPUSampler needs a structured sampler with the device's graph and properties "
                             f"(DWaveSampler, MockDWaveSampler); {type(sampler).__name__} has no "
                             f"{', '.join(missing)}. For an unstructured dimod sampler use ising.DimodSampler")
        properties = sampler.properties
        for name in ("h_range", "j_range"):
            if name not in properties:
                raise ValueError(f"the sampler's properties list no {name}: QPUSampler scales problems into the "
                                 f"device's h_range and j_range")
        self.kind, self.width = check_graph(graph)
        if energy_scale is not None:
            check_real("energy_scale", energy_scale, minimum=0.0, open_minimum=True)
        if isinstance(chain_strength, str):
            if chain_strength not in CHAIN_RULES:
                raise ValueError(f"chain_strength must be one of {CHAIN_RULES} or a number > 0, got {chain_strength!r}")
        else:
            check_real("chain_strength", chain_strength, minimum=0.0, open_minimum=True)
        if max_copies is not None:
            check_int("max_copies", max_copies, 1)
        self.energy_scale = None if energy_scale is None else float(energy_scale)
        self.chain_strength = chain_strength
        self.max_copies = max_copies
        self.embedding_seed = check_int("embedding_seed", embedding_seed, 0)
        self.embedding_tries = check_int("embedding_tries", embedding_tries, 1)
        self.target = sampler.to_networkx_graph() if hasattr(sampler, "to_networkx_graph") else _graph_of(sampler)
        self._adjacency = {q: set(self.target[q]) for q in self.target}
        self._tilings: dict[ProblemGraph, tuple[dict, ...]] = {}
        self.embedding_searches = 0
        self.calls: list[CallRecord] = []
        self.last_embedded_bqm = None

    # --------------------------------------------------------------------------------------- shape and tiling

    def shape(self, n: int) -> ProblemGraph:
        return ProblemGraph(self.kind, n, self.width)

    def tiling(self, n: int) -> tuple[dict, ...]:
        """The disjoint embeddings of the problem graph of n spins on the device, found on the first call for
        this n and kept (a second call searches nothing: ``embedding_searches`` counts the searches). ValueError
        where none is found."""
        shape = self.shape(check_int("n", n, 1))
        if shape not in self._tilings:
            if shape.kind == "band" and shape.width >= n:
                shape_note = f" (a band of width {shape.width} >= n is the clique K_{n})"
            else:
                shape_note = ""
            qubits = self.target.number_of_nodes()
            placed = [] if n > qubits else disjoint_embeddings(
                _source_graph(shape), self.target, max_copies=self.max_copies, seed=self.embedding_seed,
                tries=self.embedding_tries)
            self.embedding_searches += 1
            if not placed:
                raise ValueError(f"no embedding of {shape.describe()}{shape_note} was found on the device's graph "
                                 f"({qubits} qubits, {self.target.graph.get('name', 'no topology named')}): the "
                                 f"shape is too large for this device. Use a smaller window or n, graph=('band', w) "
                                 f"for relative couplings, or a classical method (exact up to 24 spins, banded, "
                                 f"meanfield)")
            self._tilings[shape] = tuple(placed)
        return self._tilings[shape]

    # --------------------------------------------------------------------------------------- scaling

    def _strength(self, bqm) -> float:
        """The chain strength in device units by the rule (module docstring)."""
        if self.chain_strength == "range":
            return -float(self.sampler.properties["j_range"][0])
        if self.chain_strength == "torque":
            _, embedding, _, _ = _ocean()
            return float(embedding.chain_strength.uniform_torque_compensation(bqm, prefactor=TORQUE_PREFACTOR))
        return float(self.chain_strength)

    def _check_ranges(self, embedded, chains: dict, scale: float, strength: float) -> None:
        """ValueError when the programmed problem leaves the device's ranges, naming the largest scale that fits."""
        p = self.sampler.properties
        h_lo, h_hi = map(float, p["h_range"])
        j_lo, j_hi = map(float, p["j_range"])
        chain_of = {q: v for v, chain in chains.items() for q in chain}
        linear = np.array(list(embedded.linear.values()), dtype=np.float64)
        problem, chain_couplers = [], []
        for (a, b), value in embedded.quadratic.items():
            (chain_couplers if chain_of[a] == chain_of[b] else problem).append(value)
        problem = np.array(problem, dtype=np.float64)
        if chain_couplers and not j_lo <= -strength <= j_hi:
            raise ValueError(f"chain strength {strength:g} is outside the device's j_range [{j_lo:g}, {j_hi:g}] "
                             f"(a chain coupler is -{strength:g}); use chain_strength='range' or a smaller number")
        bad = (linear.size and (linear.min() < h_lo or linear.max() > h_hi)) or \
              (problem.size and (problem.min() < j_lo or problem.max() > j_hi))
        if bad:
            fits = [min(h_hi, -h_lo) / np.abs(linear).max() if linear.size and np.abs(linear).max() > 0 else math.inf,
                    min(j_hi, -j_lo) / np.abs(problem).max() if problem.size and np.abs(problem).max() > 0
                    else math.inf]
            raise ValueError(f"energy_scale {scale:g} puts the embedded problem outside the device's h_range "
                             f"[{h_lo:g}, {h_hi:g}] or j_range [{j_lo:g}, {j_hi:g}] (largest |h| "
                             f"{np.abs(linear).max():.3g}, |J| {np.abs(problem).max() if problem.size else 0:.3g} "
                             f"per qubit and coupler): the largest energy_scale that fits this problem is "
                             f"{scale * min(fits):.4g}")
        if "per_qubit_coupling_range" in p:
            lo, hi = map(float, p["per_qubit_coupling_range"])
            total = dict.fromkeys(embedded.variables, 0.0)
            for (a, b), value in embedded.quadratic.items():
                total[a] += value
                total[b] += value
            worst = min(total.values()), max(total.values())
            if worst[0] < lo or worst[1] > hi:
                raise ValueError(f"the couplings on one qubit sum to {worst[0]:.3g}..{worst[1]:.3g}, outside the "
                                 f"device's per_qubit_coupling_range [{lo:g}, {hi:g}]: lower the chain strength or "
                                 f"energy_scale")

    # --------------------------------------------------------------------------------------- sampling

    def draw(self, h: Tensor, J: Tensor | None, mask: Tensor | None, num_samples: int,
             generator: torch.Generator | None = None) -> Tensor:
        """Samples spins (N, S, n), +-1 in h's dtype, from h (N, n), J (N or 1, n, n) or None, mask (N, n):
        ceil(N / k) QPU calls of k = len(tiling(n)) queries each (or max_copies), ``num_samples`` reads each, at
        ``energy_scale``. Absent spins come back as free coin flips from ``generator`` (the caller masks them)."""
        if self.energy_scale is None:
            raise ValueError("QPUSampler has no energy_scale: run .calibrate() (it fits the scale at which the "
                             "device's samples have beta_eff = 1 by KL against exp(-E)) or pass energy_scale=")
        return self._draw(h, J, mask, num_samples, generator, self.energy_scale)

    def _draw(self, h: Tensor, J: Tensor | None, mask: Tensor | None, num_samples: int,
              generator: torch.Generator | None, scale: float) -> Tensor:
        dimod, embedding_tools, _, _ = _ocean()
        if h.dim() != 2:
            raise ValueError(f"draw takes flat h (N, n), got shape {tuple(h.shape)}")
        check_int("num_samples", num_samples, 1)
        check_inputs(h, J, None, mask)
        if J is not None and (J.dim() != 3 or J.shape[0] not in (1, h.shape[0])):
            raise ValueError(f"J must have first dimension 1 or N = {h.shape[0]}, got {tuple(J.shape)}")
        reads = self.sampler.properties.get("num_reads_range")
        if reads is not None and not reads[0] <= num_samples <= reads[1]:
            raise ValueError(f"num_reads {num_samples} is outside the device's num_reads_range {list(reads)}: "
                             f"make several calls, or use fewer reads")
        N, n = h.shape
        out = (2 * torch.randint(0, 2, (N, num_samples, n), generator=generator) - 1).to(h.dtype)
        problems = []
        for i in range(N):
            hd, Jd = self.problem(h[i], None if J is None else J[i if J.shape[0] > 1 else 0],
                                  None if mask is None else mask[i])
            if self.kind == "band":
                far = [(j, k) for j, k in Jd if k - j > self.width]
                if far:
                    j, k = far[0]
                    raise ValueError(f"query {i} couples spins {j} and {k} (|j - k| = {k - j}), beyond the band "
                                     f"width {self.width} its embedding was found for: use graph='clique' or a "
                                     f"wider band")
            if hd:
                problems.append((i, hd, Jd))
        if not problems:
            return out
        tiling = self.tiling(n)
        for start in range(0, len(problems), len(tiling)):
            batch = problems[start:start + len(tiling)]
            linear, quadratic, chains = {}, {}, {}
            for slot, (_, hd, Jd) in enumerate(batch):
                for j, value in hd.items():
                    linear[(slot, j)] = scale * value
                    chains[(slot, j)] = tiling[slot][j]
                for (j, k), value in Jd.items():
                    quadratic[((slot, j), (slot, k))] = scale * value
            bqm = dimod.BinaryQuadraticModel.from_ising(linear, quadratic)
            strength = self._strength(bqm)
            embedded = embedding_tools.embed_bqm(bqm, chains, self._adjacency, chain_strength=strength)
            self._check_ranges(embedded, chains, scale, strength)
            self.last_embedded_bqm = embedded
            kwargs = dict(self.sample_kwargs)
            if "auto_scale" in getattr(self.sampler, "parameters", {}):
                kwargs.setdefault("auto_scale", False)  # the problem is scaled here; the device must not rescale it
            response = self.sampler.sample(embedded, num_reads=num_samples, **kwargs)
            rate = _chain_break_rate(response, chains)
            logical = embedding_tools.unembed_sampleset(response, chains, bqm,
                                                        chain_break_method=embedding_tools.majority_vote)
            variables, samples = _expanded(logical, num_samples)
            column = {v: c for c, v in enumerate(variables)}
            for slot, (i, hd, _) in enumerate(batch):
                keys = list(hd)
                out[i][:, keys] = torch.as_tensor(samples[:, [column[(slot, j)] for j in keys]], dtype=h.dtype)
            self.calls.append(CallRecord(len(batch), len(embedded.variables), num_samples, rate, scale, strength,
                                         dict(response.info["timing"]) if "timing" in response.info else None))
        return out

    @property
    def chain_break_rate(self) -> float | None:
        """The last call's chain-break rate (None before the first call); every call's is in :attr:`calls`."""
        return self.calls[-1].chain_break_rate if self.calls else None

    @property
    def record(self) -> Method:
        from ._sampling import check_sampling_options

        return Method("a QPUSampler", self.marginals, None, keyword_options(DimodSampler.marginals), "sampled",
                      "one anneal per query, tiled: many queries per QPU call; marginals only (no log Z)",
                      lambda options: check_sampling_options(DimodSampler.marginals, {"num_samples": 1, **options}))

    # --------------------------------------------------------------------------------------- temperature

    def calibrate(self, target_beta: float = 1.0, *, sizes: tuple[int, ...] | None = None,
                  num_systems: int = annealing.CALIBRATION_SYSTEMS["num_systems"], num_reads: int | None = None,
                  start: float | None = None, rounds: int = 8, tolerance: float = 0.05,
                  field_mean: float = annealing.CALIBRATION_SYSTEMS["field_mean"],
                  field_std: float = annealing.CALIBRATION_SYSTEMS["field_std"],
                  coupling_std: float = annealing.CALIBRATION_SYSTEMS["coupling_std"],
                  seed: int = annealing.CALIBRATION_SYSTEMS["seed"]) -> QPUCalibration:
        """Set ``energy_scale`` to the c at which the device's samples have median beta_eff = ``target_beta``.

        Systems: ``annealing.calibration_systems`` (the DQA study's: h ~ N(field_mean, field_std^2), J ~ N(0,
        coupling_std^2), ``num_systems`` per n in ``sizes``, default (4, 6, 8); banded to the graph's width for
        graph=('band', w)). Each round samples them at c (``num_reads`` reads, default the sampler's), fits beta_eff
        per system by ``annealing.fit_beta`` on the histogram of its reads against E over all 2^n states, and
        moves c by target / median beta_eff (a thermal device's beta_eff is proportional to c; the step is kept
        within 10x), from ``start`` (default: 1, or the largest c the systems fit in the ranges). It stops when the
        median is within ``tolerance`` (relative) of the target and raises RuntimeError after ``rounds`` rounds
        without. ValueError when beta_eff = target would need a scale beyond the ranges.
        """
        target_beta = check_real("target_beta", target_beta, minimum=0.0, open_minimum=True)
        sizes = tuple(annealing.CALIBRATION_SYSTEMS["sizes"] if sizes is None else sizes)
        if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CALIBRATION_SPINS
                            for n in sizes):
            raise ValueError(f"sizes must be a non-empty tuple of integers in 1..{MAX_CALIBRATION_SPINS} (the "
                             f"calibration enumerates 2^n states), got {sizes!r}")
        check_int("num_systems", num_systems, 1)
        check_int("rounds", rounds, 1)
        tolerance = check_real("tolerance", tolerance, minimum=0.0, open_minimum=True)
        reads = self.num_reads if num_reads is None else check_int("num_reads", num_reads, 1)
        systems = []
        for n in sizes:
            h, J = annealing.calibration_systems(n, num_systems, field_mean, field_std, coupling_std, seed)
            if self.kind == "band":
                J = J * ((torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() <= self.width)
            systems.append((h, J))
        p = self.sampler.properties
        h_max = min(float(p["h_range"][1]), -float(p["h_range"][0]))
        j_max = min(float(p["j_range"][1]), -float(p["j_range"][0]))
        largest = min(h_max / max(float(h.abs().max()) for h, _ in systems),
                      j_max / max(max(float(J.abs().max()) for _, J in systems), 1e-300))
        if self.chain_strength == "torque":  # the torque rule's strength grows with c: it must stay in j_range too
            dimod = _ocean()[0]
            torque = max(self._strength(dimod.BinaryQuadraticModel.from_ising(*self.problem(h[i], J[i])))
                         for h, J in systems for i in range(len(h)))
            largest = min(largest, j_max / torque)
        scale = min(1.0, largest) if start is None else check_real("start", start, minimum=0.0, open_minimum=True)
        history = []
        for _ in range(rounds):
            first = len(self.calls)
            beta, kl_at_beta, kl_to_target, _ = self.measure(systems, scale, reads, target_beta)
            median = float(beta.median())
            history.append((scale, median))
            if abs(median / target_beta - 1.0) <= tolerance:
                self.energy_scale = scale
                calls = self.calls[first:]
                rate = sum(c.chain_break_rate * c.queries for c in calls) / max(sum(c.queries for c in calls), 1)
                return QPUCalibration(scale, target_beta, beta, kl_at_beta, kl_to_target,
                                      tuple(n for n in sizes for _ in range(num_systems)), rate, tuple(history))
            if not median > 0:
                raise RuntimeError(f"the device's samples at energy_scale {scale:.4g} are at least as hot as uniform "
                                   f"(median beta_eff {median:.3g}): no scale calibrates them")
            scale = scale * min(max(target_beta / median, 0.1), 10.0)
            if scale > largest:
                raise ValueError(f"beta_eff = {target_beta:g} needs an energy_scale above {largest:.4g}, the largest "
                                 f"the calibration systems fit in the device's ranges (median beta_eff there "
                                 f"{median:.3g}): the device is too hot for these fields and couplings")
        raise RuntimeError(f"calibrate did not reach median beta_eff = {target_beta:g} within {tolerance:g} in "
                           f"{rounds} rounds: (energy scale, median beta_eff) = "
                           + ", ".join(f"({c:.4g}, {b:.3g})" for c, b in history))

    def measure(self, systems: list[tuple[Tensor, Tensor]], scale: float, num_reads: int,
                target_beta: float = 1.0) -> BetaMeasurement:
        """beta_eff, KL at beta_eff and KL to exp(-target_beta E) of each system (h (N, n), J (N, n, n)) at
        energy scale ``scale``, from the histogram of ``num_reads`` reads (``annealing.fit_beta``)."""
        parts = []
        for h, J in systems:
            n = h.shape[-1]
            if n > MAX_CALIBRATION_SPINS:
                raise ValueError(f"measure enumerates 2^n states: n <= {MAX_CALIBRATION_SPINS}, got {n}")
            p = empirical_distribution(self._draw(h, J, None, num_samples=num_reads, generator=None, scale=scale))
            energy = -negative_energies(h.double(), J.double(), None, configurations(n))
            fit = annealing.fit_beta(p, energy)
            kl_target = annealing._kl(p, torch.log_softmax(-target_beta * energy, -1))
            parts.append((fit.beta, fit.kl, kl_target, (p > 0).sum(-1)))
        return BetaMeasurement(*(torch.cat(x) for x in zip(*parts)))


def empirical_distribution(spins: Tensor) -> Tensor:
    """The histogram of samples (N, S, n) of +-1 over the 2^n states, (N, 2^n) float64, in the order of
    ``enumeration.configurations`` (bit j of the index is spin j, 1 meaning +1)."""
    N, S, n = spins.shape
    index = ((spins > 0).long() << torch.arange(n)).sum(-1)  # (N, S)
    counts = torch.zeros(N, 1 << n, dtype=torch.float64)
    counts.scatter_add_(1, index, torch.ones(N, S, dtype=torch.float64))
    return counts / S


def _graph_of(sampler):
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(sampler.nodelist)
    g.add_edges_from(sampler.edgelist)
    return g


def _chain_break_rate(response, chains: dict) -> float:
    """The fraction of (read, chain) pairs whose qubits disagree, reads counted with their num_occurrences."""
    _, embedding_tools, _, _ = _ocean()
    column = {q: c for c, q in enumerate(response.variables)}
    record = response.record
    broken = embedding_tools.broken_chains(record.sample, [[column[q] for q in chain] for chain in chains.values()])
    counts = np.asarray(record.num_occurrences, dtype=np.float64)
    return float((broken.mean(1) * counts).sum() / counts.sum()) if counts.sum() else 0.0


def _expanded(sampleset, num_samples: int) -> tuple[list, np.ndarray]:
    """(variables, samples (num_samples, variables)) with num_occurrences expanded; ValueError for a read count
    other than num_samples."""
    record = sampleset.record
    counts = np.asarray(record.num_occurrences)
    if int(counts.sum()) != num_samples:
        raise ValueError(f"the device returned {int(counts.sum())} reads, expected num_reads = {num_samples}")
    return list(sampleset.variables), np.repeat(np.asarray(record.sample), counts, axis=0)


# ------------------------------------------------------------------------------------------------- physics

PHYSICS = ("boltzmann", "sqa", "dqa")


class SimulatedPhysics:
    """The device's physics, simulated by this package: ``MockDWaveSampler(substitute_sampler=...)``.

    A dimod-style sampler (``sample(bqm, num_reads) -> SampleSet``) that draws each connected component of the
    programmed problem (in device units, dimod's sign) independently, as a QPU's disjoint copies are:

    * 'boltzmann': exact draws from exp(-beta E_device) (components of at most 16 qubits, enumerated);
    * 'sqa': ``ising.sqa`` at inverse temperature ``beta`` (``options``: sweeps, trotter_slices, gamma_start,
      gamma_end); each read is one slice of its own chain (an anneal), so reads are independent;
    * 'dqa': ``ising.annealing``'s simulated diabatic anneal of the device's problem (``options``: its anneal
      options, energy_scale among them, in its GHz units; components of at most 16 qubits).

    ``beta`` (device units: h and J as programmed) is the device temperature of 'boltzmann' and 'sqa'; 'dqa'
    has none. ``seed`` seeds one torch generator for every call. The QPU's own parameters that the mock passes
    on (annealing_time, auto_scale, answer_mode, ...) do not reach this physics: its options are set here.
    """

    def __init__(self, kind: str = "boltzmann", *, beta: float | None = None, seed: int = 0, **options):
        if kind not in PHYSICS:
            raise ValueError(f"kind must be one of {PHYSICS}, got {kind!r}")
        if kind == "dqa":
            if beta is not None:
                raise ValueError("'dqa' has no temperature (its anneal sets beta_eff): set its energy_scale option")
            annealing.check_dqa_options(options)
        else:
            if beta is None:
                raise ValueError(f"'{kind}' needs the device's inverse temperature beta (device units)")
            check_real("beta", beta, minimum=0.0, open_minimum=True)
            if kind == "boltzmann" and options:
                raise ValueError(f"'boltzmann' takes no options, got {sorted(options)}")
            if kind == "sqa":
                sqa._check_schedule(**{**dict(sweeps=200, trotter_slices=16, gamma_start=3.0, gamma_end=0.05),
                                       **options, "beta": beta})
        self.kind, self.beta, self.options = kind, beta, options
        self.generator = torch.Generator().manual_seed(check_int("seed", seed, 0))
        self.parameters = {"num_reads": []}
        self.properties = {}

    def sample(self, bqm, num_reads: int = 1, **device_parameters):
        dimod, _, _, _ = _ocean()
        import networkx as nx

        num_reads = check_int("num_reads", num_reads, 1)
        if bqm.vartype is not dimod.SPIN:
            bqm = bqm.change_vartype(dimod.SPIN, inplace=False)
        labels = list(bqm.variables)
        where = {v: c for c, v in enumerate(labels)}
        graph = nx.Graph()
        graph.add_nodes_from(labels)
        graph.add_edges_from(bqm.quadratic)
        groups: dict[int, list[list]] = {}
        for component in nx.connected_components(graph):
            groups.setdefault(len(component), []).append(sorted(component, key=where.get))
        samples = np.empty((num_reads, len(labels)), dtype=np.int8)
        for q, components in groups.items():
            h = torch.tensor([[-bqm.linear[v] for v in c] for c in components], dtype=torch.float64)
            J = torch.zeros(len(components), q, q, dtype=torch.float64)
            for g, c in enumerate(components):
                local = {v: a for a, v in enumerate(c)}
                for a, v in enumerate(c):
                    for u, value in bqm.adj[v].items():
                        J[g, a, local[u]] = -value
            spins = self._draw(h, J, num_reads)  # (G, reads, q)
            for g, c in enumerate(components):
                samples[:, [where[v] for v in c]] = spins[g].numpy().astype(np.int8)
        return dimod.SampleSet.from_samples_bqm((samples, labels), bqm)

    def _draw(self, h: Tensor, J: Tensor, num_reads: int) -> Tensor:
        """Samples (G, reads, q) of the components h (G, q), J (G, q, q) in the package's convention."""
        q = h.shape[-1]
        if self.kind == "sqa":
            slices = self.options.get("trotter_slices", 16)
            spins = sqa.sqa_draw(h, J, None, num_reads * slices, self.generator, beta=self.beta, **self.options)
            return spins[:, ::slices]  # slice 0 of each chain: one anneal per read
        if q > MAX_ENUMERATED_QUBITS:
            raise ValueError(f"SimulatedPhysics('{self.kind}') handles connected components of at most "
                             f"{MAX_ENUMERATED_QUBITS} qubits (got {q}); use 'sqa' for larger ones")
        if self.kind == "dqa":
            return annealing.dqa_draw(h, J, None, num_reads, self.generator, **self.options)
        states = configurations(q)
        p = torch.softmax(self.beta * negative_energies(h, J, None, states), -1)
        return states[torch.multinomial(p, num_reads, replacement=True, generator=self.generator)]
