"""The reproduction of the paper's experiments, built on the library (``boltzmann_attention``).

In three layers, the blank lines between them; a module imports only from its own layer and those above it
(``tests/test_imports.py`` holds the rule, and refuses cycles):

    data.py      Tiny Shakespeare (bundled in datasets/) and the bracket-matching generator
    blocks.py    the find-the-block generator (MTA's toy task), its conjunction option and its answer classes
    tasks/       one record per task (how to build its data, evaluate a model, its headline and options): the
                 built-in ones, Match3, and the registry
    config.py    TrainConfig: typed, nested dataclasses, every field with its help
    arms.py      a study's arm (a mode with its options and method) and its staged grids
    model.py     the paper's model: embeddings, pre-LN blocks with any attention mode, LM or position head
    train/       the training loop, evaluation, checkpoints (bit-exact resume), memory probe, DDP
    coattention.py, conjunction.py  analyses of trained models that studies ask for (conjunction.py: the
                 couplings between the keys that answer, find-the-block and Match3)
    sweep.py     grids of runs and resumable sweeps over them (generic: no study's grids)
    results.py   loading, checking and grouping run results (runs/*.json or a report's runs.jsonl.gz)
    recipes.py   training recipes several studies share (nanoGPT's configuration, the strong recipe, ...)
    progress.py  progress bars and lines

    stats.py     statistics of every report: over seeds, paired over seeds, Holm, fits
    tables.py    Markdown tables and number formatting
    plots.py     the PNG plots (matplotlib imported inside the functions)
    report.py    the sections every report shares (header, task tables, couplings, samplers, verdicts)
    claims.py    the paper's numbers and claims, checked against runs
    lr_rule.py   the studies' learning-rate stage: the rule, its decisions, table and notes
    staged_report.py  the stages of a study that calibrates its setting (lrs, seeds, the decision, the
                 coupled arms' J = 0 error and sign), shared by the conjunction and Match3 studies

    studies/     one folder per study: its grids and report (__init__.py), protocol.md, decisions.json;
                 studies/__init__.py is the registry that finds them
    explore.py   the explorer: one offline HTML page of a run, checkpoint, converted model or layer
    cli.py       the ``boltzmann-attention`` command
    benchmarks/  the ``boltzmann-attention-bench`` command: step times, layers, samplers

The library never imports this package; this package imports the library.
"""
