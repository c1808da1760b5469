"""The `priority` request field over HTTP: chat, completions, the Responses
and Messages APIs carry it to the engine's SamplingParams; a server that
schedules fcfs refuses a non-zero one by name, as vLLM does; bad values are 400s."""

from __future__ import annotations

import httpx2
import pytest

from sluice.config import EngineConfig, SchedulerConfig
from sluice.testing.fake_engine import LoopFakeEngine, parrot
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    "/v1/messages": {"messages": MESSAGES, "max_tokens": 2},
}


class RecordedPriorities:
    def __init__(self) -> None:
        self.priorities: list[int] = []

    def __call__(self, request_id, prompt, params):
        self.priorities.append(params.priority)
        return parrot(request_id, prompt, params)


def serve(script, policy: str) -> LiveServer:
    engine_config = EngineConfig(scheduler=SchedulerConfig(scheduling_policy=policy))
    return LiveServer(LoopFakeEngine(script), ChatFakeTokenizer(), engine=engine_config)


@pytest.mark.parametrize("path", list(BODIES))
def test_each_route_carries_priority_to_the_engine(path):
    script = RecordedPriorities()
    with serve(script, "priority") as live, httpx2.Client(base_url=live.url) as client:
        for priority in (-3, None, 7):
            fields = {} if priority is None else {"priority": priority}
            response = client.post(path, json={"model": MODEL, **BODIES[path], **fields})
            assert response.status_code == 200, response.text
    assert script.priorities == [-3, 0, 7]


@pytest.mark.parametrize("path", list(BODIES))
def test_a_fcfs_server_refuses_a_priority_by_name_and_takes_zero(path):
    with serve(parrot, "fcfs") as live, httpx2.Client(base_url=live.url) as client:
        refused = client.post(path, json={"model": MODEL, **BODIES[path], "priority": 1})
        assert refused.status_code == 400
        if path == "/v1/messages":
            assert "priority" in refused.json()["error"]["message"]
        else:
            assert refused.json()["error"]["param"] == "priority"
        zero = client.post(path, json={"model": MODEL, **BODIES[path], "priority": 0})
        assert zero.status_code == 200


@pytest.mark.parametrize("bad", ["high", 1.5, 2**63, [1], {"p": 1}, True])
def test_a_priority_that_is_not_a_64_bit_integer_is_a_400(bad):
    with serve(parrot, "priority") as live, httpx2.Client(base_url=live.url) as client:
        for path in BODIES:
            response = client.post(path, json={"model": MODEL, **BODIES[path], "priority": bad})
            assert response.status_code == 400, (path, bad, response.text)
