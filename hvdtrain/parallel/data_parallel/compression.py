"""Gradient compression: Horovod's `none` and `fp16`, and `bf16`.

Horovod 0.28.1's collectives cannot add bfloat16 tensors, so `bf16` is not a
cast around an allreduce: the reduction reads 16-bit values and sums them in
float32 (see `reduction._bf16_allreduce`). It moves the same bytes as an fp16
allreduce and keeps float32's exponent range, so large gradients do not
overflow and small ones do not flush to zero the way they do in fp16.
"""

from horovod.tensorflow.compression import Compression as _HorovodCompression
from horovod.tensorflow.compression import Compressor

__all__ = ["BF16Compressor", "Compression"]


class BF16Compressor(Compressor):
    """Marks a reduction to run on bfloat16 payloads with float32 sums."""


class Compression:
    """The compression algorithms DistributedOptimizer and DistributedGradientTape take.

    Attributes:
        none: Horovod's: gradients are sent as they are.
        fp16: Horovod's: float gradients are sent as float16 and summed in
            float16, then cast back.
        bf16: hvdtrain's: float gradients are sent as bfloat16 and summed in
            float32 (see the module's docstring); not with `op=hvd.Adasum`,
            and for gradients only (`hvdtrain.keras.allreduce` refuses it).
    """
    none = _HorovodCompression.none
    fp16 = _HorovodCompression.fp16
    bf16 = BF16Compressor
