"""scripts/install.sh's pieces that run in seconds: the fixes to Horovod's
source (and what the installed Horovod does with the launcher's), the choice
of Python for a new virtualenv, and the one-line failures of the CUDA
toolchain choice. (The whole GPU build is tested by `make test-gpu`.)"""

import importlib.machinery
import importlib.util
import pathlib
import re
import shlex
import sys
import threading
import time
import types

import pytest
from packaging.specifiers import SpecifierSet

from launch import REPO, run

spec = importlib.util.spec_from_file_location("fixes", REPO / "scripts" / "horovod_source_fixes.py")
fixes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixes)


def _released_source(root):
    """The passages the fixes replace, as Horovod 0.28.1 releases them."""
    for relative, _, released, _ in fixes.FIXES:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(path.read_text() + released if path.exists() else
                        f"// before\n{released}// after\n")


def test_the_source_fixes_apply_once_and_then_change_nothing(tmp_path):
    _released_source(tmp_path)
    assert fixes.apply(tmp_path) == [name for _, name, _, _ in fixes.FIXES]
    fixed = {relative: (tmp_path / relative).read_text() for relative, *_ in fixes.FIXES}
    for relative, _, released, replacement in fixes.FIXES:
        assert released not in fixed[relative] and replacement in fixed[relative]
        assert fixed[relative].startswith("// before\n")
    assert fixes.apply(tmp_path) == []
    assert fixed == {relative: (tmp_path / relative).read_text() for relative, *_ in fixes.FIXES}


def test_horovodrun_asks_once_what_the_extension_was_built_with(tmp_path, monkeypatch):
    from horovod.common import util

    # An extension whose library lies in tmp_path; the forked check imports it from sys.modules.
    library = tmp_path / "mpi_lib.cpython-311-x86_64-linux-gnu.so"
    library.write_bytes(b"a library")
    probe = types.ModuleType("horovod.built_probe")
    probe.__spec__ = importlib.machinery.ModuleSpec("horovod.built_probe", None, is_package=True)
    probe.__spec__.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setitem(sys.modules, "horovod.built_probe", probe)

    def asked(answer, question="built with Gloo"):
        probe.answer = answer
        return util._check_extension_lambda("built_probe", lambda ext: ext.answer, question,
                                            False)

    assert asked(True) is True
    assert asked(False) is True   # answered from the facts kept beside the library
    library.write_bytes(b"another library")
    assert asked(False) is False  # another build: asked again
    # What depends on the machine, not the build, is asked every time.
    assert [asked(n, "running with GPU") for n in (1, 2)] == [1, 2]


