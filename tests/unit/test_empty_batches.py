"""A model's forward pass on batches without examples
(hvdtrain.parallel.empty_batches) and the evaluation step that uses it
(hvdtrain.parallel.data_parallel.evaluation.EmptyBatchesStep): TensorFlow 2.21's
convolutions on CPU (oneDNN) return their input unchanged on zero rows, and
an evaluation shard's end is such a batch."""

import keras
import numpy as np
import tensorflow as tf

from hvdtrain.parallel import empty_batches
from hvdtrain.parallel.data_parallel.evaluation import EmptyBatchesStep


def conv_model():
    keras.utils.set_random_seed(4)
    return keras.Sequential([keras.Input((6, 6, 1)),
                             keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                             keras.layers.Conv2D(8, 3, padding="same"),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])


def test_the_forward_pass_of_no_rows_has_the_outputs_shape():
    model = conv_model()
    empty = tf.zeros((0, 6, 6, 1))
    assert empty_batches.forward(model, empty).shape == (0, 3)
    x = tf.random.normal((5, 6, 6, 1))
    np.testing.assert_array_equal(empty_batches.forward(model, x), model(x))


def test_an_empty_batch_evaluates_to_nothing_added():
    x = np.random.default_rng(0).random((10, 6, 6, 1), "float32")
    y = np.arange(10) % 3
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    with_empty = batches.concatenate(batches.take(1).map(lambda a, b: (a[:0], b[:0])))
    model = conv_model()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    expected = model.evaluate(batches, verbose=0, return_dict=True)
    EmptyBatchesStep.install(model)
    model.test_function = None
    assert model.evaluate(with_empty, verbose=0, return_dict=True) == expected


def test_a_models_own_test_step_is_left_alone():
    class Own(keras.Model):
        def test_step(self, data):
            return {}

    whole = conv_model()
    model = Own(whole.inputs, whole.outputs)
    EmptyBatchesStep.install(model)
    assert "test_step" not in vars(model)
