"""Reads one epoch of a sharded training set of N examples (the features are
the examples' ids), then fits a small model on it for two epochs counting the
steps; each rank writes what it read, how many steps it took and its
intra-op thread count (INTRA_OP_THREADS given to init, 0: automatic) to
OUT/rank<r>.json."""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import hvdtrain

out, examples, batch_size, intra_op_threads = sys.argv[1], *map(int, sys.argv[2:])
hvdtrain.init(intra_op_threads=intra_op_threads)
ids = np.arange(examples, dtype="int64")
data = hvdtrain.data.from_arrays((ids, ids % 2), batch_size, training=True, seed=1)
read = [int(i) for batch, _ in data.batches(0) for i in batch.numpy()]


class CountSteps(keras.callbacks.Callback):
    steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


counter = CountSteps()
model = keras.Sequential([keras.Input(()), keras.layers.Reshape((1,)), keras.layers.Dense(2)])
model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.01)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data.for_epochs(2).map(lambda x, y: (keras.ops.cast(x, "float32") / examples, y)),
          epochs=2, steps_per_epoch=data.steps, verbose=0, callbacks=[counter])
with open(f"{out}/rank{hvdtrain.rank()}.json", "w") as f:
    json.dump({"read": read, "steps": data.steps, "fit_steps": counter.steps,
               "dropped": data.dropped,
               "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}, f)
