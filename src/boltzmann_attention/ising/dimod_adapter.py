"""Drive the Ising layer with any dimod sampler (dwave-samplers, D-Wave QPU via Ocean, ...).

Sign convention at the boundary. This package uses E(s) = -h.s - sum_{j<k} J_jk s_j s_k with
p(s) ∝ exp(-E(s)); dimod minimises E_dimod(s) = sum_j h'_j s_j + sum_{(j,k)} J'_jk s_j s_k. So each
query is sent as h'_j = -h_j and J'_(j,k) = -J_jk for j < k (both present), and E_dimod = E exactly.

Only present spins (mask True) become variables, labelled by their index j in 0..n-1; every present
spin is in h' (with 0.0 if its field is 0). Zero couplings are left out of J'. Absent spins come back
as free +-1 coin flips (drawn from ``generator``), exactly as a spin with no field and no coupling
would; callers mask them.

Temperature: samples from hardware (or from simulated annealing run to a low temperature) are not
Boltzmann samples at beta = 1. A QPU returns samples at an unknown effective temperature that depends
on the problem, its scale (``auto_scale``), the anneal schedule and the device, so marginals from it
need a beta calibration before they can stand in for <s_j> at beta = 1. This adapter does not do it.
To sample at beta = 1 with dwave-samplers' SimulatedAnnealingSampler, pass ``beta_range=[1, 1]``
(with enough ``num_sweeps``): E_dimod = E, so its Metropolis chain targets exp(-E).

Exact solvers. A sampler whose ``parameters`` do not list ``num_reads`` (``dimod.ExactSolver``) is taken
to enumerate: it must return every state of the present spins exactly once, and the states are weighted
by their Boltzmann factors exp(-E(s)) (E computed here, at beta = 1), which gives exact marginals and
exact covariance gradients. A sampler that takes ``num_reads`` must return exactly that many reads;
anything else raises ValueError.

Cost: one ``sample_ising`` call per query (a Python loop; it is an adapter). A QPU call costs
milliseconds of access overhead each, so this is for experiments, not training.
This module never imports dimod (it only calls the sampler and reads the sample set's ``variables``
and ``record``), so the package imports without it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from ._inputs import check_inputs
from ._sampling import check_sampling_options, resolve_generator, sampled_marginals
from .record import Method, keyword_options


class DimodSampler:
    """Adapter from a dimod sampler to the draw contract and to marginals.

    sampler: anything with ``sample_ising(h: dict, J: dict, num_reads=..., **kwargs) -> SampleSet``.
    num_reads: samples per query used by :meth:`marginals` (default 1000). sample_kwargs: passed to every
    ``sample_ising`` call (e.g. ``beta_range``, ``num_sweeps``, ``seed``, ``annealing_time``).
    seed_from_generator: when True and a generator is given, each call gets ``seed=`` drawn from it
    (for samplers that accept a seed, such as dwave-samplers'), so torch's generator fixes the draws.
    """

    def __init__(self, sampler, num_reads: int = 1000, *, seed_from_generator: bool = False, **sample_kwargs):
        if not hasattr(sampler, "sample_ising"):
            raise ValueError(f"sampler must have a sample_ising method (a dimod sampler), got {type(sampler).__name__}")
        if isinstance(num_reads, bool) or not isinstance(num_reads, int) or num_reads < 1:
            raise ValueError(f"num_reads must be an integer >= 1, got {num_reads!r}")
        self.sampler = sampler
        parameters = getattr(sampler, "parameters", None)
        # dimod samplers list the keyword arguments they take; ExactSolver takes no num_reads: it enumerates
        self.enumerates = isinstance(parameters, Mapping) and "num_reads" not in parameters
        self.num_reads = num_reads
        self.seed_from_generator = seed_from_generator
        self.sample_kwargs = sample_kwargs

    def __call__(self, h, J, mask, num_samples, generator=None) -> Tensor:
        return self.draw(h, J, mask, num_samples, generator)

    def problem(self, h: Tensor, J: Tensor | None, mask: Tensor | None = None) -> tuple[dict, dict]:
        """The dimod (h', J') dicts of one query: h (n,), J (n, n) or None, mask (n,) or None."""
        n = h.shape[-1]
        present = list(range(n)) if mask is None else [int(j) for j in torch.nonzero(mask).flatten()]
        hv = h.detach().double().cpu().numpy()
        h_dimod = {j: -float(hv[j]) for j in present}
        J_dimod = {}
        if J is not None and len(present) > 1:
            Jv = J.detach().double().cpu().numpy()
            for a, j in enumerate(present):
                for k in present[a + 1:]:
                    if Jv[j, k] != 0.0:
                        J_dimod[(j, k)] = -float(Jv[j, k])
        return h_dimod, J_dimod

    def draw(self, h: Tensor, J: Tensor | None, mask: Tensor | None, num_samples: int,
             generator: torch.Generator | None = None) -> Tensor:
        """Samples spins (N, S, n), +-1 in h's dtype, from h (N, n), J (N or 1, n, n) or None, mask (N, n).

        One ``sample_ising(h', J', num_reads=num_samples)`` per query. The sample set must hold exactly
        the present spins as variables, SPIN values (+-1) and num_samples reads in total (counting
        ``num_occurrences``); anything else raises ValueError. For an enumerating sampler (see the module
        docstring) it returns ``(spins, weights)`` instead: every state once, (N, 2^k, n) with k the most
        present spins of a query, and its Boltzmann weights (N, 2^k), zero on padding rows.
        """
        if h.dim() != 2:
            raise ValueError(f"draw takes flat h (N, n), got shape {tuple(h.shape)}")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
        check_inputs(h, J, None, mask)
        if J is not None and (J.dim() != 3 or J.shape[0] not in (1, h.shape[0])):
            raise ValueError(f"J must have first dimension 1 or N = {h.shape[0]}, got {tuple(J.shape)}")
        N, n = h.shape
        if self.enumerates:
            return self._enumerate(h, J, mask)
        # absent spins: free coin flips, overwritten below where the spin is present
        out = (2 * torch.randint(0, 2, (N, num_samples, n), generator=generator) - 1).to(h.dtype)
        for i in range(N):
            m = mask[i] if mask is not None else None
            h_dimod, J_dimod = self.problem(h[i], None if J is None else J[i if J.shape[0] > 1 else 0], m)
            if not h_dimod:
                continue
            kwargs = dict(self.sample_kwargs)
            if self.seed_from_generator and generator is not None:
                kwargs["seed"] = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
            sampleset = self.sampler.sample_ising(h_dimod, J_dimod, num_reads=num_samples, **kwargs)
            columns, samples = _spin_samples(sampleset, list(h_dimod), num_samples)
            out[i][:, columns] = torch.as_tensor(samples, dtype=h.dtype)
        return out

    def _enumerate(self, h: Tensor, J: Tensor | None, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Every state of each query from the sampler, weighted by exp(-E) with our E (see ``draw``)."""
        N, n = h.shape
        states, log_weights = [], []
        for i in range(N):
            Ji = None if J is None else J[i if J.shape[0] > 1 else 0]
            h_dimod, J_dimod = self.problem(h[i], Ji, mask[i] if mask is not None else None)
            if not h_dimod:  # no spin present: one empty state, weight 1
                states.append(([], np.zeros((1, 0)))), log_weights.append(np.zeros(1))
                continue
            sampleset = self.sampler.sample_ising(h_dimod, J_dimod, **self.sample_kwargs)
            columns, samples = _all_states(sampleset, list(h_dimod))
            hv = h[i].detach().double().cpu().numpy()[columns]
            negative_energy = samples @ hv
            if Ji is not None:
                Jv = Ji.detach().double().cpu().numpy()[np.ix_(columns, columns)]
                negative_energy = negative_energy + 0.5 * np.einsum("sj,jk,sk->s", samples, Jv, samples)
            states.append((columns, samples)), log_weights.append(negative_energy)
        S = max((len(w) for w in log_weights), default=1)  # default: an empty batch
        spins = h.new_zeros(N, S, n)
        weights = torch.zeros(N, S, dtype=torch.float64)
        for i, ((columns, samples), lw) in enumerate(zip(states, log_weights, strict=True)):
            spins[i, :len(samples)][:, columns] = torch.as_tensor(samples, dtype=h.dtype)
            weights[i, :len(lw)] = torch.softmax(torch.as_tensor(lw, dtype=torch.float64), 0)
        return spins, weights.to(h.device)

    @property
    def record(self) -> Method:
        """This sampler as a method record (sampled, no log Z): what ``ising.resolve_method`` returns for it."""
        return Method("a DimodSampler", self.marginals, None, keyword_options(DimodSampler.marginals), "sampled",
                      "one sample_ising call per query; marginals only (no log Z)",
                      lambda options: check_sampling_options(DimodSampler.marginals, {"num_samples": 1, **options}))

    def marginals(self, h: Tensor, J: Tensor | None = None, K: Tensor | None = None,
                  mask: Tensor | None = None, *, gradient: str = "covariance", nudge: float = 0.1,
                  generator: torch.Generator | None = None, seed: int | None = None) -> Tensor:
        """Sample means of s_j over ``num_reads`` reads, shaped like the broadcast h (..., n); absent spins 0.

        h: (..., n); J: (n, n) or broadcastable (..., n, n); mask: (..., n) bool. Differentiable in h and J
        through the sample-based estimators of ``_sampling`` (``gradient``: covariance, ste or nudged).
        This is what runs when the adapter is passed as ``method`` to ``ising.marginals`` or the layer.
        """
        if K is not None:
            raise ValueError("DimodSampler is pairwise only (sample_ising takes h and J); got K")
        check_inputs(h, J, None, mask)
        return sampled_marginals(h, J, mask, self.draw, num_samples=self.num_reads, gradient=gradient,
                                 nudge=nudge, generator=resolve_generator(h.device, seed, generator))


def _all_states(sampleset, variables: list[int]) -> tuple[list[int], np.ndarray]:
    """(column of each variable, the 2^k states (2^k, k)) of an enumerating sampler's sample set, checked."""
    columns, samples = _spin_samples(sampleset, variables, None)
    k = len(variables)
    if len(samples) != 2**k or len(np.unique(samples, axis=0)) != 2**k:
        raise ValueError(f"the sampler takes no num_reads, so it is used as an exact enumeration, but it "
                         f"returned {len(samples)} reads of {k} spins ({len(np.unique(samples, axis=0))} "
                         f"distinct) instead of each of the 2^{k} states exactly once")
    return columns, samples.astype(np.float64)


def _spin_samples(sampleset, variables: list[int], num_samples: int | None) -> tuple[list[int], np.ndarray]:
    """Check a sample set against the request; return (column of each variable, samples (S, n_present)).

    num_samples None: any number of reads (the enumeration check is the caller's)."""
    got = list(sampleset.variables)
    if len(got) != len(variables) or set(got) != set(variables):
        raise ValueError(f"the sampler returned variables {sorted(got, key=repr)}, expected exactly "
                         f"{sorted(variables)} (the present spins of the query)")
    record = sampleset.record
    samples = np.asarray(record.sample)
    if samples.ndim != 2 or samples.shape[1] != len(got):
        raise ValueError(f"the sample set's samples have shape {samples.shape}, expected (reads, {len(got)})")
    if not np.isin(samples, (-1, 1)).all():
        raise ValueError("the sampler returned values other than -1 and +1 (a SPIN sample set is required; "
                         f"got vartype {getattr(sampleset, 'vartype', '?')})")
    counts = np.asarray(record.num_occurrences) if "num_occurrences" in record.dtype.names \
        else np.ones(len(samples), dtype=np.int64)
    if num_samples is None:
        if (counts != 1).any():
            raise ValueError("the sampler returned states with num_occurrences != 1, expected each state once")
    elif (counts < 0).any() or int(counts.sum()) != num_samples:
        raise ValueError(f"the sampler returned {int(counts.sum())} reads (num_occurrences summed), "
                         f"expected num_reads = {num_samples}: its reads cannot be used as samples. (A sampler "
                         "that enumerates every state once, such as dimod.ExactSolver, is recognised by a "
                         "`parameters` mapping without 'num_reads', and its states are weighted exactly.)")
    samples = np.repeat(samples, counts, axis=0)
    return got, samples
