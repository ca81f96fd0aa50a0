"""What --jit_compile and --profile_steps do to a training step, at np=2.

    python bench/step_options.py [--epochs=12]

launches itself under `horovodrun -np 2` (one intra-op thread per process)
and trains the small CNN (32x32x3, batch 32 per worker, SGD momentum 0.9,
hvdtrain's DistributedOptimizer) three times side by side on one synthetic
batch, one epoch at a time, the order turned each epoch:
  plain     compiled as the trainer does without XLA;
  xla       the same with hvdtrain.jit_compile: the forward and backward
            pass and the update compiled by XLA, the allreduce between them;
  profiled  plain, with rank 0's TensorFlow profiler recording steps 3-5 of
            its first epoch (--profile_steps=3:5).
The first epoch traces, compiles and profiles, and is left out. In each
later epoch the throughput meter times windows of steps after warm-up
steps; the report is the median over epochs of xla / plain (goal: above 1)
and profiled / plain (goal: within noise, the spread of plain / plain
between consecutive epochs: the profiler runs in its window only). Rank 0
prints a table and writes JSON.
"""

import json
import pathlib
import statistics

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
RUNS = ("plain", "xla", "profiled")
PROFILED_STEPS = (3, 5)


def launch():
    pathlib.Path(FLAGS.output).parent.mkdir(parents=True, exist_ok=True)
    r = horovod_workers.run(__file__, FLAGS.output, epochs=FLAGS.epochs, steps=FLAGS.steps,
                            batch_size=FLAGS.batch_size, image_size=FLAGS.image_size,
                            warmup_steps=FLAGS.warmup_steps, window_steps=FLAGS.window_steps)
    print(f"a training step with and without XLA, and after a profiled window: small CNN "
          f"{r['image_size']}x{r['image_size']}x3, np=2 (Gloo), batch {r['batch_size']} per "
          f"worker, one intra-op thread each; {r['epochs'] - 1} epochs timed")
    print(f"{'run':>10}{'examples/s':>14}{'/ plain':>10}{'range over epochs':>20}")
    for name in RUNS:
        ratios = r["ratios"].get(name)
        print(f"{name:>10}{r['examples_per_second'][name]:>14.1f}"
              + (f"{r['ratio'][name]:>10.3f}{min(ratios):>12.3f}-{max(ratios):.3f}"
                 if ratios else ""))
    print(f"noise: plain / plain between consecutive epochs, {r['noise'][0]:.3f}-"
          f"{r['noise'][1]:.3f}; the profile recorded steps {r['profiled_steps']}. "
          f"JSON: {FLAGS.output}")


def work(scratch):
    import keras

    import hvdtrain
    from hvdtrain import callbacks, data
    from small_cnn import small_cnn

    hvdtrain.init(intra_op_threads=1)
    batches = data.synthetic((FLAGS.image_size, FLAGS.image_size, 3), 10, FLAGS.batch_size,
                             FLAGS.steps, seed=hvdtrain.rank())

    def model(jit):
        keras.utils.set_random_seed(0)
        net = small_cnn()
        net.compile(optimizer=hvdtrain.DistributedOptimizer(
            keras.optimizers.SGD(0.01, momentum=0.9)), jit_compile=False,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return hvdtrain.jit_compile(net) if jit else net

    runs = {}
    for name in RUNS:
        meter = callbacks.Throughput(FLAGS.batch_size, FLAGS.warmup_steps, FLAGS.window_steps)
        chosen = [meter, callbacks.BroadcastInitialState(0)]
        if name == "profiled" and hvdtrain.is_main_process():
            chosen.append(callbacks.ProfilerWindow(pathlib.Path(scratch) / "profile",
                                                   *PROFILED_STEPS))
        runs[name] = (model(name == "xla"), callbacks.in_order(chosen), meter)

    def fit(name, epoch):
        net, chosen, meter = runs[name]
        net.fit(batches.for_epochs(epoch + 1, epoch), epochs=epoch + 1, initial_epoch=epoch,
                steps_per_epoch=FLAGS.steps, callbacks=chosen, verbose=0)
        return meter.epoch_measurement.total.mean if epoch else None

    for name in RUNS:   # tracing, XLA's compiling, the profiled window
        fit(name, 0)
    rates = {name: [] for name in RUNS}
    for epoch in range(1, FLAGS.epochs):
        for name in RUNS[::1 if epoch % 2 else -1]:
            rates[name].append(fit(name, epoch))
    plain = rates["plain"]
    ratios = {name: [a / b for a, b in zip(rates[name], plain)] for name in RUNS[1:]}
    drift = [b / a for a, b in zip(plain, plain[1:])]
    if hvdtrain.is_main_process():
        pathlib.Path(FLAGS.output).write_text(json.dumps(dict(
            examples_per_second={n: statistics.median(r) for n, r in rates.items()},
            ratio={n: statistics.median(r) for n, r in ratios.items()}, ratios=ratios,
            rates=rates, noise=[min(drift, default=1.0), max(drift, default=1.0)],
            profiled_steps=list(PROFILED_STEPS), epochs=FLAGS.epochs,
            batch_size=FLAGS.batch_size, image_size=FLAGS.image_size,
            steps=FLAGS.steps), indent=1))


if __name__ == "__main__":
    app.run(horovod_workers.main(launch, work))
