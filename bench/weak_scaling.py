"""Weak scaling from one worker to two, and what the MLP's exchange costs
against the allreduce bandwidth measured beside it.

    python bench/weak_scaling.py [--rounds=3] [--controller=gloo]

launches itself under `horovodrun -np 1` and `-np 2` in alternating rounds
(1, 2, then 2, 1, ...), one intra-op and one inter-op thread per process:
np=1 uses one core, np=2 both. Every worker trains, with the same batch per
worker, SGD through hvdtrain.DistributedOptimizer and synthetic data (so
input costs nothing):
  cnn  a compute-bound CNN (4 conv layers on 32x32x3, 66K parameters);
  mlp  a communication-heavy MLP (1024 -> 2048 -> 2048 -> 10, 6.3M
       parameters, 24 MB of float32 gradients, little compute per step);
timed by hvdtrain's throughput meter (windows of steps after warm-up).
Weak-scaling efficiency = throughput(np=2) / (2 x throughput(np=1)); goal:
>= 0.90 on the CNN. Beside it, the same in CPU time (np=1's process CPU time
per step over np=2's, all threads): the work np=2 adds, whatever share of
the cores other jobs leave the processes, which is printed too. At np=2 the
workers also time an allreduce of the MLP's gradient bytes
(allreduce_bandwidth.measure), and the MLP's np=2 step is predicted as its
np=1 step plus that allreduce; goal: measured within 10% of predicted.
Paired by round (np=1 and np=2 runs next to each other), reported as medians
over rounds. Prints a table, writes JSON and a PNG.
"""

import json
import math
import pathlib
import statistics
import time

from absl import app, flags

import allreduce_bandwidth
import horovod_workers

EFFICIENCY_GOAL = 0.90
PREDICTION_TOLERANCE = 0.10

