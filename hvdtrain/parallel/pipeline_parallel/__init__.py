"""Pipeline parallelism (GPipe's and PipeDream-Flush's): a model cut into P
stages on the P ranks of a pipeline (hvdtrain.layout), each batch fed
through them as M micro-batches so that the stages work at the same time.

`stages.py` cuts a Keras model into stage models, `stage_weights.py` leaves
the other stages' weights without values, `schedules.py` orders a
stage's forward and backward passes (1F1B, GPipe), `transfer.py` passes
activations and gradients between neighbouring stages, and `model.py`'s
Pipeline runs them inside Keras's train step. It depends on hvdtrain.layout
and hvdtrain.parallel's collectives; the public `hvdtrain.pipeline` and the
trainer depend on it.
"""

from hvdtrain.parallel.pipeline_parallel.pipeline_model import Pipeline
from hvdtrain.parallel.pipeline_parallel.schedules import (
    SCHEDULES,
    bubble,
    few_microbatches,
    peak_stashed,
)
from hvdtrain.parallel.pipeline_parallel.stage_weights import deferred, on_host
from hvdtrain.parallel.pipeline_parallel.stages import Stages, boundaries, cut

__all__ = ["SCHEDULES", "Pipeline", "Stages", "boundaries", "bubble", "cut", "deferred",
           "few_microbatches", "on_host", "peak_stashed"]
