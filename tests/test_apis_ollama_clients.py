"""The official `ollama` client and LangChain's `ChatOllama` against the live
server: chat, streaming, tools, structured `format`, thinking and generate,
as the tools built on them see it (a fake engine), and on the embedded model
through `sluice serve`, with the audit's Ollama scenario."""

from __future__ import annotations

import asyncio
import json

import ollama
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langchain_ollama import ChatOllama
from pydantic import BaseModel, ConfigDict, Field

from sluice.audit.options import AuditOptions
from sluice.audit.records import Target
from sluice.audit.runner import run_audit
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.grammar_script import accepts
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer
from tests.sluice_server import RunningServer, running_server

TOKENIZER = ChatFakeTokenizer()
ANSWER = "Bonjour! The weather is fine today."
THOUGHT = "The user greets me; I greet back."
PERSON = '{"name": "Ada", "age": 36}'
MESSAGES = [{"role": "user", "content": "hello"}]


class Person(BaseModel):
    # Closed and bounded, so the grammar ends the object within num_predict
    # whatever a tiny model's greedy choice (an extra list can repeat to the end).
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)


def get_weather(city: str) -> str:
    """Get the weather in a city.

    Args:
        city: The city's name.
    """
    return "sunny"


def tool_call_text(city: str) -> str:
    call = {"name": "get_weather", "arguments": {"city": city}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


class Script:
    """The fake engine's answers: JSON a grammar accepts, a call when a tool
    is shown, else the answer after some reasoning."""

    def __call__(self, request_id, prompt, params):
        prompt_text = TOKENIZER.decode(list(prompt), skip_special_tokens=False)
        spec = params.structured_output
        if spec is not None:
            text = next(t for t in (PERSON, '{"a": 1}', "{}") if accepts(spec, t))
        elif "get_weather" in prompt_text and "sunny" not in prompt_text:
            text = f"{THOUGHT}</think>{tool_call_text('Paris')}"
        else:
            text = f"{THOUGHT}</think>{ANSWER}"
        return iter(TOKENIZER.encode(text))


@pytest.fixture(scope="module")
def live():
    engine = FakeEngine(Script(), tokens_per_step=(1, 4), step_interval_s=0.001, seed=7)
    with LiveServer(engine, TOKENIZER, tool_call_parser="hermes",
                    reasoning_parser="deepseek_r1") as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def client(live):
    return ollama.Client(host=live.url)


def test_chat_and_its_stream_agree(client):
    response = client.chat(model=MODEL, messages=MESSAGES)
    assert response.message.role == "assistant" and response.message.content == ANSWER
    assert response.message.thinking == THOUGHT and response.done_reason == "stop"
    parts = list(client.chat(model=MODEL, messages=MESSAGES, stream=True))
    assert "".join(part.message.content or "" for part in parts) == ANSWER
    assert "".join(part.message.thinking or "" for part in parts) == THOUGHT
    assert parts[-1].done and parts[-1].eval_count == response.eval_count > 0
    assert parts[-1].prompt_eval_count == response.prompt_eval_count > 0


def test_think_false_leaves_the_whole_text_in_content(client):
    response = client.chat(model=MODEL, messages=MESSAGES, think=False)
    assert response.message.content == f"{THOUGHT}</think>{ANSWER}"
    assert not response.message.thinking


def test_a_tool_call_and_the_turn_after_it(client):
    response = client.chat(model=MODEL, messages=MESSAGES, tools=[get_weather])
    (call,) = response.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    follow_up = [
        *MESSAGES,
        response.message,
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    answer = client.chat(model=MODEL, messages=follow_up, tools=[get_weather])
    assert answer.message.content == ANSWER and not answer.message.tool_calls


def test_format_gives_json_of_the_schema(client):
    response = client.chat(model=MODEL, messages=MESSAGES, format=Person.model_json_schema())
    assert Person.model_validate_json(response.message.content) == Person(name="Ada", age=36)
    assert json.loads(client.chat(model=MODEL, messages=MESSAGES, format="json").message.content)


def test_generate_streams_and_returns_a_context(client):
    whole = client.generate(model=MODEL, prompt="hello", think=True)
    assert whole.response == ANSWER and whole.thinking == THOUGHT and whole.context
    parts = list(client.generate(model=MODEL, prompt="hello", stream=True, context=whole.context))
    assert "".join(part.response for part in parts) == ANSWER
    assert parts[-1].prompt_eval_count > len(whole.context)


def test_list_show_ps_and_an_unknown_model(client):
    assert [model.model for model in client.list().models] == [MODEL]
    assert "thinking" in client.show(MODEL).capabilities
    assert client.ps().models[0].model == MODEL
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="llama3", messages=MESSAGES)
    assert refused.value.status_code == 404 and MODEL in refused.value.error


def test_chat_ollama_invokes_streams_calls_tools_and_structures(live):
    chat = ChatOllama(model=MODEL, base_url=live.url, reasoning=True)
    message = chat.invoke([HumanMessage("hello")])
    assert message.content == ANSWER
    assert message.additional_kwargs["reasoning_content"] == THOUGHT
    assert message.usage_metadata["output_tokens"] > 0
    streamed = "".join(chunk.content for chunk in chat.stream([HumanMessage("hello")]))
    assert streamed == ANSWER
    called = ChatOllama(model=MODEL, base_url=live.url).bind_tools([tool(get_weather)])
    reply = called.invoke([HumanMessage("weather in Paris?")])
    assert isinstance(reply, AIMessage)
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    structured = ChatOllama(model=MODEL, base_url=live.url).with_structured_output(
        Person, method="json_schema"
    )
    assert structured.invoke("who?") == Person(name="Ada", age=36)


@pytest.fixture(scope="module")
def embedded_server(embedded_model_config, tmp_path_factory) -> RunningServer:
    with running_server(embedded_model_config, tmp_path_factory) as server:
        yield server


@pytest.mark.slow
def test_the_ollama_client_on_the_embedded_model(embedded_server):
    client = ollama.Client(host=embedded_server.base_url)
    options = {"temperature": 0, "num_predict": 24}
    whole = client.chat(model=embedded_server.model, messages=MESSAGES, options=options)
    parts = list(client.chat(model=embedded_server.model, messages=MESSAGES, options=options,
                             stream=True))  # fmt: skip
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count <= 24
    person = client.chat(model=embedded_server.model, messages=MESSAGES, options=options | {
        "num_predict": 200}, format=Person.model_json_schema())  # fmt: skip
    assert Person.model_validate_json(person.message.content)


@pytest.mark.slow
def test_the_audits_ollama_scenario_passes_on_the_embedded_model(embedded_server):
    options = AuditOptions(scenarios=("ollama",), vllm_extensions="off")
    target = Target("server", embedded_server.base_url, embedded_server.model)
    result = asyncio.run(run_audit([target], options))
    assert [f for f in result.findings if f.is_failure] == []
    (ollama,) = result.results
    assert ollama.figures["slow_streams"] == 2 and ollama.figures["slow_output_tokens"] > 0
