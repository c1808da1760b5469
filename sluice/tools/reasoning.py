"""Reasoning text (`--reasoning-parser`, else guessed from the chat template:
`guess_reasoning_parser`): `<think>…</think>` split from the answer.

`DeepSeekR1Splitter` reads one choice's text as it grows (push(text,
is_final) -> what is new, reading only the new text), with the prefix promise
of the tool-call parsers (`sluice/tools/calls.py`): the reasoning and the
content of a prefix are prefixes of those of the whole text
(`split_deepseek_r1`, the split of a text read at once). As in vLLM's
deepseek_r1 parser, DeepSeek-R1's template opens `<think>` in the prompt, so everything before
`</think>` is reasoning, whether or not the output repeats the `<think>` (it
is dropped when it does); text after `</think>` is content (the whitespace
that opens it dropped, as the reasoning and the answer are separate), and without a
`</think>` the whole output is reasoning. Either tag cut across tokens is
held back until decided, like a stop string's beginning. `Qwen3Splitter`
differs in one thing: an output that does not open with `<think>` is all
content (Qwen3 answering with thinking off), as vLLM's qwen3 parser reads an
output with neither tag; decided at the first characters, so a stream never
takes back what it sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sluice.tools.calls import held_tag_prefix
from sluice.tools.harmony import HARMONY, is_harmony_template

# What str.lstrip() strips (the same Unicode whitespace).
_WHITESPACE = re.compile(r"\s*")

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    reasoning: str
    # The text after `</think>`; None while there is none.
    content: str | None


@dataclass(slots=True)
class ReasoningPiece:
    """What one push decided: reasoning, then (once it ended) content."""

    reasoning: str = ""
    content: str = ""


class DeepSeekR1Splitter:
    """One choice's split, read as the text grows: each push reads only what
    is new (and the few characters of a tag cut at the end)."""

    def __init__(self) -> None:
        self.text = ""
        # Where the reasoning starts once decided (after a leading `<think>`).
        self._start: int | None = None
        # Where the reasoning ends (its `</think>`) once found; before that,
        # where the search for it resumes.
        self._end: int | None = None
        self._search = 0
        self._num_sent_reasoning = 0
        # Where content resumes after `</think>`; open once past the
        # whitespace that opens it.
        self._content_position = 0
        self._is_content_open = False

    @property
    def has_content(self) -> bool:
        return self._end is not None

    def push(self, text: str, is_final: bool) -> ReasoningPiece:
        self.text += text
        text = self.text
        if self._start is None:
            if not is_final and THINK_START.startswith(text):
                return ReasoningPiece()  # maybe the opening tag, cut
            self._begin(text)
        if self._end is None:
            self._find_end(text)
        return ReasoningPiece(self._take_reasoning(text, is_final), self._take_content(text))

    def _begin(self, text: str) -> None:
        """Decide where the reasoning starts: after a leading `<think>`, else at 0."""
        self._start = self._search = len(THINK_START) if text.startswith(THINK_START) else 0

    def _find_end(self, text: str) -> None:
        end = text.find(THINK_END, self._search)
        if end >= 0:
            self._end, self._content_position = end, end + len(THINK_END)
        else:
            self._search = max(self._search, len(text) - len(THINK_END) + 1)

    def _take_reasoning(self, text: str, is_final: bool) -> str:
        assert self._start is not None, "decided before"
        end = self._end
        if end is None:
            held = 0 if is_final else held_tag_prefix(text, THINK_END, self._search)
            end = len(text) - held
        start = self._start + self._num_sent_reasoning
        self._num_sent_reasoning = max(end - self._start, self._num_sent_reasoning)
        return text[start:end]

    def _take_content(self, text: str) -> str:
        """The text after `</think>`, the whitespace that opens it dropped."""
        if self._end is None:
            return ""
        if not self._is_content_open:
            whitespace = _WHITESPACE.match(text, self._content_position)
            assert whitespace is not None, "the pattern matches the empty string"
            self._content_position = whitespace.end()
            if self._content_position == len(text):
                return ""
            self._is_content_open = True
        piece = text[self._content_position :]
        self._content_position = len(text)
        return piece


class Qwen3Splitter(DeepSeekR1Splitter):
    """Qwen3 (hybrid thinking): reasoning only in a `<think>` block that opens
    the output. Without one the whole output is content, verbatim: with
    `enable_thinking` false Qwen3's template closes an empty block in the
    prompt, and the model answers at once."""

    def _begin(self, text: str) -> None:
        super()._begin(text)
        if self._start == 0:  # no opening tag: no reasoning, all content
            self._end, self._content_position, self._is_content_open = 0, 0, True


ReasoningParser = Callable[[], DeepSeekR1Splitter]


def split_text(parser: ReasoningParser, text: str, is_final: bool = False) -> ReasoningSplit:
    """The split of a whole text (or of a prefix, not `is_final`)."""
    splitter = parser()
    piece = splitter.push(text, is_final)
    return ReasoningSplit(piece.reasoning, piece.content if splitter.has_content else None)


def split_deepseek_r1(text: str, is_final: bool = False) -> ReasoningSplit:
    return split_text(DeepSeekR1Splitter, text, is_final)


REASONING_PARSERS: dict[str, ReasoningParser] = {
    "deepseek_r1": DeepSeekR1Splitter,
    "qwen3": Qwen3Splitter,
}
_GENERATION_PROMPT = "add_generation_prompt"


# `--reasoning-parser none`: no splitting, whatever the chat template shows.
NO_REASONING_PARSER = "none"
# What `--reasoning-parser` takes: the splitters, and harmony's reader.
REASONING_PARSER_NAMES = (*REASONING_PARSERS, HARMONY)


def chosen_reasoning_parser(setting: str | None, chat_template: str | None) -> str | None:
    """The reasoning parser a server runs: the one `--reasoning-parser` names,
    none for "none", else the template's guess (`guess_reasoning_parser`)."""
    if setting == NO_REASONING_PARSER:
        return None
    return setting or guess_reasoning_parser(chat_template)


def guess_reasoning_parser(chat_template: str | None) -> str | None:
    """The reasoning parser a chat template's `<think>` calls for; None when
    it shows none.
    - `enable_thinking` beside `<think>` (Qwen3's hybrid template): "qwen3",
      so that an answer given without thinking stays content;
    - a generation prompt that opens `<think>` itself (DeepSeek-R1,
      Qwen3-Thinking-2507): "deepseek_r1", all before `</think>` is reasoning;
    - `<think>` only in past turns: "qwen3" (the output's own tag decides);
    - gpt-oss's harmony channels: "harmony" (`sluice/tools/harmony.py`)."""
    if is_harmony_template(chat_template):
        return HARMONY
    if not chat_template or THINK_START not in chat_template:
        return None
    if "enable_thinking" in chat_template:
        return "qwen3"
    prompt_part = chat_template.rpartition(_GENERATION_PROMPT)[2]
    if _GENERATION_PROMPT in chat_template and THINK_START in prompt_part:
        return "deepseek_r1"
    return "qwen3"
