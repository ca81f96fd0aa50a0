"""Input pipeline throughput against what training consumes, in one run.

    python bench/input_pipeline.py [--np=2] [--rounds=3]

launches itself under `horovodrun -np N --gloo`. Each worker builds, for two
datasets, the sharded training pipeline hvdtrain trains from, and times in
alternating rounds:
  pipeline  batches pulled from the pipeline alone (examples/s per worker);
  training  model.fit steps on that same pipeline (examples/s per worker).
Datasets: the default recipe (digits through TFDS, cached), and a folder of
32x32 RGB PNG files decoded and augmented every epoch (no cache) feeding a
small CNN. Goal: pipeline / training >= 5. Rank 0 prints a table and writes JSON.
"""

import json
import pathlib
import tempfile
import time

from absl import app, flags

import horovod_workers

flags.DEFINE_integer("np", 2, "Workers.")
flags.DEFINE_integer("rounds", 3, "Alternating timing rounds.")
flags.DEFINE_integer("steps", 40, "Batches timed per round and kind.")
flags.DEFINE_string("output", "runs/bench/input_pipeline.json", "Where rank 0 writes the results.")
flags.DEFINE_string("images", None, "Internal: the image folder the launcher made.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS


def launch():
    with tempfile.TemporaryDirectory() as scratch:
        make_images(pathlib.Path(scratch, "images"))
        results = horovod_workers.run(__file__, FLAGS.output, np=FLAGS.np, rounds=FLAGS.rounds,
                                      steps=FLAGS.steps, images=f"{scratch}/images")
    print(f"input pipeline against training, np={FLAGS.np}, examples/s per worker (medians)")
    print(f"{'dataset':<16}{'pipeline':>10}{'training':>10}{'ratio':>8}")
    for name, r in results.items():
        print(f"{name:<16}{r['pipeline']:>10.0f}{r['training']:>10.0f}{r['ratio']:>8.1f}")
    print(f"ratio = pipeline / training; goal >= 5. JSON: {FLAGS.output}")


def make_images(root, count=2048, classes=10):
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        tf.io.write_file(str(folder / f"{i}.png"), tf.io.encode_png(pixels))


def work():
    import keras
    import numpy as np
    import tensorflow as tf

    import hvdtrain
    from hvdtrain import data, recipe, runtime
    from small_cnn import small_cnn

    hvdtrain.init()

    def augment(image, label, seed):
        image = tf.image.stateless_random_flip_left_right(image, seed)
        image = tf.image.resize_with_crop_or_pad(image, 36, 36)
        image = tf.image.stateless_random_crop(image, (32, 32, 3), seed)
        return tf.cast(image, tf.float32) / 255.0, label

    digits = recipe.get("digits_cnn")
    config = recipe.make_config("digits_cnn", data_dir=f"{FLAGS.images}/../tfds")
    cases = {
        "digits (tfds)": (digits.load_data(config).train, digits.build_model(config)),
        "images 32x32": (data.from_image_folder(FLAGS.images, 64, training=True,
                                                preprocess=augment), small_cnn()),
    }
    results = {}
    for name, (train, model) in cases.items():
        model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        batch = int(next(iter(train.batches(0)))[0].shape[0])
        epochs = FLAGS.rounds * 2 * (FLAGS.steps // train.steps + 2) + 2
        dataset = train.for_epochs(epochs)
        stream = iter(dataset)
        model.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0, shuffle=False)  # warm-up

        def pipeline(stream=stream):
            for _ in range(FLAGS.steps):
                np.asarray(next(stream)[0])

        def training(model=model, dataset=dataset):
            model.fit(dataset, steps_per_epoch=FLAGS.steps, epochs=1, verbose=0, shuffle=False)

        rates = {"pipeline": [], "training": []}
        for _ in range(FLAGS.rounds):
            for kind, fn in (("pipeline", pipeline), ("training", training)):
                runtime.barrier()
                start = time.perf_counter()
                fn()
                rates[kind].append(FLAGS.steps * batch / (time.perf_counter() - start))
        medians = {k: float(np.median(v)) for k, v in rates.items()}
        results[name] = {**medians, "ratio": medians["pipeline"] / medians["training"],
                         "batch_per_worker": batch, "samples": rates}
    if hvdtrain.is_main_process():
        path = pathlib.Path(FLAGS.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2))


def main(argv):
    work() if FLAGS.worker else launch()


if __name__ == "__main__":
    app.run(main)
