"""Trains a small model with DistributedOptimizer and jit_compile=JIT (0/1)."""

import sys

import keras
import numpy as np

import hvdtrain

hvdtrain.init()
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
              jit_compile=sys.argv[1] == "1")
x = np.ones((8, 3), "float32")
model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0)
print("trained")
