"""TensorFlow's errors from reading input data, as one clean line.

An op that fails inside a tf.data pipeline (decoding, parsing, reading, an
assertion) raises when the next batch is fetched, with a message made of
function-node names, iterator paths and stack headers around one line of
reason. A source that can find the file to blame does (ShardedDataset's
`explain`, run only once something failed, with `each_file`); otherwise the
line gives TensorFlow's reason alone.
"""

import re

import tensorflow as tf

from hvdtrain import errors
from hvdtrain.errors import MODEL_INPUT, UsageError

__all__ = ["each_file", "reason", "usage_error"]

# What TensorFlow puts around the reason on one line.
_NOISE = re.compile(
    r"\{\{function_node [^}]*\}\}"                # {{function_node __wrapped__...}}
    r"|\[\[[^\]]*\]\]"                            # [[{{node decode_image/DecodeImage}}]]
    r"|\[Op:[^\]]*\]( name: ?)?"                  # [Op:IteratorGetNext] name:
    r"|Error in user-defined function passed to \S+ transformation with iterator: \S+: ")
# Lines that only frame the reason: headers and stack frames.
_FRAME = re.compile(r"Graph execution error|Detected at node|<stack traces|\s|\d+ root error")
_ASSERTION = re.compile(r"assertion failed: \[(.*?)\]( \[|$)")


def reason(error):
    """TensorFlow's one line of reason in `error` (a tf.errors.OpError)."""
    for line in error.message.splitlines():
        if not line or _FRAME.match(line):
            continue
        text = _NOISE.sub("", line).strip()
        assertion = _ASSERTION.search(text)
        if assertion:  # a tf.debugging check: its own message (unescaped), not its operands
            return assertion.group(1).replace("\\'", "'").replace('\\"', '"')
        if text:
            return text.replace("' failed with ", ": ")
    return type(error).__name__


def from_pipeline(error):
    """Whether `error` was raised fetching the next element of a tf.data
    pipeline (in Keras's training function, or iterating one eagerly)."""
    return (isinstance(error, tf.errors.OpError) and "IteratorGetNext" in error.message
            and errors.lost_peer(error) is None)


def usage_error(error, *datasets):
    """The UsageError for `error` if it came from the input pipeline of one
    of `datasets` (ShardedDatasets; None ones are skipped) or from a layer's
    check of its inputs, else None."""
    if isinstance(error, tf.errors.OpError) and (
            found := reason(error)).startswith(MODEL_INPUT):
        return UsageError(found.removeprefix(MODEL_INPUT))
    if not from_pipeline(error):
        return None
    for dataset in datasets:
        if dataset is not None and dataset.explain is not None:
            message = dataset.explain(error)
            if message:
                return UsageError(message)
    return UsageError(f"reading the input data failed ({reason(error)}); check the data "
                      "and the recipe's load_data")


def each_file(paths, compute):
    """([compute(path) for path in paths], None), computed in parallel by
    tf.data (compute: a path tensor -> a tensor); or (None, (path, error))
    for the first path it fails on: the file to blame for an error."""
    done = tf.data.Dataset.from_tensor_slices(list(paths)).enumerate().map(
        lambda i, path: (i, compute(path)), num_parallel_calls=tf.data.AUTOTUNE
    ).ignore_errors().batch(1024)
    values = {int(i): value for indices, batch in done.as_numpy_iterator()
              for i, value in zip(indices, batch)}
    results = []
    for i, path in enumerate(paths):
        if i not in values:  # again on its own, for its error
            try:
                values[i] = next(iter(tf.data.Dataset.from_tensors(path).map(compute))).numpy()
            except tf.errors.OpError as e:
                return None, (path, e)
        results.append(values[i])
    return results, None
