"""Fixes to Horovod 0.28.1's source for the TensorFlow hvdtrain pins, applied
to an unpacked sdist before it is built:

    python scripts/horovod_source_fixes.py SOURCE_DIR

Each fix replaces one exact passage. A passage already replaced is left alone
(running twice changes nothing); a passage found neither way means the source
is not the one these fixes were written for, and the build stops there, naming
the fix, instead of compiling something nobody checked.
"""

import pathlib
import sys

# (file, what it fixes, the passage as released, the passage fixed)
FIXES = [
    ("horovod/tensorflow/xla_mpi_ops.cc",
     # GPU builds only (the file's body is under HAVE_GPU). XLA dropped its
     # xla::StatusOr alias of absl::StatusOr (gone in TensorFlow 2.21); the
     # absl name compiles against every TensorFlow that had the alias too.
     "xla::StatusOr -> absl::StatusOr (TensorFlow 2.21's XLA)",
     "::xla::StatusOr<::xla::XlaOp>",
     "absl::StatusOr<::xla::XlaOp>"),
    ("horovod/tensorflow/mpi_ops.cc",
     # GPU builds only. Horovod declares stream_executor::gpu::AsGpuStreamValue
     # and leaves it to libtensorflow_framework, which no longer exports it in
     # TensorFlow 2.21: the library then links but fails to load with an
     # undefined symbol. From 2.21 on it is defined here, as TensorFlow's own
     # inline helper does; older TensorFlow keeps its exported one.
     "define AsGpuStreamValue (no longer exported by TensorFlow 2.21)",
     """// Forward declaration of AsGpuStreamValue
namespace stream_executor {
namespace gpu {
GpuStreamHandle AsGpuStreamValue(Stream* stream);
} // namespace stream_executor
} // namespace gpu
#if TENSORFLOW_VERSION >= 2011000000
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#else
#include "tensorflow/stream_executor/stream.h"
#endif // TENSORFLOW_VERSION >= 2011000000
""",
     """#if TENSORFLOW_VERSION >= 2011000000
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#else
#include "tensorflow/stream_executor/stream.h"
#endif // TENSORFLOW_VERSION >= 2011000000
namespace stream_executor {
namespace gpu {
#if TENSORFLOW_VERSION >= 2021000000
inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
#else
GpuStreamHandle AsGpuStreamValue(Stream* stream);
#endif // TENSORFLOW_VERSION >= 2021000000
} // namespace gpu
} // namespace stream_executor
"""),
]


def apply(source_dir):
    """Applies every fix to the sources under `source_dir`; returns the names
    of those applied now (not those found applied already)."""
    applied = []
    for relative, name, released, fixed in FIXES:
        path = pathlib.Path(source_dir) / relative
        text = path.read_text()
        if released in text:
            path.write_text(text.replace(released, fixed))
            applied.append(name)
        elif fixed not in text:
            raise SystemExit(f"Horovod source fix '{name}' no longer matches "
                             f"{relative}: update scripts/horovod_source_fixes.py for this "
                             "Horovod version")
    return applied


if __name__ == "__main__":
    print("; ".join(apply(sys.argv[1])) or "none needed (applied before)")
