"""Test-only start-up hook, put on PYTHONPATH by tests/compat: MNIST without
the network. Keras's `mnist.load_data` (tf.keras.datasets.mnist's too)
returns scikit-learn's 8x8 digits scaled up to MNIST's 28x28 uint8 images.

With HVDTRAIN_DUMP_DIR set, a process that loaded them also writes, at exit,
its `__main__.mnist_model`'s weights and history to <dir>/rank<r>.npz and
.json, so that a test can compare the ranks.

Python imports this in every process, horovodrun's included; the Keras
module is patched only when something imports it, so the others do not pay
for Keras.
"""

import atexit
import importlib.machinery
import json
import os
import sys

_MODULE = "keras.src.datasets.mnist"


def load_data(path="mnist.npz"):
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    # Pixels of 0..16 drawn 3x3 (24x24), centred in 28x28, as 0..255.
    images = np.pad(np.kron(digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
    images = (images * 255 / 16).round().astype("uint8")
    labels = digits.target.astype("uint8")
    if os.environ.get("HVDTRAIN_DUMP_DIR"):
        # After Horovod's own exit hook, so this runs first, while Horovod is up.
        atexit.register(_dump, os.environ["HVDTRAIN_DUMP_DIR"])
    return (images[:1500], labels[:1500]), (images[1500:], labels[1500:])


def _dump(out):
    import horovod.tensorflow as hvd
    import numpy as np

    model = sys.modules["__main__"].mnist_model
    np.savez(f"{out}/rank{hvd.rank()}.npz", *model.get_weights())
    with open(f"{out}/rank{hvd.rank()}.json", "w") as f:
        json.dump(model.history.history, f)


class _PatchMnist:
    """Replaces load_data as the module is executed, before Keras's public
    modules take their references to it."""

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            module.load_data = load_data

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchMnist())