flags.DEFINE_integer("rounds", 3, "Rounds, each an np=1 and an np=2 run.")
flags.DEFINE_enum("controller", "gloo", ["gloo", "mpi"], "Horovod's controller.")
flags.DEFINE_integer("batch_size", 32, "Examples per worker and step, for both models.")
flags.DEFINE_integer("image_size", 32, "Height and width of the CNN's images.")
flags.DEFINE_integer("mlp_width", 2048, "Width of the MLP's two hidden layers.")
flags.DEFINE_integer("warmup_steps", 3, "Steps left out at the start of each model's fit.")
flags.DEFINE_integer("window_steps", 5, "Steps per timed window.")
flags.DEFINE_integer("windows", 6, "Timed windows per model and run.")
flags.DEFINE_integer("allreduce_rounds", 10, "Rounds timing the allreduce of the gradient bytes.")
flags.DEFINE_string("output", "runs/bench/weak_scaling.json", "The JSON; the PNG goes beside it.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS


def models():
    """{name: (uncompiled model, input shape)}."""
    import keras
    layers = keras.layers
    size = FLAGS.image_size
    cnn = keras.Sequential([
        keras.Input((size, size, 3)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.Conv2D(32, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(), layers.Dense(10)])
    width = FLAGS.mlp_width
    mlp = keras.Sequential([keras.Input((1024,)), layers.Dense(width, activation="relu"),
                            layers.Dense(width, activation="relu"), layers.Dense(10)])
    return {"cnn": (cnn, (size, size, 3)), "mlp": (mlp, (1024,))}


def cpu_clock(first, last):
    """A callback timing training steps first..last - 1 in this process's CPU
    time (all its threads: TensorFlow's, tf.data's, Horovod's) and wall time."""
    import keras

    class CpuClock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == first:
                self._start = time.process_time(), time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if batch == last - 1:
                cpu, wall = time.process_time(), time.perf_counter()
                self.cpu_seconds, self.wall_seconds = cpu - self._start[0], wall - self._start[1]

    return CpuClock()


def work():
    import keras

    import hvdtrain
    from hvdtrain import callbacks, data, throughput

    # One thread inside an op and one running ops: with TensorFlow's default
    # inter-op pool, np=1 would run a step's independent ops on the second core.
    hvdtrain.init(intra_op_threads=1, inter_op_threads=1)
    steps = FLAGS.warmup_steps + FLAGS.windows * FLAGS.window_steps
    results = {"workers": hvdtrain.size()}
    for name, (model, shape) in models().items():
        model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        train = data.synthetic(shape, 10, FLAGS.batch_size, steps, seed=hvdtrain.rank())
        meter = throughput.Throughput(FLAGS.batch_size, FLAGS.warmup_steps, FLAGS.window_steps)
        cpu = cpu_clock(FLAGS.warmup_steps, steps)
        model.fit(train.for_epochs(1), steps_per_epoch=steps, verbose=0,
                  callbacks=[meter, cpu, callbacks.BroadcastGlobalVariablesCallback(0)])
        measurement = meter.measurement()
        results[name] = {
            "examples_per_second": measurement.total.mean,
            "per_worker": measurement.per_worker.mean,
            # Steps are synchronous: this rank's windows time everyone's steps.
            "step_ms": statistics.median(FLAGS.batch_size / rate for rate in meter.samples) * 1e3,
            "cpu_ms": cpu.cpu_seconds / (steps - FLAGS.warmup_steps) * 1e3,
            # How much of a core the process had (other jobs take the rest).
            "core_share": cpu.cpu_seconds / cpu.wall_seconds,
            "parameters": model.count_params(),
            "gradient_bytes": 4 * sum(math.prod(v.shape) for v in model.trainable_variables)}
    if hvdtrain.size() > 1:
        size = results["mlp"]["gradient_bytes"]
        seconds = allreduce_bandwidth.measure([size], FLAGS.allreduce_rounds)[size]["allreduce"]
        results["mlp"]["allreduce_ms"] = statistics.median(seconds) * 1e3
    if hvdtrain.is_main_process():
        pathlib.Path(FLAGS.output).write_text(json.dumps(results, indent=1))


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    rounds = []
    for index in range(FLAGS.rounds):
        runs = {}
        for np in (1, 2) if index % 2 == 0 else (2, 1):
            runs[np] = horovod_workers.run(
                __file__, output.with_suffix(f".np{np}.json"), np=np, controller=FLAGS.controller,
                batch_size=FLAGS.batch_size, image_size=FLAGS.image_size,
                mlp_width=FLAGS.mlp_width, warmup_steps=FLAGS.warmup_steps,
                window_steps=FLAGS.window_steps, windows=FLAGS.windows,
                allreduce_rounds=FLAGS.allreduce_rounds)
        rounds.append(runs)
    results = summarize(rounds)
    output.write_text(json.dumps(results, indent=1))
    plot(results, output.with_suffix(".png"))
    report(results, output)


def summarize(rounds):
    """Medians over rounds of each run's numbers and of the paired ratios."""
    def median(key, model, np):
        return statistics.median(r[np][model][key] for r in rounds)

    results = {"controller": FLAGS.controller, "batch_per_worker": FLAGS.batch_size,
               "rounds": rounds}
    for model in ("cnn", "mlp"):
        results[model] = {
            "parameters": rounds[0][1][model]["parameters"],
            "np1": median("examples_per_second", model, 1),
            "np2": median("examples_per_second", model, 2),
            "efficiency": statistics.median(r[2][model]["examples_per_second"] / (
                2 * r[1][model]["examples_per_second"]) for r in rounds),
            "np1_step_ms": median("step_ms", model, 1), "np2_step_ms": median("step_ms", model, 2),
            # The same ratio in CPU time per step: what np=2 adds in work, whatever
            # cores the processes got on a busy machine.
            "cpu_efficiency": statistics.median(
                r[1][model]["cpu_ms"] / r[2][model]["cpu_ms"] for r in rounds),
            "np1_core_share": median("core_share", model, 1),
            "np2_core_share": median("core_share", model, 2)}
    mlp = results["mlp"]
    mlp["gradient_mb"] = rounds[0][2]["mlp"]["gradient_bytes"] / 2**20
    mlp["allreduce_ms"] = median("allreduce_ms", "mlp", 2)
    mlp["allreduce_busbw_gbs"] = rounds[0][2]["mlp"]["gradient_bytes"] / mlp["allreduce_ms"] / 1e6
    mlp["predicted_np2_step_ms"] = mlp["np1_step_ms"] + mlp["allreduce_ms"]
    mlp["measured_over_predicted"] = statistics.median(
        r[2]["mlp"]["step_ms"] / (r[1]["mlp"]["step_ms"] + r[2]["mlp"]["allreduce_ms"])
        for r in rounds)
    results["goals"] = {"cnn_efficiency": f">= {EFFICIENCY_GOAL}",
                        "mlp_measured_over_predicted": f"within 1 +- {PREDICTION_TOLERANCE}"}
    return results


def report(results, output):
    print(f"weak scaling np=1 -> np=2, {results['controller']}, batch {results['batch_per_worker']}"
          f" per worker, 1 intra-op and 1 inter-op thread per process (medians of "
          f"{FLAGS.rounds} rounds)")
    print(f"{'model':<6}{'params':>10}{'np=1 ex/s':>11}{'np=2 ex/s':>11}{'np=1 step':>11}"
          f"{'np=2 step':>11}{'efficiency':>12}{'in CPU time':>13}")
    for model in ("cnn", "mlp"):
        r = results[model]
        print(f"{model:<6}{r['parameters']:>10,}{r['np1']:>11.1f}{r['np2']:>11.1f}"
              f"{r['np1_step_ms']:>9.1f}ms{r['np2_step_ms']:>9.1f}ms{r['efficiency']:>12.3f}"
              f"{r['cpu_efficiency']:>13.3f}")
    print("cores each process had (its CPU time / wall time): " + ", ".join(
        f"{model} {results[model]['np1_core_share']:.2f} at np=1, "
        f"{results[model]['np2_core_share']:.2f} at np=2" for model in ("cnn", "mlp")))
    mlp = results["mlp"]
    print(f"mlp at np=2: predicted step {mlp['predicted_np2_step_ms']:.1f} ms = np=1 step "
          f"{mlp['np1_step_ms']:.1f} ms + allreduce of {mlp['gradient_mb']:.1f} MB "
          f"{mlp['allreduce_ms']:.1f} ms ({mlp['allreduce_busbw_gbs']:.2f} GB/s bus bandwidth); "
          f"measured {mlp['np2_step_ms']:.1f} ms; measured/predicted "
          f"{mlp['measured_over_predicted']:.3f}")
    cnn_met = results["cnn"]["efficiency"] >= EFFICIENCY_GOAL
    mlp_met = abs(mlp["measured_over_predicted"] - 1) <= PREDICTION_TOLERANCE
    print(f"goals: cnn efficiency >= {EFFICIENCY_GOAL}: {'met' if cnn_met else 'NOT met'}; "
          f"mlp measured within {PREDICTION_TOLERANCE:.0%} of predicted: "
          f"{'met' if mlp_met else 'NOT met'}. JSON: {output}, chart: {output.with_suffix('.png')}")


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (rates, steps) = pyplot.subplots(1, 2, figsize=(9, 4))
    names = ["cnn", "mlp"]
    rates.bar([i - 0.2 for i in range(2)], [results[m]["np1"] for m in names], 0.4,
              color="tab:gray", label="np=1")
    rates.bar([i + 0.2 for i in range(2)], [results[m]["np2"] / 2 for m in names], 0.4,
              color="tab:blue", label="np=2, per worker")
    for i, model in enumerate(names):
        r = results[model]
        rates.annotate(f"efficiency {r['efficiency']:.2f}", (i, max(r["np1"], r["np2"] / 2)),
                       ha="center", va="bottom", xytext=(0, 3), textcoords="offset points",
                       fontsize=8)
    rates.set_xticks(range(2), names)
    rates.set_ylabel("examples/s per worker")
    rates.set_ylim(0, 1.2 * max(max(results[m]["np1"], results[m]["np2"] / 2) for m in names))
    rates.legend(fontsize=8)
    mlp = results["mlp"]
    steps.bar(0, mlp["np1_step_ms"], color="tab:gray", label="np=1 step")
    steps.bar(0, mlp["allreduce_ms"], bottom=mlp["np1_step_ms"], color="tab:orange",
              label=f"allreduce of {mlp['gradient_mb']:.0f} MB")
    steps.bar(1, mlp["np2_step_ms"], color="tab:blue", label="np=2 step")
    steps.set_xticks([0, 1], ["predicted", "measured"])
    steps.set_ylabel("mlp step, ms")
    steps.legend(fontsize=8)
    figure.suptitle(f"np=1 -> np=2, {results['controller']}, batch {results['batch_per_worker']} "
                    "per worker, 1 thread each; medians", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def main(argv):
    work() if FLAGS.worker else launch()


if __name__ == "__main__":
    app.run(main)
