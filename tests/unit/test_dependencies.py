"""pyproject.toml's version ranges agree with constraints.txt, which pins
the versions the tests run, and it lists every package a wheel must hold."""

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from launch import REPO

PINNED = {canonicalize_name(name): version for name, version in re.findall(
    r"^([\w.-]+)==(\S+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE)}
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
REQUIREMENTS = {canonicalize_name(r.name): r for r in map(Requirement, [
    *PROJECT["dependencies"], *sum(PROJECT["optional-dependencies"].values(), [])])}
# hvdtrain reaches into their internals, which change between minor versions.
INTERNALS_USED = ("keras", "horovod")


@pytest.mark.parametrize("name", REQUIREMENTS)
def test_every_dependency_admits_the_version_the_tests_run(name):
    assert name in PINNED, f"constraints.txt pins no version of {name}"
    assert REQUIREMENTS[name].specifier.contains(PINNED[name]), (
        f"pyproject.toml's {REQUIREMENTS[name]} excludes constraints.txt's {name}=={PINNED[name]}")


@pytest.mark.parametrize("name", INTERNALS_USED)
def test_a_dependency_used_through_its_internals_admits_no_other_minor_version(name):
    pinned = Version(PINNED[name])
    others = [f"{pinned.major}.{pinned.minor + 1}.0", f"{pinned.major + 1}.0.0"]
    if pinned.minor:
        others.append(f"{pinned.major}.{pinned.minor - 1}.99")
    admitted = [v for v in others if REQUIREMENTS[name].specifier.contains(v)]
    assert not admitted, (f"pyproject.toml's {REQUIREMENTS[name]} admits {', '.join(admitted)}; "
                          f"the tests run {name}=={pinned}")


def test_a_wheel_holds_every_package_of_the_source():
    # The editable install of the tests finds any package; a wheel only those listed.
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(init.parent.relative_to(REPO).parts)
             for init in (REPO / "hvdtrain").rglob("__init__.py")}
    assert found <= listed, f"pyproject.toml's packages lack {sorted(found - listed)}"
