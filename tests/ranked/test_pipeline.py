"""Pipeline parallelism (hvdtrain.parallel.pipeline) against the whole model
in one process:

- a model cut into 2 stages and fed 4 micro-batches a step, trained for 5
  steps, equals the whole model trained on the global batch, to float32
  round-off, under both schedules: its weights, its logged loss and metric
  (joined by a stage's regularization), its exact evaluation of shards and
  its predictions; at
  np=2 (P=2) and at np=4 with D=2 x P=2 and with T=2 x P=2 (split layers
  inside each stage);
- activations and gradients in bfloat16 travel between stages losslessly.

All cases run in the suite's shared launches (np=2 under both controllers,
np=4 under Gloo); each arranges its layout in-process (hvdtrain.layout).
"""

import horovod.tensorflow as hvd
import keras
import numpy as np
import pytest

from hvdtrain import callbacks, layout
from hvdtrain.layers import ColumnParallelDense, RowParallelDense, set_whole_weights
from hvdtrain.parallel import collectives, pipeline, sharding
from hvdtrain.parallel.data.optimizer import DistributedOptimizer
from ranked.support import replica_rows

BATCH, STEPS, MICROBATCHES, WIDTH = 8, 5, 4, 6


def residual(split):
    """Dense layers around a residual block, an L2 penalty on the first
    stage; `split`: its MLPs column- then row-parallel."""
    x = keras.Input((WIDTH,))
    penalty = keras.regularizers.L2(1e-2)
    h = keras.layers.Dense(8, activation="tanh", name="embed", kernel_regularizer=penalty)(x)
    h = keras.layers.Add(name="block")([h, mlp(h, "", split)])
    return keras.Model(x, keras.layers.Dense(3, name="head")(mlp(h, "mix_", split)))


def mlp(x, prefix, split):
    up, down = ((ColumnParallelDense, RowParallelDense) if split
                else (keras.layers.Dense, keras.layers.Dense))
    return down(8, name=f"{prefix}down")(up(16, activation="tanh", name=f"{prefix}up")(x))


def train_both(schedule, tensor_parallel=1, precision=None):
    """(the whole model, the pipeline, the data, the whole's weights at the
    start) after STEPS steps of the global batch each."""
    replicas = hvd.size() // (2 * tensor_parallel)
    global_batch = BATCH * replicas
    rng = np.random.default_rng(7)
    x = rng.normal(size=(global_batch * STEPS, WIDTH)).astype("float32")
    y = rng.normal(size=(global_batch * STEPS, 3)).astype("float32")
    sgd = lambda: keras.optimizers.SGD(0.1, momentum=0.9)  # noqa: E731
    if precision:
        keras.mixed_precision.set_global_policy(precision)
    layout.arrange(1)
    keras.utils.set_random_seed(3)
    whole = residual(split=False)
    start = whole.get_weights()
    whole.compile(sgd(), "mse", metrics=["mae"])
    expected = whole.fit(x, y, batch_size=global_batch, shuffle=False, verbose=0).history

    layout.arrange(tensor_parallel, 2)
    model = residual(split=tensor_parallel > 1)
    set_whole_weights(model, start)
    pipelined = pipeline.Pipeline(pipeline.cut(model, at=["block"]), MICROBATCHES, schedule)
    pipelined.compile(DistributedOptimizer(sgd(), process_set=layout.data_set()), "mse",
                      metrics=["mae"])
    mine = replica_rows(global_batch, STEPS)
    history = pipelined.fit(x[mine], y[mine], batch_size=BATCH, shuffle=False,
                            verbose=0).history
    return whole, pipelined, (x, y, expected, history), start


def assert_stage_equals_its_layers(whole, pipelined, start, tolerance, moved_past=1000):
    reference = {w.path: (w.numpy(), initial) for w, initial in zip(whole.weights, start)}
    moved = 0.0
    for weight in pipelined.stage.weights:
        expected, initial = reference[weight.path]
        placement = sharding.placement_of(weight)
        if placement is not None:
            expected = placement.part(expected, hvd.rank(), hvd.size())
            initial = placement.part(initial, hvd.rank(), hvd.size())
        np.testing.assert_allclose(weight.numpy(), expected, rtol=0, atol=tolerance,
                                   err_msg=weight.path)
        moved = max(moved, float(np.abs(expected - initial).max()))
    # Training moved the weights well past the tolerance.
    assert moved > moved_past * tolerance


def check(schedule, tensor_parallel=1):
    whole, pipelined, (x, y, expected, history), start = train_both(schedule,
                                                                    tensor_parallel)
    assert_stage_equals_its_layers(whole, pipelined, start, tolerance=2e-6)
    # Every stage logs its replica's loss (with the first stage's penalty) and
    # metric: averaged over the workers (as hvdtrain's AverageMetrics does),
    # the whole model's on the global batch.
    for name, values in expected.items():
        np.testing.assert_allclose(collectives.allreduce_scalars(history[name]), values,
                                   rtol=1e-5, err_msg=name)
    # Each replica evaluates its shard; the metric states summed over the
    # replicas (not the stages, which hold the same) are the whole split's.
    shard = replica_rows(16, 1)
    exact = callbacks.ExactEvaluation(steps=2)
    np.testing.assert_allclose(
        pipelined.evaluate(x[shard], y[shard], batch_size=16 // layout.data_size() // 2,
                           verbose=0, callbacks=[exact]),
        whole.evaluate(x[:16], y[:16], batch_size=8, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(pipelined.predict(x[:8], verbose=0),
                               whole.predict(x[:8], verbose=0), rtol=0, atol=1e-5)


SCHEDULES = ["1f1b", "gpipe"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_two_stages_train_as_the_whole_model_on_the_global_batch(schedule):
    check(schedule)


@pytest.mark.launches(np=4)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_two_stages_over_two_replicas_train_as_the_whole_model(schedule):
    check(schedule)   # D=2 x P=2


@pytest.mark.launches(np=4)
def test_two_stages_of_split_layers_train_as_the_whole_model():
    check("1f1b", tensor_parallel=2)   # T=2 x P=2


@pytest.mark.launches(controllers=("gloo",))
def test_bfloat16_activations_and_gradients_pass_between_stages():
    whole, pipelined, _, start = train_both("1f1b", precision="mixed_bfloat16")
    assert pipelined.stage.outputs[0].dtype == "bfloat16"
    # The two differ by bfloat16's round-off, which moves the weights too.
    assert_stage_equals_its_layers(whole, pipelined, start, tolerance=5e-3, moved_past=10)
