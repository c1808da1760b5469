"""Every module of sluice/ is named in docs/ARCHITECTURE.md's map.

A module counts as named when its path under sluice/ appears there (or the
path's tail from any folder on, as in `native/rows.c`), or its file name
alone where no other module shares that name. Package `__init__`
files only re-export, so they need no line.
"""

import collections
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLUICE = ROOT / "sluice"
MAP = ROOT / "docs" / "ARCHITECTURE.md"


def _modules() -> list[Path]:
    python = [p for p in SLUICE.rglob("*.py") if p.name != "__init__.py"]
    native = [p for p in SLUICE.rglob("native/*") if p.suffix in (".c", ".h")]
    return sorted(python + native)


def _is_named(text: str, name: str) -> bool:
    # Not the tail of a longer name: rope.py is not named by longrope.py.
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?!\w)", text) is not None


def _unnamed(text: str) -> list[str]:
    modules = _modules()
    counts = collections.Counter(p.name for p in modules)
    missing = []
    for path in modules:
        parts = path.relative_to(SLUICE).parts
        # The path under sluice/, or its tail from a folder on (native/rows.c);
        # a name that several modules share is named by such a path only.
        tails = ["sluice/" + "/".join(parts)] + ["/".join(parts[i:]) for i in range(len(parts) - 1)]
        if counts[path.name] == 1:
            tails.append(path.name)
        if not any(_is_named(text, tail) for tail in tails):
            missing.append("/".join(parts))
    return missing


def test_every_module_is_in_the_architecture_map():
    missing = _unnamed(MAP.read_text())
    assert not missing, "add to docs/ARCHITECTURE.md's map:\n" + "\n".join(missing)


def test_a_shared_name_needs_the_path_and_a_longer_name_is_not_a_match():
    text = "frontend/usage.py, native/rows.c and longrope.py"
    missing = _unnamed(text)
    assert "frontend/usage.py" not in missing
    assert "audit/checks/usage.py" in missing, "a name shared by three modules names none"
    assert "models/native/rows.c" not in missing, "a tail from a folder on names it"
    assert "models/native/rope.py" in missing and "models/longrope.py" not in missing
