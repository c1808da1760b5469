"""No import cycles among sluice's modules, at run time or in the design.

The graphs are read from the source (`ast`), not from a running interpreter.

- **At run time** module A depends on module B when A imports B at module
  level (inside `if TYPE_CHECKING:` does not count; inside a function does
  not either, since it runs later). Importing `pkg.mod` runs `pkg/__init__.py`
  first, so it also depends on every package above it: a package `__init__`
  that imports its own modules closes a loop with each of them that imports
  a sibling (hence the lazy `__init__`s, `sluice.lazy_exports`).
- **In the design** every import counts, in a function or under
  TYPE_CHECKING too: two modules that import each other are one concept in
  two files however late one of them imports, and a lazy import only hides
  that from the first graph. Packages above are not implied here (their
  `__init__`s are lazy), and `from pkg import mod` is an edge to `pkg.mod`.

    python tests/test_import_cycles.py     prints every cycle (strongly connected set)

And no test module imports another: shared fakes live in sluice/testing,
shared fixtures in tests/conftest.py, other helpers in modules not named test_*.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "sluice"

# Design cycles known and owned elsewhere, each with who breaks it. Remove a
# pair once it is broken (the test fails on a listed pair that is no longer a cycle).
KNOWN_DESIGN_CYCLES: list[list[str]] = []


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_level_imports(module: str, path: Path) -> set[str]:
    """Every dotted name `module` imports when it is imported (absolute, and
    for `from X import y` both X and X.y, since y may be a module)."""
    nodes = _module_level_nodes(_parse(path).body)
    return _imported_names(module, path, nodes, lambda base, name: {base, f"{base}.{name}"})


def every_import(module: str, path: Path, modules: set[str]) -> set[str]:
    """Every dotted name `module` imports anywhere: in functions and under
    TYPE_CHECKING too; `from X import y` names X.y where that is a module, else X."""

    def targets(base: str, name: str) -> set[str]:
        return {f"{base}.{name}" if f"{base}.{name}" in modules else base}

    return _imported_names(module, path, ast.walk(_parse(path)), targets)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imported_names(
    module: str,
    path: Path,
    nodes: Iterable[ast.AST],
    from_targets: Callable[[str, str], set[str]],
) -> set[str]:
    """The names `nodes` import; `from_targets(X, y)`: what `from X import y` names."""
    names: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.module, node.level)
            for alias in node.names:
                names.update(from_targets(base, alias.name))
    return names


def _module_level_nodes(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run at import: into if/try/with/class bodies, not into functions."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _module_level_nodes(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from _module_level_nodes(getattr(node, field, []))
        for handler in getattr(node, "handlers", []):
            yield from _module_level_nodes(handler.body)


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - level + 1]
    return ".".join(parts + ([name] if name else []))


def _paths(package_dir: Path) -> dict[str, Path]:
    return {module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """At run time: module -> the modules importing it imports (packages above included)."""
    paths = _paths(package_dir)
    graph = {}
    for module, path in paths.items():
        targets = set()
        for name in module_level_imports(module, path):
            if name in paths:
                parts = name.split(".")
                targets.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        targets.discard(module)
        graph[module] = {target for target in targets if target in paths}
    return graph


def design_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """In the design: module -> the modules it imports anywhere."""
    paths = _paths(package_dir)
    modules = set(paths)
    return {
        module: (every_import(module, path, modules) & modules) - {module}
        for module, path in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = []
            while not members or members[-1] != module:
                members.append(stack.pop())
                on_stack.discard(members[-1])
            if len(members) > 1:
                found.append(sorted(members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_of_sluice_is_in_an_import_cycle():
    assert cycles(import_graph()) == []


def test_no_two_modules_of_sluice_import_each_other_anywhere():
    found = cycles(design_graph())
    assert [c for c in found if c not in KNOWN_DESIGN_CYCLES] == []
    assert [c for c in KNOWN_DESIGN_CYCLES if c not in found] == [], "broken now: unlist it"


def test_the_design_graph_sees_imports_in_functions_and_under_type_checking(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    )
    # The two cycles the run-time graph could not see: one import in a
    # function (scaleout's ray_cluster <-> replica_actor), one under
    # TYPE_CHECKING (the audit's records <-> stream_view).
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def make():\n    from pkg.a import A\n")
    (package / "c.py").write_text("from pkg.d import D\n")
    (package / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n"
    )
    assert cycles(import_graph(package)) == []
    # The lazy __init__'s re-export is no cycle: its package is not implied.
    assert cycles(design_graph(package)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]


def test_the_checker_finds_a_cycle_through_an_eager_package_init():
    graph = {
        "pkg": {"pkg.a"},  # pkg/__init__.py: from pkg.a import x
        "pkg.a": {"pkg", "pkg.b"},  # pkg/a.py: from pkg.b import y
        "pkg.b": {"pkg"},
        "other": {"pkg.b", "pkg"},
    }
    assert cycles(graph) == [["pkg", "pkg.a", "pkg.b"]]
    assert cycles({"pkg": set(), "pkg.a": {"pkg", "pkg.b"}, "pkg.b": {"pkg"}}) == []


def test_imports_under_type_checking_and_in_functions_are_not_edges(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import a.b\n"
        "from . import sibling\n"
        "try:\n    from c import d\nexcept ImportError:\n    import e\n"
        "if TYPE_CHECKING:\n    import hidden\nelse:\n    import shown\n"
        "def later():\n    import lazy\n"
        "class K:\n    import in_class\n"
    )
    names = module_level_imports("pkg.mod", source)
    assert {"a.b", "pkg", "pkg.sibling", "c", "c.d", "e", "shown", "in_class"} <= names
    assert not {"hidden", "lazy"} & names


def test_no_test_module_imports_another():
    tests_dir = Path(__file__).resolve().parent
    offenders = []
    for path in sorted(tests_dir.glob("test_*.py")):
        source = path.read_text()
        imported = module_level_imports(f"tests.{path.stem}", path) | _nested_imports(source)
        offenders += [
            f"{path.name}: {name}"
            for name in sorted(imported)
            if name.startswith("tests.test_") or name.startswith("test_")
        ]
        if re.search(r"(from|import) tests\.test_", source):
            offenders.append(f"{path.name}: in a string (a subprocess's code)")
    assert offenders == []


def _nested_imports(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


if __name__ == "__main__":
    for kind, graph in (("run time", import_graph()), ("design", design_graph())):
        for members in cycles(graph):
            print(f"{kind}, {len(members)}: {' '.join(members)}")
    sys.exit(0)
