"""Evaluates a fixed model on a validation split of EXAMPLES examples with
ExactEvaluation: `run` in a test's own process
(tests/ranked/test_evaluation.py), or `python evaluate.py OUT EXAMPLES...`
alone, for the single-process references, writing each split's results to
OUT/np1.<EXAMPLES>.json."""

import json
import sys

import keras
import numpy as np

import hvdtrain
from hvdtrain.callbacks import ExactEvaluation


def run(examples):
    """{"results": {metric: value}, "steps": this rank's steps}."""
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
    return {"results": results, "steps": data.steps}


if __name__ == "__main__":
    hvdtrain.init()
    for examples in map(int, sys.argv[2:]):
        with open(f"{sys.argv[1]}/np1.{examples}.json", "w") as f:
            json.dump(run(examples), f)
