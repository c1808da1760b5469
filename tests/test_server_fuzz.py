"""Fuzz: random request bodies against the live server never cause a 5xx or a 422.

Bodies mix plausible values (so requests get deep into preprocessing and
generation) with arbitrary JSON of any type, nesting, size and script for
every field, NaN and infinities, integers beyond 64 bits, and non-object
bodies. Any answer must be a success or an OpenAI error object with a 4xx.

Every feature's fields join: reasoning controls (effort, budget, the chat
template's variables), structured outputs (schemas with `$defs`,
`definitions` and references, good and bad), tools and tool_choice, earlier
tool calls; values nested up to 1,500 deep (in any field, in schemas, in
tools' parameters, in arguments text); `$defs` of any type; and bodies padded
past the worker threshold (8 KiB) or the huge lane (256 KiB), so the worker
path converts them, grammars and all.
"""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.json_strategies import Deep, deep, json_text, json_values, scalars
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

MAX_MODEL_LEN = 64
NUM_EXAMPLES = 300

VOCAB_SIZE = ChatFakeTokenizer().vocab_size
token_ids = st.lists(st.integers(min_value=0, max_value=VOCAB_SIZE - 1), min_size=1, max_size=6)
roles = st.sampled_from(["system", "user", "assistant", "tool", "developer"])
text_parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=12)}),
                      min_size=1, max_size=3)  # fmt: skip
messages = st.lists(
    st.fixed_dictionaries(
        {"role": roles, "content": st.text(min_size=1, max_size=30) | text_parts}
    ),
    min_size=1,
    max_size=3,
)
stop_strings = st.text(min_size=1, max_size=4)
# Reasoning controls: efforts (and not), a template's variables of any JSON.
EFFORTS = st.sampled_from(["none", "minimal", "low", "medium", "high", "xhigh", "max"])
TEMPLATE_KWARGS = st.dictionaries(
    st.sampled_from(["enable_thinking", "reasoning_effort", "messages", "x"]) | st.text(max_size=8),
    json_values | deep, max_size=3,
)  # fmt: skip
# Valid values, so requests reach generation; the corruption step below breaks some.
VALID = {
    "model": st.just(MODEL),
    "max_tokens": st.integers(1, 20), "max_completion_tokens": st.integers(1, 20),
    "min_tokens": st.integers(0, 3), "n": st.integers(1, 3),
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 10),
    "min_p": st.floats(0, 1), "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.5, 2),
    "seed": st.integers(0, 2**32), "logprobs": st.integers(0, 5) | st.booleans(),
    "top_logprobs": st.integers(0, 5), "echo": st.booleans(), "stream": st.booleans(),
    "ignore_eos": st.booleans(), "stop": stop_strings | st.lists(stop_strings, max_size=3),
    "stop_token_ids": token_ids,
    "logit_bias": st.dictionaries(st.integers(0, VOCAB_SIZE - 1).map(str), st.floats(-100, 100),
                                  max_size=3),
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
    ),
    "response_format": st.just({"type": "text"}),
    "include_stop_str_in_output": st.booleans(), "skip_special_tokens": st.booleans(),
    "spaces_between_special_tokens": st.booleans(), "add_generation_prompt": st.booleans(),
    "add_special_tokens": st.booleans(), "tokens": token_ids, "user": st.text(max_size=5),
    "return_token_strs": st.booleans(), "priority": st.integers(-(2**63), 2**63 - 1),
    "reasoning_effort": EFFORTS, "thinking_token_budget": st.integers(0, 30),
    "chat_template_kwargs": TEMPLATE_KWARGS,
}  # fmt: skip
PROMPTS = st.text(min_size=1, max_size=30) | st.lists(st.text(min_size=1, max_size=10),
          min_size=1, max_size=3) | token_ids | st.lists(token_ids, min_size=1, max_size=3)  # fmt: skip


defs = st.just({"A": {"type": "integer"}}) | scalars | st.lists(scalars, max_size=2) | deep
schema_leaves = st.sampled_from([
    {"type": "integer"}, {"type": "string", "maxLength": 3}, {"enum": ["a", "b"]},
    {"$ref": "#/$defs/A"}, {"$ref": "#/definitions/A"}, {"$ref": "#/properties/a"}, {"$ref": "#"},
]) | deep  # fmt: skip
schemas = st.fixed_dictionaries(
    {"type": st.just("object"),
     "properties": st.dictionaries(st.sampled_from("abc"), schema_leaves, max_size=3)},
    optional={"$defs": defs, "definitions": defs, "required": st.just(["a"])},
)  # fmt: skip
tools = st.lists(st.fixed_dictionaries(
    {"type": st.just("function"),
     "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g"])},
                                       optional={"parameters": schemas})}),
    min_size=1, max_size=2)  # fmt: skip
