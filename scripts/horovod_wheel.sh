# Shell functions shared by scripts/install.sh (hvdtrain's environment) and
# bench/keras2_env.sh (the Keras 2 contender's): a virtualenv of one of the
# Python versions the caller supports, and Horovod built from its PyPI source
# against the TensorFlow installed in it, with the wheel cached by the caller.
# Sourced; the caller defines `say` and `die`.

# new_venv VENV VERSION...: creates the virtualenv VENV unless it exists, with
# $PYTHON, else python3, which must be one of the Python VERSIONs (oldest
# first, e.g. 3.11 3.12 3.13): otherwise one line names them and dies.
new_venv() {
  local venv=$1 python=${PYTHON:-python3} found
  shift
  [ -x "$venv/bin/python" ] && return
  local versions=$* hint="set PYTHON=/path/to/python${!#}"
  found=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || die "no Python at $python (supported: ${versions// /, }); $hint"
  [[ " $versions " == *" $found "* ]] \
    || die "$python is Python $found (supported: ${versions// /, }); $hint"
  say "creating virtualenv $venv with Python $found"
  "$python" -m venv "$venv"
}

# source_fixes_key: names the version of horovod_source_fixes.py, for the
# callers' wheel folders (a wheel built with other fixes is another wheel).
source_fixes_key() {
  sha256sum "$(dirname "${BASH_SOURCE[0]}")/horovod_source_fixes.py" | cut -c1-8
}

# build_horovod_wheel VENV VERSION WHEELS [NAME=VALUE...]: unless WHEELS holds a
# wheel already, builds horovod==VERSION with MPI and Gloo against VENV's
# TensorFlow into WHEELS, from its PyPI source with the fixes of
# horovod_source_fixes.py, the extra build settings (e.g.
# HOROVOD_GPU_OPERATIONS=NCCL) in the environment.
build_horovod_wheel() {
  local venv=$1 version=$2 wheels=$3 build
  shift 3
  ls "$wheels"/horovod-*.whl >/dev/null 2>&1 && return
  say "building horovod==$version against the TensorFlow in $venv (takes a few minutes)"
  build=$(mktemp -d)
  # --no-cache-dir: pip's own wheel cache would hand back a Horovod built from
  # the same source archive against another TensorFlow.
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
      --no-cache-dir -d "$build" "horovod==$version" >"$build/log" 2>&1 \
    && mkdir "$build/src" && tar -xzf "$build"/horovod-*.tar.gz -C "$build/src" --strip-components=1 \
    || { tail -n 20 "$build/log" >&2; rm -rf "$build"; die "could not fetch Horovod $version's source from PyPI (log above)"; }
  local fixed
  fixed=$("$venv/bin/python" "$(dirname "${BASH_SOURCE[0]}")/horovod_source_fixes.py" "$build/src" 2>&1) \
    || { rm -rf "$build"; die "$fixed"; }
  say "fixed in Horovod's source: $fixed"
  # TensorFlow >= 2.19 moved xla_builder.h; Horovod 0.28.1 includes the old
  # path. A forwarding header there, only where TensorFlow lacks the old one
  # (CPATH is searched before TensorFlow's own include folder).
  local tf_include
  tf_include=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tensorflow/include
  mkdir -p "$build/include/tensorflow/compiler/xla/client"
  [ -f "$tf_include/tensorflow/compiler/xla/client/xla_builder.h" ] \
    || echo '#include "xla/hlo/builder/xla_builder.h"' \
      >"$build/include/tensorflow/compiler/xla/client/xla_builder.h"
  if ! env "$@" PATH="$venv/bin:$PATH" CPATH="$build/include${CPATH:+:$CPATH}" \
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
      CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
      "$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-build-isolation \
        --no-deps --no-cache-dir -w "$build/wheel" "$build/src" >"$build/log" 2>&1; then
    tail -n 40 "$build/log" >&2
    rm -rf "$build"
    die "building Horovod failed (log above)"
  fi
  mkdir -p "$(dirname "$wheels")"
  rm -rf "$wheels.tmp" && mv "$build/wheel" "$wheels.tmp" && mv "$wheels.tmp" "$wheels"
  rm -rf "$build"
}

# check_horovod_build VENV WHEELS FRAMEWORK...: horovodrun --check-build lists
# every FRAMEWORK (TensorFlow, MPI, Gloo, NCCL); if not, drops the cached
# wheels, so that the next run rebuilds them, and dies.
check_horovod_build() {
  local venv=$1 wheels=$2 report need
  shift 2
  report=$(PATH="$venv/bin:$PATH" "$venv/bin/horovodrun" --check-build 2>&1) \
    || { echo "$report" >&2; rm -rf "$wheels"; die "horovodrun --check-build failed"; }
  for need in "$@"; do
    grep -qE "\[X\] $need" <<<"$report" \
      || { echo "$report" >&2; rm -rf "$wheels"; die "Horovod was built without $need (report above)"; }
  done
}

# check_horovod_loads VENV STAMP_FILE OPERATIONS...: every run, in seconds:
# horovod.tensorflow loads and initialises, built with each of OPERATIONS (MPI,
# Gloo, NCCL: nccl_built() is NCCL's version code, e.g. 23203); if not, the
# stamp goes, so the next run reinstalls.
check_horovod_loads() {
  local venv=$1 stamp_file=$2 log missing
  shift 2
  log=$(mktemp)
  if ! missing=$("$venv/bin/python" -c 'import sys, horovod.tensorflow as hvd
hvd.init()
built = {"MPI": hvd.mpi_built(), "Gloo": hvd.gloo_built(), "NCCL": hvd.nccl_built()}
print(" ".join(name for name in sys.argv[1:] if not built[name]))' "$@" 2>"$log") || [ -n "$missing" ]; then
    tail -n 5 "$log" >&2; rm -f "$log" "$stamp_file"
    die "horovod.tensorflow does not initialise with $*${missing:+ (missing: $missing)}; run this script again"
  fi
  rm -f "$log"
}
