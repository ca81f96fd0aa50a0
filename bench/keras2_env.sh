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
#   PYTHON                the interpreter for a new virtualenv: Python 3.11 (default:
#                         python3.11, else python3)
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

source "$repo/scripts/horovod_wheel.sh"
# TensorFlow 2.15 has no wheels for a newer Python.
PYTHON=${PYTHON:-$(command -v python3.11 || echo python3)} new_venv "$venv" 3.11
py=$venv/bin/python
pip=("$py" -m pip install -q --disable-pip-version-check -c "$constraints")
tf_version=$(pinned tensorflow-cpu)
hvd_version=$(pinned horovod)
py_tag=$("$py" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')

stamp_file=$venv/.hvdtrain-keras2-env
stamp=$(cat "$constraints" "${BASH_SOURCE[0]}" "$repo"/scripts/horovod_* | sha256sum | cut -c1-16)
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
  say "pip install tensorflow-cpu==$tf_version keras numpy cmake"
  "${pip[@]}" --upgrade pip wheel setuptools >/dev/null
  "${pip[@]}" tensorflow-cpu keras numpy absl-py cmake cloudpickle psutil pyyaml packaging
  wheels=$cache/wheels/horovod-$hvd_version-tensorflow-cpu-$tf_version-$py_tag-fixes$(source_fixes_key)-cpu
  build_horovod_wheel "$venv" "$hvd_version" "$wheels"
  say "installing the Horovod wheel from $wheels"
  "${pip[@]}" --no-deps --force-reinstall "$wheels"/horovod-*.whl
  check_horovod_build "$venv" "$wheels" TensorFlow MPI Gloo
  echo "$stamp" >"$stamp_file"
fi

check_horovod_loads "$venv" "$stamp_file" MPI Gloo
say "ok: Horovod $hvd_version with TensorFlow $tf_version (Keras 2), MPI and Gloo in $venv"