def test_a_rank_that_stops_on_sigterm_keeps_its_status_through_horovods_middleman(tmp_path):
    """horovodrun --gloo's stop of a rank (a signal to horovodrun, another
    rank's failure, horovodrun's death): its middleman sends SIGTERM, and
    the rank's shell then ends with the rank's status (200 after a stop),
    not frozen and killed (137) as it exited."""
    from horovod.runner.common.util import safe_shell_exec

    ready = tmp_path / "ready"
    rank = (f"import pathlib, signal, sys, time; "
            f"signal.signal(signal.SIGTERM, lambda *_: sys.exit(200)); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    stop, status = threading.Event(), []
    launched = threading.Thread(target=lambda: status.append(safe_shell_exec.execute(
        f"{shlex.quote(sys.executable)} -c {shlex.quote(rank)}; exit $?", events=[stop])))
    launched.start()
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    launched.join(timeout=60)
    assert status == [200]


def test_a_fix_that_no_longer_matches_stops_the_build_naming_it(tmp_path):
    _released_source(tmp_path)
    relative, name, released, _ = fixes.FIXES[1]
    (tmp_path / relative).write_text("// another Horovod\n")
    with pytest.raises(SystemExit) as stopped:
        fixes.apply(tmp_path)
    assert str(stopped.value) == (f"Horovod source fix '{name}' no longer matches {relative}: "
                                  "update scripts/horovod_source_fixes.py for this Horovod version")


def _fake_python(folder, name, version):
    """An interpreter `name` in `folder` that reports Python `version` to
    new_venv's check and makes a virtualenv folder naming itself."""
    folder.mkdir(exist_ok=True)
    python = folder / name
    python.write_text(f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  /bin/mkdir -p "$3/bin" && echo "$0" >"$3/made-by"
else
  echo {version}
fi
""")
    python.chmod(0o755)
    return python


def _new_venv(tmp_path, script, python=None):
    """Runs `script`'s own new_venv line (scripts/install.sh's or
    bench/keras2_env.sh's) with only tmp_path/bin on PATH and `python` as
    PYTHON; returns the result and the interpreter that made the virtualenv."""
    text = (REPO / script).read_text()
    line = re.search(r'^.*\bnew_venv "\$venv" .*$', text, re.MULTILINE).group(0)
    name = pathlib.Path(script).stem
    result = run(["bash", "-c", f"""set -euo pipefail
export PATH={tmp_path / "bin"}
unset PYTHON
{f"export PYTHON={python}" if python else ""}
venv={tmp_path / "venv"}
say() {{ printf '{name}: %s\\n' "$*"; }}
die() {{ printf '{name}: error: %s\\n' "$*" >&2; exit 1; }}
source {REPO}/scripts/horovod_wheel.sh
{line}
"""])
    made_by = tmp_path / "venv" / "made-by"
    return result, made_by.read_text().strip() if made_by.exists() else None


def test_install_makes_its_virtualenv_with_python3_of_a_supported_version(tmp_path):
    python3 = _fake_python(tmp_path / "bin", "python3", "3.12")
    _fake_python(tmp_path / "bin", "python3.11", "3.11")   # not preferred: install takes python3
    result, made_by = _new_venv(tmp_path, "scripts/install.sh")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"install: creating virtualenv {tmp_path}/venv with Python 3.12\n"
    assert made_by == str(python3)


def test_install_refuses_an_unsupported_python3_in_one_line(tmp_path):
    _fake_python(tmp_path / "bin", "python3", "3.10")
    result, made_by = _new_venv(tmp_path, "scripts/install.sh")
    assert result.returncode == 1 and result.stdout == "" and made_by is None
    assert result.stderr == ("install: error: python3 is Python 3.10 (supported: 3.11, 3.12, "
                             "3.13); set PYTHON=/path/to/python3.13\n")


@pytest.mark.parametrize("version", ["3.13", "3.10", None])
def test_install_takes_python_from_PYTHON_before_python3(tmp_path, version):
    _fake_python(tmp_path / "bin", "python3", "3.12")
    python = (_fake_python(tmp_path / "other", "python", version) if version
              else tmp_path / "other" / "python")
    result, made_by = _new_venv(tmp_path, "scripts/install.sh", python)
    if version == "3.13":
        assert result.returncode == 0 and made_by == str(python)
    else:
        assert result.returncode == 1 and made_by is None
        found = f"{python} is Python {version}" if version else f"no Python at {python}"
        assert result.stderr == (f"install: error: {found} (supported: 3.11, 3.12, 3.13); "
                                 "set PYTHON=/path/to/python3.13\n")


def test_an_existing_virtualenv_is_kept_whatever_python3_is(tmp_path):
    _fake_python(tmp_path / "bin", "python3", "3.10")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to("/bin/true")
    result, made_by = _new_venv(tmp_path, "scripts/install.sh")
    assert (result.returncode, result.stdout, result.stderr, made_by) == (0, "", "", None)


def test_the_keras2_environment_takes_python3_11_only(tmp_path):
    _fake_python(tmp_path / "bin", "python3", "3.12")
    result, made_by = _new_venv(tmp_path, "bench/keras2_env.sh")
    assert result.returncode == 1 and made_by is None
    assert result.stderr == ("keras2_env: error: python3 is Python 3.12 (supported: 3.11); "
                             "set PYTHON=/path/to/python3.11\n")
    # python3.11 on PATH is taken before python3.
    python311 = _fake_python(tmp_path / "bin", "python3.11", "3.11")
    result, made_by = _new_venv(tmp_path, "bench/keras2_env.sh")
    assert result.returncode == 0 and made_by == str(python311)


def test_the_supported_pythons_agree_with_pyproject_and_the_makefile():
    line = re.search(r'^new_venv "\$venv" (.*)$', (REPO / "scripts" / "install.sh").read_text(),
                     re.MULTILINE).group(1)
    required = SpecifierSet(re.search(r'^requires-python = "(.*)"$',
                                      (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1))
    assert line.split() == [f"3.{minor}" for minor in range(20) if f"3.{minor}" in required]
    newest = re.search(r"^NEWEST_PYTHON := (.*)$", (REPO / "Makefile").read_text(),
                       re.MULTILINE).group(1)
    assert newest == line.split()[-1]


def _toolkit(tmp_path, env):
    """Runs cuda_toolchain.sh's choice of CUDA compiler as install.sh does."""
    script = f"""set -euo pipefail
constraints={REPO}/constraints.txt
say() {{ printf 'install: %s\\n' "$*"; }}
die() {{ printf 'install: error: %s\\n' "$*" >&2; exit 1; }}
pinned() {{ sed -n "s/^$1==\\([^ ]*\\).*/\\1/p" "$constraints"; }}
source {REPO}/scripts/cuda_toolchain.sh
cuda_toolkit {sys.executable} {tmp_path / "cache"}
"""
    return run(["bash", "-c", script], env=env, timeout=300)


def test_a_missing_cuda_toolkit_is_named_in_one_line(tmp_path):
    result = _toolkit(tmp_path, {"HVDTRAIN_CUDA_HOME": str(tmp_path / "cuda")})
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (
        f"install: error: no CUDA 12+ toolkit at HVDTRAIN_CUDA_HOME={tmp_path}/cuda (its "
        "bin/nvcc and include/cuda_runtime.h); point it at one, or set "
        "HVDTRAIN_CUDA_HOME=pypi for NVIDIA's nvcc from PyPI")


def _fake_nvcc(root, release):
    """A toolkit folder whose nvcc reports `release`, and no headers."""
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(
        f"#!/bin/sh\necho 'Cuda compilation tools, release {release[:4]}, V{release}'\n")
    nvcc.chmod(0o755)


def test_the_toolkit_search_passes_over_what_is_no_cuda_12_toolkit(tmp_path):
    # An old CUDA_HOME, and an nvcc on PATH outside a toolkit, are passed over
    # for the next candidate: /usr/local/cuda where the machine has one, else
    # NVIDIA's nvcc from PyPI, which cannot be fetched here.
    _fake_nvcc(tmp_path / "wrapper", "13.0.88")
    _fake_nvcc(tmp_path / "old", "11.8.89")
    (tmp_path / "old" / "include").mkdir()
    (tmp_path / "old" / "include" / "cuda_runtime.h").write_text("")
    result = _toolkit(tmp_path, {"CUDA_HOME": str(tmp_path / "old"),
                                 "PATH": f"{tmp_path / 'wrapper' / 'bin'}:/usr/bin:/bin",
                                 "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)})
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f"install: not using {tmp_path / 'old'}: no CUDA 12+ toolkit there"
    assert lines[1] == f"install: not using {tmp_path / 'wrapper'}: no CUDA 12+ toolkit there"
    if result.returncode == 0:
        assert result.stdout == "/usr/local/cuda\n"
    else:
        assert result.stdout == ""
        assert lines[-1].startswith("install: error: could not install NVIDIA's CUDA compiler")


def test_a_cuda_compiler_that_cannot_be_fetched_is_named_in_one_line(tmp_path):
    result = _toolkit(tmp_path, {"HVDTRAIN_CUDA_HOME": "pypi", "PIP_NO_INDEX": "1",
                                 "PIP_FIND_LINKS": str(tmp_path)})
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    nvcc = re.search(r"^nvidia-cuda-nvcc==(\S+)$", (REPO / "constraints.txt").read_text(),
                     re.MULTILINE).group(1)
    assert lines[:-1] == [f"install: installing NVIDIA's CUDA compiler {nvcc} from PyPI into "
                          f"{tmp_path}/cache/cuda/nvcc-{nvcc}"]
    assert lines[-1].startswith("install: error: could not install NVIDIA's CUDA compiler from "
                               "PyPI (nvidia-cuda-nvcc ")
    assert lines[-1].endswith("install a CUDA 12+ toolkit and set HVDTRAIN_CUDA_HOME to it, "
                             "or build the GPU image (docker/Dockerfile)")
    assert not (tmp_path / "cache" / "cuda").exists() or not any(
        (tmp_path / "cache" / "cuda").iterdir())
