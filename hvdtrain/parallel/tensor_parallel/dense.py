"""Megatron-LM's parallel linear layers.

An MLP is a column-parallel layer then a row-parallel one: the first splits
its output units over the replica's T ranks (each computes a slice of the
hidden activations, and the activation function works on its slice), the
second splits its input rows, takes the split activations as they are and
sums the partial outputs with one allreduce. Forward, that block costs one
allreduce; backward, one more (the column layer's input gradient).
"""

import keras

from hvdtrain import layout
from hvdtrain.parallel.tensor_parallel import operators, split_weights

__all__ = ["ColumnParallelDense", "RowParallelDense"]


class _ParallelDense(keras.layers.Layer):
    def __init__(self, units, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def get_config(self):
        return {**super().get_config(), "units": self.units,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer)}

    def plain_layer(self):
        """The `keras.layers.Dense` this layer is, whole (for export)."""
        return keras.layers.Dense(self.units, activation=self.activation, use_bias=self.use_bias,
                                  name=self.name, dtype=self.dtype_policy)

    def _collective(self, what):
        return operators.collective_name(self.name, what)


@keras.saving.register_keras_serializable(package="hvdtrain")
class ColumnParallelDense(_ParallelDense):
    """`keras.layers.Dense` whose output units are split over the replica's ranks.

    Args:
        units: The whole layer's output units (divisible by T).
        activation, use_bias, kernel_initializer, bias_initializer: As for
            `keras.layers.Dense`.
        gather_output: Give every rank all `units` (an allgather); False
            (the default) leaves each rank its slice, for a
            `RowParallelDense` or a vocabulary-parallel loss to take.
        **kwargs: Layer arguments (name, dtype, ...).
    """

    def __init__(self, units, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 gather_output=False, **kwargs):
        super().__init__(units, activation, use_bias, kernel_initializer, bias_initializer,
                         **kwargs)
        self.gather_output = gather_output

    def build(self, input_shape):
        split_weights.check_divisible(self, "units", self.units)
        self.kernel = split_weights.add_split_weight(
            self, "kernel", (input_shape[-1], self.units), 1, self.kernel_initializer)
        self.bias = (split_weights.add_split_weight(
            self, "bias", (self.units,), 0, self.bias_initializer) if self.use_bias else None)

    def call(self, inputs):
        x = operators.copy_to_group(inputs, self._collective("input"))
        y = keras.ops.matmul(x, self.kernel)
        if self.use_bias:
            y = y + self.bias
        y = self.activation(y) if self.activation is not None else y
        if self.gather_output:
            y = operators.gather_from_group(y, self._collective("output"))
        return y

    def compute_output_shape(self, input_shape):
        units = self.units if self.gather_output else self.units // layout.tensor_size()
        return (*input_shape[:-1], units)

    def get_config(self):
        return {**super().get_config(), "gather_output": self.gather_output}


@keras.saving.register_keras_serializable(package="hvdtrain")
class RowParallelDense(_ParallelDense):
    """`keras.layers.Dense` whose input rows are split over the replica's ranks;
    every rank gets the whole output.

    Args:
        units: Output units (whole on every rank).
        activation, use_bias, kernel_initializer, bias_initializer: As for
            `keras.layers.Dense`; the bias and activation act after the sum.
        input_is_parallel: The input is already split (a `ColumnParallelDense`'s
            output, the default); False: each rank takes its slice of a
            whole input.
        **kwargs: Layer arguments (name, dtype, ...).
    """

    def __init__(self, units, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 input_is_parallel=True, **kwargs):
        super().__init__(units, activation, use_bias, kernel_initializer, bias_initializer,
                         **kwargs)
        self.input_is_parallel = input_is_parallel

    def build(self, input_shape):
        rows = input_shape[-1] * (layout.tensor_size() if self.input_is_parallel else 1)
        split_weights.check_divisible(self, "input width", rows)
        self.kernel = split_weights.add_split_weight(self, "kernel", (rows, self.units), 0,
                                                     self.kernel_initializer)
        self.bias = (self.add_weight(shape=(self.units,), name="bias",
                                     initializer=self.bias_initializer)
                     if self.use_bias else None)

    def call(self, inputs):
        x = inputs if self.input_is_parallel else operators.split_to_group(
            inputs, self._collective("input"))
        y = operators.reduce_from_group(keras.ops.matmul(x, self.kernel),
                                        self._collective("output"))
        if self.use_bias:
            y = y + self.bias
        return self.activation(y) if self.activation is not None else y

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self):
        return {**super().get_config(), "input_is_parallel": self.input_is_parallel}
