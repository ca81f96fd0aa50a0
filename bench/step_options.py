"""What --jit_compile and --profile_steps do to a training step.

    python bench/step_options.py [--epochs=12]

launches itself under `horovodrun -np 2`, then `-np 1` (one intra-op thread
per process), and trains the small CNN (32x32x3, batch 32 per worker, SGD
momentum 0.9) side by side on one synthetic batch, one epoch at a time, the
order turned each epoch. At np=2, with hvdtrain's DistributedOptimizer:
  plain      compiled as the trainer does without XLA;
  xla        the same with hvdtrain.jit_compile: the forward and backward
             pass and the update compiled by XLA, the allreduce between them;
  profiled   plain, with rank 0's TensorFlow profiler recording steps 3-5 of
             its first epoch (--profile_steps=3:5).
At np=1, where a step has no collective and Keras can compile it whole:
  xla        as above;
  keras_xla  plain Keras, its whole train step compiled (jit_compile=True).
The first epoch traces, compiles and profiles, and is left out. In each
later epoch the throughput meter times windows of steps after warm-up
steps; the report is the median over epochs of xla / plain (what XLA gives
here), profiled / plain (goal: within noise, the spread of plain / plain
between consecutive epochs: the profiler runs in its window only), and at
np=1 xla / keras_xla (goal: within noise: cutting the step at the
collectives costs XLA nothing). Rank 0 prints a table and writes JSON.
"""

import json
import pathlib

from absl import app, flags

import horovod_workers

flags.DEFINE_integer("epochs", 12, "Epochs each trains: one ratio per epoch after the first.")
flags.DEFINE_integer("steps", 40, "Steps per epoch.")
flags.DEFINE_integer("batch_size", 32, "Examples per batch on each worker.")
flags.DEFINE_integer("image_size", 32, "Height and width of the synthetic images.")
flags.DEFINE_integer("warmup_steps", 5, "Steps of each epoch left out of its throughput.")
flags.DEFINE_integer("window_steps", 5, "Steps per timed window.")
flags.DEFINE_string("output", "runs/bench/step_options.json", "Where rank 0 writes the results.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS
flags.DEFINE_list("runs", None, "Internal: the runs a worker trains, the first the baseline.")
# At np=2, then at np=1; the first of each is the baseline.
RUNS = {2: ("plain", "xla", "profiled"), 1: ("keras_xla", "xla")}
PROFILED_STEPS = (3, 5)


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    results = {}
    for np, runs in RUNS.items():
        part = output.with_name(f"{output.stem}.np{np}.json")
        results[f"np{np}"] = horovod_workers.run(
            __file__, part, np=np, runs=",".join(runs), epochs=FLAGS.epochs, steps=FLAGS.steps,
            batch_size=FLAGS.batch_size, image_size=FLAGS.image_size,
            warmup_steps=FLAGS.warmup_steps, window_steps=FLAGS.window_steps)
        part.unlink()
    output.write_text(json.dumps(results, indent=1))
    print(f"a training step with and without XLA, and after a profiled window: small CNN "
          f"{FLAGS.image_size}x{FLAGS.image_size}x3, batch {FLAGS.batch_size} per worker, one "
          f"intra-op thread each, Gloo; {FLAGS.epochs - 1} epochs timed")
    print(f"{'np':>3}{'run':>11}{'examples/s':>12}{'/ first':>9}{'range over epochs':>20}"
          f"{'noise':>15}")
    for np, runs in RUNS.items():
        r = results[f"np{np}"]
        for name in runs:
            ratios = r["ratios"].get(name)
            print(f"{np:>3}{name:>11}{r['examples_per_second'][name]:>12.1f}" + (
                f"{r['ratio'][name]:>9.3f}{min(ratios):>12.3f}-{max(ratios):.3f}"
                f"{r['noise'][0]:>10.3f}-{r['noise'][1]:.3f}" if ratios else ""))
    print(f"noise: the first run's rate / its rate in the epoch before; the profile recorded "
          f"steps {list(PROFILED_STEPS)}. JSON: {FLAGS.output}")


def work(scratch):
    import keras

    import hvdtrain
    from hvdtrain import callbacks, data
    from small_cnn import small_cnn

    hvdtrain.init(intra_op_threads=1)
    batches = data.synthetic((FLAGS.image_size, FLAGS.image_size, 3), 10, FLAGS.batch_size,
                             FLAGS.steps, seed=hvdtrain.rank())

    def model(name):
        keras.utils.set_random_seed(0)
        net = small_cnn(image_size=FLAGS.image_size)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        net.compile(optimizer=optimizer if name == "keras_xla" else
                    hvdtrain.DistributedOptimizer(optimizer), jit_compile=name == "keras_xla",
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return hvdtrain.jit_compile(net) if name == "xla" else net

    names = tuple(FLAGS.runs)
    runs = {}
    for name in names:
        meter = callbacks.Throughput(FLAGS.batch_size, FLAGS.warmup_steps, FLAGS.window_steps)
        chosen = [meter, callbacks.BroadcastInitialState(0)]
        if name == "profiled" and hvdtrain.is_main_process():
            chosen.append(callbacks.ProfilerWindow(pathlib.Path(scratch) / "profile",
                                                   *PROFILED_STEPS))
        runs[name] = (model(name), callbacks.in_order(chosen), meter)

    def fit(name, epoch):
        net, chosen, meter = runs[name]
        net.fit(batches.for_epochs(epoch + 1, epoch), epochs=epoch + 1, initial_epoch=epoch,
                steps_per_epoch=FLAGS.steps, callbacks=chosen, verbose=0)
        return meter.epoch_measurement.total.mean if epoch else None

    # The first epoch traces, compiles with XLA and records the profiled window.
    measured = horovod_workers.side_by_side(names, fit, FLAGS.epochs)
    if hvdtrain.is_main_process():
        pathlib.Path(FLAGS.output).write_text(json.dumps(
            dict(measured, workers=hvdtrain.size()), indent=1))


if __name__ == "__main__":
    app.run(horovod_workers.main(launch, work))
