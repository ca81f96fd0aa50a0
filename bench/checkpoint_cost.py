"""What rank 0's checkpoints cost, as a share of an epoch, in one run.

    python bench/checkpoint_cost.py [--np=2] [--saves=3]

launches itself under `horovodrun -np N --gloo`; the workers measure, side
by side:
  default recipe  `hvdtrain train` on digits_cnn, a checkpoint after every
                  epoch: the saves' time against the epochs' (both from the
                  same run; the other ranks wait while rank 0 saves).
  ResNet-50       Keras's ResNet-50 (25.6M parameters) with SGD momentum:
                  hvdtrain's checkpoint write (variables to host, npz, fsync,
                  sha256, rename) against training steps on 224x224 images;
                  the share is that of an ImageNet epoch (1,281,167 images)
                  at the throughput measured here, and the script prints the
                  throughput at which the save would reach 1% of an epoch.
Rank 0 prints a table and writes JSON.
"""

import json
import pathlib
import statistics
import tempfile
import time

from absl import app, flags

import horovod_workers

flags.DEFINE_integer("np", 2, "Workers.")
flags.DEFINE_integer("saves", 3, "Checkpoints timed for ResNet-50.")
flags.DEFINE_integer("epochs", 5, "Epochs of the default recipe.")
flags.DEFINE_integer("steps", 3, "ResNet-50 training steps timed (after one untimed).")
flags.DEFINE_integer("batch_size", 4, "ResNet-50 batch per worker.")
flags.DEFINE_string("output", "runs/bench/checkpoint_cost.json", "Where rank 0 writes the results.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS

IMAGENET_TRAIN_IMAGES = 1_281_167


def launch():
    results = horovod_workers.run(__file__, FLAGS.output, np=FLAGS.np, saves=FLAGS.saves,
                                  epochs=FLAGS.epochs, steps=FLAGS.steps,
                                  batch_size=FLAGS.batch_size)
    print(f"checkpoint save time against training, np={FLAGS.np} (medians)")
    print(f"{'model':<16}{'state MB':>10}{'save s':>9}{'epoch s':>10}{'share':>8}")
    for name, r in results.items():
        print(f"{name:<16}{r['megabytes']:>10.1f}{r['save_seconds']:>9.2f}"
              f"{r['epoch_seconds']:>10.1f}{r['share']:>8.2%}")
    resnet = results["resnet50"]
    print(f"ResNet-50 epoch: ImageNet at the {resnet['images_per_second']:.1f} images/s measured "
          f"here; its save is 1% of an epoch at {resnet['one_percent_at']:,.0f} images/s. "
          f"JSON: {FLAGS.output}")


def worker():
    import hvdtrain
    from hvdtrain import recipe

    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        config = recipe.make_config("digits_cnn", model_dir=f"{scratch}/digits",
                                    epochs=FLAGS.epochs, verbose=0)
        result = hvdtrain.train(config)
        if hvdtrain.is_main_process():
            saves = result.checkpoint_seconds
            epoch = (result.seconds - sum(saves)) / FLAGS.epochs
            results["digits_cnn"] = dict(
                megabytes=_megabytes(result.model), save_seconds=statistics.median(saves),
                epoch_seconds=epoch, share=statistics.median(saves) / epoch)
        results.update(_resnet50(pathlib.Path(scratch, "resnet")))
    if hvdtrain.is_main_process():
        path = pathlib.Path(FLAGS.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))


def _resnet50(directory):
    import keras
    import numpy as np

    import hvdtrain
    from hvdtrain.state import checkpoint, training_state

    model = keras.applications.ResNet50(weights=None)
    model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss="sparse_categorical_crossentropy", jit_compile=False)
    rng = np.random.default_rng(hvdtrain.rank())
    images = rng.uniform(size=(FLAGS.batch_size, 224, 224, 3)).astype("float32")
    labels = rng.integers(0, 1000, FLAGS.batch_size)
    model.train_on_batch(images, labels)  # traces the step, builds the optimizer
    start = time.perf_counter()
    for _ in range(FLAGS.steps):
        model.train_on_batch(images, labels)
    images_per_second = FLAGS.steps * FLAGS.batch_size * hvdtrain.size() / (
        time.perf_counter() - start)
    if not hvdtrain.is_main_process():
        return {}
    seconds = []
    for i in range(FLAGS.saves):
        start = time.perf_counter()
        values = [keras.ops.convert_to_numpy(v) for v in training_state.training_variables(model)]
        checkpoint.save(directory, values, training_state.Position(0, i + 1, 1, 1, 1), {})
        seconds.append(time.perf_counter() - start)
    save = statistics.median(seconds)
    epoch = IMAGENET_TRAIN_IMAGES / images_per_second
    return {"resnet50": dict(megabytes=_megabytes(model), save_seconds=save, epoch_seconds=epoch,
                             share=save / epoch, images_per_second=images_per_second,
                             one_percent_at=0.01 * IMAGENET_TRAIN_IMAGES / save)}


def _megabytes(model):
    from hvdtrain.state import training_state
    return sum(v.numpy().nbytes for v in training_state.training_variables(model)) / 1e6


def main(argv):
    worker() if FLAGS.worker else launch()


if __name__ == "__main__":
    app.run(main)
