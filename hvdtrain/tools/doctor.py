"""`hvdtrain doctor`: what this machine gives a training job, in one report.

Versions; how Horovod was built (controllers, tensor operations); the
devices TensorFlow sees; the GPU stack (driver, the CUDA and cuDNN
TensorFlow was built for, Horovod's NCCL at build and at run time); the
thread settings each process would get; the horovodrun --config-file in use,
checked; and allreduce self-tests started by Horovod's own launcher
(`horovod.runner.run`): on two local processes under each controller built,
and through NCCL on the GPUs of this machine, each with its result checked
and its bandwidth.
"""

import ctypes
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time

__all__ = ["nccl_version", "report", "sections"]

SELF_TEST_BYTES = 64 * 2**20
SELF_TEST_REPEATS = 5


def report(config_file=None, self_test=True):
    """The report's text. `config_file`: the horovodrun.cfg to check (None:
    ./horovodrun.cfg if there is one)."""
    found = sections(config_file, self_test)
    width = max(len(k) for _, rows in found for k, _ in rows)
    lines = []
    for title, rows in found:
        lines.append(title)
        lines += [f"  {key:<{width}}  {value}" for key, value in rows]
    return "\n".join(lines)


def sections(config_file=None, self_test=True):
    """The report as [(section title, [(key, value), ...]), ...]."""
    found = [("versions", _versions()), ("Horovod build", _horovod_build()),
             ("devices", _devices()), ("GPU stack", _gpu_stack()), ("threads", _threads()),
             ("horovodrun config", _config(config_file))]
    if self_test:
        found.append(("allreduce self-test, 2 local processes", _self_tests()))
        found.append(("NCCL self-test, one process per GPU", _nccl_self_test()))
    return found


def _versions():
    from importlib import metadata

    import horovod
    import keras
    import numpy as np
    import tensorflow as tf

    return [("Python", platform.python_version()), ("TensorFlow", tf.__version__),
            ("Keras", keras.__version__), ("Horovod", horovod.__version__),
            ("NumPy", np.__version__), ("hvdtrain", metadata.version("hvdtrain"))]


