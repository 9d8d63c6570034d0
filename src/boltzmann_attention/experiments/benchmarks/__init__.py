"""Every benchmark of the package, run by the ``boltzmann-attention-bench`` command (:mod:`.cli`; also
``python -m boltzmann_attention.experiments.benchmarks``).

- :mod:`.common`: the stamp (machine, threads, load, torch, commit), side-by-side timing, ratio wording.
- :mod:`.layers`: attention layers: each marginal method inside attention against naive enumeration and SDPA,
  and the long-window layers (coupled window, Toeplitz mean field / TAP, banded exact) against mode h.
- :mod:`.training`: training steps: the paper's model per mode, configurations side by side
  (:func:`~.training.time_steps`), a profile's grid in two source trees.
- :mod:`.approximations`: approximate methods' errors against exact, and their time against n.
- :mod:`.dqa`: DQA's effective temperature and calibration (report/dqa_calibration/).
- :mod:`.qpu`: the QPU path: windows per call, calibration on the mock, reads, cost per token (report/qpu/).
"""
