"""The package's layers: which folder may import which.

Each row of LAYERS holds units (a package under hvdtrain/, or a module at its
top) that may import only units in rows above it, never one beside or below:
the table is the architecture page's diagram, checked.
"""

import ast
import pathlib
import re

import pytest

import hvdtrain

PACKAGE = pathlib.Path(hvdtrain.__file__).parent
ARCHITECTURE = pathlib.Path(__file__).parents[2] / "docs" / "architecture.md"

LAYERS = (                                   # lowest first
    ("errors",),
    ("faults",),                             # the watchdog, the launcher watch, preemption
    ("layout",),                             # which worker does what: replicas, groups
    ("runtime",),                            # one Horovod worker
    ("parallel", "tools"),                   # collectives and placement; doctor, report, ...
    ("parallel.sharded_tables", "parallel.pipeline_parallel",   # rows; stages;
     "parallel.tensor_parallel"),                               # split layers
    ("parallel.data_parallel",),             # the optimizer, over every strategy's gradients
    ("datasets",),                           # TFDS datasets built locally, once
    ("data", "state", "lr_schedules"),
    ("callbacks", "config"),
    ("recipe", "layers", "keras"),           # settings of a recipe; the public facades
    ("run",),                                # the trainer and the evaluator
    ("cli",),
    ("__main__", ""),                        # "" is hvdtrain's own __init__: the public names
)
RANK = {unit: row for row, units in enumerate(LAYERS) for unit in units}


def unit_of(module):
    """The unit of LAYERS holding `module` (dotted, under hvdtrain), or None."""
    parts = module.split(".")[1:]
    for end in range(len(parts), -1, -1):
        if ".".join(parts[:end]) in RANK:
            return ".".join(parts[:end])
    return None


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path):
    """The hvdtrain modules `path` imports, anywhere in it (lazy ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                # `from hvdtrain.state import checkpoint` imports a module,
                # `from hvdtrain.errors import UsageError` a name in one.
                dotted = f"{node.module}.{alias.name}"
                found.add(dotted if _exists(dotted) else node.module)
    return {name for name in found if name.split(".")[0] == "hvdtrain"}


def _exists(dotted):
    relative = pathlib.Path(*dotted.split(".")[1:])
    return (PACKAGE / relative).is_dir() or (PACKAGE / relative).with_suffix(".py").is_file()


def wrong_way(edges):
    """The imports in `edges` ({module: modules it imports}) that go sideways
    or up the table, as 'importer -> imported' lines."""
    found = []
    for importer, imported in sorted(edges.items()):
        for target in sorted(imported):
            source, goal = unit_of(importer), unit_of(target)
            if goal is None or source != goal and RANK[goal] >= RANK[source]:
                found.append(f"{importer} ({source}) -> {target} ({goal})")
    return found


def package_edges():
    return {module_name(path): imports(path) for path in PACKAGE.rglob("*.py")}


def test_every_import_goes_down_the_table():
    assert wrong_way(package_edges()) == []


def test_a_lower_package_importing_a_higher_one_is_caught():
    planted = {"hvdtrain.faults.watchdog": {"hvdtrain.run.trainer"},
               "hvdtrain.parallel.data_parallel.optimizer": {"hvdtrain.parallel.split_variables"},
               "hvdtrain.state.checkpoint": {"hvdtrain.data.files"}}
    assert wrong_way(planted) == [
        "hvdtrain.faults.watchdog (faults) -> hvdtrain.run.trainer (run)",
        "hvdtrain.state.checkpoint (state) -> hvdtrain.data.files (data)"]


def test_every_module_belongs_to_a_unit_of_the_table():
    """A new package has its place in the table before it has code."""
    modules = [module_name(path) for path in PACKAGE.rglob("*.py")]
    assert [m for m in modules if unit_of(m) is None] == []
    on_disk = {m.split(".", 1)[1] for m in modules if "." in m}
    assert [unit for unit in RANK if unit and not any(
        m == unit or m.startswith(unit + ".") for m in on_disk)] == []


@pytest.mark.parametrize("package", sorted(
    module_name(path) for path in PACKAGE.rglob("__init__.py")))
def test_each_package_says_what_it_is_and_what_may_depend_on_it(package):
    docstring = ast.get_docstring(ast.parse(
        (PACKAGE.parent / package.replace(".", "/") / "__init__.py").read_text()))
    assert docstring and len(docstring.split()) >= 12, f"{package} has no docstring to speak of"
    assert "depend" in docstring.lower(), f"{package}'s docstring does not say what depends on it"


def unit_edges():
    """Which unit imports which, across units."""
    found = {}
    for importer, imported in package_edges().items():
        for target in imported:
            if unit_of(target) != unit_of(importer):
                found.setdefault(unit_of(importer), set()).add(unit_of(target))
    return found


def direct(edges):
    """`edges` without those another path already implies (what a drawing shows)."""
    def reached(unit):
        seen, todo = set(), [unit]
        while todo:
            for after in edges.get(todo.pop(), ()):
                if after not in seen:
                    seen.add(after)
                    todo.append(after)
        return seen
    return {(unit, target) for unit, targets in edges.items() for target in targets
            if not any(target in reached(other) for other in targets - {target})}


def drawn():
    """The arrows of the architecture page's package diagram, as units."""
    page = ARCHITECTURE.read_text()
    diagram = page.split("## Packages", 1)[1].split("```mermaid", 1)[1].split("```", 1)[0]
    unit_of_node = {unit.replace(".", "_"): unit for unit in RANK}   # ids cannot hold dots
    return {tuple(unit_of_node.get(node, node) for node in arrow)
            for arrow in re.findall(r"(\w+)(?:\[[^\]]*\])? --> (\w+)", diagram)}


def test_the_architecture_page_draws_the_imports_there_are():
    wanted = {edge for edge in direct(unit_edges()) if "__main__" not in edge}
    assert sorted(drawn() - wanted) == [], "drawn, but no such import (or one implied by others)"
    assert sorted(wanted - drawn()) == [], "imports the architecture page does not draw"
