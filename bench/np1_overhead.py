"""What hvdtrain costs a single process: its training path against plain
Keras `model.fit` on the same model, data and optimizer, in one process.

    python bench/np1_overhead.py [--epochs=30]

launches itself under `horovodrun -np 1` (one intra-op thread by default)
and trains the digits_cnn recipe's CNN (batch 32, SGD momentum 0.9) twice
side by side, one epoch at a time, alternating which goes first:
  hvdtrain  the trainer's own set-up: hvdtrain.init, DistributedOptimizer as
            the trainer wraps it, and the callbacks trainer._callbacks makes
            (throughput meter, broadcast, metric averaging, NaN check,
            learning-rate warm-up, checkpoints, run log, TensorBoard, stall
            watchdog); the recipe's settings (2 epochs of warm-up) over 30 epochs;
  keras     the same model compiled with a plain SGD, the same input
            pipeline and epochs, with hvdtrain's throughput meter as its
            only callback.
Each epoch is its own `fit` (as the trainer fits the rest of an epoch after a
resume), so the two alternate every half second or so and drift on a busy
machine hits both alike. Both are measured by the throughput meter: windows
of steps after warm-up steps, inside epochs, so epoch-end work (checkpoints,
logs) is left out and only training steps are compared. The report is the
median over epochs of hvdtrain / keras; goal: >= 0.99 (at most 1% slower).
The first epoch is left out of it: there each hvdtrain callback's per-step
hooks are timed instead (median CPU microseconds per step; goal: none above
0.3% of a step), which says where a gap comes from. The learning rate is
set in the step and the stop vote comes out of it (run/learning_rate.py,
run/executions.py): neither has a hook of its own. Rank 0 prints a table
and writes JSON.
"""

import collections
import contextlib
import json
import pathlib
import statistics
import time

from absl import app, flags

import horovod_workers

RECIPE = "digits_cnn"
GOAL = 0.99
HOOK_GOAL = 0.003   # of a step, for each callback's per-step hooks

