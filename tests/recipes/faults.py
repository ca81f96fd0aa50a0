"""A test recipe: a small MLP on two Gaussian blobs, with a fault injected
on one rank from a given batch of a given epoch on, as the environment says:
FAULT=nan (that rank's features become NaN), FAULT=hang (that rank's input
pipeline blocks) or FAULT=pause (it blocks until the file FAULT_RESUME
exists, having made FAULT_RESUME.waiting; with FAULT_RESUME_ON_STOP set,
or until a stop reaches it), FAULT_RANK, FAULT_EPOCH and FAULT_STEP (0-based); or before
training, FAULT=hang_loading (that rank never finishes loading its data) or
FAULT=pause_loading (it loads once the file FAULT_RESUME exists)."""

import dataclasses
import os
import select
import signal
import time

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain import data
from hvdtrain.faults import preemption
from hvdtrain.recipe import Recipe, Splits


def _blobs(examples, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, examples)
    features = rng.normal(size=(examples, 8)) + labels[:, None] * 1.5
    return features.astype("float32"), labels


def _hang(x):
    time.sleep(3600)
    return x


# With FAULT_RESUME_ON_STOP: a pipe that Python's own signal handler writes
# each arriving signal to at once. The stop it asks for waits for the main
# thread, and the main thread for the paused input.
_signals = None


def _arrive_in_a_pipe():
    global _signals
    _signals, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)


def _stop_asked():
    """A stop signal arrived, or a thread asked this rank to stop (its launcher gone)."""
    return _signals is not None and bool(
        preemption.requested() or select.select([_signals], [], [], 0)[0])


def _pause(x):
    open(os.environ["FAULT_RESUME"] + ".waiting", "w").close()   # tests wait for this
    while not (os.path.exists(os.environ["FAULT_RESUME"]) or _stop_asked()):
        time.sleep(0.1)
    return x


def _faulty(batches):
    fault, step = os.environ["FAULT"], int(os.environ.get("FAULT_STEP", 0))

    def fail(features):
        if fault == "nan":
            return features * np.float32("nan")
        block = _pause if fault == "pause" else _hang
        return tf.ensure_shape(tf.py_function(block, [features], tf.float32), features.shape)

    def broken(i, batch):
        features, labels = batch
        return tf.cond(i < step, lambda: features, lambda: fail(features)), labels

    return lambda epoch: batches(epoch).enumerate().map(broken) if epoch == int(
        os.environ.get("FAULT_EPOCH", 0)) else batches(epoch)


def load_data(config):
    faulty = os.environ.get("FAULT") and hvd.rank() == int(os.environ.get("FAULT_RANK", 1))
    if faulty and os.environ["FAULT"] == "hang_loading":
        _hang(None)
    if faulty and os.environ["FAULT"] == "pause_loading":
        _pause(None)
    read = dict(batch_size=config.batch_size, seed=config.seed)
    train = data.from_arrays(_blobs(512, 0), training=True, **read)
    if faulty:
        if os.environ.get("FAULT_RESUME_ON_STOP"):
            _arrive_in_a_pipe()
        train = dataclasses.replace(train, batches=_faulty(train.batches))
    return Splits(train=train, validation=data.from_arrays(_blobs(128, 1), training=False, **read))


RECIPE = Recipe(name="faults", load_data=load_data,
                build_model=lambda config: keras.Sequential([
                    # tanh passes NaN on
                    keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                    keras.layers.Dense(2, dtype="float32")]),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=("accuracy",),
                defaults=dict(epochs=3, batch_size=8, learning_rate=0.05, warmup_epochs=0))
