"""Evaluates a fixed model on a validation split of EXAMPLES examples with
ExactEvaluation; rank 0 writes the results to OUT.json."""

import json
import sys

import keras
import numpy as np

import hvdtrain
from hvdtrain.callbacks import ExactEvaluation

out, examples = sys.argv[1], int(sys.argv[2])
hvdtrain.init()
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(examples, 5)).astype("float32")
y = rng.integers(0, 3, size=examples).astype("int32")
model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
data = hvdtrain.data.from_arrays((x, y), 8, training=False)
results = model.evaluate(data.batches(), verbose=0, return_dict=True,
                         callbacks=[ExactEvaluation(data.steps)])
if hvdtrain.is_main_process():
    with open(out, "w") as f:
        json.dump({"results": results, "steps": data.steps}, f)
