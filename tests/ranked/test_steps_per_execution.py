"""Several training steps per call of the train function
(--steps_per_execution) at np=2, through hvdtrain.train: the very steps one
step per call trains, with the features that act in the step; a stop on
request at a call's end where every rank stands; a bit-exact resume."""

import pathlib

import numpy as np
import pytest

from hvdtrain import recipe, train
from ranked.support import stopped_in_the_second_epoch

pytestmark = [pytest.mark.launches(controllers=("gloo",)), pytest.mark.slow]

# digits_cnn at np=2 and batch 40: 17 steps an epoch, so 4 steps per call
# cut each epoch's last call to one step.
STEPS, K = 17, 4

# wide_and_deep, its 4000 examples in 15 steps of 128 an epoch: dense layers,
# which float16 computes at float32's pace on a CPU (digits_cnn's
# convolutions, 17 times slower); and its tables sharded across the workers.
WIDE_AND_DEEP = {"table_rows": 4096, "embedding_dim": 8, "hidden_units": "32",
                 "synthetic_examples": 4000}
DENSE = dict(recipe_name="wide_and_deep", batch_size=128, options=WIDE_AND_DEEP)
SHARDED = dict(DENSE, options={**WIDE_AND_DEEP, "embeddings": "sharded"})

FEATURES = {
    "warm-up with momentum correction, checkpoints every 5 steps": dict(
        checkpoint_steps=5, keep_checkpoints=10),
    "tables sharded across the workers": SHARDED,
    "accumulation, mixed float16, moving average": dict(
        **DENSE, backward_passes_per_step=2, precision="mixed_float16", ema_momentum=0.9),
    "xla around the collectives, cosine decay": dict(
        jit_compile=True, lr_schedule="cosine", warmup_epochs=0.5),
}


def _config(model_dir, steps_per_execution, recipe_name="digits_cnn", options=None,
            **settings):
    return recipe.make_config(
        recipe_name, options or (), model_dir=str(model_dir), deterministic=True,
        steps_per_execution=steps_per_execution, intra_op_threads=1, verbose=0,
        export=False, **{"epochs": 1, "batch_size": 40, **settings})


def _weights(result):
    return [np.asarray(w) for w in result.model.weights]


def _checkpoints(model_dir):
    return sorted(p.name for p in (pathlib.Path(model_dir) / "checkpoints").iterdir())


@pytest.mark.parametrize("feature", FEATURES, ids=list(FEATURES))
def test_several_steps_per_call_train_the_steps_of_one_per_call(shared_tmp_path, feature):
    settings = FEATURES[feature]
    one = train(_config(shared_tmp_path / "one", 1, **settings))
    several = train(_config(shared_tmp_path / "several", K, **settings))
    assert several.model.steps_per_execution == K
    for a, b in zip(_weights(one), _weights(several)):
        np.testing.assert_array_equal(a, b)
    # The same metrics, validation's summed over the ranks after its calls.
    for history in (one.history, several.history):
        history.pop("examples_per_second", None)
    assert one.history == several.history
    if "checkpoint_steps" in settings:
        # Written at the end of the call that reaches each multiple of 5.
        assert _checkpoints(shared_tmp_path / "several") == [
            f"epoch-0001-step-{step:06d}" for step in (8, 12, 16, STEPS)]


def test_a_stop_on_request_ends_a_call_where_every_rank_stands_and_resumes_bit_exactly(
        shared_tmp_path):
    settings = dict(epochs=2, checkpoint_epochs=1)
    straight = train(_config(shared_tmp_path / "straight", K, **settings))
    preempted = shared_tmp_path / "preempted"
    where = stopped_in_the_second_epoch(_config(preempted, K, **settings))
    assert where[0] == where[1], where
    step = int(where[0].split()[-1])
    assert step % K == 0 and step < STEPS, where   # a call's end, inside the epoch
    assert f"epoch-0002-step-{step:06d}" in _checkpoints(preempted)
    resumed = train(_config(preempted, K, resume=True, **settings))
    for a, b in zip(_weights(straight), _weights(resumed)):
        np.testing.assert_array_equal(a, b)


def test_a_script_compiled_with_steps_per_execution_reduces_every_step():
    # Your own script: Keras's fit and its own loop of 4 steps per call,
    # with hvdtrain's DistributedOptimizer (an epoch a multiple of 4, as
    # Keras needs) trains what one step per call trains.
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    import hvdtrain

    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(64, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32")

    def trained(steps_per_execution):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=hvdtrain.DistributedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse",
            steps_per_execution=steps_per_execution)
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0,
                  callbacks=[hvdtrain.callbacks.BroadcastInitialState(0)])
        return model.get_weights()

    one, several = trained(1), trained(4)
    for a, b in zip(one, several):
        np.testing.assert_array_equal(a, b)
    # Reduced: the ranks, on data of their own, hold the same weights.
    assert len({w.tobytes() for w in hvd.allgather_object(several[0])}) == 1
