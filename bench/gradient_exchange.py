"""What hvdtrain's gradient exchange costs inside a training step, against
raw `hvd.grouped_allreduce` on the same tensors, measured in the same run.

    python bench/gradient_exchange.py [--controllers=gloo,mpi] [--rounds=30]

launches itself under `horovodrun -np 2` once per controller. Each worker
times, in interleaved rounds (so drift on a noisy machine hits all alike):
  local     one train step of `model.fit`'s compiled function with a plain
            optimizer (no exchange);
  raw_step  the same step with an optimizer that calls hvd.grouped_allreduce
            on its gradients and nothing else (the minimal Horovod wrapper);
  hvdtrain  the same step with hvdtrain.DistributedOptimizer;
  raw       hvd.grouped_allreduce alone on tensors shaped like the gradients;
  reducer   the same through hvdtrain's GradientReducer alone.
The exchange inside a step is its time minus local's. The ratio
(hvdtrain - local) / (raw_step - local) is hvdtrain's exchange against raw
Horovod's in the same step (goal: at most 1.10); reducer / raw compares the
collectives alone. Rank 0 prints a table and writes JSON.
"""

import json
import pathlib
import time

from absl import app, flags

import horovod_workers

flags.DEFINE_list("controllers", ["gloo", "mpi"], "Horovod controllers to measure.")
flags.DEFINE_integer("rounds", 30, "Interleaved timing rounds.")
flags.DEFINE_integer("steps", 5, "Steps (or collectives) timed per round and kind.")
flags.DEFINE_integer("groups", None,
                     "DistributedOptimizer's groups (default: none, Horovod fuses).")
flags.DEFINE_integer("width", 1024,
                     "Width of the MLP's hidden layers (gradient size ~ 3 x width^2).")
flags.DEFINE_string("output", "runs/bench/gradient_exchange.json",
                    "Where rank 0 writes the results.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS


def launch(argv):
    results = {}
    for controller in FLAGS.controllers:
        out = pathlib.Path(FLAGS.output).with_suffix(f".{controller}.json")
        results[controller] = horovod_workers.run(
            __file__, out, controller=controller, rounds=FLAGS.rounds, steps=FLAGS.steps,
            width=FLAGS.width, groups=FLAGS.groups or None)
    print(f"gradient exchange, np=2, {results[FLAGS.controllers[0]]['gradient_mb']:.1f} MB "
          "of float32 gradients per step (medians, ms)")
    print(f"{'controller':<11}{'local':>7}{'raw_step':>9}{'hvdtrain':>9}{'ratio':>7}"
          f"{'raw':>8}{'reducer':>9}{'reducer/raw':>12}")
    for controller, r in results.items():
        print(f"{controller:<11}{r['local_ms']:>7.2f}{r['raw_step_ms']:>9.2f}"
              f"{r['hvdtrain_ms']:>9.2f}{r['ratio']:>7.3f}{r['raw_ms']:>8.2f}"
              f"{r['reducer_ms']:>9.2f}{r['reducer_ratio']:>12.3f}")
    pathlib.Path(FLAGS.output).write_text(json.dumps(results, indent=2))
    print("ratio = (hvdtrain - local) / (raw_step - local), the exchange inside a step; "
          f"goal <= 1.10. JSON: {FLAGS.output}")


def work():
    import horovod.tensorflow as hvd
    import keras
    import numpy as np
    import tensorflow as tf

    import hvdtrain
    from hvdtrain.parallel.data_parallel.reduction import GradientReducer

    hvdtrain.init()

    def model():
        keras.utils.set_random_seed(0)
        layers = [keras.Input((FLAGS.width,))]
        layers += [keras.layers.Dense(FLAGS.width, activation="relu") for _ in range(3)]
        return keras.Sequential(layers + [keras.layers.Dense(10)])

    x = np.random.default_rng(0).normal(size=(8, FLAGS.width)).astype("float32")
    y = np.zeros(8, "int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step_function(optimizer):
        net = model()
        net.compile(optimizer=optimizer, loss=loss, jit_compile=False)
        net.fit(x, y, batch_size=8, epochs=1, verbose=0)  # builds and traces
        train_function = net.train_function
        data = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
        return net, lambda: train_function(data)

    class RawAllreduceSGD(keras.optimizers.SGD):
        def apply(self, grads, trainable_variables=None):
            return super().apply(hvd.grouped_allreduce(list(grads), op=hvd.Average),
                                 trainable_variables)

    local_model, local_step = step_function(keras.optimizers.SGD(0.001))
    _, raw_step = step_function(RawAllreduceSGD(0.001))
    _, hvdtrain_step = step_function(hvdtrain.DistributedOptimizer(
        keras.optimizers.SGD(0.001), groups=FLAGS.groups))
    tensors = [tf.zeros_like(v) for v in local_model.trainable_variables]
    allreduce = tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Average))

    def raw():
        return allreduce(tensors)

    reduce = tf.function(GradientReducer(groups=FLAGS.groups))

    def reducer():
        return reduce(tensors)

    def timed(fn):
        hvd.allreduce(tf.constant(0.0), name="bench.sync")  # start the ranks together
        start = time.perf_counter()
        for _ in range(FLAGS.steps):
            result = fn()
        np.asarray(tf.nest.flatten(result)[0])  # wait for the last one
        return (time.perf_counter() - start) / FLAGS.steps * 1000

    kinds = {"raw": raw, "reducer": reducer, "local": local_step, "raw_step": raw_step,
             "hvdtrain": hvdtrain_step}
    for fn in kinds.values():  # warm-up
        timed(fn)
    samples = {kind: [] for kind in kinds}
    for _ in range(FLAGS.rounds):
        for kind, fn in kinds.items():
            samples[kind].append(timed(fn))
    medians = {f"{k}_ms": float(np.median(v)) for k, v in samples.items()}

    def exchange(kind):
        return float(np.median([step - local
                                for step, local in zip(samples[kind], samples["local"])]))

    result = {**medians, "exchange_ms": exchange("hvdtrain"),
              "raw_exchange_ms": exchange("raw_step"),
              "gradient_mb": sum(int(np.prod(t.shape)) for t in tensors) * 4 / 2**20,
              "rounds": FLAGS.rounds, "steps_per_round": FLAGS.steps, "samples_ms": samples}
    result["ratio"] = result["exchange_ms"] / result["raw_exchange_ms"]
    result["reducer_ratio"] = result["reducer_ms"] / result["raw_ms"]
    if hvdtrain.is_main_process():
        path = pathlib.Path(FLAGS.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))


def main(argv):
    work() if FLAGS.worker else launch(argv)


if __name__ == "__main__":
    app.run(main)
