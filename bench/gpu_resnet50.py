"""ResNet-50 on synthetic images on one GPU: hvdtrain against plain Keras,
and hvdtrain with XLA against without, at float32, mixed_float16 and
mixed_bfloat16, in one JSON file.

    python bench/gpu_resnet50.py                     # one H200: under 10 minutes
    python bench/gpu_resnet50.py --image_size=32 --batch_size=2 --warmup_steps=2 \\
        --window_steps=2 --windows=2 --num_classes=10   # any CPU, in a minute

Each (precision, contender) runs in a process of its own (a dtype policy and
a GPU's memory belong to a process), in the order float32 keras, float32
hvdtrain, mixed_float16 keras, ... so that a drift in clock or temperature
touches both contenders of a precision alike. Both train the same model on
the same data and are measured the same way:
  keras         keras.Model.fit with SGD (and, under mixed_float16, the loss
                scaling Keras adds itself), no XLA;
  hvdtrain      `hvdtrain.train` with the resnet50_synthetic recipe at np=1:
                Horovod initialised, DistributedOptimizer, hvdtrain's
                callbacks, no XLA;
  hvdtrain_xla  the same with --jit_compile: the forward and backward pass
                and the update compiled by XLA, the reduction between them.
Throughput is hvdtrain's own measurement (hvdtrain.tools.throughput): windows of
steps after warm-up, a 95% interval of the mean. Per precision, hvdtrain /
keras is the cost of the framework on one device, and hvdtrain_xla /
hvdtrain what XLA gives it.
"""

import json
import pathlib
import subprocess
import sys
import tempfile
import time

from absl import app, flags

flags.DEFINE_list("precisions", ["float32", "mixed_float16", "mixed_bfloat16"],
                  "Keras dtype policies to measure.")
flags.DEFINE_list("contenders", ["keras", "hvdtrain", "hvdtrain_xla"],
                  "What to measure: keras, hvdtrain, hvdtrain_xla.")
flags.DEFINE_integer("image_size", 224, "Height and width of the random images.")
flags.DEFINE_integer("num_classes", 1000, "Classes of the random labels.")
flags.DEFINE_integer("batch_size", 256, "Images per step.")
flags.DEFINE_integer("warmup_steps", 20, "Steps left out of the measurement.")
flags.DEFINE_integer("window_steps", 10, "Steps per timed window.")
flags.DEFINE_integer("windows", 10, "Timed windows per run.")
flags.DEFINE_string("output", "runs/bench/gpu_resnet50.json", "The results file.")
flags.DEFINE_string("worker", None, "Internal: PRECISION,CONTENDER to measure in this process.")
FLAGS = flags.FLAGS


def _config(precision, model_dir, jit_compile):
    from hvdtrain import recipe
    return recipe.make_config(
        "resnet50_synthetic",
        dict(image_size=FLAGS.image_size, num_classes=FLAGS.num_classes,
             iterations=FLAGS.windows),
        batch_size=FLAGS.batch_size, precision=precision, jit_compile=jit_compile,
        throughput_warmup_steps=FLAGS.warmup_steps, throughput_window_steps=FLAGS.window_steps,
        model_dir=model_dir, verbose=0)


def _keras(config):
    """Plain Keras on the recipe's model and data; hvdtrain's measurement."""
    import keras
    import tensorflow as tf

    from hvdtrain import callbacks, recipe

    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)  # as hvdtrain.init does
    keras.mixed_precision.set_global_policy(config.precision)
    keras.utils.set_random_seed(config.seed)
    benchmark = recipe.get("resnet50_synthetic")
    data = benchmark.load_data(config).train
    model = benchmark.build_model(config)
    model.compile(optimizer=keras.optimizers.SGD(config.learning_rate), loss=benchmark.loss,
                  jit_compile=False)
    meter = callbacks.Throughput(config.batch_size, config.throughput_warmup_steps,
                                 config.throughput_window_steps)
    model.fit(data.for_epochs(1), epochs=1, steps_per_epoch=data.steps, callbacks=[meter],
              verbose=0)
    return meter.measurement()


def _hvdtrain(config):
    import hvdtrain
    return hvdtrain.train(config).throughput


def worker():
    precision, contender = FLAGS.worker.split(",")
    with tempfile.TemporaryDirectory() as model_dir:
        config = _config(precision, model_dir, jit_compile=contender == "hvdtrain_xla")
        measured = (_keras if contender == "keras" else _hvdtrain)(config)
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    device = (tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
              if gpus else "CPU")
    rate = measured.total
    print(json.dumps(dict(precision=precision, contender=contender, device=device,
                          images_per_second=rate.mean, low=rate.low, high=rate.high,
                          windows=rate.windows)))


def main(argv):
    if FLAGS.worker:
        worker()
        return
    start = time.perf_counter()
    runs = []
    for precision in FLAGS.precisions:
        for contender in FLAGS.contenders:
            command = [sys.executable, __file__, f"--worker={precision},{contender}",
                       *(a for a in sys.argv[1:] if not a.startswith("--worker"))]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                sys.exit(f"{precision} {contender} failed:\n{result.stderr[-3000:]}")
            runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(f"{precision:<15} {contender:<12} {runs[-1]['images_per_second']:10.1f} "
                  f"images/s (95% interval {runs[-1]['low']:.1f}-{runs[-1]['high']:.1f})",
                  flush=True)
    rates = {(r["precision"], r["contender"]): r["images_per_second"] for r in runs}
    ratios = {p: rates[p, "hvdtrain"] / rates[p, "keras"] for p in FLAGS.precisions
              if {(p, "hvdtrain"), (p, "keras")} <= set(rates)}
    xla = {p: rates[p, "hvdtrain_xla"] / rates[p, "hvdtrain"] for p in FLAGS.precisions
           if {(p, "hvdtrain_xla"), (p, "hvdtrain")} <= set(rates)}
    for precision in FLAGS.precisions:
        print(f"{precision:<15}" + "".join(
            f" {name} {found[precision]:.3f}" for name, found in (
                ("hvdtrain / keras", ratios), ("hvdtrain_xla / hvdtrain", xla))
            if precision in found))
    results = dict(device=runs[0]["device"], seconds=time.perf_counter() - start,
                   settings={name: FLAGS[name].value for name in (
                       "image_size", "num_classes", "batch_size", "warmup_steps",
                       "window_steps", "windows")},
                   runs=runs, ratios=ratios, xla_ratios=xla)
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['seconds']:.0f} s on {results['device']}; results in {output}")


if __name__ == "__main__":
    app.run(main)
