"""XLA in data-parallel training: the forward and backward pass and the
optimizer's update compiled, Horovod's collectives between them.

Horovod 0.28.1 has no XLA kernels for its collectives on CPU, and on GPU only
a plain allreduce behind HOROVOD_ENABLE_XLA_OPS, off by default: a train
step compiled whole (`model.compile(jit_compile=True)`) cannot hold the
gradients' reduction. `jit_compile(model)` splits the step at it instead:

    XLA:  forward pass, loss, backward pass   -> gradients
          Horovod's allreduce (and allgather, the stop vote), as usual
    XLA:  the optimizer's update (clipping, weight decay, EMA, loss scale)
          the metrics

each compiled part a `tf.function(jit_compile=True)` called from Keras's
ordinary train function, which XLA clusters as a whole.
"""

import keras
import tensorflow as tf
from keras.src import tree
from keras.src.losses import loss as loss_module

from hvdtrain.errors import UsageError
from hvdtrain.parallel import split_variables
from hvdtrain.parallel.data_parallel import optimizer as optimizer_lib

__all__ = ["jit_compile"]


def jit_compile(model):
    """Compiles `model`'s train step with XLA, all but Horovod's collectives.

    Call it after `model.compile(..., jit_compile=False)`. The model's
    forward and backward pass run as one XLA computation; the gradients
    leave it for their reduction; a distributed optimizer's update (of dense
    gradients: an allgathered sparse one has no static shape) runs as
    another. Evaluation and prediction are left as they are.

    Args:
        model: A compiled Keras model.

    Returns:
        `model`, whose train step is compiled from its next fit on.

    Raises:
        UsageError: If the model is not compiled, compiled with
            jit_compile=True (which would put the collectives inside XLA),
            or has tables sharded across workers or tensor-parallel layers
            (whose lookups and exchanges are collectives inside the forward
            pass).
    """
    if not model.compiled:
        raise UsageError("jit_compile(model): compile the model first "
                         "(model.compile(..., jit_compile=False))")
    if model.jit_compile:
        raise UsageError("jit_compile(model): compile the model with jit_compile=False; this "
                         "compiles all of its train step but Horovod's collectives")
    if split_variables.has_rows_sharded(model):
        raise UsageError(f"jit_compile(model): {split_variables.NO_XLA}")
    if split_variables.has_shards(model):
        raise UsageError(f"jit_compile(model): {split_variables.NO_XLA_TENSOR_PARALLEL}")
    model.train_step = _CompiledTrainStep(model)
    optimizer_lib.compile_updates(model.optimizer)
    model.train_function = None   # Keras traces the step again at the next fit
    return model


class _CompiledTrainStep:
    """Keras 3's train step (keras/src/backend/tensorflow/trainer.py), cut
    where the optimizer applies the gradients: what comes before it is
    compiled with XLA; the update is the optimizer's (compiled by it when
    distributed, see optimizer.compile_updates)."""

    def __init__(self, model):
        self.model = model
        self.gradients = tf.function(self._gradients, jit_compile=True)

    def __call__(self, data):
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred, gradients = self.gradients(x, y, sample_weight)
        if model.trainable_weights:
            model.optimizer.apply(gradients, model.trainable_weights)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _gradients(self, x, y, sample_weight):
        model = self.model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                       training=True)
            model._loss_tracker.update_state(
                loss_module.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(next(i for i in tree.flatten(x) if i is not None))[0])
            if model.optimizer is not None:
                loss = model.optimizer.scale_loss(loss)
        if not model.trainable_weights:
            return y_pred, []
        return y_pred, tape.gradient(loss, model.trainable_weights)
