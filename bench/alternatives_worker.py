"""One worker of bench/alternatives.py: the same CNN, data, optimizer and
timing, trained with `model.fit` by one of the contenders:

  hvdtrain         Keras 3, hvdtrain.DistributedOptimizer (under horovodrun)
  horovod_ops      Keras 3, a train_step of its own that averages the gradients
                   with one horovod.tensorflow.grouped_allreduce (under horovodrun):
                   Horovod's engine alone, what hvdtrain is built on
  mwms             Keras 3, tf.distribute.MultiWorkerMirroredStrategy (TF_CONFIG)
  horovod_keras2   tf.keras 2 (TensorFlow 2.15), horovod.tensorflow.keras (under horovodrun)

It also runs in the Keras 2 environment, so it imports only TensorFlow,
Keras, Horovod, NumPy, absl and bench/small_cnn.py at the top, and only APIs
that Keras 2.15 and Keras 3 share. Each rank writes its window rates, the CPU time its process
(all threads) spent per step in them, split by what its threads do, and a
checksum of its final weights to `<output>.rank<N>.json`.
"""

import collections
import json
import os
import time

import keras  # Keras 3, or tf.keras 2.15 in the Keras 2 environment
import numpy as np
import tensorflow as tf
from absl import app, flags

from small_cnn import small_cnn

flags.DEFINE_enum("mode", None, ["hvdtrain", "horovod_ops", "mwms", "horovod_keras2"],
                  "The contender.")
flags.DEFINE_integer("batch_size", 64, "Examples per worker and step.")
flags.DEFINE_integer("warmup_steps", 10, "Steps left out at the start of the fit.")
flags.DEFINE_integer("window_steps", 10, "Steps per timed window.")
flags.DEFINE_integer("windows", 5, "Timed windows.")
flags.DEFINE_integer("examples", 1024, "Size of the fixed random data set.")
flags.DEFINE_string("output", None, "Prefix of the per-rank JSON files.")
flags.mark_flags_as_required(["mode", "output"])
FLAGS = flags.FLAGS


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_by_thread_kind():
    """CPU seconds this process's threads have used, by kind: "compute"
    (TensorFlow's op threads, tf_Compute), "python" (the main thread: Keras
    and the step's dispatch), "other" (the rest: Horovod's background thread
    and Gloo's or MPI's, MultiWorkerMirroredStrategy's collective and gRPC
    threads, tf.data's). TensorFlow before 2.16 does not name its threads:
    there, no thread is "compute"."""
    used = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                text = stat.read()
        except OSError:   # the thread ended
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()   # utime and stime: fields 14 and 15
        kind = ("python" if int(tid) == os.getpid() else
                "compute" if name.startswith("tf_Compute") else "other")
        used[kind] += (int(fields[11]) + int(fields[12])) / _TICKS
    return used


class WindowTimer(keras.callbacks.Callback):
    """This rank's examples/s over windows of `window_steps` steps after
    `warmup_steps`, as hvdtrain.callbacks.Throughput times them (which
    needs Keras 3 and so cannot serve the Keras 2 contender), and the
    process's CPU seconds per step in each window (all its threads), which
    depends less than the rate on what else runs on the cores."""

    def __init__(self, batch_size, warmup_steps, window_steps):
        super().__init__()
        self.batch_size = batch_size
        self.warmup_steps = warmup_steps
        self.window_steps = window_steps
        self.rates = []
        self.cpu_per_step = []
        self.cpu_by_kind = collections.Counter()   # seconds over all windows
        self._steps = 0
        self._window_start = None
        self._window_cpu = None
        self._window_kinds = None
        self._in_window = 0

    def on_train_batch_begin(self, batch, logs=None):
        if self._steps >= self.warmup_steps and self._window_start is None:
            self._window_start, self._in_window = time.perf_counter(), 0
            self._window_cpu = time.process_time()
            self._window_kinds = cpu_by_thread_kind()

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._window_start is None:
            return
        float((logs or {}).get("loss", 0.0))  # the step has finished
        self._in_window += 1
        if self._in_window == self.window_steps:
            seconds = time.perf_counter() - self._window_start
            self.rates.append(self.window_steps * self.batch_size / seconds)
            self.cpu_per_step.append((time.process_time() - self._window_cpu) / self.window_steps)
            self.cpu_by_kind.update(cpu_by_thread_kind())
            self.cpu_by_kind.subtract(self._window_kinds)
            self._window_start = None


