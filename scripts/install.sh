#!/usr/bin/env bash
# Installs everything hvdtrain needs, idempotently: Debian's Open MPI, ssh
# (launches across hosts, and the multi-host test's sshd) and the headers
# TensorFlow's wheel includes but does not ship, a virtualenv with the
# pinned Python packages, and Horovod built from its PyPI source against the
# installed TensorFlow (the wheel is cached outside the checkout, keyed by the
# Horovod, TensorFlow and Python versions, and for GPUs the CUDA compiler).
# An install ends with `horovodrun --check-build` and an import of hvdtrain;
# a run with nothing to install takes seconds.
#
# Environment:
#   HVDTRAIN_VENV       the virtualenv to create or update (default: <repo>/.venv)
#   HVDTRAIN_CACHE      where built Horovod wheels are kept (default: ~/.cache/hvdtrain)
#   HVDTRAIN_GPU=1      install `tensorflow[and-cuda]` and build Horovod with NCCL
#                       operations (works without a GPU; see scripts/cuda_toolchain.sh)
#   HVDTRAIN_CUDA_HOME  the CUDA toolkit for that build, or `pypi` (cuda_toolchain.sh)
#   PYTHON              the interpreter for a new virtualenv: Python 3.11, 3.12 or 3.13
#                       (default: python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HVDTRAIN_VENV:-$repo/.venv}
cache=${HVDTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdtrain}
gpu=${HVDTRAIN_GPU:-0}
constraints=$repo/constraints.txt

say() { printf 'install: %s\n' "$*"; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }
pinned() { # pinned NAME -> the version constraints.txt pins NAME to
  sed -n "s/^$1==\([^ ]*\).*/\1/p" "$constraints"
}

# --- Debian packages -------------------------------------------------------
debs=(openmpi-bin libopenmpi-dev openssh-client openssh-server libhighwayhash-dev
      libfarmhash-dev g++ make)
missing=()
for d in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q 'install ok installed' || missing+=("$d")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  command -v apt-get >/dev/null || die "missing system packages ${missing[*]} and no apt-get; install them by hand"
  say "apt-get install ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Python packages -------------------------------------------------------
source "$repo/scripts/horovod_wheel.sh"
# The Pythons TensorFlow publishes wheels for, as pyproject.toml's requires-python.
new_venv "$venv" 3.11 3.12 3.13
py=$venv/bin/python
pip=("$py" -m pip install -q --disable-pip-version-check -c "$constraints")

tf_pkg=tensorflow-cpu; [ "$gpu" = 1 ] && tf_pkg=tensorflow
tf_version=$(pinned "$tf_pkg")
hvd_version=$(pinned horovod)
py_tag=$("$py" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
flavour=cpu; [ "$gpu" = 1 ] && flavour=nccl-${HVDTRAIN_CUDA_HOME:-auto}

# A stamp of everything that decides the environment: when it matches, nothing
# is reinstalled and a second run takes seconds.
stamp_file=$venv/.hvdtrain-install
# (The checkout's path too: hvdtrain is installed from it in editable mode.)
stamp=$( (cat "$constraints" "$repo/pyproject.toml" "${BASH_SOURCE[0]}" "$repo"/scripts/horovod_* \
  "$repo/scripts/cuda_toolchain.sh"; echo "$repo") | sha256sum | cut -c1-16)-$flavour
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
  tf_req=$tf_pkg; [ "$gpu" = 1 ] && tf_req="tensorflow[and-cuda]"
  say "pip install $tf_req==$tf_version and hvdtrain's dependencies"
  "${pip[@]}" --upgrade pip wheel setuptools >/dev/null
  "${pip[@]}" "$tf_req" cmake
  wheels=$cache/wheels/horovod-$hvd_version-$tf_pkg-$tf_version-$py_tag-fixes$(source_fixes_key)-cpu
  build_env=()
  if [ "$gpu" = 1 ]; then
    # The kernels' CUDA compiler and TensorFlow's NCCL decide the GPU wheel.
    source "$repo/scripts/cuda_toolchain.sh"
    cuda=$(cuda_toolkit "$py" "$cache")
    cuda_v=$(cuda_version "$cuda")
    nccl=$(pinned nvidia-nccl-cu12)
    archs=${HOROVOD_BUILD_CUDA_CC_LIST:-$(cuda_architectures "$cuda")}
    wheels=${wheels%-cpu}-nccl$nccl-cuda$cuda_v-sm${archs//,/-}
    nccl_env=$(nccl_build_env "$venv" "$venv/.hvdtrain-nccl")
    mapfile -t build_env <<<"$nccl_env"
    build_env+=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=$cuda" "HOROVOD_BUILD_CUDA_CC_LIST=$archs")
    say "GPU build: CUDA compiler $cuda_v at $cuda for compute capabilities $archs, NCCL $nccl from TensorFlow's packages"
    # For `hvdtrain doctor`: the device code decides the driver it needs
    # (CUDA 12: 525 or later; CUDA 13: 580 or later).
    driver=525; [ "${cuda_v%%.*}" -ge 13 ] && driver=580
    printf '{"cuda_compiler": "%s", "cuda_architectures": "%s", "nccl": "%s", "driver": %s}\n' \
      "$cuda_v" "$archs" "$nccl" "$driver" >"$venv/horovod-build.json"
  fi
  build_horovod_wheel "$venv" "$hvd_version" "$wheels" "${build_env[@]}"
  say "installing the Horovod wheel from $wheels"
  "${pip[@]}" --no-deps --force-reinstall "$wheels"/horovod-*.whl
  "${pip[@]}" -e "$repo[test]"
  needs=(TensorFlow MPI Gloo); [ "$gpu" = 1 ] && needs+=(NCCL)
  check_horovod_build "$venv" "$wheels" "${needs[@]}"
  echo "$stamp" >"$stamp_file"
fi

ops=(MPI Gloo); [ "$gpu" = 1 ] && ops+=(NCCL)
check_horovod_loads "$venv" "$stamp_file" "${ops[@]}"
"$py" -c 'import hvdtrain' || { rm -f "$stamp_file"; die "hvdtrain does not import in $venv (error above); run this script again"; }
listed="MPI and Gloo"; [ "$gpu" = 1 ] && listed="NCCL, MPI and Gloo"
say "ok: Horovod $hvd_version with TensorFlow $tf_version, $listed operations, in $venv"
