"""Package `__init__` files that re-export without importing.

A package whose `__init__` imports its own modules closes an import loop
with every one of them that imports a sibling (importing `pkg.a` runs
`pkg/__init__.py` first, which imports `pkg.a`). With `lazy_exports` the
package names what it re-exports and from where; a name is imported the
first time someone reads it, so importing one module of a package imports
only that module and what it needs.

    __getattr__ = lazy_exports(__name__, {"Frontend": "sluice.frontend.serving"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: each name of `exports`, read from
    its module on first use; any other name is an AttributeError (so
    `from package import submodule` still imports the submodule)."""

    def __getattr__(name: str) -> object:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module_name), name)

    return __getattr__
