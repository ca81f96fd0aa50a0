"""Weak scaling from one worker to two, against what this machine gives two
processes, and what the MLP's exchange costs against the allreduce
bandwidth measured beside it.

    python bench/weak_scaling.py [--rounds=3] [--controller=gloo]

launches itself under horovodrun three ways per round, their order rotated
each round, with one intra-op and one inter-op thread per process:
  np1        one worker (one core);
  np2        two workers averaging gradients (both cores);
  np2_alone  two processes started together that each train alone, with
             no gradient exchange: the machine's own limit for np=2 (two
             processes share caches, memory bandwidth and, on a virtual
             machine, whatever the host gives its cores).
Every worker trains, with the same batch per worker, SGD (through
hvdtrain.DistributedOptimizer when exchanging) on synthetic data (so input
costs nothing):
  cnn  a compute-bound CNN (4 conv layers on 32x32x3, 66K parameters);
  mlp  a communication-heavy MLP (1024 -> 2048 -> 2048 -> 10, 6.3M
       parameters, 24 MB of float32 gradients, little compute per step);
timed by hvdtrain's throughput meter (windows of steps after warm-up).
Weak-scaling efficiency = throughput(np2) / (2 x throughput(np1)); goal:
>= 0.90 on the CNN. Beside it: the ceiling, np2_alone / (2 x np1); the
share of it reached, np2 / np2_alone (what the exchange costs); and the
efficiency in CPU time (np1's process CPU time per step over np2's, all
threads). At np=2 the workers also time, with no compute beside it, an
allreduce of tensors shaped as the MLP's gradients, grouped (negotiated
together and fused into one buffer, as the step's are), and the MLP's np=2
step is predicted as np2_alone's step plus that allreduce; goal: measured
within 10% of predicted. Ratios are paired by round, and reported as
medians over rounds. Prints a table, writes JSON and a PNG.
"""

import json
import math
import pathlib
import statistics
import time

from absl import app, flags

import horovod_workers

EFFICIENCY_GOAL = 0.90
PREDICTION_TOLERANCE = 0.10

flags.DEFINE_integer("rounds", 3, "Rounds, each an np=1 and an np=2 run.")
flags.DEFINE_enum("controller", "gloo", ["gloo", "mpi"], "Horovod's controller.")
flags.DEFINE_integer("batch_size", 32, "Examples per worker and step, for both models.")
flags.DEFINE_integer("image_size", 32, "Height and width of the CNN's images.")
flags.DEFINE_integer("mlp_width", 2048, "Width of the MLP's two hidden layers.")
flags.DEFINE_integer("warmup_steps", 3, "Steps left out at the start of each model's fit.")
flags.DEFINE_integer("window_steps", 10, "Steps per timed window.")
flags.DEFINE_integer("windows", 8, "Timed windows per model and run.")
flags.DEFINE_integer("allreduce_groups", None, "As hvdtrain train's flag: 0, each gradient's "
                     "allreduce starts when it is computed; N, the gradients in N groups "
                     "(default: hvdtrain's choice for this host).")
flags.DEFINE_integer("allreduce_rounds", 10, "Rounds timing the allreduce of the gradient bytes.")
flags.DEFINE_string("output", "runs/bench/weak_scaling.json", "The JSON; the PNG goes beside it.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
flags.DEFINE_bool("exchange", True, "Internal: average gradients across the workers (False: "
                  "each trains alone, for the machine's own np=2 ceiling).")
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
    from hvdtrain import callbacks, data

    # One thread inside an op and one running ops: with TensorFlow's default
    # inter-op pool, np=1 would run a step's independent ops on the second core.
    hvdtrain.init(intra_op_threads=1, inter_op_threads=1)
    steps = FLAGS.warmup_steps + FLAGS.windows * FLAGS.window_steps
    results, shapes = {"workers": hvdtrain.size()}, {}
    for name, (model, shape) in models().items():
        optimizer = keras.optimizers.SGD(0.01)
        meter = callbacks.Throughput(FLAGS.batch_size, FLAGS.warmup_steps, FLAGS.window_steps)
        cpu = cpu_clock(FLAGS.warmup_steps, steps)
        fit_callbacks = [meter, cpu]
        if FLAGS.exchange:
            optimizer = hvdtrain.DistributedOptimizer(
                optimizer, groups="auto" if FLAGS.allreduce_groups is None
                else FLAGS.allreduce_groups or None)
            fit_callbacks.append(callbacks.BroadcastInitialState(0))
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        train = data.synthetic(shape, 10, FLAGS.batch_size, steps, seed=hvdtrain.rank())
        model.fit(train.for_epochs(1), steps_per_epoch=steps, verbose=0, callbacks=fit_callbacks)
        shapes[name] = [tuple(v.shape) for v in model.trainable_variables]
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
            "gradient_bytes": 4 * sum(math.prod(dims) for dims in shapes[name])}
    if hvdtrain.size() > 1 and FLAGS.exchange:
        results["mlp"]["allreduce_ms"] = grouped_allreduce_ms(shapes["mlp"], FLAGS.allreduce_rounds)
    if hvdtrain.is_main_process():
        pathlib.Path(FLAGS.output).write_text(json.dumps(results, indent=1))


