"""Which tool-call format a server reads, and whether the server or the chat
template shows it to the model."""

from __future__ import annotations

from pathlib import Path

from sluice.tools.tool_format import ToolCallFormat, chosen_tool_call_format

QWEN3_TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
LLAMA3 = '{% if tools %}{"name": function name, "parameters": ...}<|python_tag|>{% endif %}'
MISTRAL = "{% if tools %}[AVAILABLE_TOOLS]{{ tools }}{% endif %}[TOOL_CALLS]"
UNKNOWN_SYNTAX = "{% for tool in tools %}<function={{ tool.name }}>{% endfor %}"


def test_a_template_that_shows_a_known_format_shows_it_itself():
    assert chosen_tool_call_format(None, QWEN3_TEMPLATE) == ToolCallFormat("hermes", False)
    assert chosen_tool_call_format(None, LLAMA3) == ToolCallFormat("llama3_json", False)
    assert chosen_tool_call_format(None, MISTRAL) == ToolCallFormat("mistral", False)


def test_a_template_without_tools_gets_the_default_shown_by_the_server():
    assert chosen_tool_call_format(None, CHATML) == ToolCallFormat("hermes", True)
    assert chosen_tool_call_format(None, UNKNOWN_SYNTAX) == ToolCallFormat("hermes", True)


def test_a_named_parser_is_shown_by_the_server_where_the_template_drops_tools():
    assert chosen_tool_call_format("llama3_json", CHATML) == ToolCallFormat("llama3_json", True)
    assert chosen_tool_call_format("hermes", UNKNOWN_SYNTAX) == ToolCallFormat("hermes", False)
    assert chosen_tool_call_format("hermes", None) == ToolCallFormat("hermes", False)
    assert chosen_tool_call_format(None, None) == ToolCallFormat("hermes", True)


def test_none_turns_tool_calling_off_whatever_the_template():
    assert chosen_tool_call_format("none", QWEN3_TEMPLATE) == ToolCallFormat(None, False)
    assert chosen_tool_call_format("none", CHATML) == ToolCallFormat(None, True)
