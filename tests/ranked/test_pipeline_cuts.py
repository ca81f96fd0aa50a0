"""Each recipe's model cut into 2 pipeline stages (where its parameters
split evenly) trains as the whole model in one process on the same batches:
convolutions and pooling (digits_cnn), batch normalization and residual
blocks (cifar10_resnet), two inputs whose branches cross the cut
(wide_and_deep), a padding mask the model computes from its inputs
(text_transformer), an embedding tied across the first and last stages
(gpt).

The reference takes each micro-batch as a step of its own and applies
their mean gradient (Keras's gradient_accumulation_steps): the gradient of
the whole batch, with batch normalization over each micro-batch, as a
pipeline normalizes. Dropout is off (its masks are drawn per micro-batch).
A wrongly wired stage (a tensor fed to the wrong layer, inputs and targets
of different examples) misses the tolerance by orders of magnitude: the
weights move 100 times as far.

At np=2 under Gloo, in its shared launch.
"""

import keras
import numpy as np
import pytest

from hvdtrain import layout
from hvdtrain import recipe as recipe_lib
from hvdtrain.parallel import pipeline_parallel
from hvdtrain.parallel.data_parallel.optimizer import DistributedOptimizer

pytestmark = pytest.mark.launches(np=2, controllers=("gloo",))

BATCH, STEPS, MICROBATCHES = 8, 3, 2


def _tokens(rng, rows, vocab, length, padded=False):
    tokens = rng.integers(1, vocab, size=(rows, length))
    if padded:   # each sequence ends in padding (id 0) of its own length
        tokens[np.arange(length) >= rng.integers(2, length, size=(rows, 1))] = 0
    return tokens.astype("int32")


def _click_log(rng, rows):
    return ({"dense": rng.integers(0, 50, size=(rows, 13)).astype("float32"),
             "categorical": rng.integers(-1, 1000, size=(rows, 26))},
            rng.integers(0, 2, size=(rows, 1)).astype("float32"))


# recipe: (its options, rng, rows -> (inputs, targets))
RECIPES = {
    "digits_cnn": ([], lambda rng, n: (rng.random((n, 8, 8, 1), "float32"),
                                       rng.integers(0, 10, n))),
    "cifar10_resnet": (["depth=8"], lambda rng, n: (rng.random((n, 32, 32, 3), "float32"),
                                                    rng.integers(0, 10, n))),
    "wide_and_deep": (["table_rows=2048", "embedding_dim=4", "hidden_units=16,8"],
                      _click_log),
    "text_transformer": (["vocab_size=64", "sequence_length=12", "d_model=16", "heads=2",
                          "mlp_dim=32", "dropout=0"],
                         lambda rng, n: (_tokens(rng, n, 64, 12, padded=True),
                                         rng.integers(0, 2, n))),
    "gpt": (["vocab_size=64", "sequence_length=12", "d_model=16", "heads=2", "mlp_dim=32",
             "layers=2", "dropout=0"],
            lambda rng, n: (_tokens(rng, n, 64, 12), _tokens(rng, n, 64, 12))),
}


def _built(recipe, config, deferred=False):
    keras.utils.set_random_seed(11)
    if deferred:
        with pipeline_parallel.deferred():
            model = recipe.make_model(config)
    else:
        model = recipe.make_model(config)
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
    return model


def _sgd(**accumulation):
    return keras.optimizers.SGD(0.05, momentum=0.9, **accumulation)


@pytest.mark.parametrize("name", RECIPES)
def test_the_recipes_model_cut_in_two_trains_as_the_whole(name):
    options, make_batches = RECIPES[name]
    recipe = recipe_lib.get(name)
    config = recipe_lib.make_config(name, options=options)
    x, y = make_batches(np.random.default_rng(5), BATCH * STEPS)

    layout.arrange(1)
    whole = _built(recipe, config)
    start = [np.array(v) for v in whole.get_weights()]
    whole.compile(_sgd(gradient_accumulation_steps=MICROBATCHES), recipe.loss)
    whole.fit(x, y, batch_size=BATCH // MICROBATCHES, shuffle=False, verbose=0)

    layout.arrange(1, 2)
    model = _built(recipe, config, deferred=True)
    stages = pipeline_parallel.cut(model, stages=2)
    pipelined = pipeline_parallel.Pipeline(stages, MICROBATCHES)
    mine = {id(v) for v in pipelined.stage.weights}
    held = [(v, s, w) for v, s, w in zip(model.weights, start, whole.weights) if id(v) in mine]
    for variable, value, _ in held:
        variable.assign(value)
    pipelined.compile(DistributedOptimizer(_sgd(), process_set=layout.data_set()), recipe.loss)
    pipelined.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)

    tolerance, moved = 1e-5, 0.0
    for variable, value, reference in held:
        np.testing.assert_allclose(variable.numpy(), reference.numpy(), rtol=0, atol=tolerance,
                                   err_msg=variable.path)
        if variable.trainable:
            moved = max(moved, float(np.abs(reference.numpy() - value).max()))
    assert moved > 100 * tolerance
