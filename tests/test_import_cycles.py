"""No import cycles among sluice's modules.

The graph is read from the source (`ast`), not from a running interpreter:
module A depends on module B when A imports B at module level (inside `if
TYPE_CHECKING:` does not count; inside a function does not either, since it
runs later). Importing `pkg.mod` runs `pkg/__init__.py` first, so it also
depends on every package above it: a package `__init__` that imports its own
modules closes a loop with each of them that imports a sibling (hence the
lazy `__init__`s, `sluice.lazy_exports`).

    python tests/test_import_cycles.py     prints every cycle (strongly connected set)

And no test module imports another: shared fakes live in sluice/testing,
shared fixtures in tests/conftest.py, other helpers in modules not named test_*.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "sluice"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_level_imports(module: str, path: Path) -> set[str]:
    """Every dotted name `module` imports when it is imported (absolute, and
    for `from X import y` both X and X.y, since y may be a module)."""
    names: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in _module_level_nodes(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.module, node.level)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
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


def import_graph() -> dict[str, set[str]]:
    """module -> the sluice modules importing it imports (packages above included)."""
    paths = {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}
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
    for members in cycles(import_graph()):
        print(f"{len(members)}: {' '.join(members)}")
    sys.exit(0)