def _horovod_build():
    import horovod.tensorflow as hvd
    built = lambda flags: ", ".join(name for name, on in flags if on) or "none"  # noqa: E731
    return [("controllers", built([("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built())])),
            ("tensor operations", built([("NCCL", hvd.nccl_built()), ("DDL", hvd.ddl_built()),
                                         ("oneCCL", hvd.ccl_built()), ("MPI", hvd.mpi_built()),
                                         ("Gloo", hvd.gloo_built())])),
            ("GPU support", built([("CUDA", hvd.cuda_built()), ("ROCm", hvd.rocm_built())]))]


def _devices():
    import tensorflow as tf
    rows = []
    for device in tf.config.list_physical_devices():
        details = tf.config.experimental.get_device_details(device)
        name = details.get("device_name") or _cpu_model()
        if details.get("compute_capability"):
            name += " (compute capability {}.{})".format(*details["compute_capability"])
        rows.append((device.name.removeprefix("/physical_device:"), name))
    return rows


def _gpu_stack():
    """The driver, what TensorFlow and Horovod were built with, and the NCCL
    library Horovod loads: what decides whether GPU training can run here."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    build = tf.sysconfig.get_build_info()
    rows = [("NVIDIA driver", _driver())]
    rows.append(("TensorFlow built for", f"CUDA {build['cuda_version']}, cuDNN "
                 f"{build['cudnn_version']}" if build.get("is_cuda_build")
                 else "no CUDA (a CPU build: HVDTRAIN_GPU=1 scripts/install.sh for GPUs)"))
    code = hvd.nccl_built()
    if not code:
        rows.append(("NCCL operations", "not built (a CPU build of Horovod)"))
        return rows
    rows.append(("NCCL operations", f"built with NCCL {nccl_version(code)}"))
    kernels = _horovod_build_record()
    if kernels:
        rows.append(("Horovod's GPU kernels", f"CUDA {kernels['cuda_compiler']}, compute "
                     f"capabilities {kernels['cuda_architectures']} (driver {kernels['driver']}+)"))
        driver_cuda = _cuda_driver_api()
        kernels_cuda = int(kernels["cuda_compiler"].split(".")[0])
        if driver_cuda and driver_cuda[0] < kernels_cuda:
            rows.append(("problem", f"the driver runs CUDA {'.'.join(map(str, driver_cuda))}, "
                         f"older than the kernels' CUDA {kernels_cuda}: update the driver to "
                         f"{kernels['driver']}+, or rebuild with a CUDA {driver_cuda[0]} "
                         "toolkit (HVDTRAIN_CUDA_HOME=/usr/local/cuda scripts/install.sh)"))
    rows.append(("NCCL at run time", _nccl_runtime()))
    return rows


def nccl_version(code):
    """NCCL's version code (hvd.nccl_built(), ncclGetVersion) as a version:
    23203 -> 2.32.3 (NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _driver():
    smi = shutil.which("nvidia-smi")
    if smi:
        result = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, check=False, timeout=60)
        if result.returncode == 0 and result.stdout.strip():
            driver = result.stdout.split()[0]
            api = _cuda_driver_api()
            return f"{driver}{' (CUDA {}.{})'.format(*api) if api else ''}"
    version = pathlib.Path("/proc/driver/nvidia/version")
    if version.exists():
        return version.read_text().splitlines()[0]
    return "none on this machine"


def _cuda_driver_api():
    """The newest CUDA the driver runs (cuDriverGetVersion), e.g. (12, 4)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value // 1000, version.value % 1000 // 10


def _horovod_build_record():
    """What scripts/install.sh recorded of the GPU build in this environment."""
    record = pathlib.Path(sys.prefix) / "horovod-build.json"
    return json.loads(record.read_text()) if record.exists() else None


def _nccl_runtime():
    """The libnccl.so.2 Horovod's library resolves (TensorFlow's pip NCCL,
    through its rpath), loaded and asked for its version."""
    import horovod.tensorflow
    library = next(pathlib.Path(horovod.tensorflow.__file__).parent.glob("mpi_lib*.so"))
    try:
        ldd = subprocess.run(["ldd", str(library)], capture_output=True, text=True,
                             check=False, timeout=60).stdout
        path = next(line.split("=>")[1].split()[0] for line in ldd.splitlines()
                    if "libnccl.so" in line)
        if path == "not":
            return f"NOT FOUND: {library.name} finds no libnccl.so.2"
        version = ctypes.c_int()
        ctypes.CDLL(path).ncclGetVersion(ctypes.byref(version))
    except (OSError, StopIteration, IndexError) as e:
        return f"NOT FOUND ({e or 'ldd lists no libnccl.so'})"
    return f"NCCL {nccl_version(version.value)} from {os.path.realpath(path)}"


def _cpu_model():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _threads():
    from hvdtrain.runtime import choose_mpi_wait, communication_has_a_core, default_intra_op_threads

    cores = len(os.sched_getaffinity(0))
    threads = default_intra_op_threads(local_size=2)
    groups = ("each allreduced as backprop makes it" if communication_has_a_core(threads, 2, cores)
              else "in one group, once all are made")
    return [("cores available", str(cores)),
            ("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "unset")),
            ("intra-op threads", f"cores / processes on the host (2 processes: {threads} "
                                 "each); --intra_op_threads to set"),
            ("MPI ranks waiting", f"2 processes would {choose_mpi_wait('auto', threads, 2, cores)}"
                                  " (--mpi_wait=auto); --mpi_wait to set"),
            ("gradients (CPU)", f"2 processes would send them {groups}; "
                                "--allreduce_groups to set")]


def _config(config_file):
    from hvdtrain.errors import UsageError
    from hvdtrain.tools import horovod_config
    path = pathlib.Path(config_file or "horovodrun.cfg")
    if config_file is None and not path.exists():
        return [("file", "none here (horovodrun uses its defaults); pass --config_file")]
    try:
        config = horovod_config.check(path)
    except UsageError as e:
        return [("file", str(path.resolve())), ("problem", str(e))]
    params = config.get("params") or {}     # a section may be empty
    return [("file", f"{path.resolve()} (valid)"),
            *[(key, str(value)) for key, value in params.items()]]


def _self_tests():
    import horovod.tensorflow as hvd
    rows = []
    for controller, built in (("Gloo", hvd.gloo_built()), ("MPI", hvd.mpi_built())):
        if not built:
            continue
        try:
            rows.append((controller, _verdict(_launch(controller))))
        except Exception as e:  # the launcher's failures take many forms
            rows.append((controller, _failure(e)))
    return rows or [("none", "Horovod has no controller built")]


def _nccl_self_test():
    """A float32 allreduce of GPU tensors, which Horovod hands to NCCL: one
    process per GPU of this machine, each pinned as hvdtrain.init pins it."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    if not hvd.nccl_built():
        return [("NCCL", "skipped: Horovod has no NCCL operations")]
    gpus = len(tf.config.list_physical_devices("GPU"))
    if not gpus:
        return [("NCCL", "skipped: no GPU visible")]
    try:
        results = _launch("Gloo", np=gpus, device="GPU")
    except Exception as e:  # the launcher's failures take many forms
        return [("NCCL", _failure(e))]
    return [(f"NCCL, {gpus} GPU{'s' * (gpus > 1)}", _verdict(results))]


def _failure(error):
    """A failed self-test's line: the launcher's first line, shortened."""
    return f"FAILED: {str(error).strip().splitlines()[0][:200]}"


def _verdict(results):
    """One line for the ranks' (sum correct, seconds): correct or not, time,
    and bandwidth: algorithm bandwidth (bytes / time), and bus bandwidth as
    nccl-tests reports it (each byte crosses the ring 2 (n - 1) / n times)."""
    correct = all(ok for ok, _ in results)
    seconds = max(s for _, s in results)
    algorithm = SELF_TEST_BYTES / seconds
    bus = 2 * (len(results) - 1) / len(results) * algorithm
    return (f"{'correct' if correct else 'WRONG SUM'}; {SELF_TEST_BYTES // 2**20} MiB in "
            f"{seconds * 1e3:.1f} ms: bus bandwidth {bus / 1e9:.2f} GB/s"
            + (f" (algorithm {algorithm / 1e9:.2f} GB/s)" if len(results) == 1 else ""))


def _launch(controller, np=2, device="CPU"):
    from horovod.runner import run
    return run(_allreduce_on_rank, args=(device,), np=np, hosts=f"localhost:{np}",
               use_gloo=controller == "Gloo", use_mpi=controller == "MPI")


def _allreduce_on_rank(device):
    """On each process: (sum correct, median seconds) of a float32 allreduce
    of a tensor on `device` (CPU, or this process's GPU)."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from hvdtrain import runtime

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    runtime.pin_gpu()
    with tf.device(f"/{device}:0"):
        values = tf.fill([SELF_TEST_BYTES // 4], float(hvd.rank() + 1))
        expected = hvd.size() * (hvd.size() + 1) / 2
        hvd.allreduce(values, op=hvd.Sum, name="doctor.warmup")
        seconds = []
        for i in range(SELF_TEST_REPEATS):
            start = time.perf_counter()
            summed = hvd.allreduce(values, op=hvd.Sum, name=f"doctor.{i}").numpy()
            seconds.append(time.perf_counter() - start)
    correct = bool(np.all(summed == expected))
    return correct, float(np.median(seconds))
