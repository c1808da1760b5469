"""Which tool-call format a server reads, and who shows it to the model:
one frozen value, `ToolCallFormat`, decided once at startup from
`--tool-call-parser` and the chat template (`chosen_tool_call_format`).

Tools work with no flags on every model:
- a template that renders `tools` in a format sluice knows (hermes
  `<tool_call>`, llama3_json, mistral `[TOOL_CALLS]`: `guess_tool_call_parser`),
  or whose format `--tool-call-parser` names, shows the model its tools
  itself; its parser reads the output;
- any other template (SmolLM2's ChatML knows no tools; a template whose tool
  syntax sluice cannot read) gets no `tools`: the server shows them in the
  system prompt with the default call format instead (hermes-style
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, or the format
  `--tool-call-parser` names), and writes earlier calls and their results as
  text in that format (`sluice/apis/rules/tool_prompt.py`). The model is shown
  exactly one format, and it is the one parsed.
`--tool-call-parser none` turns tool calling off where it cannot work (a
model too small to call tools, a context too small for an agent's tool
definitions): tool_choice "auto" is served as "none", the tools are not
shown and nothing is parsed; "required" and a named function are still
forced by their grammars.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.tools.parsers import TOOL_CALL_PARSER_NAMES, guess_tool_call_parser

# The format the server shows a model whose template shows none it knows.
DEFAULT_TOOL_CALL_PARSER = "hermes"
# `--tool-call-parser none`: tool_choice "auto" is served as "none".
NO_TOOL_CALL_PARSER = "none"
# A template that uses the `tools` variable renders the request's tools.
_RENDERS_TOOLS = re.compile(r"\btools\b")


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    # The parser that reads "auto" outputs: a name of TOOL_CALL_PARSER_NAMES;
    # None: "auto" is served as "none" (--tool-call-parser none).
    parser: str | None = DEFAULT_TOOL_CALL_PARSER
    # True: the server writes the tools, the call format and earlier calls
    # into the prompt (the template is given no `tools`); False: the template does.
    is_shown_by_server: bool = False

    def __post_init__(self) -> None:
        assert self.parser in {*TOOL_CALL_PARSER_NAMES, None}, f"unknown parser {self.parser!r}"


def chosen_tool_call_format(setting: str | None, chat_template: str | None) -> ToolCallFormat:
    """The format a server reads: `setting` (--tool-call-parser), else the
    template's guess, else the default; shown by the server unless the template
    renders the tools in a format known to be that one; "none": no tool calls."""
    # A template whose text is unknown (a tokenizer that renders in code) is
    # trusted to render the tools of the format named.
    renders_tools = chat_template is None or _RENDERS_TOOLS.search(chat_template) is not None
    if setting == NO_TOOL_CALL_PARSER:  # forced calls still show their tools
        return ToolCallFormat(None, not renders_tools)
    known = setting or guess_tool_call_parser(chat_template)
    is_shown_by_template = known is not None and renders_tools
    return ToolCallFormat(known or DEFAULT_TOOL_CALL_PARSER, not is_shown_by_template)
