"""Hypothesis strategies of arbitrary JSON, for the request-body fuzz tests:
any type, nesting, size and script, NaN and infinities, integers beyond 64
bits, and values nested deeper than json.dumps writes (`Deep`, spelled out
in place by `json_text`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from hypothesis import strategies as st

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


@dataclass(frozen=True)
class Deep:
    """JSON nested `depth` deep, written into the body's text (json.dumps
    stops at a few hundred levels)."""

    depth: int

    def text(self) -> str:
        half = self.depth // 2
        return '{"a": [' * half + "[" * (self.depth % 2) + "]" * (self.depth % 2) + "]}" * half


def json_text(value: object) -> str:
    """`value` as JSON text, each `Deep` written out in place."""
    text = json.dumps(value, allow_nan=True, default=lambda deep: f"<deep:{deep.depth}>")
    return re.sub(r'"<deep:(\d+)>"', lambda match: Deep(int(match[1])).text(), text)


# Either side of sluice's nesting limit (64) and of what Python's recursion
# survives (~950); in a body, within orjson's limit (1,024).
deep = st.builds(Deep, st.sampled_from([2, 64, 65, 1000]))
