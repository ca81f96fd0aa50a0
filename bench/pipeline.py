"""Pipeline parallelism (P=2) at np=2: its bubble against theory, the
activations 1F1B holds against GPipe, the model's state each worker holds,
and its rate against data parallelism.

    python bench/pipeline.py [--width=1024 --layers=8 --global_batch=64 ...]

launches itself under `horovodrun -np 2` (one intra-op thread per process)
and trains a deep MLP (`layers` dense layers of `width`, cut into two stages
of equal parameters) several ways on the same global batch, one epoch at a
time, the order turned each epoch:
  data_parallel     the whole model on each worker, half the batch each (the
                    baseline for the rate);
  1f1b_M2 .. M8     two stages fed M = P, 2P, 4P micro-batches, 1F1B;
  gpipe_M8          the same at M = 4P under GPipe;
  alone_M2 .. M8    each rank's own stage, its M micro-batches forward and
                    backward with nothing to wait for: the stage's compute.
It reports, for each pipelined run:
  - the stages' idle fraction, 1 - (their compute alone / their pipelined
    step), against the bubble's theory (P - 1) / (M + P - 1);
  - the memory its activations take beyond computing one micro-batch at a
    time: its peak (TensorFlow's CPU allocator, the higher stage's) less
    alone_M's, against GPipe's at M = 4P; beside it the micro-batches the
    first stage holds at once (P for 1F1B, M for GPipe);
  - its rate against data_parallel's, the median over the epochs after the
    first (each stage counts its share of the batch, 1/P);
and the weights and AdamW state a worker holds (TensorFlow's CPU
allocator), a stage's against the whole model's (goal: 1/P).
Rank 0 prints a table and writes JSON.
"""

import json
import os
import pathlib

from absl import app, flags

# TensorFlow's CPU allocator counts its bytes only as a BFC allocator: set
# before TensorFlow loads in the workers.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import horovod_workers

