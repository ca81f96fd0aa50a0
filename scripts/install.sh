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
source "$repo/scripts/horovod_wheel.sh"
new_venv "$venv"
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
stamp=$(cat "$constraints" "$repo/pyproject.toml" "${BASH_SOURCE[0]}" "$repo/scripts/horovod_wheel.sh" \
  | sha256sum | cut -c1-16)-$flavour
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
  say "pip install $tf_pkg==$tf_version and hvdtrain's dependencies"
  "${pip[@]}" --upgrade pip wheel setuptools >/dev/null
  "${pip[@]}" "$tf_pkg" cmake
  wheels=$cache/wheels/horovod-$hvd_version-$tf_pkg-$tf_version-$py_tag-$flavour
  gpu_env=(); [ "$gpu" = 1 ] && gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL)
  build_horovod_wheel "$venv" "$hvd_version" "$wheels" "${gpu_env[@]}"
  say "installing the Horovod wheel from $wheels"
  "${pip[@]}" --no-deps --force-reinstall "$wheels"/horovod-*.whl
  "${pip[@]}" -e "$repo[test]"
  needs=(TensorFlow MPI Gloo); [ "$gpu" = 1 ] && needs+=(NCCL)
  check_horovod_build "$venv" "$wheels" "${needs[@]}"
  echo "$stamp" >"$stamp_file"
fi

check_horovod_loads "$venv" "$stamp_file"
say "ok: Horovod $hvd_version with TensorFlow $tf_version, MPI and Gloo in $venv"
