#!/usr/bin/env bash
# Installs everything hvdtrain needs, idempotently: Debian's Open MPI, ssh
# (launches across hosts, and the multi-host test's sshd) and the headers
# TensorFlow's wheel includes but does not ship, a virtualenv with the
# pinned Python packages, and Horovod built from its PyPI source against the
# installed TensorFlow (the wheel is cached outside the checkout, keyed by the
# Horovod, TensorFlow and Python versions). An install ends with
# `horovodrun --check-build`; a run with nothing to install takes seconds.
#
# Environment:
#   HVDTRAIN_VENV    the virtualenv to create or update (default: <repo>/.venv)
#   HVDTRAIN_CACHE   where built Horovod wheels are kept (default: ~/.cache/hvdtrain)
#   HVDTRAIN_GPU=1   install `tensorflow` and build Horovod with NCCL operations
#   PYTHON           the interpreter for a new virtualenv (default: python3.11 or python3)
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
if [ ! -x "$venv/bin/python" ]; then
  python=${PYTHON:-$(command -v python3.11 || command -v python3)}
  "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$python is not Python 3.11; set PYTHON=/path/to/python3.11"
  say "creating virtualenv $venv"
  "$python" -m venv "$venv"
fi
py=$venv/bin/python
pip=("$py" -m pip install -q --disable-pip-version-check -c "$constraints")

tf_pkg=tensorflow-cpu; [ "$gpu" = 1 ] && tf_pkg=tensorflow
tf_version=$(pinned "$tf_pkg")
hvd_version=$(pinned horovod)
py_tag=$("$py" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
flavour=cpu; [ "$gpu" = 1 ] && flavour=nccl

# A stamp of everything that decides the environment: when it matches, nothing
# is reinstalled and a second run takes seconds.
stamp_file=$venv/.hvdtrain-install
stamp=$(cat "$constraints" "$repo/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)-$flavour
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
  say "pip install $tf_pkg==$tf_version and hvdtrain's dependencies"
  "${pip[@]}" --upgrade pip wheel setuptools >/dev/null
  "${pip[@]}" "$tf_pkg" cmake
  wheels=$cache/wheels/horovod-$hvd_version-$tf_pkg-$tf_version-$py_tag-$flavour
  if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
    say "building horovod==$hvd_version against $tf_pkg==$tf_version (takes a few minutes)"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    # TensorFlow >= 2.19 moved xla_builder.h; Horovod 0.28.1 includes the old path.
    shim=$build/include/tensorflow/compiler/xla/client
    mkdir -p "$shim"
    echo '#include "xla/hlo/builder/xla_builder.h"' >"$shim/xla_builder.h"
    gpu_env=(); [ "$gpu" = 1 ] && gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL)
    env "${gpu_env[@]}" \
      PATH="$venv/bin:$PATH" CPATH="$build/include${CPATH:+:$CPATH}" \
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
      CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
      "$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
        -w "$build/wheel" "horovod==$hvd_version" >"$build/log" 2>&1 \
      || { tail -n 40 "$build/log" >&2; die "building Horovod failed (log above)"; }
    mkdir -p "$(dirname "$wheels")"
    rm -rf "$wheels.tmp" && mv "$build/wheel" "$wheels.tmp" && mv "$wheels.tmp" "$wheels"
  fi
  say "installing the Horovod wheel from $wheels"
  "${pip[@]}" --no-deps --force-reinstall "$wheels"/horovod-*.whl
  "${pip[@]}" -e "$repo[test]"

  # Horovod's own report of what it was built with.
  report=$(PATH="$venv/bin:$PATH" "$venv/bin/horovodrun" --check-build 2>&1) \
    || { echo "$report" >&2; die "horovodrun --check-build failed"; }
  needs=(TensorFlow MPI Gloo); [ "$gpu" = 1 ] && needs+=(NCCL)
  for need in "${needs[@]}"; do
    grep -qE "\[X\] $need" <<<"$report" \
      || { echo "$report" >&2; die "Horovod was built without $need (report above)"; }
  done
  echo "$stamp" >"$stamp_file"
fi

# Every run, in seconds: the installed Horovod loads into TensorFlow with both controllers.
"$py" -c 'import sys, horovod.tensorflow as hvd; sys.exit(not (hvd.mpi_built() and hvd.gloo_built()))' \
  2>/dev/null || { rm -f "$stamp_file"; die "horovod.tensorflow does not load with MPI and Gloo; run this script again"; }
say "ok: Horovod $hvd_version with TensorFlow $tf_version, MPI and Gloo in $venv"