def grouped_allreduce_ms(shapes, rounds, calls=5):
    """On every rank: the median time of one allreduce of float32 tensors of
    `shapes` (a model's gradients) as one group: negotiated together and
    copied into one fusion buffer, as a step's gradients are when all are
    ready. No compute runs beside it."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    tensors = [tf.ones(shape) for shape in shapes]
    # One element of each result: fetching all of them would add a copy to the host.
    exchange = tf.function(lambda ts: tf.add_n([tf.reshape(t, [-1])[0] for t in
                                                hvd.grouped_allreduce(ts, op=hvd.Sum)]))
    samples = []
    for round_index in range(rounds + 1):
        hvd.allreduce(tf.constant(0.0), name="bench.sync")  # start the ranks together
        start = time.perf_counter()
        for _ in range(calls):
            exchange(tensors).numpy()
        if round_index:  # round 0 is the warm-up
            samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples) * 1e3


RUNS = {"np1": (1, True), "np2": (2, True), "np2_alone": (2, False)}  # name: (np, exchange)


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    rounds = []
    for index in range(FLAGS.rounds):
        runs = {}
        # Rotated each round, so that drift on a busy machine hits all alike.
        names = list(RUNS)[index % len(RUNS):] + list(RUNS)[:index % len(RUNS)]
        for name in names:
            np, exchange = RUNS[name]
            runs[name] = horovod_workers.run(
                __file__, output.with_suffix(f".{name}.json"), np=np, controller=FLAGS.controller,
                exchange=exchange, allreduce_groups=FLAGS.allreduce_groups,
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
    """Medians over rounds of each run's numbers and of the ratios, paired by round."""
    def median(key, model, run):
        return statistics.median(r[run][model][key] for r in rounds)

    def paired(ratio, model):
        return statistics.median(ratio(*(r[run][model] for run in RUNS)) for r in rounds)

    results = {"controller": FLAGS.controller, "allreduce_groups": FLAGS.allreduce_groups,
               "batch_per_worker": FLAGS.batch_size,
               "rounds": rounds}
    for model in ("cnn", "mlp"):
        results[model] = {
            "parameters": rounds[0]["np1"][model]["parameters"],
            **{f"{run}_examples_per_second": median("examples_per_second", model, run)
               for run in RUNS},
            **{f"{run}_step_ms": median("step_ms", model, run) for run in RUNS},
            **{f"{run}_core_share": median("core_share", model, run) for run in RUNS},
            "efficiency": paired(lambda np1, np2, alone: np2["examples_per_second"] / (
                2 * np1["examples_per_second"]), model),
            # What two processes get from this machine with nothing exchanged:
            # the most any np=2 job could reach here.
            "ceiling": paired(lambda np1, np2, alone: alone["examples_per_second"] / (
                2 * np1["examples_per_second"]), model),
            "efficiency_of_ceiling": paired(lambda np1, np2, alone: np2["examples_per_second"] /
                                            alone["examples_per_second"], model),
            # The same in CPU time per step: the work np=2 adds, whatever cores
            # the processes got on a busy machine.
            "cpu_efficiency": paired(lambda np1, np2, alone: np1["cpu_ms"] / np2["cpu_ms"], model)}
    mlp = results["mlp"]
    mlp["gradient_mb"] = rounds[0]["np2"]["mlp"]["gradient_bytes"] / 2**20
    mlp["allreduce_ms"] = median("allreduce_ms", "mlp", "np2")
    mlp["allreduce_busbw_gbs"] = rounds[0]["np2"]["mlp"]["gradient_bytes"] / mlp[
        "allreduce_ms"] / 1e6
    # Two processes computing at once are slower than one alone (they share
    # memory bandwidth and caches), so the prediction starts from np2_alone's step.
    mlp["predicted_np2_step_ms"] = mlp["np2_alone_step_ms"] + mlp["allreduce_ms"]
    mlp["measured_over_predicted"] = paired(
        lambda np1, np2, alone: np2["step_ms"] / (alone["step_ms"] + np2["allreduce_ms"]), "mlp")
    results["goals"] = {"cnn_efficiency": f">= {EFFICIENCY_GOAL}",
                        "mlp_measured_over_predicted": f"within 1 +- {PREDICTION_TOLERANCE}"}
    return results


