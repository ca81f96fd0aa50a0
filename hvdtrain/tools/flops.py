"""Model FLOPs and their utilisation of the device (MFU), for language models.

A training step of a transformer costs about 6 x parameters FLOPs per
token (Kaplan et al., 2020: 2 forward, 4 backward; attention's own left
out), the estimate Megatron-LM and PaLM report utilisation against. The
peak is the device's dense tensor-core figure for the run's precision, from
its datasheet: float32 counts TF32 where the GPU has it (TensorFlow uses it
for float32 matmuls by default).
"""

import re

__all__ = ["PEAK_TERAFLOPS", "describe", "peak_teraflops"]

# Dense TFLOP/s per GPU: (float32 via TF32 or plain FP32, 16-bit), datasheets.
# The first name matching the device's wins (H100 PCIe before H100).
PEAK_TERAFLOPS = (
    (r"H100 PCIe", 378.0, 756.0),
    (r"H100|H200", 494.0, 989.0),
    (r"A100", 156.0, 312.0),
    (r"L40S", 183.0, 362.0),
    (r"\bA10\b", 62.5, 125.0),
    (r"\bL4\b", 60.0, 121.0),
    (r"V100", 15.7, 125.0),
    (r"\bT4\b", 8.1, 65.0),
)


def peak_teraflops(device_name, policy):
    """The device's peak for `policy` (a Keras dtype policy's name), or None
    when it is not known (a CPU, a GPU not in the table)."""
    for pattern, full, half in PEAK_TERAFLOPS:
        if device_name and re.search(pattern, device_name):
            return full if policy == "float32" else half
    return None


def describe(tokens_per_second, parameters, workers, device_name, policy):
    """One line: tokens/s, model FLOP/s in total and per worker, and MFU."""
    per_worker = 6 * parameters * tokens_per_second / workers / 1e12
    peak = peak_teraflops(device_name, policy)
    utilisation = (f"MFU {per_worker / peak:.1%} of {device_name}'s {peak:g} TFLOP/s"
                   if peak else f"MFU: no peak known for {device_name or 'this device'}")
    return (f"{tokens_per_second:,.0f} tokens/s; model FLOPs 6 x {parameters:,} parameters x "
            f"tokens = {per_worker * workers:.3g} TFLOP/s, {per_worker:.3g} per worker; "
            f"{utilisation}")
