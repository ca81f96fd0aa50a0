"""Every rank starts from the same model and optimizer state."""

import keras

from hvdtrain.parallel import collectives
from hvdtrain.parallel.data_parallel.optimizer import check_loss_scale_order

__all__ = ["BroadcastInitialState"]


class BroadcastInitialState(keras.callbacks.Callback):
    """Copies rank `root_rank`'s model and optimizer state to every rank when
    training starts, so all ranks begin identical (random init, or a
    checkpoint restored on one rank only).

    A model built before `fit` (one with an Input) is broadcast before the
    first step, its optimizer built for it. Keras builds a model without an
    Input only when it traces the first step: that one is broadcast after
    the first step, as Horovod does with Keras 2 (the ranks take that step
    with the same reduced gradients, then all continue from rank 0's state).

    Args:
        root_rank: The rank whose state every rank takes.
        local_variables: A variable or a list of variables (of the model or
            its optimizer) that keep their own value on each rank; see also
            `register_local_var`.
    """

    def __init__(self, root_rank=0, local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._local_variables = set()
        if local_variables is not None:
            local_variables = (local_variables if isinstance(local_variables, (list, tuple))
                               else [local_variables])
            for variable in local_variables:
                self.register_local_var(variable)

    def register_local_var(self, var):
        """Leaves `var` (a model or optimizer variable) out of the broadcast."""
        self._local_variables.add(id(var))

    def on_train_begin(self, logs=None):
        check_loss_scale_order(self.model.optimizer)
        if self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        self._broadcast()

    def _broadcast(self):
        if self.broadcast_done:
            return
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        optimizer_variables = optimizer.variables if optimizer is not None else []
        collectives.broadcast_variables(
            [v for v in [*self.model.variables, *optimizer_variables]
             if id(v) not in self._local_variables], self.root_rank)
        self.broadcast_done = True
