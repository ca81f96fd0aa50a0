# Shell functions for scripts/install.sh's GPU flavour: the CUDA compiler that
# builds Horovod's kernels, and the NCCL it links. Sourced; the caller defines
# `say`, `die` and `pinned`.
#
# Which CUDA compiler (HVDTRAIN_CUDA_HOME):
#   a directory  that CUDA toolkit (its bin/nvcc and include/), version 12 or later
#   pypi         NVIDIA's nvcc from PyPI, at the versions constraints.txt pins,
#                installed once under the cache: for machines without a toolkit
#   unset        the first CUDA 12+ toolkit of $CUDA_HOME, the `nvcc` on PATH
#                and /usr/local/cuda, else pypi
# The kernels are small (scaling and copying fusion buffers); the host side of
# Horovod calls the CUDA runtime that TensorFlow's pip packages bring, so the
# toolkit decides only which driver the device code needs (docs/gpus.md).
# The functions print their results on stdout and their progress on stderr.

CUDA_PYPI_PACKAGES=(nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-runtime nvidia-cuda-cccl)

# cuda_toolkit PYTHON CACHE: prints the root of the CUDA toolkit to build with.
cuda_toolkit() {
  local python=$1 cache=$2 nvcc candidate
  case ${HVDTRAIN_CUDA_HOME:-} in
    pypi) cuda_from_pypi "$python" "$cache"; return ;;
    ?*) usable_cuda "$HVDTRAIN_CUDA_HOME" \
          || die "no CUDA 12+ toolkit at HVDTRAIN_CUDA_HOME=$HVDTRAIN_CUDA_HOME (its bin/nvcc and include/cuda_runtime.h); point it at one, or set HVDTRAIN_CUDA_HOME=pypi for NVIDIA's nvcc from PyPI"
        echo "$HVDTRAIN_CUDA_HOME"; return ;;
  esac
  nvcc=$(command -v nvcc || true)
  for candidate in "${CUDA_HOME:-}" ${nvcc:+"$(dirname "$(dirname "$(readlink -f "$nvcc")")")"} \
      /usr/local/cuda; do
    [ -n "$candidate" ] || continue
    if usable_cuda "$candidate"; then echo "$candidate"; return; fi
    say "not using $candidate: no CUDA 12+ toolkit there" >&2
  done
  cuda_from_pypi "$python" "$cache"
}

# usable_cuda ROOT: ROOT holds a CUDA 12+ nvcc and the runtime's headers.
usable_cuda() {
  local version
  version=$(cuda_version "$1") && [ "${version%%.*}" -ge 12 ] && [ -f "$1/include/cuda_runtime.h" ]
}

# cuda_version ROOT: the release of ROOT's nvcc (e.g. 13.0.88); fails without one.
cuda_version() {
  "$1/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p' | grep .
}

# cuda_from_pypi PYTHON CACHE: installs NVIDIA's CUDA compiler, headers and
# static runtime from PyPI (pinned) under CACHE once; prints its root.
cuda_from_pypi() {
  local python=$1 cache=$2 version target log
  version=$(pinned nvidia-cuda-nvcc)
  target=$cache/cuda/nvcc-$version
  if [ ! -x "$target/nvidia/cu${version%%.*}/bin/nvcc" ]; then
    say "installing NVIDIA's CUDA compiler $version from PyPI into $target" >&2
    log=$(mktemp)
    rm -rf "$target.tmp"
    if ! "$python" -m pip install -q --disable-pip-version-check --no-deps -c "$constraints" \
        --target "$target.tmp" "${CUDA_PYPI_PACKAGES[@]}" >"$log" 2>&1; then
      local reason
      reason=$(grep -m1 -E 'ERROR|error' "$log" || tail -n1 "$log")
      rm -rf "$target.tmp" "$log"
      die "could not install NVIDIA's CUDA compiler from PyPI (${CUDA_PYPI_PACKAGES[*]}: ${reason}); install a CUDA 12+ toolkit and set HVDTRAIN_CUDA_HOME to it, or build the GPU image (docker/Dockerfile)"
    fi
    rm -f "$log"
    local root=$target.tmp/nvidia/cu${version%%.*}
    # The wheels put the libraries in lib/ as libcudart.so.N; nvcc's profile
    # links from lib64/ and CMake's FindCUDAToolkit wants libcudart.so.
    ln -sfn lib "$root/lib64"
    ln -sfn "$(basename "$(ls "$root"/lib/libcudart.so.* | head -n1)")" "$root/lib/libcudart.so"
    mkdir -p "$(dirname "$target")"
    rm -rf "$target" && mv "$target.tmp" "$target"
  fi
  echo "$target/nvidia/cu${version%%.*}"
}

# cuda_architectures ROOT: the compute capabilities to build kernels for, as
# TensorFlow 2.21's own GPU build does (SASS for 6.0, 7.0, 8.0, 8.9, and 9.0
# with PTX, which runs later GPUs), less those ROOT's nvcc no longer
# supports, plus 7.5 (T4s) where 7.0 is gone (CUDA 13).
cuda_architectures() {
  local supported list=() cc
  supported=$("$1/bin/nvcc" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_//p' | tr '\n' ' ')
  for cc in 60 70 75 80 89 90; do
    [[ " $supported " == *" $cc "* ]] || continue
    [ "$cc" = 75 ] && [[ " $supported " == *" 70 "* ]] && continue
    list+=("$cc")
  done
  ((${#list[@]})) || die "nvcc at $1 supports none of compute capabilities 6.0-9.0"
  (IFS=,; echo "${list[*]}")
}

# nccl_build_env VENV DIR: prints, one a line, the Horovod build settings that
# link the NCCL of VENV's TensorFlow (nvidia-nccl-cu12) as a shared library,
# with DIR for the link-time names the wheel lacks. One NCCL in the process,
# found at run time through an rpath relative to Horovod's library, with no
# LD_LIBRARY_PATH.
nccl_build_env() {
  local venv=$1 dir=$2 nccl
  nccl=$("$venv/bin/python" -c 'import importlib.util as u
print(u.find_spec("nvidia.nccl").submodule_search_locations[0])' 2>/dev/null) \
    || die "TensorFlow's NCCL (nvidia-nccl-cu12) is not in $venv; run this script again"
  mkdir -p "$dir/lib"
  ln -sfn "$nccl/include" "$dir/include"
  ln -sfn "$nccl/lib/libnccl.so.2" "$dir/lib/libnccl.so"
  # horovod/tensorflow/mpi_lib*.so -> site-packages/nvidia/nccl/lib
  printf '%s\n' HOROVOD_NCCL_LINK=SHARED "HOROVOD_NCCL_INCLUDE=$dir/include" "HOROVOD_NCCL_LIB=$dir/lib"
  echo "LDFLAGS=-Wl,-rpath,\$ORIGIN/../../nvidia/nccl/lib${LDFLAGS:+ $LDFLAGS}"
}
