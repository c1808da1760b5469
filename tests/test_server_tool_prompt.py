"""Tools on a model whose chat template shows none (SmolLM2's ChatML): the
server shows them in the system prompt with the default hermes format, reads
that format back, and every API takes tools with every tool_choice on a
server started with no flags."""

from __future__ import annotations

import pytest

from sluice.apis.rules.tool_prompt import shown_tools_messages
from sluice.frontend.preprocess import ChatMessage, MessageToolCall
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.grammar_script import GrammarChoice
from sluice.testing.live_server import LiveServer
from tests.tool_apis import APIS

# SmolLM2-135M-Instruct's template (the embedded model's): no tools, no calls.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOL = {"type": "function", "function": {"name": "get_time"}}
CALL = MessageToolCall("call_1", "get_weather", '{"city": "Oslo"}')
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


class NoToolsTemplateTokenizer(ChatFakeTokenizer):
    chat_template_source = SMOLLM2_TEMPLATE


def history() -> list[ChatMessage]:
    return [
        ChatMessage("user", "weather in Oslo and Bern?"),
        ChatMessage("assistant", "Checking.", tool_calls=(CALL, CALL)),
        ChatMessage("tool", "12 degrees", tool_call_id="call_1"),
        ChatMessage("tool", "14 degrees", tool_call_id="call_1"),
    ]


def test_the_tools_and_the_format_open_the_system_prompt():
    (system, *rest) = shown_tools_messages(history(), [TOOL], "hermes")
    assert system.role == "system" and system.content.startswith("# Tools\n")
    assert '{"type": "function", "function": {"name": "get_time"}}' in system.content
    assert '<tool_call>\n{"name": <function-name>, "arguments": ' in system.content
    assert rest[0] == history()[0]
    given = [ChatMessage("system", "Be brief."), *history()]
    (system, *_) = shown_tools_messages(given, [TOOL], "hermes")
    assert system.content.startswith("Be brief.\n\n# Tools\n")


def test_earlier_calls_and_results_are_written_in_the_format():
    *_, assistant, results = shown_tools_messages(history(), None, "hermes")
    assert assistant == ChatMessage("assistant", f"Checking.\n{HERMES_CALL}\n{HERMES_CALL}")
    assert results == ChatMessage(
        "user", "<tool_response>\n12 degrees\n</tool_response>\n"
        "<tool_response>\n14 degrees\n</tool_response>",
    )  # fmt: skip
    *_, llama3, _ = shown_tools_messages(history(), None, "llama3_json")
    one = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    assert llama3.content == f"Checking.\n{one}; {one}"
    *_, mistral, _ = shown_tools_messages(history(), None, "mistral")
    one = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert mistral.content == f"Checking.\n[TOOL_CALLS][{one}, {one}]"
    *_, harmony, _ = shown_tools_messages(history(), None, "harmony")
    one = (
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Oslo"}<|call|>'
    )
    assert harmony.content == f"Checking.\n{one}{one}"
    (system, *_) = shown_tools_messages(history(), [TOOL], "harmony")
    assert "to=functions.<function-name> <|constrain|>json" in system.content


def test_without_tools_only_the_history_is_written_out():
    shown = shown_tools_messages([ChatMessage("user", "hi")], None, "hermes")
    assert shown == [ChatMessage("user", "hi")]


def serve(script: GrammarChoice) -> LiveServer:
    """No flags, a template that shows no tools."""
    return LiveServer(FakeEngine(script, tokens_per_step=3), script.tokenizer)


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_auto_on_a_default_server_shows_the_tools_and_reads_the_call(api):
    """Before: chat said "needs a tool-call parser" (400); Responses and
    Messages dropped the tools and answered in text."""
    script = GrammarChoice(NoToolsTemplateTokenizer(), [f"Checking.\n{HERMES_CALL}"])
    with serve(script) as live:
        response = api.post(live.url, api.body())
    assert response.status_code == 200, response.text
    assert api.calls(response.json()) == [("get_weather", {"city": "Oslo"})]
    (prompt,) = script.prompts
    assert "<tools>\n" in prompt and '"name": "get_time"' in prompt
    assert "<tool_call></tool_call> XML tags" in prompt
    assert "tools: " not in prompt, "the template is given no tools"


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
@pytest.mark.parametrize("tool_choice", ["auto", "required", "get_weather", "none"])
def test_every_tool_choice_is_served_on_a_default_server(api, tool_choice):
    outputs = ['[{"name": "get_weather", "parameters": {"city": "Oslo"}}]', '{"city": "Oslo"}']
    script = GrammarChoice(NoToolsTemplateTokenizer(), [HERMES_CALL, *outputs])
    with serve(script) as live:
        response = api.post(live.url, api.body(tool_choice))
    assert response.status_code == 200, response.text
    (prompt,) = script.prompts
    assert "<tools>" in prompt, "shown whatever tool_choice says, as vLLM and OpenAI do"
    if tool_choice == "none":
        assert api.calls(response.json()) == []
    else:
        assert api.calls(response.json()) == [("get_weather", {"city": "Oslo"})]


def test_a_follow_up_turn_shows_the_call_and_its_result_as_text():
    script = GrammarChoice(NoToolsTemplateTokenizer(), ["It is 12 degrees."])
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees"},
    ]
    with serve(script) as live:
        response = APIS[0].post(live.url, APIS[0].body() | {"messages": messages})
    assert response.status_code == 200, response.text
    (prompt,) = script.prompts
    assert f"assistant: {HERMES_CALL}\n" in prompt
    assert "user: <tool_response>\n12 degrees\n</tool_response>" in prompt


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_tool_call_parser_none_serves_auto_as_none_and_still_forces_required(api):
    script = GrammarChoice(NoToolsTemplateTokenizer(), [HERMES_CALL, '{"city": "Oslo"}'])
    engine = FakeEngine(script, tokens_per_step=3)
    with LiveServer(engine, script.tokenizer, tool_call_parser="none") as live:
        auto = api.post(live.url, api.body("auto"))
        forced = api.post(live.url, api.body("get_weather"))
    assert auto.status_code == forced.status_code == 200, auto.text + forced.text
    assert api.calls(auto.json()) == [] and HERMES_CALL in api.text(auto.json())
    assert api.calls(forced.json()) == [("get_weather", {"city": "Oslo"})]
    assert "<tools>" not in script.prompts[0] and "<tools>" in script.prompts[1]
