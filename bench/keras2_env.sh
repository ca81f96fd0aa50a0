#!/usr/bin/env bash
# Builds, idempotently, the virtualenv of bench/alternatives.py's Horovod-Keras 2
# contender: TensorFlow 2.15 (tf.keras is Keras 2) with Horovod built from its
# PyPI source against it, versions from bench/keras2-constraints.txt. It does
# what scripts/install.sh does for hvdtrain's own environment (and relies on
# the Debian packages that script installs); the built wheel is cached beside
# install.sh's, keyed by the Horovod, TensorFlow and Python versions, so a run
# with nothing to do takes seconds. An install ends with `horovodrun --check-build`.
#
# Environment:
#   HVDTRAIN_KERAS2_VENV  the virtualenv (default: ~/.cache/hvdtrain/keras2-venv)
#   HVDTRAIN_CACHE        where built Horovod wheels are kept (default: ~/.cache/hvdtrain)
#   PYTHON                the interpreter for a new virtualenv (default: python3.11 or python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${HVDTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdtrain}
venv=${HVDTRAIN_KERAS2_VENV:-$cache/keras2-venv}
constraints=$repo/bench/keras2-constraints.txt

say() { printf 'keras2_env: %s\n' "$*"; }
die() { printf 'keras2_env: error: %s\n' "$*" >&2; exit 1; }
pinned() { sed -n "s/^$1==\([^ ]*\).*/\1/p" "$constraints"; }

for d in libopenmpi-dev g++ make; do
  dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q 'install ok installed' \
    || die "Debian package $d is missing; run scripts/install.sh first"
done

if [ ! -x "$venv/bin/python" ]; then
  python=${PYTHON:-$(command -v python3.11 || command -v python3)}
  "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$python is not Python 3.11; set PYTHON=/path/to/python3.11"
  say "creating virtualenv $venv"
  "$python" -m venv "$venv"
fi
py=$venv/bin/python
pip=("$py" -m pip install -q --disable-pip-version-check -c "$constraints")
tf_version=$(pinned tensorflow-cpu)
hvd_version=$(pinned horovod)
py_tag=$("$py" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')

stamp_file=$venv/.hvdtrain-keras2-env
stamp=$(cat "$constraints" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
  say "pip install tensorflow-cpu==$tf_version keras numpy cmake"
  "${pip[@]}" --upgrade pip wheel setuptools >/dev/null
  "${pip[@]}" tensorflow-cpu keras numpy absl-py cmake cloudpickle psutil pyyaml packaging
  wheels=$cache/wheels/horovod-$hvd_version-tensorflow-cpu-$tf_version-$py_tag-cpu
  if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
    say "building horovod==$hvd_version against tensorflow-cpu==$tf_version (takes a few minutes)"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    # --no-cache-dir: pip's own wheel cache would hand back a Horovod built
    # against another TensorFlow (hvdtrain's) from the same source archive.
    PATH="$venv/bin:$PATH" \
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
      CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
      "$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps --no-cache-dir \
        -w "$build/wheel" "horovod==$hvd_version" >"$build/log" 2>&1 \
      || { tail -n 40 "$build/log" >&2; die "building Horovod failed (log above)"; }
    mkdir -p "$(dirname "$wheels")"
    rm -rf "$wheels.tmp" && mv "$build/wheel" "$wheels.tmp" && mv "$wheels.tmp" "$wheels"
  fi
  say "installing the Horovod wheel from $wheels"
  "${pip[@]}" --no-deps --force-reinstall "$wheels"/horovod-*.whl

  # A wheel that fails these checks is dropped from the cache, so the next run rebuilds it.
  report=$(PATH="$venv/bin:$PATH" "$venv/bin/horovodrun" --check-build 2>&1) \
    || { echo "$report" >&2; rm -rf "$wheels"; die "horovodrun --check-build failed"; }
  for need in TensorFlow MPI Gloo; do
    grep -qE "\[X\] $need" <<<"$report" \
      || { echo "$report" >&2; rm -rf "$wheels"; die "Horovod was built without $need (report above)"; }
  done
  echo "$stamp" >"$stamp_file"
fi

"$py" -c 'import sys, horovod.tensorflow as hvd; sys.exit(not (hvd.mpi_built() and hvd.gloo_built()))' \
  2>/dev/null || { rm -f "$stamp_file"; die "horovod.tensorflow does not load with MPI and Gloo; run this script again"; }
say "ok: Horovod $hvd_version with TensorFlow $tf_version (Keras 2), MPI and Gloo in $venv"
