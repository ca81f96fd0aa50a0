"""Elastic training of a small classifier with model.fit under
hvdtrain.elastic.run, for horovodrun's elastic mode.

Usage: elastic_train.py OUT [--hold EPOCH BATCH SIZE] [--wait-for-hosts]

The examples come as one stream (a new order at each pass over the data);
each step takes the next BATCH x size examples and each rank trains on its
BATCH of them, so every (re)start shards what is left by the current rank
and size. An epoch is STEPS steps; the state commits every COMMIT batches.

Rank 0 appends JSON lines to OUT/log.jsonl: a "start" each time training
(re)starts, with each rank's host and pid and the settings above; a "batch"
after each batch and a "commit" at each commit, with the position (epoch,
batches done in it, examples seen), the world size and the learning rate;
at the end an "end" with the loss and accuracy on all the examples. Every
rank writes its final variables to OUT/weights.rank<r>.npz.

--hold: at the end of batch BATCH of epoch EPOCH at world size SIZE, every
rank writes its pid to OUT/held.rank<r> and waits for OUT/go (the test kills
a worker or adds a host meanwhile); with --wait-for-hosts it then commits and
waits for Horovod to report the new hosts.
"""

import argparse
import json
import os
import time

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import hvdtrain
from hvdtrain.keras import elastic

EXAMPLES, FEATURES = 1024, 8
BATCH, STEPS, EPOCHS, COMMIT = 16, 8, 4, 3
BASE_LR = 0.01  # per worker: the rate is BASE_LR x size
MAX_SIZE = 2

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--hold", type=int, nargs=3, metavar=("EPOCH", "BATCH", "SIZE"))
parser.add_argument("--wait-for-hosts", action="store_true")
args = parser.parse_args()

hvdtrain.init(intra_op_threads=1)

# The same examples and stream order on every rank.
rng = np.random.default_rng(0)
features = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
labels = (features @ rng.normal(size=FEATURES) > 0).astype("int64")
passes = EPOCHS * STEPS * BATCH * MAX_SIZE // EXAMPLES + 1  # enough for any run
order = np.concatenate([np.random.default_rng(p + 1).permutation(EXAMPLES)
                        for p in range(passes)])


def shard(seen):
    """This rank's part of each global batch after the first `seen` examples."""
    rank, size = hvd.rank(), hvd.size()
    ids = tf.data.Dataset.from_tensor_slices(order[seen:])
    ids = ids.batch(BATCH * size, drop_remainder=True).map(
        lambda i: i[rank * BATCH:(rank + 1) * BATCH])
    return ids.map(lambda i: (tf.gather(features, i), tf.gather(labels, i)))


def log(event, **fields):
    if hvd.rank() == 0:
        line = dict(event=event, epoch=state.epoch, batch=state.batch, seen=state.seen,
                    size=hvd.size(), lr=float(model.optimizer.learning_rate),
                    time=time.time(), **fields)
        with open(os.path.join(args.out, "log.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")


def write_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


class LoggedState(elastic.KerasState):
    def save(self):
        super().save()
        log("commit")


class CountExamples(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        state.seen += BATCH * hvd.size()
        log("batch", loss=float(logs["loss"]))


class Hold(keras.callbacks.Callback):
    held = False

    def on_train_batch_end(self, batch, logs=None):
        if self.held or [state.epoch, state.batch, hvd.size()] != args.hold:
            return
        self.held = True
        write_atomically(os.path.join(args.out, f"held.rank{hvd.rank()}"), str(os.getpid()))
        deadline = time.monotonic() + 60  # then go on: the test fails on the log
        while not os.path.exists(os.path.join(args.out, "go")) and time.monotonic() < deadline:
            time.sleep(0.05)
        if args.wait_for_hosts:
            # A commit whose check for host changes is repeated until it raises
            # HostsUpdatedInterrupt (the driver polls for hosts every second).
            state.save()
            while time.monotonic() < deadline:
                state.check_host_updates()
                time.sleep(0.1)


model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(2)])
model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.Adam(BASE_LR * hvd.size())),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
state = LoggedState(model, epoch=0, batch=0, seen=0)


def rescale_learning_rate():
    model.optimizer.learning_rate = BASE_LR * hvd.size()


state.register_reset_callbacks([rescale_learning_rate])
callbacks = [elastic.UpdateEpochStateCallback(state), elastic.UpdateBatchStateCallback(state),
             CountExamples(), elastic.CommitStateCallback(state, batches_per_commit=COMMIT)]
if args.hold:
    callbacks.append(Hold())


@elastic.run
def train(state):
    workers = hvd.allgather_object((os.environ["HOROVOD_HOSTNAME"], os.getpid()))
    log("start", hosts=[host for host, _ in workers], pids=[pid for _, pid in workers],
        per_rank_batch=BATCH, steps_per_epoch=STEPS, epochs=EPOCHS, batches_per_commit=COMMIT,
        base_lr=BASE_LR)
    model.fit(shard(state.seen), steps_per_epoch=STEPS, epochs=EPOCHS - state.epoch,
              callbacks=callbacks, shuffle=False, verbose=0)


train(state)
loss, accuracy = model.evaluate(features, labels, batch_size=256, verbose=0)
log("end", loss=loss, accuracy=accuracy)
weights = os.path.join(args.out, f"weights.rank{hvd.rank()}")
np.savez(f"{weights}.tmp.npz", **{f"{i}:{v.path}": np.asarray(v) for i, v in
                                  enumerate(model.variables + model.optimizer.variables)})
os.replace(f"{weights}.tmp.npz", f"{weights}.npz")
