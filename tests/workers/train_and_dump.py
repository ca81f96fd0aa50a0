"""Trains the default recipe with hvdtrain.train, keeping a moving average
of the weights; `run` gives this rank's (not just rank 0's) model and
optimizer variables and its history (tests/ranked/test_training.py)."""

import numpy as np

import hvdtrain


def run(out, model_dir):
    """({"<index>:<path>": value} of the model's and optimizer's variables,
    the history); the data is built under OUT/data."""
    config = hvdtrain.recipe.make_config("digits_cnn", model_dir=str(model_dir), epochs=2,
                                         verbose=0, data_dir=f"{out}/data", ema_momentum=0.99)
    result = hvdtrain.train(config)
    variables = result.model.variables + result.model.optimizer.variables
    return {f"{i}:{v.path}": np.asarray(v) for i, v in enumerate(variables)}, result.history
