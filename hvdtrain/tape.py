"""Horovod's `DistributedGradientTape` for custom training loops on Keras 3.

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # reduced
    optimizer.apply(grads, model.trainable_variables)        # a plain optimizer

With mixed_float16, scale the loss with a LossScaleOptimizer's `scale_loss`
inside the tape and apply through that optimizer: the gradients it checks for
inf/NaN are already reduced, so all ranks take the same decision.
"""

import horovod.tensorflow as hvd

from hvdtrain.compression import Compression
from hvdtrain.reduction import GradientReducer, LocalVariables


class DistributedGradientTape:
    """Wraps a finished `tf.GradientTape`; `gradient()` returns reduced gradients.

    Takes Horovod's options with their meaning (see GradientReducer);
    `device_dense` and `device_sparse` are accepted for compatibility and
    have no effect. Sources given to `register_local_source` keep each
    rank's own gradient.
    """

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False, op=hvd.Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups=None,
                 process_set=hvd.global_process_set, scale_local_gradients=True):
        self._tape = gradtape
        self._reducer = GradientReducer(
            op=op, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            groups=groups if groups is not None else (num_groups or None),
            process_set=process_set, scale_local_gradients=scale_local_gradients)
        self._local = LocalVariables()

    def register_local_source(self, source):
        """Keeps `source`'s gradient on each rank (Horovod's name)."""
        self._local.add(source)

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        """The gradients, reduced; hvdtrain always names its collectives by
        position, as `use_generic_names` asks of Horovod."""
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        self._reducer.check_runtime()
        return self._reducer(grads, list(sources), self._local)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """([(source, gradient)] of the local sources, the same of the others)."""
        sources = list(sources)
        pairs = list(zip(sources, self.gradient(target, sources, output_gradients)))
        return ([p for p in pairs if p[0] in self._local],
                [p for p in pairs if p[0] not in self._local])

    def __getattr__(self, name):
        return getattr(self._tape, name)
