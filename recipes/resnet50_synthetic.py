"""resnet50_synthetic: Horovod's synthetic benchmark (ResNet-50 on random
images) as a recipe, measured the way a benchmark should be.

The model is Keras's ResNet-50 (He et al., 2016; any `keras.applications`
model by --option=model=NAME), trained with SGD on one random batch per
worker, repeated: the input costs nothing, so the run measures the model's
steps and the gradient exchange. As in Horovod's
`tensorflow2_synthetic_benchmark.py`, the first steps are warm-up and each
sample is a window of steps (--throughput_warmup_steps, default 10, and
--throughput_window_steps, default 10; --option=iterations=10 windows). The
report differs in two ways: the interval is a 95% confidence interval of the
mean images/s (Student's t over the windows), not 1.96 standard deviations
of the windows; and the total is the sum of every worker's measured rate,
not rank 0's times the workers. There is no validation, no checkpoint and
no export.

    horovodrun --config-file horovodrun.cfg -np 8 -H localhost:8 \\
        python recipes/resnet50_synthetic.py --precision=mixed_float16 --compression=fp16

prints, on rank 0, a line of this form (bench/gpu_resnet50.py measures this
recipe on one GPU and records the figures):

    hvdtrain: throughput N images/s (95% interval LOW-HIGH) on 8 workers,
    M images/s (95% interval ...) per worker; 10 windows of 10 steps after 10 warm-up steps

--precision picks float32, mixed_float16 (with loss scaling) or
mixed_bfloat16; --compression=fp16 is Horovod's --fp16-allreduce.
"""

import keras

from hvdtrain import data
from hvdtrain.config import POSITIVE
from hvdtrain.errors import UsageError
from hvdtrain.recipe import Option, Recipe, Splits


def load_data(config):
    steps = (config.throughput_warmup_steps
             + config.options["iterations"] * config.throughput_window_steps)
    size = config.options["image_size"]
    return Splits(train=data.synthetic((size, size, 3), config.options["num_classes"],
                                       config.batch_size, steps, seed=config.seed))


def build_model(config):
    name = config.options["model"]
    application = getattr(keras.applications, name, None)
    if not callable(application):
        raise UsageError(f"--option=model={name} is not a keras.applications model; "
                         "e.g. ResNet50, ResNet101, MobileNetV2, EfficientNetB0")
    size = config.options["image_size"]
    features = application(weights=None, include_top=False, pooling="avg",
                           input_shape=(size, size, 3))
    return keras.Sequential([
        features,
        # Logits in float32 under mixed precision, for a stable softmax.
        keras.layers.Dense(config.options["num_classes"], dtype="float32"),
    ], name=f"{name.lower()}_synthetic")


RECIPE = Recipe(
    name="resnet50_synthetic",
    build_model=build_model,
    load_data=load_data,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    # Horovod's benchmark: SGD at 0.01, no momentum, no warm-up.
    defaults=dict(epochs=1, batch_size=32, learning_rate=0.01, optimizer="sgd", momentum=0.0,
                  warmup_epochs=0, checkpoint_epochs=0, keep_checkpoints=0, best_metric="",
                  export=False),
    options=dict(
        model=Option("ResNet50", "the keras.applications model to train"),
        image_size=Option(224, "height and width of the random images", allowed=POSITIVE),
        num_classes=Option(1000, "classes of the random labels", allowed=POSITIVE),
        iterations=Option(10, "timed windows per epoch, after the warm-up steps", allowed=POSITIVE),
    ),
    unit="images",
)

if __name__ == "__main__":
    from hvdtrain import cli

    cli.run_recipe(RECIPE.name)
