"""Horovod elastic training for Keras 3 models.

Horovod's `TensorFlowKerasState` and its Keras elastic callbacks are Keras 2
only (they read `optimizer.variables()` and broadcast with Horovod's
`broadcast_variables`, which fails on Keras 3 variables). `KerasState` and
`run` are their Keras 3 equivalents, with the same meaning:

    state = hvdtrain.elastic.KerasState(model, position=None)
    state.register_reset_callbacks([rescale_learning_rate])

    @hvdtrain.elastic.run
    def train(state):
        model.fit(..., callbacks=[hvdtrain.callbacks.TrackPosition(state, batch_size),
                                  hvdtrain.callbacks.CommitState(state, 10)])

    train(state)

When workers leave or join, every worker goes back to the last commit, Horovod
restarts with the new world size, rank 0's state is broadcast and `train` runs
again. What depends on the world size must then be redone: `KerasState`
retraces the model's train step (the traced one has the old size in it), the
reset callbacks rescale the learning rate, and `train` shards its data by the
new rank and size, going on from `state.position` (training_state.continue_at).

`hvdtrain train` does all this when horovodrun starts it in elastic mode
(see run/trainer.py). Horovod's own callbacks (epoch and batch counters) are in
hvdtrain.keras.elastic.
"""

import functools
import os

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from hvdtrain import runtime
from hvdtrain.errors import UsageError, lost_peer
from hvdtrain.faults import watchdog
from hvdtrain.parallel import collectives
from hvdtrain.state.training_state import training_variables

__all__ = ["KerasState", "launched", "run"]


def launched():
    """Whether this worker runs under horovodrun's elastic mode.

    Returns:
        True in a worker that horovodrun started in elastic mode (with
        --min-np, --max-np or --host-discovery-script): its elastic driver
        sets HOROVOD_ELASTIC=1 for the workers.
    """
    return os.environ.get("HOROVOD_ELASTIC") == "1"


class KerasState(ObjectState):
    """A Keras 3 model's and optimizer's variables, plus the keyword arguments
    (e.g. `epoch=0, batch=0`) as attributes, kept in step across workers.

    `commit()` copies the variables to host memory (and raises
    `HostsUpdatedInterrupt` when hosts were added or removed), `restore()`
    puts the last copy back, `sync()` sets every worker to rank 0's state.

    Args:
        model: A built Keras 3 model. Its train step is traced again at each
            reset, since the traced one holds the old world size.
        optimizer: The optimizer whose variables (slots, iteration count) are
            kept with the model's; built here if it is not yet. Defaults to
            `model.optimizer`.
        **kwargs: Further state, each an attribute of its own name (e.g.
            `position`), committed, restored and synced with the variables.

    Raises:
        UsageError: If there is no optimizer (neither given nor compiled) or
            the model is not built.
    """

    def __init__(self, model, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is None:
            raise UsageError("KerasState needs an optimizer: compile the model or pass one")
        if not model.built:
            raise UsageError("KerasState needs a built model (give it an Input or call "
                             "model.build(input_shape))")
        if not self.optimizer.built:
            # Its variables (slots, iteration count) are part of the state.
            self.optimizer.build(model.trainable_variables)
        self._save_variables()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for variable, value in zip(self._variables(), self._saved_values):
            variable.assign(value)
        super().restore()

    def sync(self):
        collectives.broadcast_variables(self._variables(), root_rank=0)
        self._save_variables()
        super().sync()

    def reset(self):
        # Keras keeps the traced train step across fits, and hvdtrain's
        # gradient reduction reads the world size while tracing (no allreduce
        # at size 1, 1/size factors): trace it again for the new size.
        if self.model.compiled:
            self.model.make_train_function(force=True)

    def _variables(self):
        return training_variables(self.model, self.optimizer)

    def _save_variables(self):
        self._saved_values = [np.array(v) for v in self._variables()]


def run(func):
    """Horovod's `elastic.run` for TensorFlow: runs `func(state, ...)` and,
    when a worker fails (then `state` goes back to its last commit) or hosts
    are added or removed (noticed at a commit), restarts Horovod with the
    new workers, syncs `state` from rank 0 and runs `func` again.

    Code that runs before the first call must not use collectives: a worker
    that joins runs it while the others are syncing.

    Args:
        func: A function whose first argument is the `KerasState` (or other
            Horovod `State`) it trains from.

    Returns:
        A function of the same arguments that returns `func`'s result once
        it completes on the workers there are at the end. A lost peer,
        whatever op noticed it, counts as a failed worker; other errors are
        raised as they are.
    """
    @functools.wraps(func)
    def recoverable(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as error:
            # Horovod's own check looks for op names in the message (missing
            # HorovodGroupedAllreduce) and returns None on other errors.
            if lost_peer(error):
                raise HorovodInternalError(error) from error
            raise

    return run_fn(recoverable, _reset)


def _reset():
    # The elastic driver bounds the wait for workers (horovodrun --elastic-timeout).
    with watchdog.paused("restarting with the new workers"):
        hvd.shutdown()
        hvd.init()
    # Ranks can change (the old rank 0 may be gone).
    runtime.set_log_verbosity()
