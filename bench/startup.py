"""Time from launch to the end of the first training step, at np=1 and
np=2, and what checkpoints cost as a share of an epoch.

    python bench/startup.py [--rounds=3]

launches `horovodrun -np N` (both N through horovodrun, as the demo runs)
of this script's worker in alternating rounds (np=1, np=2, then np=2, np=1,
...), noting the wall-clock time just before. The worker runs what `hvdtrain
train --recipe=digits_cnn --epochs=1` runs (hvdtrain.train on the recipe's
settings; no checkpoints or export, which come after the first step), with
marks at the ends of the trainer's stages (wrappers around runtime.init and
the recipe's load_data, and the throughput meter's first batch). Rank 0's
stages, in seconds:
  launcher    from launch to the worker process's start (horovodrun's own
              start-up, then starting the workers; the kernel's start time);
  python      interpreter start-up to the worker's main();
  imports     TensorFlow, Keras, Horovod, hvdtrain, the recipe (TFDS);
  init        hvdtrain.init: hvd.init (the ranks' rendezvous), threads;
  model       the recipe's model built, DistributedOptimizer, compile;
  data        the recipe's input pipeline (TFDS, sharding, the steps agreed);
  setup       resume check, callbacks, run log, until fit starts;
  first step  tracing the train step, the broadcast, the step itself.
Medians over rounds; np=2 / np=1 per stage. Checkpoint cost: this then runs
bench/checkpoint_cost.py as it is (np=2 unless --checkpoint_cost_flags,
passed through, say otherwise), which prints its own table, and puts its
JSON into this one. Prints a table and writes JSON.
"""

import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

import horovod_workers

RECIPE = "digits_cnn"
STAGES = ("launcher", "python", "imports", "init", "model", "data", "setup", "first step")
CHECKPOINT_COST = pathlib.Path(__file__).with_name("checkpoint_cost.py")

flags.DEFINE_integer("rounds", 3, "Rounds, each an np=1 and an np=2 launch.")
flags.DEFINE_list("checkpoint_cost_flags", [],
                  "Flags for bench/checkpoint_cost.py, e.g. --saves=1,--epochs=2.")
flags.DEFINE_string("output", "runs/bench/startup.json", "Where the results go.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    runs = {1: [], 2: []}
    for index in range(FLAGS.rounds):
        for np in (1, 2) if index % 2 == 0 else (2, 1):
            launched = time.time()
            marks = horovod_workers.run(__file__, output.with_suffix(f".np{np}.json"), np=np)
            runs[np].append(stages(launched, marks))
    cost_output = output.with_name("checkpoint_cost.json")
    subprocess.run([sys.executable, CHECKPOINT_COST, f"--output={cost_output}",
                    *FLAGS.checkpoint_cost_flags], check=True)
    results = {"recipe": RECIPE, "rounds": runs,
               "medians": {np: {stage: statistics.median(r[stage] for r in rs)
                                for stage in [*STAGES, "total"]} for np, rs in runs.items()},
               "checkpoint_cost": json.loads(cost_output.read_text())}
    output.write_text(json.dumps(results, indent=1))
    report(results, output)


def stages(launched, marks):
    """Seconds of each stage, and the total, from rank 0's wall-clock marks."""
    times = [launched, *(marks[stage] for stage in STAGES)]
    result = {stage: end - start for stage, start, end in zip(STAGES, times, times[1:])}
    result["total"] = times[-1] - launched
    return result


def report(results, output):
    medians = results["medians"]
    print(f"time to the first training step, {RECIPE} through hvdtrain.train under horovodrun, "
          f"seconds from launch (medians of {FLAGS.rounds} rounds)")
    print(f"{'stage':<12}{'np=1':>8}{'np=2':>8}{'np=2/np=1':>11}")
    for stage in [*STAGES, "total"]:
        one, two = medians[1][stage], medians[2][stage]
        print(f"{stage:<12}{one:>8.2f}{two:>8.2f}{two / one:>11.2f}")
    digits = results["checkpoint_cost"]["digits_cnn"]
    print(f"checkpoint save against an epoch ({CHECKPOINT_COST.name}): {RECIPE} "
          f"{digits['save_seconds']:.3f} s of a {digits['epoch_seconds']:.2f} s epoch = "
          f"{digits['share']:.2%}. JSON: {output}")


def process_start():
    """This process's start as wall-clock time (the kernel's record, in clock ticks)."""
    fields = pathlib.Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def work():
    marks = {"launcher": process_start(), "python": time.time()}
    from unittest import mock

    from hvdtrain import callbacks, runtime
    from hvdtrain import recipe as recipe_lib
    from hvdtrain.run import trainer

    # As `hvdtrain train` does before training; this imports the recipe's module (TFDS) too.
    config = recipe_lib.make_config(RECIPE, epochs=1, verbose=0, export=False,
                                    keep_checkpoints=0)
    marks["imports"] = time.time()

    def marked(fn, before=None, after=None):
        def wrapper(*args, **kwargs):
            if before:
                marks[before] = time.time()
            result = fn(*args, **kwargs)
            if after:
                marks[after] = time.time()
            return result
        return wrapper

    def get(name):
        recipe = real_get(name)
        return dataclasses.replace(recipe, load_data=marked(recipe.load_data, before="model",
                                                            after="data"))

    class FirstStep(callbacks.Throughput):
        def on_train_begin(self, logs=None):
            marks["setup"] = time.time()
            super().on_train_begin(logs)

        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            marks.setdefault("first step", time.time())

    real_get = recipe_lib.get
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(runtime, "init", marked(runtime.init, after="init")))
        stack.enter_context(mock.patch.object(recipe_lib, "get", get))
        stack.enter_context(mock.patch.object(callbacks, "Throughput", FirstStep))
        model_dir = stack.enter_context(tempfile.TemporaryDirectory())
        trainer.train(config.override(model_dir=model_dir))
    if runtime.is_main_process():
        pathlib.Path(FLAGS.output).write_text(json.dumps(marks, indent=1))


def main(argv):
    work() if FLAGS.worker else launch()


if __name__ == "__main__":
    app.run(main)
