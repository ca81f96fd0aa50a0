"""The optimizer's update of a sharded embedding table: only the rows the
step looked up change, as recommender systems train their tables.

A worker's shard gets a `tf.IndexedSlices` gradient, its rows summed over
every worker that looked them up. The rules, per looked-up row i with
gradient g (averaged over the workers, as the allreduce averages the rest):

    sgd      w_i -= lr g
    adagrad  a_i += g^2;  w_i -= lr g / sqrt(a_i + eps)
    adam     m_i = b1 m_i + (1 - b1) g;  v_i = b2 v_i + (1 - b2) g^2
             w_i -= lr sqrt(1 - b2^t) / (1 - b1^t) m_i / (sqrt(v_i) + eps)

SGD and Adagrad equal Keras's dense updates exactly: a row without gradient
would not move there either. Adam is lazy Adam (TensorFlow Addons'
LazyAdam): a row's moments decay only in the steps that look it up, where
Keras's Adam decays every row's moments at every step and keeps moving rows
that were looked up before (their momentum) even when no batch has them.
The bias correction uses the global step t, as in LazyAdam.

Other optimizers (and knobs whose meaning needs the whole table's gradient)
are refused in one line when the optimizer is built.
"""

import keras
import tensorflow as tf

from hvdtrain.errors import UsageError
from hvdtrain.parallel import split_variables

__all__ = ["RULES", "check", "make_slots", "problem", "refuse", "update"]

# Each rule's optimizer-class name -> its slots (name, initial value getter).
RULES = {
    "SGD": (),
    "Adagrad": (("accumulator", lambda o: o.initial_accumulator_value),),
    "Adam": (("momentum", lambda o: 0.0), ("velocity", lambda o: 0.0)),
}


def check(optimizer, accumulating):
    """Refuses what the sparse rules cannot follow, naming the way out.

    Args:
        optimizer: The distributed optimizer, whose model has sharded tables.
        accumulating: Whether it accumulates gradients over several passes.

    Raises:
        UsageError: For an optimizer without a sparse rule, or a knob the
            rules do not apply alike on every worker.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        refuse(problem("LossScaleOptimizer", loss_scaling=True))
    refuse(problem(type(optimizer).__name__, momentum=getattr(optimizer, "momentum", 0),
                   amsgrad=getattr(optimizer, "amsgrad", False),
                   clipping_by_norm=bool(optimizer.clipnorm or optimizer.global_clipnorm),
                   ema=optimizer.use_ema,
                   accumulating=accumulating or bool(optimizer.gradient_accumulation_steps)))


def problem(kind, *, loss_scaling=False, momentum=0, amsgrad=False, clipping_by_norm=False,
            ema=False, accumulating=False):
    """What the sparse rules cannot follow in a Keras optimizer of class
    `kind` with these knobs, in words; None if nothing (also for a run's
    settings before any optimizer is made: TrainConfig.check_sharded_tables)."""
    if loss_scaling:
        return "mixed_float16's loss scaling is not supported; use --precision=mixed_bfloat16"
    if kind not in RULES:
        return f"{kind} has no sparse update; use sgd, adagrad or adam (lazy Adam)"
    if kind == "SGD" and momentum:
        return "sgd with momentum has no sparse update here; use adagrad or adam"
    if amsgrad:
        return "adam with amsgrad has no sparse update here; leave amsgrad off"
    if clipping_by_norm:
        return ("clipping by norm needs the whole table's gradient, which no worker has; "
                "use --clipvalue")
    if ema:
        return "the weights' moving average is not kept for sharded tables; leave it off"
    if accumulating:
        return "gradient accumulation is not supported; use a larger batch"
    return None


def refuse(found):
    """Raises the UsageError of a `problem`, if there is one."""
    if found:
        raise UsageError(f"tables sharded across workers (ShardedEmbedding): {found}")


def make_slots(optimizer, variable):
    """The optimizer variables the rule keeps for the shard `variable`
    (sharded like it, so that they are checkpointed whole)."""
    return [split_variables.mark(optimizer.add_variable_from_reference(
                variable, name=name, initializer=keras.initializers.Constant(initial(optimizer))),
            split_variables.placement_of(variable))
            for name, initial in RULES[type(optimizer).__name__]]


def update(optimizer, gradient, variable, slots):
    """Applies `gradient` (a tf.IndexedSlices, each row once) to the rows of
    `variable` it names, and to their slots. Call it before the optimizer's
    `iterations` advances."""
    rows, g = gradient.indices, tf.cast(gradient.values, variable.dtype)
    if optimizer.clipvalue:
        g = tf.clip_by_value(g, -optimizer.clipvalue, optimizer.clipvalue)
    lr = tf.cast(optimizer.learning_rate, variable.dtype)
    kind = type(optimizer).__name__
    if kind == "SGD":
        step = lr * g
    elif kind == "Adagrad":
        (accumulator,) = slots
        accumulated = tf.gather(accumulator, rows) + tf.square(g)
        optimizer.assign(accumulator, tf.IndexedSlices(accumulated, rows))
        step = lr * g / tf.sqrt(accumulated + optimizer.epsilon)
    else:
        momentum, velocity = slots
        t = tf.cast(optimizer.iterations + 1, variable.dtype)
        alpha = lr * tf.sqrt(1 - tf.pow(tf.cast(optimizer.beta_2, variable.dtype), t)) / (
            1 - tf.pow(tf.cast(optimizer.beta_1, variable.dtype), t))
        m = optimizer.beta_1 * tf.gather(momentum, rows) + (1 - optimizer.beta_1) * g
        v = optimizer.beta_2 * tf.gather(velocity, rows) + (1 - optimizer.beta_2) * tf.square(g)
        optimizer.assign(momentum, tf.IndexedSlices(m, rows))
        optimizer.assign(velocity, tf.IndexedSlices(v, rows))
        step = alpha * m / (tf.sqrt(v) + optimizer.epsilon)
    optimizer.assign_sub(variable, tf.IndexedSlices(step, rows))
