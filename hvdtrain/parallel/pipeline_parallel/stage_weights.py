"""Weights made only on the stage that trains them.

Every rank builds the whole model, from the same code, and keeps one stage.
Built inside `deferred()` (Keras's stateless scope), the model's variables
are shapes without values; each rank then gives values to its own stage's
(`keep`), so that a rank holds its stage's weights, not the whole model's.
An initializer draws its seed when its layer is made, not when it fills a
variable: a stage's weights are what the whole model's would have been.
Rank 0 fills in the others in host memory when it exports the whole model
(`on_host`).
"""

import keras
import tensorflow as tf

# Keras keeps the variables made in a stateless scope in a list, and gives
# them all their values at the end of the next one: `keep` empties it.
from keras.src.backend.common import global_state

__all__ = ["deferred", "is_deferred", "keep", "on_host"]

_WAITING = "uninitialized_variables"


def deferred():
    """A context in which the model's variables are made without values."""
    return keras.StatelessScope(initialize_variables=False)


def is_deferred(variable):
    """Whether `variable` was made in `deferred()` and has no value yet."""
    return getattr(variable, "_initializer", None) is not None and variable._value is None


def keep(variables):
    """Gives `variables` their values where they have none; every other
    variable made in `deferred()` stays without one."""
    for variable in variables:
        if is_deferred(variable):
            variable._deferred_initialize()
    global_state.set_global_attribute(_WAITING, [])


def on_host(variables):
    """Gives those of `variables` that have no value one, in host memory."""
    with tf.device("/CPU:0"):
        for variable in variables:
            if is_deferred(variable):
                variable._deferred_initialize()
