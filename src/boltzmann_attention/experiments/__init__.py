"""The reproduction of the paper's experiments, built on the library (``boltzmann_attention``).

In layers, each importing only those above it in this list (``tests/test_imports.py`` holds the rule):

    data.py      Tiny Shakespeare (bundled in datasets/) and the bracket-matching generator
    model.py     the paper's model: embeddings, pre-LN blocks with any attention mode, LM or position head
    train.py     TrainConfig, the training loop, evaluation, checkpoints (bit-exact resume), DDP
    sweep.py     grids of runs and resumable sweeps over them (generic: no study's grids)
    results.py   loading, checking and grouping run results (runs/*.json or a report's runs.jsonl.gz)
    recipes.py   training recipes several studies share (nanoGPT's configuration, the strong recipe, ...)

    stats.py     statistics of every report: over seeds, paired over seeds, Holm, fits
    tables.py    Markdown tables and number formatting
    plots.py     the PNG plots (matplotlib imported inside the functions)
    report.py    the sections every report shares (header, task tables, couplings, samplers, verdicts)
    claims.py    the paper's numbers and claims, checked against runs

    studies/     one folder per study: its grids and report (__init__.py), protocol.md, decisions.json;
                 studies/__init__.py is the registry that finds them
    cli.py       the ``boltzmann-attention`` command

The library never imports this package; this package imports the library.
"""
