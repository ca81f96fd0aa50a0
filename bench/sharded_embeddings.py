"""Embedding tables sharded across workers against replicated ones.

    python bench/sharded_embeddings.py [--rows_log2=20,22,24]

launches itself under `horovodrun -np 2` once per table size (one intra-op
thread per process) and trains a recommender (26 ids per example into one
table of 2**k x 16 float32, flattened, Dense 64, Dense 1; batch 512 per
worker, ids uniform over the table) three ways, side by side on the same
batches, one epoch at a time, the order turned each epoch:
  replicated_adam  keras.layers.Embedding on every worker, Keras's Adam: the
                   table's gradient is allgathered and Adam densifies it,
                   updating the whole table and both moment tables each step
                   (wide_and_deep's default, the baseline);
  replicated_sgd   the same table and exchange, plain SGD: Keras updates only
                   the looked-up rows (sparse updates, replicated table);
  sharded_adam     hvdtrain.layers.ShardedEmbedding: half the table on each
                   worker, lookups and gradients by alltoall, lazy Adam on
                   the looked-up rows (sparse updates, sharded table).
For each it reports:
  - the bytes of the table and its optimizer slots on one worker (memory per
    worker for the table; goal: sharded is 1/N of replicated Adam's);
  - its training rate relative to replicated_adam's, the median over the
    epochs after the first (goal: sharded_adam faster from 2**22 rows on);
  - the bytes one worker sends per step for the table, from the batches'
    ids: the allgather of its rows and their indices (replicated), or the
    alltoall of ids to their owners, the rows back and their gradients
    (sharded), ring collectives assumed; the dense layers' allreduce is the
    same in all three and left out.
Rank 0 prints a table and writes JSON.
"""

import json
import pathlib

from absl import app, flags

import horovod_workers

