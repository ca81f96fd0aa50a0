"""Trains the default recipe's model a few steps on the digits (TFDS data in
DATA_DIR), each rank on its own shard, from random weights that differ per
rank until rank 0's are broadcast. Each rank prints one line, "multi_host
{json}": where it ran (hostname, the address of INTERFACE, ranks), its mean
loss on its own batches, and sha256 digests of the weights training started
from and ended with."""

import hashlib
import json
import socket
import sys

import horovod.tensorflow as hvd
import keras
import psutil

import hvdtrain

STEPS = 5

data_dir, interface = sys.argv[1:]

hvdtrain.init(intra_op_threads=1)
keras.utils.set_random_seed(hvdtrain.rank())
recipe = hvdtrain.recipe.get("digits_cnn")
config = hvdtrain.recipe.make_config(recipe.name, data_dir=data_dir)
train = recipe.load_data(config).train
model = recipe.build_model(config)
model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(config.learning_rate)),
              loss=recipe.loss)


def digest(model):
    weights = hashlib.sha256()
    for weight in model.get_weights():
        weights.update(weight.tobytes())
    return weights.hexdigest()


class InitialDigest(keras.callbacks.Callback):
    """The digest of the weights as training starts: after the broadcast."""

    def on_train_begin(self, logs=None):
        self.digest = digest(self.model)


initial = InitialDigest()
history = model.fit(train.for_epochs(1), epochs=1, steps_per_epoch=STEPS, verbose=0,
                    callbacks=[hvdtrain.callbacks.BroadcastInitialState(0), initial])
address, = (a.address for a in psutil.net_if_addrs()[interface] if a.family == socket.AF_INET)
# One write: Open MPI tags each piece of output it reads with the rank.
sys.stdout.write("multi_host " + json.dumps({
    "hostname": socket.gethostname(), "address": address,
    "rank": hvdtrain.rank(), "local_rank": hvdtrain.local_rank(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
    "loss": history.history["loss"][0], "initial": initial.digest, "final": digest(model)}) + "\n")