flags.DEFINE_integer("width", 256, "Width of each dense layer.")
flags.DEFINE_integer("layers", 8, "Dense layers, half on each stage.")
flags.DEFINE_integer("global_batch", 2048, "Examples per step, over the replicas.")
flags.DEFINE_integer("epochs", 5, "Epochs each run trains: one ratio per epoch after the first.")
flags.DEFINE_integer("steps", 8, "Steps per epoch.")
flags.DEFINE_integer("warmup_steps", 2, "Steps of each epoch left out of its throughput.")
flags.DEFINE_integer("window_steps", 4, "Steps per timed window.")
flags.DEFINE_string("output", "runs/bench/pipeline.json", "Where rank 0 writes the results.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS
STAGES = 2
MICROBATCHES = (STAGES, 2 * STAGES, 4 * STAGES)
PIPELINED = [f"1f1b_M{m}" for m in MICROBATCHES] + [f"gpipe_M{MICROBATCHES[-1]}"]
RUNS = ["data_parallel", *PIPELINED, *(f"alone_M{m}" for m in MICROBATCHES)]


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    r = horovod_workers.run(
        __file__, output, width=FLAGS.width, layers=FLAGS.layers,
        global_batch=FLAGS.global_batch, epochs=FLAGS.epochs, steps=FLAGS.steps,
        warmup_steps=FLAGS.warmup_steps, window_steps=FLAGS.window_steps)
    print(f"MLP of {FLAGS.layers} x {FLAGS.width} at np=2, P={STAGES}: global batch "
          f"{FLAGS.global_batch}, SGD; one intra-op thread each, Gloo; "
          f"{FLAGS.epochs - 1} epochs timed")
    print(f"{'run':>14}{'idle':>8}{'theory':>8}{'held MiB':>10}{'/ gpipe':>9}{'held':>6}"
          f"{'rate / DP':>11}{'range':>14}")
    gpipe = r["held_bytes"][PIPELINED[-1]]
    for name in PIPELINED:
        ratios = r["ratios"][name]
        print(f"{name:>14}{r['idle'][name]:>8.3f}{r['theory'][name]:>8.3f}"
              f"{r['held_bytes'][name] / 2**20:>10.1f}{r['held_bytes'][name] / gpipe:>9.3f}"
              f"{r['held'][name]:>6}{r['ratio'][name]:>11.3f}"
              f"{min(ratios):>8.3f}-{max(ratios):.3f}")
    state = r["state_bytes"]
    print(f"weights + AdamW state per worker: {state['pipelined'] / 2**20:.2f} MiB at P={STAGES}, "
          f"{state['data_parallel'] / 2**20:.2f} MiB data parallel: "
          f"{state['pipelined'] / state['data_parallel']:.3f} (goal: 1/P)")
    print(f"data_parallel: {r['examples_per_second']['data_parallel']:.1f} examples/s; noise: "
          f"its rate / its rate in the epoch before: {r['noise'][0]:.3f}-{r['noise'][1]:.3f}. "
          f"JSON: {FLAGS.output}")


def work(scratch):
    import horovod.tensorflow as hvd
    import keras
    import numpy as np
    import tensorflow as tf

    import hvdtrain
    from hvdtrain import callbacks, layout
    from hvdtrain.parallel import pipeline_parallel

    hvdtrain.init(intra_op_threads=1, pipeline_parallel=STAGES)
    rng = np.random.default_rng(0)
    examples = FLAGS.steps * FLAGS.global_batch
    x = rng.normal(size=(examples, FLAGS.width)).astype("float32")
    y = rng.normal(size=(examples, FLAGS.width)).astype("float32")

    def mlp():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((FLAGS.width,))
        h = inputs
        for i in range(FLAGS.layers):
            h = keras.layers.Dense(FLAGS.width, activation="gelu", name=f"dense_{i}")(h)
        return keras.Model(inputs, h)

    def build(name):
        kind, _, microbatches = name.partition("_M")
        if kind == "data_parallel":
            layout.arrange(1)
            model, data = mlp(), slice(hvdtrain.rank(), None, hvdtrain.size())
            batch = share = FLAGS.global_batch // hvdtrain.size()
        elif kind == "alone":
            # This rank's stage by itself: a one-stage pipeline of it, its
            # outputs' loss standing in for the next stage's gradient.
            layout.arrange(1)
            mine = layout.Layout(hvdtrain.size(), pipeline=STAGES).position(hvdtrain.rank())[2]
            stage = pipeline_parallel.cut(mlp(), stages=STAGES)[mine]
            model = pipeline_parallel.Pipeline([keras.Model(stage.input, stage.output)],
                                               int(microbatches))
            data, batch = slice(None), FLAGS.global_batch
            share = batch / STAGES
        else:
            layout.arrange(1, STAGES)
            model = pipeline_parallel.Pipeline(pipeline_parallel.cut(mlp(), stages=STAGES),
                                               int(microbatches), kind)
            data, batch = slice(None), FLAGS.global_batch
            share = batch / STAGES   # every stage of the replica steps through its batch
        optimizer = keras.optimizers.SGD(1e-3)
        if kind != "alone":
            optimizer = hvdtrain.DistributedOptimizer(optimizer, process_set=layout.data_set())
        model.compile(optimizer, "mse")
        meter = callbacks.Throughput(share, FLAGS.warmup_steps, FLAGS.window_steps)
        return dict(model=model, kind=kind, batch=batch, meter=meter, x=x[data], y=y[data])

    kept = []   # the models measured: freed later, not while the next is measured

    def state_bytes(pipelined):
        """The bytes of weights and AdamW state this rank holds, the whole
        model's or, pipelined, its stage's (the others' never made)."""
        layout.arrange(1, STAGES if pipelined else 1)
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        if pipelined:
            with pipeline_parallel.deferred():
                whole = mlp()
            model = pipeline_parallel.Pipeline(pipeline_parallel.cut(whole, stages=STAGES), STAGES)
        else:
            model = mlp()
        optimizer = keras.optimizers.AdamW(1e-3)
        optimizer.build(model.trainable_variables)
        held = tf.config.experimental.get_memory_info("CPU:0")["current"] - before
        kept.append((model, optimizer))
        return max(hvd.allgather_object(held))

    state = {"data_parallel": state_bytes(False), "pipelined": state_bytes(True)}
    kept.clear()
    runs = {name: build(name) for name in RUNS}
    peaks = {name: 0 for name in RUNS}

    def fit(name, epoch):
        run = runs[name]
        layout.arrange(1, STAGES if run["kind"] in ("1f1b", "gpipe") else 1)
        tf.config.experimental.reset_memory_stats("CPU:0")
        run["model"].fit(run["x"], run["y"], batch_size=run["batch"], epochs=epoch + 1,
                         initial_epoch=epoch, shuffle=False, verbose=0,
                         callbacks=[run["meter"]])
        if epoch:   # the first epoch's tracing allocates on its own
            peaks[name] = max(peaks[name],
                              tf.config.experimental.get_memory_info("CPU:0")["peak"])
        return run["meter"].epoch_measurement.total.mean if epoch else None

    measured = horovod_workers.side_by_side(RUNS, fit, FLAGS.epochs)
    rates = measured["examples_per_second"]
    idle = {name: 1 - rates[name] / rates[f"alone_M{name.partition('_M')[2]}"]
            for name in PIPELINED}
    peaks = {name: max(hvd.allgather_object(peak)) for name, peak in peaks.items()}
    if hvdtrain.is_main_process():
        # The first stage holds the most: P micro-batches under 1F1B, M under GPipe.
        held = {name: pipeline_parallel.peak_stashed(
            pipeline_parallel.SCHEDULES[name.partition("_M")[0]](
                STAGES, int(name.partition("_M")[2]), 0)) for name in PIPELINED}
        pathlib.Path(FLAGS.output).write_text(json.dumps(dict(
            measured, workers=hvdtrain.size(),
            idle=idle,
            theory={n: pipeline_parallel.bubble(STAGES, int(n.partition("_M")[2]))
                    for n in PIPELINED},
            held_bytes={n: peaks[n] - peaks[f"alone_M{n.partition('_M')[2]}"]
                        for n in PIPELINED},
            held=held, state_bytes=state), indent=1))


if __name__ == "__main__":
    app.run(horovod_workers.main(launch, work))
