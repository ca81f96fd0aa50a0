"""Each rank builds a model and an Adam optimizer with the weights' moving
average and gives every variable (weights, slots, averages, iteration
count) the value rank + 1; then BroadcastInitialState runs as at the start
of fit. `run` gives this rank's variables before and after
(tests/ranked/test_training.py)."""

import keras
import numpy as np

import hvdtrain


def run():
    """{"before:<path>": value, "after:<path>": value} of every variable."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.Adam(use_ema=True)),
                  loss="mse")
    model.optimizer.build(model.trainable_variables)
    variables = model.variables + model.optimizer.variables
    for variable in variables:
        variable.assign(np.full(variable.shape, hvdtrain.rank() + 1, variable.dtype))
    before = [np.asarray(v) for v in variables]
    callback = hvdtrain.callbacks.BroadcastInitialState(root_rank=0)
    callback.set_model(model)
    callback.on_train_begin()
    after = [np.asarray(v) for v in variables]
    return {**{f"before:{v.path}": b for v, b in zip(variables, before)},
            **{f"after:{v.path}": a for v, a in zip(variables, after)}}
