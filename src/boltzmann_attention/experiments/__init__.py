"""The reproduction of the paper's experiments, built on the library (``boltzmann_attention``).

    data.py      Tiny Shakespeare (bundled in datasets/) and the bracket-matching generator
    model.py     the paper's model: embeddings, pre-LN blocks with any attention mode, LM or position head
    train.py     TrainConfig, the training loop, evaluation, checkpoints (bit-exact resume), DDP
    sweep.py     grids of runs and resumable sweeps over them (generic: no study's grids)
    studies/     one module per study (paper, fair, sampling): its grids and its report; the registry
    results.py   loading, checking and grouping run results (runs/*.json or a report's runs.jsonl.gz)
    stats.py     statistics of every report: over seeds, paired over seeds, Holm, fits
    tables.py    Markdown tables and number formatting
    plots.py     the PNG plots (matplotlib imported inside the functions)
    report.py    the sections every report shares (header, task tables, couplings, verdicts)
    cli.py       the ``boltzmann-attention`` command

The library never imports this package; this package imports the library.
"""
