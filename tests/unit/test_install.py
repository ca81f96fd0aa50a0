"""scripts/install.sh's pieces that run in seconds: the fixes to Horovod's
source (and what the installed Horovod does with the launcher's), and the
one-line failures of the CUDA toolchain choice. (The whole GPU build is
tested by `make test-gpu`.)"""

import importlib.machinery
import importlib.util
import re
import sys
import types

import pytest

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


def test_a_fix_that_no_longer_matches_stops_the_build_naming_it(tmp_path):
    _released_source(tmp_path)
    relative, name, released, _ = fixes.FIXES[1]
    (tmp_path / relative).write_text("// another Horovod\n")
    with pytest.raises(SystemExit) as stopped:
        fixes.apply(tmp_path)
    assert str(stopped.value) == (f"Horovod source fix '{name}' no longer matches {relative}: "
                                  "update scripts/horovod_source_fixes.py for this Horovod version")


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
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release[:4]}, V{release}'\n")
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