flags.DEFINE_integer("epochs", 30, "Epochs each trains: one ratio per epoch after the first.")
flags.DEFINE_integer("intra_op_threads", 1, "TensorFlow's intra-op threads, for both.")
flags.DEFINE_integer("warmup_steps", None, "Steps of each fit left out (default: the trainer's).")
flags.DEFINE_integer("window_steps", None, "Steps per timed window (default: the trainer's).")
flags.DEFINE_string("output", "runs/bench/np1_overhead.json", "Where rank 0 writes the results.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS


def launch():
    pathlib.Path(FLAGS.output).parent.mkdir(parents=True, exist_ok=True)
    r = horovod_workers.run(__file__, FLAGS.output, np=1, epochs=FLAGS.epochs,
                            intra_op_threads=FLAGS.intra_op_threads,
                            warmup_steps=FLAGS.warmup_steps, window_steps=FLAGS.window_steps)
    print(f"hvdtrain against Keras model.fit at np=1: {RECIPE}, batch {r['batch_size']}, "
          f"{r['intra_op_threads']} intra-op thread(s), {r['epochs']} epochs; examples/s over "
          f"windows of {r['window_steps']} steps after {r['warmup_steps']} per epoch (medians)")
    print(f"{'keras':>10}{'hvdtrain':>10}{'hvdtrain/keras':>16}{'range over epochs':>20}")
    print(f"{r['keras']:>10.1f}{r['hvdtrain']:>10.1f}{r['ratio']:>16.3f}"
          f"{min(r['ratios']):>12.3f}-{max(r['ratios']):.3f}")
    step_us = r["batch_size"] / r["keras"] * 1e6
    print(f"per-step hooks of hvdtrain's callbacks in a learning-rate warm-up epoch (median "
          f"CPU us per step, % of keras's {step_us / 1e3:.2f} ms step):")
    for name, us in sorted(r["hook_us_per_step"].items(), key=lambda item: -item[1]):
        print(f"  {name:<34}{us:>8.1f}{us / step_us:>8.1%}")
    verdict = "met" if r["ratio"] >= GOAL else "NOT met"
    costly = [name for name, us in r["hook_us_per_step"].items() if us / step_us > HOOK_GOAL]
    print(f"goal: hvdtrain/keras >= {GOAL} (at most 1% slower): {verdict}; each callback's "
          f"hooks at most {HOOK_GOAL:.1%} of a step: "
          f"{'NOT met by ' + ', '.join(costly) if costly else 'met'}. JSON: {FLAGS.output}")


def work(scratch):
    import keras

    import hvdtrain
    from hvdtrain import callbacks as hvdtrain_callbacks
    from hvdtrain import recipe as recipe_lib
    from hvdtrain.run import compiled_model, learning_rate, trainer

    hvdtrain.init(intra_op_threads=FLAGS.intra_op_threads)
    recipe = recipe_lib.get(RECIPE)
    config = recipe_lib.make_config(
        RECIPE, model_dir=scratch, epochs=FLAGS.epochs, verbose=0, export=False,
        intra_op_threads=FLAGS.intra_op_threads, throughput_warmup_steps=FLAGS.warmup_steps,
        throughput_window_steps=FLAGS.window_steps)

    def model():
        keras.utils.set_random_seed(config.seed)
        return recipe.build_model(config)

    # As trainer.train sets up a run (one worker: the rate needs no scaling).
    hvd_model = compiled_model.compile_model(model(), recipe, config)
    learning_rate.set_up(hvd_model.optimizer, config)
    # With its stop vote in the step, as a run that stops cleanly on a signal.
    vote = trainer.stop_vote(hvd_model)
    splits = recipe.load_data(config)
    learning_rate.stand_at(hvd_model.optimizer, config, 0, splits.train.steps, replicas=1)
    started = trainer._callbacks(
        None, vote, config, pathlib.Path(scratch), splits.train.steps,
        splits.validation.steps, start=(0, 0), resumed=False)
    hvd_callbacks, hvd_meter = started.ordered, started.meter

    keras_model = model()
    keras_model.compile(optimizer=compiled_model.keras_optimizer(config, config.learning_rate),
                        loss=recipe.loss, jit_compile=False,
                        metrics=[m() if isinstance(m, type) else m for m in recipe.metrics])
    keras_train = recipe.load_data(config).train
    keras_meter = hvdtrain_callbacks.Throughput(config.batch_size, config.throughput_warmup_steps,
                                                config.throughput_window_steps)

    runs = {"hvdtrain": (hvd_model, splits.train, hvd_callbacks, hvd_meter),
            "keras": (keras_model, keras_train, [keras_meter], keras_meter)}

    def fit(name, epoch):
        net, data, callbacks, meter = runs[name]
        net.fit(data.for_epochs(epoch + 1, epoch), epochs=epoch + 1, initial_epoch=epoch,
                steps_per_epoch=data.steps, callbacks=callbacks, verbose=0, shuffle=False)
        return meter.epoch_measurement.total.mean

    # The first epoch (one of learning-rate warm-up) times hvdtrain's hooks.
    fit("keras", 0)
    with hook_timer(hvd_callbacks) as hook_us:
        fit("hvdtrain", 0)
    rates = {name: [] for name in runs}
    for epoch in range(1, config.epochs):
        for name in list(runs)[::1 if epoch % 2 else -1]:
            rates[name].append(fit(name, epoch))
    ratios = [h / k for h, k in zip(rates["hvdtrain"], rates["keras"])]
    result = {name: statistics.median(r) for name, r in rates.items()}
    result.update(ratio=statistics.median(ratios), ratios=ratios, rates=rates, goal=GOAL,
                  hook_us_per_step=hook_us, batch_size=config.batch_size,
                  epochs=config.epochs, warmup_steps=config.throughput_warmup_steps,
                  window_steps=config.throughput_window_steps,
                  intra_op_threads=FLAGS.intra_op_threads,
                  hvdtrain_callbacks=[type(c).__name__ for c in hvd_callbacks])
    pathlib.Path(FLAGS.output).write_text(json.dumps(result, indent=1))


@contextlib.contextmanager
def hook_timer(callbacks):
    """Yields {callback class: microseconds per step in its per-step hooks},
    filled in when the block ends: the median call of each hook, in thread
    CPU time (waiting for a core on a busy machine is not the callback's
    cost, nor is a one-off first call)."""
    seconds = collections.defaultdict(list)
    for callback in callbacks:
        for hook in ("on_train_batch_begin", "on_train_batch_end"):
            setattr(callback, hook, _timed(getattr(callback, hook), seconds[callback, hook]))
    per_step = {}
    try:
        yield per_step
    finally:
        for callback in callbacks:
            del callback.on_train_batch_begin, callback.on_train_batch_end
        for (callback, _), calls in seconds.items():
            name = type(callback).__name__
            per_step[name] = per_step.get(name, 0.0) + statistics.median(calls) * 1e6


def _timed(hook, calls):
    def timed(*args, **kwargs):
        start = time.thread_time()
        hook(*args, **kwargs)
        calls.append(time.thread_time() - start)
    return timed


if __name__ == "__main__":
    app.run(horovod_workers.main(launch, work))
