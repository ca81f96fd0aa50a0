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

from hvdtrain.parallel.data_parallel.compression import Compression
from hvdtrain.parallel.data_parallel.reduction import GradientReducer, LocalVariables, chosen_groups

__all__ = ["DistributedGradientTape"]


class DistributedGradientTape:
    """Wraps a finished `tf.GradientTape`; `gradient()` returns reduced gradients.

    Horovod's `DistributedGradientTape`, with its arguments. Sources given
    to `register_local_source` keep each rank's own gradient. Other
    attributes are the wrapped tape's.

    Args:
        gradtape: The `tf.GradientTape` that recorded the loss.
        device_dense: Accepted for compatibility, no effect: hvdtrain keeps
            tensors where TensorFlow put them.
        device_sparse: Likewise.
        compression: As for `hvdtrain.DistributedOptimizer`: `Compression.none`,
            `.fp16` or `.bf16`.
        sparse_as_dense: As for `hvdtrain.DistributedOptimizer`.
        op: `hvd.Average`, `hvd.Sum` or `hvd.Adasum`, as for
            `hvdtrain.DistributedOptimizer`.
        gradient_predivide_factor: As for `hvdtrain.DistributedOptimizer`.
        num_groups: Horovod's older name for an integer `groups`, used when
            `groups` is "auto" or None.
        groups: As for `hvdtrain.DistributedOptimizer`.
        process_set: The Horovod process set to reduce over; a rank outside
            it gets its own gradients back.
        scale_local_gradients: Divide the gradients of local sources by the
            process set's size, as Horovod does.

    Raises:
        UsageError: If an option has a value, or a combination, that
            `hvdtrain.DistributedOptimizer` refuses too.
    """

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False, op=hvd.Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups="auto",
                 process_set=hvd.global_process_set, scale_local_gradients=True):
        self._tape = gradtape
        self._reducer = GradientReducer(
            op=op, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            groups=chosen_groups(groups, num_groups),
            process_set=process_set, scale_local_gradients=scale_local_gradients)
        self._local = LocalVariables()

    def register_local_source(self, source):
        """Keeps `source`'s gradient on each rank: it is not reduced.

        Args:
            source: A variable that `gradient` is asked about.
        """
        self._local.add(source)

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        """Computes the gradients, then reduces them over the process set.

        Args:
            target: As for `tf.GradientTape.gradient`.
            sources: A list of variables or tensors: gradients are named by
                their position in it, so every rank must give them in the
                same order.
            output_gradients: As for `tf.GradientTape.gradient`.
            use_generic_names: Accepted for compatibility: hvdtrain always
                names its collectives by position, as this asks of Horovod.
            **kwargs: Passed on to `tf.GradientTape.gradient`
                (`unconnected_gradients`).

        Returns:
            A list of gradients in the order of `sources`: reduced, except
            those of local sources; None where the source has no gradient.

        Raises:
            UsageError: If `op=hvd.Adasum` cannot run here (it needs the MPI
                controller, the global process set and a power-of-2 number
                of processes).
        """
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        self._reducer.check_runtime()
        return self._reducer(grads, list(sources), self._local)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """Computes the gradients as `gradient` does, split into local and global ones.

        Args:
            target: As for `gradient`.
            sources: As for `gradient`.
            output_gradients: As for `gradient`.
            use_generic_names: As for `gradient`.

        Returns:
            A pair of lists of `(source, gradient)`: those of the local
            sources (this rank's own gradients), then the others' (reduced).
        """
        sources = list(sources)
        pairs = list(zip(sources, self.gradient(target, sources, output_gradients)))
        return ([p for p in pairs if p[0] in self._local],
                [p for p in pairs if p[0] not in self._local])

    def __getattr__(self, name):
        return getattr(self._tape, name)
