# Horovod's TensorFlow 2 Keras MNIST example (examples/tensorflow2/
# tensorflow2_keras_mnist.py, Apache-2.0, Copyright 2019 Uber Technologies),
# reconstructed call for call, run on Keras 3 with these changes only:
#   1. `import horovod.tensorflow.keras as hvd` -> `import hvdtrain.keras as hvd`;
#   2. compile() without `experimental_run_tf_function=False` (Keras 3's
#      compile has no such argument);
#   3. for a short test on two CPU cores: epochs=24 -> 4 and
#      steps_per_epoch=500 // hvd.size() -> 16 // hvd.size().
# The checkpoint name './checkpoint-{epoch}.h5' stays: Keras 3 still saves
# whole models in the legacy HDF5 format.

import tensorflow as tf

import hvdtrain.keras as hvd

hvd.init()

# One GPU per process, by local rank.
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

(mnist_images, mnist_labels), _ = \
    tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
     tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000).batch(128)

mnist_model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
    tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation='relu'),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation='softmax')
])

# The learning rate grows with the number of workers.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)
opt = hvd.DistributedOptimizer(
    opt, backward_passes_per_step=1, average_aggregated_gradients=True)

mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                    optimizer=opt,
                    metrics=['accuracy'])

callbacks = [
    # Every worker starts from rank 0's weights.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Epoch metrics averaged over the workers, before anything reads them.
    hvd.callbacks.MetricAverageCallback(),
    # From one worker's rate to scaled_lr over 3 epochs (Goyal et al., 2017).
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
]

# Only worker 0 writes checkpoints.
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))

# Only worker 0 reports progress.
verbose = 1 if hvd.rank() == 0 else 0

# Each worker takes its share of the steps.
mnist_model.fit(dataset, steps_per_epoch=16 // hvd.size(), callbacks=callbacks, epochs=4,
                verbose=verbose)
