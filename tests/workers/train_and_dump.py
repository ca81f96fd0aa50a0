"""Trains the default recipe with hvdtrain.train, keeping a moving average
of the weights, then every rank (not just rank 0) writes its model and
optimizer variables to OUT/rank<r>.npz and its history to OUT/rank<r>.json."""

import json
import sys

import numpy as np

import hvdtrain

out, model_dir = sys.argv[1:]
config = hvdtrain.recipe.make_config("digits_cnn", model_dir=model_dir, epochs=2, verbose=0,
                                     data_dir=f"{out}/data", ema_momentum=0.99)
result = hvdtrain.train(config)
variables = result.model.variables + result.model.optimizer.variables
np.savez(f"{out}/rank{hvdtrain.rank()}.npz",
         **{f"{i}:{v.path}": np.asarray(v) for i, v in enumerate(variables)})
with open(f"{out}/rank{hvdtrain.rank()}.json", "w") as f:
    json.dump(result.history, f)
