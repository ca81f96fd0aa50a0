"""hvdtrain: data-parallel training of Keras 3 models with Horovod, and tables
sharded across the workers where data parallelism alone breaks (hvdtrain.layers).

Names load on first use, so that the command line can check its input and
fail before TensorFlow starts.
"""

import importlib

_EXPORTS = {
    "Compression": "hvdtrain.compression",
    "DistributedGradientTape": "hvdtrain.tape",
    "DistributedOptimizer": "hvdtrain.optimizer",
    "PartialDistributedOptimizer": "hvdtrain.optimizer",
    "Preempted": "hvdtrain.preemption",
    "Recipe": "hvdtrain.recipe",
    "Splits": "hvdtrain.recipe",
    "TrainConfig": "hvdtrain.config",
    "Evaluation": "hvdtrain.evaluator",
    "TrainResult": "hvdtrain.trainer",
    "broadcast_variables": "hvdtrain.collectives",
    "evaluate": "hvdtrain.evaluator",
    "init": "hvdtrain.runtime",
    "is_main_process": "hvdtrain.runtime",
    "jit_compile": "hvdtrain.xla",
    "local_rank": "hvdtrain.runtime",
    "local_size": "hvdtrain.runtime",
    "rank": "hvdtrain.runtime",
    "size": "hvdtrain.runtime",
    "train": "hvdtrain.trainer",
}
_SUBMODULES = ("callbacks", "checkpoint", "data", "elastic", "layers", "recipe")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"hvdtrain.{name}")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hvdtrain' has no attribute '{name}'")
