"""Run: one training or evaluation run put together.

The trainer (config, runtime, data, model, where to start, callbacks, rank-0
files), Keras `fit` from a position, the model compiled as the settings say,
XLA around Horovod's collectives, and the evaluator behind `hvdtrain
evaluate`. It composes every package below it; only the command line and
hvdtrain's public names depend on it.
"""
