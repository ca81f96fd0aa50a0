"""Independent numpy references for the learning-rate tests: least squares
trained with Keras's update rules, in float64, with Horovod's momentum
correction (momentum x new / old rate on a step whose rate changed) and
Keras's decoupled weight decay."""

import numpy as np


def gradients(w, b, x, y):
    """Of Keras's mean squared error for a Dense(1) layer on one batch."""
    error = x @ w + b - y
    return 2 * x.T @ error / len(x), 2 * error.mean(axis=0)


def train(w, b, batches, lrs, initial_lr, momentum, rule="sgd", corrected=True,
          previous_lrs=None, rho=0.9, epsilon=1e-7, weight_decay=0.0):
    """(w, b) after one step per (batch, lr). rule: "sgd", "nesterov" or
    "rmsprop". The correction divides by the rate before each step's was set:
    `previous_lrs`, by default the previous step's (`initial_lr` for the first).
    Weight decay, as Keras applies it: the gradients are the weights' before
    the step; the weights first lose weight x weight_decay x the step's rate."""
    params = [np.array(w, np.float64), np.array(b, np.float64)]
    velocities = [np.zeros_like(p) for p in params]
    mean_squares = [np.zeros_like(p) for p in params]
    previous_lrs = previous_lrs or [initial_lr, *lrs[:-1]]
    for (x, y), lr, previous in zip(batches, lrs, previous_lrs):
        mu = momentum * lr / previous if corrected else momentum
        for p, v, s, g in zip(params, velocities, mean_squares, gradients(*params, x, y)):
            p -= p * weight_decay * lr
            if rule == "rmsprop":
                s[...] = rho * s + (1 - rho) * g ** 2
                v[...] = mu * v + lr * g / np.sqrt(s + epsilon)
                p -= v
            else:
                v[...] = mu * v - lr * g
                p += mu * v - lr * g if rule == "nesterov" else v
    return params