flags.DEFINE_list("rows_log2", ["20", "22", "24"], "Table sizes, as powers of 2 of the rows.")
flags.DEFINE_integer("epochs", 5, "Epochs each trains: one ratio per epoch after the first.")
flags.DEFINE_integer("steps", 12, "Steps per epoch.")
flags.DEFINE_integer("batch_size", 512, "Examples per batch on each worker.")
flags.DEFINE_integer("width", 16, "Values per table row.")
flags.DEFINE_integer("warmup_steps", 2, "Steps of each epoch left out of its throughput.")
flags.DEFINE_integer("window_steps", 5, "Steps per timed window.")
flags.DEFINE_string("output", "runs/bench/sharded_embeddings.json",
                    "Where rank 0 writes the results.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
flags.DEFINE_integer("rows", None, "Internal: the table's rows in a worker.")
FLAGS = flags.FLAGS
RUNS = ("replicated_adam", "replicated_sgd", "sharded_adam")
FEATURES = 26


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    results = {}
    for log2 in map(int, FLAGS.rows_log2):
        part = output.with_name(f"{output.stem}.{log2}.json")
        results[log2] = horovod_workers.run(
            __file__, part, rows=2**log2, epochs=FLAGS.epochs, steps=FLAGS.steps,
            batch_size=FLAGS.batch_size, width=FLAGS.width, warmup_steps=FLAGS.warmup_steps,
            window_steps=FLAGS.window_steps)
        part.unlink()
    output.write_text(json.dumps(results, indent=1))
    print(f"embedding tables at np=2: {FEATURES} ids per example, rows of {FLAGS.width} float32, "
          f"batch {FLAGS.batch_size} per worker, one intra-op thread each, Gloo; "
          f"{FLAGS.epochs - 1} epochs timed")
    print(f"{'rows':>6}{'run':>17}{'table MiB/worker':>18}{'/ first':>9}{'examples/s':>12}"
          f"{'/ first':>9}{'range':>14}{'KiB sent/step':>15}")
    for log2, r in results.items():
        for name in RUNS:
            ratios = r["ratios"].get(name)
            print(f"{'2^' + str(log2):>6}{name:>17}{r['table_bytes'][name] / 2**20:>18.1f}"
                  f"{r['table_bytes'][name] / r['table_bytes'][RUNS[0]]:>9.3f}"
                  f"{r['examples_per_second'][name]:>12.1f}" + (
                      f"{r['ratio'][name]:>9.3f}{min(ratios):>8.3f}-{max(ratios):.3f}"
                      if ratios else f"{'':>9}{'':>14}") +
                  f"{r['bytes_sent'][name] / 1024:>15.1f}")
    print("noise: replicated_adam's rate / its rate in the epoch before, per size: "
          + ", ".join(f"2^{k} {r['noise'][0]:.3f}-{r['noise'][1]:.3f}"
                      for k, r in results.items()) + f". JSON: {FLAGS.output}")


def work(scratch):
    import keras
    import numpy as np
    import tensorflow as tf

    import hvdtrain
    from hvdtrain import callbacks
    from hvdtrain.layers import ShardedEmbedding

    hvdtrain.init(intra_op_threads=1)
    rows, width, size = FLAGS.rows, FLAGS.width, hvdtrain.size()
    rng = np.random.default_rng(hvdtrain.rank())
    ids = rng.integers(0, rows, (FLAGS.steps * FLAGS.batch_size, FEATURES))
    labels = rng.random((len(ids), 1)) < 0.3
    batches = tf.data.Dataset.from_tensor_slices((ids, labels.astype("float32"))).batch(
        FLAGS.batch_size).cache()

    def model(name):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((FEATURES,), dtype="int64")
        table = (ShardedEmbedding(rows, width) if name.startswith("sharded")
                 else keras.layers.Embedding(rows, width))
        x = keras.layers.Dense(64, activation="relu")(keras.layers.Flatten()(table(inputs)))
        net = keras.Model(inputs, keras.layers.Dense(1)(x))
        optimizer = (keras.optimizers.SGD(0.01) if name.endswith("sgd")
                     else keras.optimizers.Adam(0.001))
        net.compile(optimizer=hvdtrain.DistributedOptimizer(optimizer),
                    loss=keras.losses.BinaryCrossentropy(from_logits=True))
        net.optimizer.build(net.trainable_variables)
        return net, table

    def table_bytes(net, table):
        """The table's and its optimizer slots' bytes on this worker: the
        variables of the table's shape here (no other layer has it)."""
        shape = tuple(table.embeddings.shape)
        return sum(int(np.prod(shape)) * np.dtype(v.dtype).itemsize
                   for v in [*net.variables, *net.optimizer.variables] if tuple(v.shape) == shape)

    def bytes_sent(name):
        """Per step, averaged over the epoch's batches (see the docstring)."""
        sent = []
        for batch in np.split(ids, FLAGS.steps):
            if name.startswith("replicated"):   # this worker's rows and int64 indices
                sent.append(batch.size * (4 * width + 8) * (size - 1))
                continue
            unique = np.unique(batch)
            away = np.count_nonzero(unique % size != hvdtrain.rank())
            sent.append(away * 8 + 2 * away * 4 * width)   # ids; rows back; gradients
        return float(np.mean(sent))

    runs = {}
    for name in RUNS:
        net, table = model(name)
        meter = callbacks.Throughput(FLAGS.batch_size, FLAGS.warmup_steps, FLAGS.window_steps)
        runs[name] = (net, callbacks.in_order([meter, callbacks.BroadcastInitialState(0)]),
                      meter, table_bytes(net, table))

    def fit(name, epoch):
        net, chosen, meter, _ = runs[name]
        net.fit(batches, epochs=epoch + 1, initial_epoch=epoch, callbacks=chosen, verbose=0)
        return meter.epoch_measurement.total.mean if epoch else None

    measured = horovod_workers.side_by_side(RUNS, fit, FLAGS.epochs)
    if hvdtrain.is_main_process():
        pathlib.Path(FLAGS.output).write_text(json.dumps(dict(
            measured, rows=rows, workers=size, table_bytes={n: runs[n][3] for n in RUNS},
            bytes_sent={n: bytes_sent(n) for n in RUNS}), indent=1))


if __name__ == "__main__":
    app.run(horovod_workers.main(launch, work))
