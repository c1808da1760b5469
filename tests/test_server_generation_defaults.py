"""--override-generation-config: what a request that leaves a sampling field
unset gets, on every generation route, and what the flag refuses."""

from __future__ import annotations

import httpx2
import pytest

from sluice.cli import main
from sluice.config import GenerationDefaults
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer

TOKENIZER = ChatFakeTokenizer()
OUTPUT = "One. Two. Three."
DEFAULTS = GenerationDefaults(temperature=0.0, top_k=5, max_new_tokens=7, stop_strings=(".",))
MESSAGES = [{"role": "user", "content": "count"}]
BODIES = {
    "/v1/chat/completions": {"messages": MESSAGES},
    "/v1/completions": {"prompt": "count"},
    "/v1/responses": {"input": "count"},
    "/v1/messages": {"messages": MESSAGES, "max_tokens": 50},
}


@pytest.fixture(scope="module")
def live():
    seen = []

    def script(request_id, prompt, params):
        seen.append(params)
        return iter(TOKENIZER.encode(OUTPUT))

    with LiveServer(FakeEngine(script), TOKENIZER, generation_defaults=DEFAULTS) as server:
        server.seen = seen
        yield server


def post(live, path: str, **fields) -> dict:
    response = httpx2.post(live.url + path, json={"model": "fake-model"} | BODIES[path] | fields)
    assert response.status_code == 200, response.text
    return response.json()


def text_of(path: str, body: dict) -> str:
    if path == "/v1/chat/completions":
        return body["choices"][0]["message"]["content"]
    if path == "/v1/completions":
        return body["choices"][0]["text"]
    if path == "/v1/responses":
        return body["output"][0]["content"][0]["text"]
    return body["content"][0]["text"]


@pytest.mark.parametrize("path", sorted(BODIES))
def test_unset_fields_take_the_servers_defaults_on_every_route(live, path):
    body = post(live, path)
    params = live.seen[-1]
    assert (params.temperature, params.top_k) == (0.0, 5)
    assert text_of(path, body) == "One"  # the default stop string
    if path != "/v1/messages":  # max_tokens is required there
        assert params.max_tokens == 7


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_fields_a_request_sets_win_over_the_defaults(live, path):
    body = post(live, path, temperature=0.5, top_k=2, max_tokens=40, stop=["Three"])
    params = live.seen[-1]
    assert (params.temperature, params.top_k, params.max_tokens) == (0.5, 2, 40)
    assert text_of(path, body) == "One. Two. "


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        ('{"temperature": 3}', "temperature must be within"),
        ('{"temprature": 0}', "unknown keys ['temprature']"),
        ('{"top_k": 1.5}', "top_k must be an integer"),
        ('{"stop_strings": "."}', "stop_strings must be a list"),
        ("[1]", "must be a JSON object"),
        ("{", "not JSON"),
    ],
)
def test_the_flag_refuses_bad_values_with_one_line(capsys, flag, problem):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--override-generation-config", flag])
    assert exit_info.value.code == 2
    assert problem in capsys.readouterr().err
