"""hvdtrain: data-parallel training of Keras 3 models with Horovod, and where
data parallelism alone breaks, tables sharded across the workers, layers
split over tensor-parallel ranks (hvdtrain.layers) and models cut into
pipeline stages (hvdtrain.pipeline).

Each folder is one concept, lowest first: faults (the watchdog, preemption),
layout.py (which worker does what: replicas and groups), tools (doctor,
report, throughput), parallel (the strategies: data_parallel/,
sharded_tables/, tensor_parallel/, pipeline_parallel/), data (input
pipelines), state (position, checkpoints, export), callbacks, run (the
trainer, the evaluator); keras and layers are public facades, and cli.py,
config.py, recipe.py the command line and its settings. A package's
docstring says what may depend on it; tests/unit/test_layers.py holds the table.

Names load on first use, so that the command line can check its input and
fail before TensorFlow starts.
"""

import importlib

_EXPORTS = {
    "Compression": "hvdtrain.parallel.data_parallel.compression",
    "DistributedGradientTape": "hvdtrain.parallel.data_parallel.tape",
    "DistributedOptimizer": "hvdtrain.parallel.data_parallel.optimizer",
    "PartialDistributedOptimizer": "hvdtrain.parallel.data_parallel.optimizer",
    "Preempted": "hvdtrain.faults.preemption",
    "Recipe": "hvdtrain.recipe",
    "Splits": "hvdtrain.recipe",
    "TrainConfig": "hvdtrain.config",
    "Evaluation": "hvdtrain.run.evaluator",
    "TrainResult": "hvdtrain.run.trainer",
    "broadcast_variables": "hvdtrain.parallel.collectives",
    "evaluate": "hvdtrain.run.evaluator",
    "init": "hvdtrain.runtime",
    "is_main_process": "hvdtrain.runtime",
    "jit_compile": "hvdtrain.run.xla",
    "local_rank": "hvdtrain.runtime",
    "local_size": "hvdtrain.runtime",
    "rank": "hvdtrain.runtime",
    "size": "hvdtrain.runtime",
    "train": "hvdtrain.run.trainer",
}
# Public modules by their public names, wherever their concept's folder is.
_SUBMODULES = {
    "callbacks": "hvdtrain.callbacks",
    "checkpoint": "hvdtrain.state.checkpoint",
    "data": "hvdtrain.data",
    "elastic": "hvdtrain.state.elastic_state",
    "layers": "hvdtrain.layers",
    "layout": "hvdtrain.layout",
    "pipeline": "hvdtrain.parallel.pipeline_parallel",
    "recipe": "hvdtrain.recipe",
}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hvdtrain' has no attribute '{name}'")