def build_model():
    keras.utils.set_random_seed(0)
    return small_cnn()


def dataset(batch_size):
    rng = np.random.default_rng(0)
    x = rng.random((FLAGS.examples, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, FLAGS.examples).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True)
    return data.cache().repeat().prefetch(tf.data.AUTOTUNE)


def sgd():
    return keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)


def compile_model(model, optimizer):
    # No XLA for any of the three: Horovod's ops do not compile with it.
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    return model


def hvdtrain_setup():
    import hvdtrain
    import hvdtrain.callbacks

    hvdtrain.init(intra_op_threads=1)
    model = compile_model(build_model(), hvdtrain.DistributedOptimizer(sgd()))
    return (hvdtrain.rank(), model, dataset(FLAGS.batch_size),
            [hvdtrain.callbacks.BroadcastInitialState(0)])


def horovod_ops_setup():
    import horovod.tensorflow as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()

    class Averaged(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            variables = self.trainable_variables
            grads = hvd.grouped_allreduce(tape.gradient(loss, variables), op=hvd.Average)
            self.optimizer.apply(grads, variables)
            return {"loss": loss}

    # Every rank starts from the same weights: the seed is the same.
    plain = build_model()
    model = compile_model(Averaged(plain.inputs, plain.outputs), sgd())
    return hvd.rank(), model, dataset(FLAGS.batch_size), []


def horovod_keras2_setup():
    import horovod.tensorflow.keras as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    model = compile_model(build_model(), hvd.DistributedOptimizer(sgd()))
    return (hvd.rank(), model, dataset(FLAGS.batch_size),
            [hvd.callbacks.BroadcastGlobalVariablesCallback(0)])


def mwms_setup():
    tf.config.threading.set_intra_op_parallelism_threads(1)  # before the strategy starts TF
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    # Keras 3's fit calls strategy.reduce in two ways this strategy rejects
    # (tensorflow/tensorflow#72388): on the first batch, an (x, y) tuple, and with
    # axis=0 on each step's scalar loss. Reduce a tuple's tensors one by one,
    # and scalars across replicas only.
    reduce = strategy.reduce

    def reduce_each(op, value, axis=None):
        def one(v):
            rank = strategy.experimental_local_results(v)[0].shape.rank
            return reduce(op, v, axis if rank else None)
        return tf.nest.map_structure(one, value)

    strategy.reduce = reduce_each
    with strategy.scope():
        model = compile_model(build_model(), sgd())
    # A global batch of workers x per-worker batch; every worker reads the
    # same fixed arrays, as the Horovod contenders do, so no sharding.
    data = dataset(FLAGS.batch_size * strategy.num_replicas_in_sync)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    return rank, model, data.with_options(options), []


def main(argv):
    setup = {"hvdtrain": hvdtrain_setup, "horovod_ops": horovod_ops_setup, "mwms": mwms_setup,
             "horovod_keras2": horovod_keras2_setup}[FLAGS.mode]
    rank, model, data, callbacks = setup()
    timer = WindowTimer(FLAGS.batch_size, FLAGS.warmup_steps, FLAGS.window_steps)
    steps = FLAGS.warmup_steps + FLAGS.windows * FLAGS.window_steps
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False,
              callbacks=[timer, *callbacks])
    with open(f"{FLAGS.output}.rank{rank}.json", "w") as out:
        # Equal on every rank only if the contender really trained data-parallel.
        checksum = float(sum(np.sum(w, dtype=np.float64) for w in model.get_weights()))
        timed_steps = len(timer.rates) * FLAGS.window_steps
        json.dump({"rates": timer.rates, "cpu_per_step": timer.cpu_per_step,
                   "cpu_per_step_by_kind": {kind: seconds / max(1, timed_steps)
                                            for kind, seconds in timer.cpu_by_kind.items()}
                   if timer.cpu_by_kind["compute"] else None,   # None: threads not named
                   "weights_checksum": checksum,
                   "tensorflow": tf.__version__, "keras": keras.__version__}, out)


if __name__ == "__main__":
    app.run(main)
