"""Fuzz: random request bodies against the live server never cause a 5xx or a 422.

Bodies mix plausible values (so requests get deep into preprocessing and
generation) with arbitrary JSON of any type, nesting, size and script for
every field, NaN and infinities, integers beyond 64 bits, and non-object
bodies. Any answer must be a success or an OpenAI error object with a 4xx.
"""

from __future__ import annotations

import json

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

MAX_MODEL_LEN = 64
NUM_EXAMPLES = 300

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
    "return_token_strs": st.booleans(),
}  # fmt: skip
PROMPTS = st.text(min_size=1, max_size=30) | st.lists(st.text(min_size=1, max_size=10),
          min_size=1, max_size=3) | token_ids | st.lists(token_ids, min_size=1, max_size=3)  # fmt: skip
FIELDS = sorted([*VALID, "prompt", "messages", "suffix", "best_of"])
PATHS = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]


@st.composite
def requests(draw) -> tuple[str, object]:
    """A path and a body: valid fields, a few corrupted, sometimes no object at all."""
    path = draw(st.sampled_from(PATHS))
    body = draw(st.fixed_dictionaries({}, optional=VALID))
    if path in ("/v1/completions", "/tokenize"):
        body["prompt"] = draw(PROMPTS if path == "/v1/completions" else st.text(max_size=30))
    else:
        body["messages"] = draw(messages)
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=2)):
        body[field] = draw(json_values)
    if draw(st.integers(0, 19)) == 0:
        return path, draw(json_values)
    return path, body


@pytest.fixture(scope="module")
def client():
    engine = LoopFakeEngine(tokens_per_step=(1, 4), finish_probability=0.05, max_model_len=64)
    server = LiveServer(engine, ChatFakeTokenizer(), max_model_len=MAX_MODEL_LEN)
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


def test_random_bodies_never_cause_a_5xx(client, record_property):
    counts = {"requests": 0, "ok": 0}

    @settings(max_examples=NUM_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(request=requests())
    def send(request: tuple[str, object]) -> None:
        path, body = request
        raw = json.dumps(body, allow_nan=True).encode()
        response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
        counts["requests"] += 1
        counts["ok"] += response.status_code == 200
        check_answer(response)

    send()
    record_property("fuzz_requests", counts["requests"])
    print(f"fuzz: {counts['requests']} requests, {counts['ok']} answered 200")
    assert counts["requests"] >= NUM_EXAMPLES and counts["ok"] > 0


def test_the_case_the_fuzzer_found_echo_with_logprobs_on_the_fake_engine(client):
    """Echo with logprobs asks the engine for prompt logprobs; the fake engine
    computes them as the real one does (it used to send none: a 500)."""
    body = {"model": "fake-model", "prompt": "01", "echo": True, "logprobs": 0, "max_tokens": 1}
    response = client.post("/v1/completions", json=body)
    check_answer(response)
    logprobs = response.json()["choices"][0]["logprobs"]
    assert response.status_code == 200 and logprobs["token_logprobs"][0] is None
