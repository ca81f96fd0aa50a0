"""A Keras 3 optimizer whose updates use gradients averaged over all workers.

`DistributedOptimizer(keras.optimizers.Adam(...))` returns an optimizer of a
subclass of the given one's class, rebuilt from its config, whose `apply`
first averages the gradients across processes with one Horovod grouped
allreduce (Horovod fuses the tensors into few ring-allreduces), then runs the
original update. It works inside the compiled train step of `model.fit` and
in custom loops that call `apply_gradients`. The subclass keeps the original
class's name and module, so saved models load as the plain optimizer.
"""

import functools

import horovod.tensorflow as hvd
import keras
import tensorflow as tf


def DistributedOptimizer(optimizer, op=hvd.Average):  # noqa: N802 (Horovod's name)
    """Wraps `optimizer` so that each update averages gradients over workers.

    Wrap the optimizer before it is built (before `fit` or the first update):
    the returned optimizer is a new instance made from `optimizer`'s config.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a keras.optimizers.Optimizer, "
                        f"got {type(optimizer).__name__}")
    if optimizer.built:
        raise ValueError("DistributedOptimizer: wrap the optimizer before its "
                         "first update (it is rebuilt from its config)")
    distributed = _distributed_class(type(optimizer)).from_config(optimizer.get_config())
    distributed._hvd_op = op
    return distributed


class _GradientAllreduce:
    """The part of the distributed class that comes before the base class."""

    _hvd_op = hvd.Average

    def apply(self, grads, trainable_variables=None):
        return super().apply(self._allreduce(list(grads)), trainable_variables)

    def _allreduce(self, grads):
        if hvd.size() == 1:
            return grads
        present = [i for i, g in enumerate(grads) if g is not None]
        # Sparse gradients (embeddings) are reduced densely.
        dense = [tf.convert_to_tensor(grads[i]) for i in present]
        reduced = hvd.grouped_allreduce(dense, op=self._hvd_op)
        for i, g in zip(present, reduced):
            grads[i] = g
        return grads


@functools.cache
def _distributed_class(cls):
    return type(cls.__name__, (_GradientAllreduce, cls),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