def _groups_text(groups):
    return {None: "hvdtrain's choice", 0: "none"}.get(groups, str(groups))


def report(results, output):
    print(f"weak scaling np=1 -> np=2, {results['controller']}, batch {results['batch_per_worker']}"
          f" per worker, allreduce groups {_groups_text(results['allreduce_groups'])},"
          f" 1 intra-op and 1 inter-op thread per process (medians of "
          f"{FLAGS.rounds} rounds; alone: np=2 with no gradient exchange)")
    print(f"{'model':<6}{'params':>10}{'np=1 ex/s':>11}{'np=2 ex/s':>11}{'alone ex/s':>12}"
          f"{'np=1 step':>11}{'np=2 step':>11}{'efficiency':>12}{'ceiling':>9}"
          f"{'of ceiling':>12}{'in CPU time':>13}")
    for model in ("cnn", "mlp"):
        r = results[model]
        print(f"{model:<6}{r['parameters']:>10,}{r['np1_examples_per_second']:>11.1f}"
              f"{r['np2_examples_per_second']:>11.1f}{r['np2_alone_examples_per_second']:>12.1f}"
              f"{r['np1_step_ms']:>9.1f}ms{r['np2_step_ms']:>9.1f}ms{r['efficiency']:>12.3f}"
              f"{r['ceiling']:>9.3f}{r['efficiency_of_ceiling']:>12.3f}"
              f"{r['cpu_efficiency']:>13.3f}")
    print("ceiling = alone / (2 x np=1): what this machine gives two processes that exchange "
          "nothing; of ceiling = np=2 / alone: what the exchange costs")
    print("cores each process had (its CPU time / wall time): " + "; ".join(
        f"{model} " + ", ".join(f"{results[model][f'{run}_core_share']:.2f} {run}" for run in RUNS)
        for model in ("cnn", "mlp")))
    mlp = results["mlp"]
    print(f"mlp at np=2: predicted step {mlp['predicted_np2_step_ms']:.1f} ms = alone step "
          f"{mlp['np2_alone_step_ms']:.1f} ms + grouped allreduce of its "
          f"{mlp['gradient_mb']:.1f} MB "
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

    figure, (rates, steps) = pyplot.subplots(1, 2, figsize=(10, 4))
    names = ["cnn", "mlp"]
    bars = {"np1": ("np=1", "tab:gray", 1), "np2": ("np=2, per worker", "tab:blue", 2),
            "np2_alone": ("np=2 alone (no exchange), per worker", "tab:green", 2)}
    for offset, (run, (label, color, workers)) in zip((-0.27, 0, 0.27), bars.items()):
        rates.bar([i + offset for i in range(2)],
                  [results[m][f"{run}_examples_per_second"] / workers for m in names], 0.27,
                  color=color, label=label)
    for i, model in enumerate(names):
        r = results[model]
        rates.annotate(f"efficiency {r['efficiency']:.2f}\nceiling {r['ceiling']:.2f}",
                       (i, r["np1_examples_per_second"]), ha="center", va="bottom",
                       xytext=(0, 3), textcoords="offset points", fontsize=8)
    rates.set_xticks(range(2), names)
    rates.set_ylabel("examples/s per worker")
    rates.set_ylim(0, 1.35 * max(results[m]["np1_examples_per_second"] for m in names))
    rates.legend(fontsize=7, loc="upper left")
    mlp = results["mlp"]
    steps.bar(0, mlp["np2_alone_step_ms"], color="tab:green", label="np=2 alone step")
    steps.bar(0, mlp["allreduce_ms"], bottom=mlp["np2_alone_step_ms"], color="tab:orange",
              label=f"grouped allreduce of {mlp['gradient_mb']:.0f} MB")
    steps.bar(1, mlp["np2_step_ms"], color="tab:blue", label="np=2 step")
    steps.set_xticks([0, 1], ["predicted", "measured"])
    steps.set_ylabel("mlp step, ms")
    steps.set_ylim(0, 1.35 * max(mlp["predicted_np2_step_ms"], mlp["np2_step_ms"]))
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
