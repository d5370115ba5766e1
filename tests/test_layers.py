"""The package's layers depend one way: no import cycle between modules, no import of a higher layer.

The imports are read from the source (``ast``), those inside functions included, so an import moved
into a function to dodge a cycle is still seen.
"""

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "addernet"

# lowest first; a module may import its own layer's and lower layers' modules only
LAYERS = [
    ("errors", "checks", "registry", "config"),
    ("ops",),
    ("models",),
    ("data", "optim", "checkpoint", "distributed", "compile", "cuda_graph", "forward", "zoo"),
    ("tasks", "quant", "analysis"),
    ("engine",),
    ("tools",),
    ("train", "test"),  # the entry points (python -m addernet.train / addernet.test)
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def modules():
    """dotted name -> (path, is_package) for every module of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def imports(name, path, package, known):
    """The package modules that module ``name`` imports, anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names)
    return {m for m in found if m in known and m != name}


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return {name: imports(name, path, package, known) for name, (path, package) in known.items()}


def layer(module):
    """The first name below ``addernet`` (``addernet`` itself: the package facade, above every layer)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_has_a_layer(graph):
    unplaced = sorted({layer(m) for m in graph if layer(m) is not None} - set(RANK))
    assert not unplaced, (
        f"place these in LAYERS (tests/test_layers.py) and the layer diagram of docs/layout.md: {unplaced}"
    )


def test_no_import_cycle_between_modules(graph):
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_imports_go_to_the_same_or_a_lower_layer(graph):
    upward = [
        f"{a} imports {b}"
        for a, targets in graph.items()
        for b in targets
        if layer(a) is not None and layer(b) is not None and RANK[layer(b)] > RANK[layer(a)]
    ]
    assert not upward, "\n".join(sorted(upward))


def test_the_checker_sees_cycles_and_upward_imports_inside_functions(tmp_path):
    """The analysis itself: a function-level import that closes a cycle is found."""
    pkg = tmp_path / "addernet"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "tasks").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("from ..tasks import run\n")
    (pkg / "tasks" / "__init__.py").write_text("def run():\n    from ..engine import fit\n")
    known = {
        "addernet": (pkg / "__init__.py", True),
        "addernet.engine": (pkg / "engine" / "__init__.py", True),
        "addernet.tasks": (pkg / "tasks" / "__init__.py", True),
    }
    g = {name: imports(name, path, package, known) for name, (path, package) in known.items()}
    assert g["addernet.tasks"] == {"addernet.engine"} and g["addernet.engine"] == {"addernet.tasks"}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(g).prepare()