named_choice = st.sampled_from(["f", "g"]).map(
    lambda name: {"type": "function", "function": {"name": name}}
)
# Text: no bound but the body's size.
arguments = st.sampled_from(['{"a": 1}', '"[[["', "[" * 1500]) | deep.map(Deep.text)
earlier_calls = st.lists(
    st.fixed_dictionaries({"id": st.just("call_1"), "type": st.just("function"),
                           "function": st.fixed_dictionaries(
                               {"name": st.sampled_from(["f", "g"]), "arguments": arguments})}),
    min_size=1, max_size=2,
).map(lambda calls: {"role": "assistant", "content": None, "tool_calls": calls})  # fmt: skip
GRAMMAR_FIELDS = {
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}])
    | schemas.map(lambda schema: {"type": "json_schema",
                                  "json_schema": {"name": "A", "schema": schema}}),
    "structured_outputs": st.one_of(
        schemas.map(lambda schema: {"json": schema}), st.just({"json_object": True}),
        st.just({"regex": "[0-9]+"}), st.just({"choice": ["yes", "no"]}),
        st.just({"grammar": 'start: "a"+'})),
    "guided_json": schemas | schemas.map(json_text),
    "guided_regex": st.sampled_from(["[0-9]+", "a(b", "(a|b)*"]),
    "guided_choice": st.lists(st.text(max_size=3), max_size=3),
    "guided_grammar": st.sampled_from(['start: "a"+', "root ::= ((("]),
    "tools": tools,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | named_choice,
    "parallel_tool_calls": st.booleans(),
}  # fmt: skip
# Fields drawn together: tools mostly come with a tool_choice.
GRAMMAR_GROUPS = [*({field} for field in GRAMMAR_FIELDS), {"tools", "tool_choice"},
                  {"tools", "tool_choice", "parallel_tool_calls"}]  # fmt: skip
# A body this long takes the worker path (OFFLOAD_THRESHOLD_BYTES) or the huge lane.
PADDINGS = [0, 0, 9000, 300_000]
FIELDS = sorted([*VALID, *GRAMMAR_FIELDS, "prompt", "messages", "suffix", "best_of"])
PATHS = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]


@st.composite
def requests(
    draw, valid=VALID, paths=PATHS, chat=messages, num_corrupted=2, non_objects=True
) -> tuple[str, object]:
    """A path and a body: valid fields (and up to two of GRAMMAR_GROUPS), up to
    `num_corrupted` fields corrupted, sometimes padded, sometimes no object at all."""
    path = draw(st.sampled_from(paths))
    body = draw(st.fixed_dictionaries({}, optional=valid))
    for group in draw(st.lists(st.sampled_from(GRAMMAR_GROUPS), max_size=2)):
        body.update({field: draw(GRAMMAR_FIELDS[field]) for field in sorted(group)})
    if path in ("/v1/completions", "/tokenize"):
        body["prompt"] = draw(PROMPTS if path == "/v1/completions" else st.text(max_size=30))
    else:
        body["messages"] = draw(chat)
        if draw(st.booleans()):
            body["messages"][:0] = [draw(earlier_calls)]
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=num_corrupted)):
        body[field] = draw(json_values | deep)
    padding = draw(st.sampled_from(PADDINGS))
    if padding:
        body["user"] = "x" * padding
    if non_objects and draw(st.integers(0, 19)) == 0:
        return path, draw(json_values)
    return path, body


# Bodies that mostly reach the constraint's compile and the chat template, on
# the loop or in a worker: besides the grammar fields, fields that rarely
# refuse one; user turns; at most one field corrupted.
grammar_requests = requests(
    {field: VALID[field] for field in ("model", "max_tokens", "stream", "seed")},
    ["/v1/completions", "/v1/chat/completions"],
    st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=8)}),
             min_size=1, max_size=2),
    num_corrupted=1,
    non_objects=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def client():
    engine = LoopFakeEngine(tokens_per_step=(1, 4), finish_probability=0.05, max_model_len=64)
    server = LiveServer(
        engine,
        ChatFakeTokenizer(),
        max_model_len=MAX_MODEL_LEN,
        tool_call_parser="hermes",
        reasoning_parser="deepseek_r1",
    )
    with server as live, httpx2.Client(base_url=live.url, timeout=30) as http:
        yield http


def check_answer(response: httpx2.Response) -> None:
    assert response.status_code < 500 and response.status_code != 422, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.content.endswith(b"data: [DONE]\n\n")
        assert b"internal_server_error" not in response.content


@pytest.mark.parametrize(
    ("strategy", "num_examples"),
    [
        (requests(), NUM_EXAMPLES),
        (grammar_requests, NUM_EXAMPLES),
    ],
    ids=["any fields", "grammar fields"],
)
def test_random_bodies_never_cause_a_5xx(client, record_property, strategy, num_examples):
    counts = {"requests": 0, "ok": 0}

    @settings(max_examples=num_examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(request=strategy)
    def send(request: tuple[str, object]) -> None:
        path, body = request
        raw = json_text(body).encode()
        response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
        counts["requests"] += 1
        counts["ok"] += response.status_code == 200
        check_answer(response)

    send()
    record_property("fuzz_requests", counts["requests"])
    print(f"fuzz: {counts['requests']} requests, {counts['ok']} answered 200")
    assert counts["requests"] >= num_examples and counts["ok"] > 0


def test_the_case_the_fuzzer_found_echo_with_logprobs_on_the_fake_engine(client):
    """Echo with logprobs asks the engine for prompt logprobs; the fake engine
    computes them as the real one does (it used to send none: a 500)."""
    body = {"model": "fake-model", "prompt": "01", "echo": True, "logprobs": 0, "max_tokens": 1}
    response = client.post("/v1/completions", json=body)
    check_answer(response)
    logprobs = response.json()["choices"][0]["logprobs"]
    assert response.status_code == 200 and logprobs["token_logprobs"][0] is None
