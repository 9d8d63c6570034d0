"""The reproduction of the paper's experiments, built on the library (``boltzmann_attention``).

    data.py      Tiny Shakespeare (bundled in datasets/) and the bracket-matching generator
    model.py     the paper's model: embeddings, pre-LN blocks with any attention mode, LM or position head
    train.py     TrainConfig, the training loop, evaluation, checkpoints (bit-exact resume), DDP
    sweep.py     grids of runs and resumable sweeps over them
    cli.py       the ``boltzmann-attention`` command

The library never imports this package; this package imports the library.
"""
