"""XLA and the distributed optimizer. `train(PAIRS[name], jit=False,
whole=True)`: a model compiled with jit_compile=True trains (Horovod's
collectives inside XLA: refused; tests/ranked/test_collective_limits.py).
`python jit_compile.py split OUT`: for each optimizer setting of PAIRS, two
models from the same initial weights take STEPS steps on the same global
batches (GLOBAL_BATCH fixed examples, each rank on its share), one compiled
by hvdtrain.jit_compile, one not; each rank writes both models' weights to
OUT/rank<r>.npz (tests/parallel/test_collective_limits.py)."""

import sys

import keras
import numpy as np

import hvdtrain

try:
    from shares import rank_rows  # run as a script: tests/workers on the path
except ImportError:
    from workers.shares import rank_rows  # imported by a ranked test: tests/ on the path

STEPS, GLOBAL_BATCH = 2, 16
PAIRS = {
    "sgd_momentum": lambda: hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
    # The update compiled holds clipping, decoupled weight decay and the moving average.
    "adamw_ema_clipnorm": lambda: hvdtrain.DistributedOptimizer(keras.optimizers.AdamW(
        0.01, weight_decay=0.1, clipnorm=0.5, use_ema=True, ema_momentum=0.5)),
    # The update compiled inside the branch that applies the accumulated gradients.
    "accumulated": lambda: hvdtrain.DistributedOptimizer(
        keras.optimizers.SGD(0.1), backward_passes_per_step=2, average_aggregated_gradients=True),
}


def train(make_optimizer, jit, whole=False):
    """The weights after training; `whole`: the model compiled with
    jit_compile=True, `jit`: by hvdtrain.jit_compile."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * GLOBAL_BATCH, 5)).astype("float32")
    y = rng.integers(0, 3, STEPS * GLOBAL_BATCH)
    share = GLOBAL_BATCH // hvdtrain.size()
    mine = rank_rows(STEPS, GLOBAL_BATCH)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=make_optimizer(),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=whole)
    if jit:
        hvdtrain.jit_compile(model)
    model.fit(x[mine], y[mine], batch_size=share, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdtrain.callbacks.BroadcastInitialState(0)])
    return model.get_weights()


if __name__ == "__main__":
    hvdtrain.init(intra_op_threads=1)
    weights = {f"{name}:{jit}:{i}": w for name, make in PAIRS.items() for jit in (False, True)
               for i, w in enumerate(train(make, jit))}
    np.savez(f"{sys.argv[2]}/rank{hvdtrain.rank()}.npz", **weights)
    print("trained")
