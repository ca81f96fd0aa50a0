"""What --steps_per_execution gives a fast step: K steps per call of the
train function against one.

    python bench/steps_per_execution.py [--epochs=12] [--k=8]

launches itself under `horovodrun -np 2` (one intra-op thread per process,
Gloo) and trains a small MLP (a step of a few milliseconds here) on one
synthetic batch with hvdtrain's DistributedOptimizer, its in-step learning
rate (warm-up) and its fit (hvdtrain.run.fit, as the trainer fits), side by
side, one epoch at a time, the order turned each epoch:
  k1   one step per call (the default);
  kK   --k steps per call (Keras's steps_per_execution; gradients still
       reduced every step).
Both carry the throughput meter, the stop vote and the NaN check, the
per-call work of every run. The first epoch traces and is left out; in each
later epoch the meter times windows of steps after warm-up steps. The report
is the median over epochs of kK / k1, with the noise (k1's rate / its rate
in the epoch before). Rank 0 prints a table and writes JSON.
"""

import json
import pathlib

from absl import app, flags

import horovod_workers

flags.DEFINE_integer("epochs", 12, "Epochs each trains: one ratio per epoch after the first.")
flags.DEFINE_integer("steps", 64, "Steps per epoch.")
flags.DEFINE_integer("k", 8, "Steps per call of the run measured against one.")
flags.DEFINE_integer("batch_size", 32, "Examples per batch on each worker.")
flags.DEFINE_integer("width", 256, "The MLP's features and hidden units.")
flags.DEFINE_integer("warmup_steps", 8, "Steps of each epoch left out of its throughput.")
flags.DEFINE_integer("window_steps", 8, "Steps per timed window.")
flags.DEFINE_string("output", "runs/bench/steps_per_execution.json",
                    "Where rank 0 writes the results.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    r = horovod_workers.run(__file__, output, np=2, epochs=FLAGS.epochs, steps=FLAGS.steps,
                            k=FLAGS.k, batch_size=FLAGS.batch_size, width=FLAGS.width,
                            warmup_steps=FLAGS.warmup_steps, window_steps=FLAGS.window_steps)
    names = list(r["examples_per_second"])
    print(f"steps per call of the train function at np=2: MLP {FLAGS.width} wide, batch "
          f"{FLAGS.batch_size} per worker, one intra-op thread each, Gloo; "
          f"{FLAGS.epochs - 1} epochs of {FLAGS.steps} steps timed")
    print(f"{'run':>5}{'examples/s':>12}{'step ms':>9}{'/ k1':>8}{'range over epochs':>20}"
          f"{'noise':>15}")
    for name in names:
        rate = r["examples_per_second"][name]
        ratios = r["ratios"].get(name)
        print(f"{name:>5}{rate:>12.1f}{FLAGS.batch_size / rate * 1e3:>9.2f}" + (
            f"{r['ratio'][name]:>8.3f}{min(ratios):>12.3f}-{max(ratios):.3f}"
            f"{r['noise'][0]:>10.3f}-{r['noise'][1]:.3f}" if ratios else ""))
    print(f"noise: k1's rate / its rate in the epoch before. JSON: {FLAGS.output}")


def work(scratch):
    import keras

    import hvdtrain
    from hvdtrain import callbacks, data
    from hvdtrain.recipe import make_config
    from hvdtrain.run import executions, fit, learning_rate, trainer

    hvdtrain.init(intra_op_threads=1)
    batches = data.synthetic((FLAGS.width,), 10, FLAGS.batch_size, FLAGS.steps,
                             seed=hvdtrain.rank())
    config = make_config("digits_cnn", epochs=FLAGS.epochs, learning_rate=0.01,
                         warmup_epochs=2)

    def model(steps_per_execution):
        keras.utils.set_random_seed(0)
        net = keras.Sequential([keras.Input((FLAGS.width,)),
                                keras.layers.Dense(FLAGS.width, activation="relu"),
                                keras.layers.Dense(FLAGS.width, activation="relu"),
                                keras.layers.Dense(10)])
        optimizer = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
        learning_rate.set_up(optimizer, config)
        learning_rate.stand_at(optimizer, config, 0, FLAGS.steps, hvdtrain.size())
        net.compile(optimizer=optimizer, jit_compile=False,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        executions.Executions(net, steps_per_execution)
        return net, trainer.stop_vote(net)

    class Voting(keras.callbacks.Callback):
        """The stop vote's read after each call, as PreemptionStop's."""

        def __init__(self, vote):
            super().__init__()
            self.vote = vote

        def on_train_batch_end(self, batch, logs=None):
            if self.vote.passed():
                raise RuntimeError("no rank was asked to stop")

    runs = {}
    for name, k in (("k1", 1), (f"k{FLAGS.k}", FLAGS.k)):
        net, vote = model(k)
        meter = callbacks.Throughput(FLAGS.batch_size, FLAGS.warmup_steps, FLAGS.window_steps)
        chosen = [meter, callbacks.BroadcastInitialState(0), callbacks.FailOnNonFiniteLoss(),
                  Voting(vote)]
        runs[name] = (net, chosen, meter)

    def fit_epoch(name, epoch):
        net, chosen, meter = runs[name]
        fit.from_position(net, batches, None, chosen, epochs=epoch + 1, epoch=epoch, step=0,
                          verbose=0)
        return meter.epoch_measurement.total.mean if epoch else None

    measured = horovod_workers.side_by_side(tuple(runs), fit_epoch, FLAGS.epochs)
    if hvdtrain.is_main_process():
        pathlib.Path(FLAGS.output).write_text(json.dumps(
            dict(measured, workers=hvdtrain.size(), k=FLAGS.k), indent=1))


if __name__ == "__main__":
    app.run(horovod_workers.main(launch, work))
