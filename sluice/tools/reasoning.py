"""Reasoning text (`--reasoning-parser`): `<think>…</think>` split from the answer.

`split_deepseek_r1(text, is_final) -> ReasoningSplit` is a pure function over
all the text generated so far, with the prefix promise of the tool-call
parsers (`sluice/tools/calls.py`): the reasoning and the content of a prefix
are prefixes of those of the whole text. As in vLLM's deepseek_r1 parser,
DeepSeek-R1's template opens `<think>` in the prompt, so everything before
`</think>` is reasoning, whether or not the output repeats the `<think>` (it
is dropped when it does); text after `</think>` is content (the whitespace
that opens it dropped, as the reasoning and the answer are separate), and without a
`</think>` the whole output is reasoning. Either tag cut across tokens is
held back until decided, like a stop string's beginning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.tools.calls import held_tag_prefix

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    reasoning: str
    # The text after `</think>`; None while there is none.
    content: str | None


ReasoningParser = Callable[[str, bool], ReasoningSplit]


def split_deepseek_r1(text: str, is_final: bool = False) -> ReasoningSplit:
    start = 0
    if text.startswith(THINK_START):
        start = len(THINK_START)
    elif not is_final and THINK_START.startswith(text):
        return ReasoningSplit("", None)  # maybe the opening tag, cut
    end = text.find(THINK_END, start)
    if end >= 0:
        return ReasoningSplit(text[start:end], text[end + len(THINK_END) :].lstrip())
    held = 0 if is_final else held_tag_prefix(text, THINK_END, start)
    return ReasoningSplit(text[start : len(text) - held], None)


REASONING_PARSERS: dict[str, ReasoningParser] = {"deepseek_r1": split_deepseek_r1}
