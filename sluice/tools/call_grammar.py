"""The grammar of tool_choice "auto" with a response format: the output is
EITHER tool calls in the server's format, each call's arguments held to its
tool's parameters, OR the answer the format asks for (its JSON, or its
regex, choice or grammar), decided by the first characters.

Without it, the format's grammar covers the whole output from the first
token and the model can never call a tool (an agent with tools and an output
type). The calls' side, by format (`--tool-call-parser`, or the one chosen
from the template, `sluice/tools/tool_format.py`):
- hermes: `<tool_call>` JSON `</tool_call>` blocks, whitespace around;
- llama3_json: `{"name": ..., "parameters": {...}}` objects joined by ";";
- mistral: none: its `[TOOL_CALLS]` is a special token, which a grammar
  built here, without the tokenizer, cannot name; the format governs alone.
One call when parallel_tool_calls is false, else one or more. The parser of
the format reads the output as for any "auto" request: calls become calls,
the answer its content. Built as llguidance's own grammar list: a Lark start
rule over two named subgrammars (`@call`, `@answer`), so the format's grammar
is embedded whole, whatever its kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from sluice.structured.grammar import grammar_text
from sluice.structured.spec import StructuredOutputSpec
from sluice.tools.schema import FunctionTool, call_object_schema

# Whitespace the calls' side allows around and between calls.
_SPACE = r"/[ \t\r\n]*/"
# Per format: the key of a call's arguments, one call in Lark, between two calls.
_CALL_SYNTAX = {
    "hermes": ("arguments", f'"<tool_call>" {_SPACE} @call {_SPACE} "</tool_call>"', _SPACE),
    "llama3_json": ("parameters", "@call", f'{_SPACE} ";" {_SPACE}'),
}


def calls_or_answer(
    tools: Sequence[FunctionTool],
    parser: str,
    is_parallel: bool,
    answer: StructuredOutputSpec,
) -> StructuredOutputSpec | None:
    """The union, or None where the format has no grammar form here (mistral)."""
    if parser not in _CALL_SYNTAX:
        return None
    arguments_key, one_call, between = _CALL_SYNTAX[parser]
    more = f"({between} {one_call})*" if is_parallel else ""
    start = f"start: {_SPACE} calls {_SPACE} | @answer\ncalls: {one_call} {more}\n"
    call = _schema_grammar(call_object_schema(tools, arguments_key))
    return StructuredOutputSpec.llguidance(
        [{"lark_grammar": start}, call | {"name": "call"}, _answer_grammar(answer)]
    )


def _schema_grammar(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema's grammar as the JSON grammars are built (flexible whitespace)."""
    (grammar,) = orjson.loads(grammar_text(StructuredOutputSpec.json_schema(schema)))["grammars"]
    return grammar


def _answer_grammar(answer: StructuredOutputSpec) -> dict[str, Any]:
    """The format's grammar, named "answer": llguidance gives a JSON grammar
    list (schemas, regexes), or Lark text (choices, grammars)."""
    text = grammar_text(answer)
    if not text.lstrip().startswith("{"):
        return {"name": "answer", "lark_grammar": text}
    (grammar,) = orjson.loads(text)["grammars"]
    return grammar | {"name": "answer"}
