"""The count of `type: ignore` comments in sluice/ only goes down.

mypy runs in `make lint` (settings in pyproject.toml, with `warn_unused_ignores`);
this test holds the line-level escapes to the count they had. Remove one and
lower `MAX_TYPE_IGNORES`; a new error is fixed, not ignored.
"""

import re
from pathlib import Path

SLUICE = Path(__file__).resolve().parent.parent / "sluice"
MAX_TYPE_IGNORES = 29
_IGNORE = re.compile(r"type: *ignore")


def _ignores() -> list[str]:
    found = []
    for path in sorted(SLUICE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _IGNORE.search(line):
                found.append(f"{path.relative_to(SLUICE.parent)}:{number}")
    return found


def test_type_ignores_do_not_grow():
    found = _ignores()
    assert len(found) <= MAX_TYPE_IGNORES, (
        f"{len(found)} `type: ignore` comments in sluice/, at most {MAX_TYPE_IGNORES}: "
        "fix the type error instead\n" + "\n".join(found)
    )


def test_the_ceiling_follows_the_count_down():
    # A stale ceiling would let ignores creep back up to it unnoticed.
    assert len(_ignores()) == MAX_TYPE_IGNORES, "lower MAX_TYPE_IGNORES to the new count"
