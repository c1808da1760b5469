"""Per-key limits over HTTP (a real socket, the fake engine, an injected clock):
each limit answers 429 with Retry-After at the right count, other keys are
unaffected, limits reset as the window slides, a reload changes them, and no
key appears in logs or metrics. Also the limiter alone, on hand-moved time."""

from __future__ import annotations

import logging
import signal
import threading

import httpx2
import pytest

from sluice.errors import RateLimitError
from sluice.server.keys.api_keys import ApiKey, KeyLimits, digest_of
from sluice.server.keys.key_limits import KeyLimiter
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

SECRETS = {"chat": "sk-chat-1111", "batch": "sk-batch-2222", "tokens": "sk-tok-3333"}


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def key_file(tmp_path, lines: list[str]):
    path = tmp_path / "keys.txt"
    path.write_text("# the test's keys\n" + "\n".join(lines) + "\n")
    return path


def serve(tmp_path, clock: Clock, engine=None, **config) -> LiveServer:
    lines = [
        f"{SECRETS['chat']} name=chat",
        f"{SECRETS['batch']} name=batch rpm=3 max_concurrent=1",
        f"{SECRETS['tokens']} name=tokens tpm=20",
    ]
    engine = engine or LoopFakeEngine()
    return LiveServer(
        engine, ChatFakeTokenizer(), clock=clock, api_key_file=key_file(tmp_path, lines), **config
    )


def completion(client, key: str, path: str = "/v1/completions", **fields) -> httpx2.Response:
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4, **fields}
    return client.post(path, json=body, headers={"Authorization": f"Bearer {key}"})


def chat(client, key: str) -> httpx2.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return client.post("/v1/chat/completions", json=body, headers={"x-api-key": key})


def assert_rate_limited(response, retry_after_s: int) -> dict:
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == str(retry_after_s)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    return error


def test_requests_per_minute_refuse_the_fourth_and_reset_as_the_window_slides(tmp_path):
    clock = Clock()
    with serve(tmp_path, clock) as live, httpx2.Client(base_url=live.url) as client:
        for _ in range(2):
            assert completion(client, SECRETS["batch"]).status_code == 200
        clock.now_s += 20
        assert chat(client, SECRETS["batch"]).status_code == 200
        clock.now_s += 10
        error = assert_rate_limited(completion(client, SECRETS["batch"]), retry_after_s=30)
        assert "'batch'" in error["message"] and "3 requests per minute" in error["message"]
        # Other keys are unaffected.
        for _ in range(5):
            assert completion(client, SECRETS["chat"]).status_code == 200
        clock.now_s += 30  # the first two left the window
        assert completion(client, SECRETS["batch"]).status_code == 200
        assert completion(client, SECRETS["batch"]).status_code == 200
        assert_rate_limited(completion(client, SECRETS["batch"]), retry_after_s=20)


def test_tokens_per_minute_count_prompt_and_generated_tokens(tmp_path):
    clock = Clock()
    with serve(tmp_path, clock) as live, httpx2.Client(base_url=live.url) as client:
        used, num_requests = 0, 0
        while used < 20:  # each request is admitted while the window holds less than 20
            response = completion(client, SECRETS["tokens"])
            assert response.status_code == 200
            used += response.json()["usage"]["total_tokens"]
            num_requests += 1
            clock.now_s += 1
        assert num_requests > 1
        # Room again once the first request's tokens leave the window, 60 s after it.
        response = completion(client, SECRETS["tokens"])
        error = assert_rate_limited(response, retry_after_s=60 - num_requests)
        assert f"used {used} tokens" in error["message"]
        clock.now_s += 60 - num_requests
        assert completion(client, SECRETS["tokens"]).status_code == 200


def test_a_stream_holds_its_concurrency_slot_until_it_ends(tmp_path):
    clock = Clock()
    # Requests spend a long "prefill": the first one is still waiting when the second comes.
    engine = LoopFakeEngine(prefill_steps=1, step_interval_s=3600)
    with serve(tmp_path, clock, engine) as live, httpx2.Client(base_url=live.url) as client:
        first: list[httpx2.Response] = []
        thread = threading.Thread(
            target=lambda: first.append(completion(client, SECRETS["batch"], stream=True))
        )
        thread.start()
        engine.wait_until(lambda: len(engine.added_request_ids) == 1)
        error = assert_rate_limited(completion(client, SECRETS["batch"]), retry_after_s=1)
        assert "max_concurrent 1" in error["message"]
        engine.die_threadsafe()  # ends the first request (a 503 before its first event)
        thread.join(30)
        assert first[0].status_code == 503
        # The slot is free again: admitted past the key's limits, refused by the dead engine.
        assert completion(client, SECRETS["batch"]).status_code == 503


def test_the_messages_route_answers_a_limit_in_anthropics_shape(tmp_path):
    clock = Clock()
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": SECRETS["batch"]}
    with serve(tmp_path, clock) as live, httpx2.Client(base_url=live.url) as client:
        for _ in range(3):
            assert client.post("/v1/messages", json=body, headers=headers).status_code == 200
        refused = client.post("/v1/messages", json=body, headers=headers)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "60"
        assert refused.json()["type"] == "error"
        assert refused.json()["error"]["type"] == "rate_limit_error"


def test_the_responses_route_takes_the_same_keys_and_limits(tmp_path):
    clock = Clock()
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4}
    with serve(tmp_path, clock) as live, httpx2.Client(base_url=live.url) as client:
        assert client.post("/v1/responses", json=body).status_code == 401
        headers = {"Authorization": f"Bearer {SECRETS['batch']}"}
        for _ in range(3):
            assert client.post("/v1/responses", json=body, headers=headers).status_code == 200
        assert_rate_limited(
            client.post("/v1/responses", json=body, headers=headers), retry_after_s=60
        )


def test_the_log_and_metrics_name_the_key_and_never_show_it(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    clock = Clock()
    with serve(tmp_path, clock) as live, httpx2.Client(base_url=live.url) as client:
        assert completion(client, SECRETS["chat"]).status_code == 200
        assert completion(client, SECRETS["batch"], stream=True).status_code == 200
        assert completion(client, "sk-wrong").status_code == 401
        metrics = client.get("/metrics").text
    access = [r.getMessage() for r in caplog.records if r.name == "sluice.access"]
    assert any(line.endswith(" key=chat") for line in access)
    assert any(line.endswith(" key=batch") for line in access)
    assert 'sluice:request_success_total{finished_reason="length",key="chat"' in metrics
    assert 'vllm:prompt_tokens_total{key="batch",model_name=' in metrics
    assert 'sluice:time_to_first_token_seconds_count{key="chat"' in metrics
    everything = metrics + "\n".join(r.getMessage() for r in caplog.records)
    for secret in (*SECRETS.values(), "sk-wrong"):
        assert secret not in everything


def test_sighup_rereads_the_key_file_and_keeps_usage(tmp_path):
    clock = Clock()
    with serve(tmp_path, clock) as live, httpx2.Client(base_url=live.url) as client:
        assert completion(client, SECRETS["chat"]).status_code == 200
        key_file(tmp_path, [f"{SECRETS['chat']} name=chat rpm=2", "sk-new-4444 name=new"])
        reload_keys(live)
        assert completion(client, SECRETS["chat"]).status_code == 200
        assert_rate_limited(completion(client, SECRETS["chat"]), retry_after_s=60)
        assert completion(client, "sk-new-4444").status_code == 200
        assert completion(client, SECRETS["batch"]).status_code == 401  # gone from the file
        # A file that no longer parses leaves the keys as they were.
        key_file(tmp_path, ["sk-broken rpm=none"])
        reload_keys(live)
        assert completion(client, "sk-new-4444").status_code == 200


def reload_keys(live: LiveServer) -> None:
    """What SIGHUP does (the handler, as the signal would call it), then wait for the loop."""
    live.server.handle_hangup(signal.SIGHUP, None)
    done = threading.Event()
    live.loop.call_soon_threadsafe(done.set)
    assert done.wait(10)


# -- the limiter alone ---------------------------------------------------------------


def limited(**limits) -> ApiKey:
    return ApiKey("k", digest_of("secret"), KeyLimits(**limits))


def test_a_released_lease_frees_its_slot_once_only():
    limiter, key = KeyLimiter(Clock()), limited(max_concurrent=2)
    first, _second = limiter.admit(key), limiter.admit(key)
    with pytest.raises(RateLimitError):
        limiter.admit(key)
    first.release()
    first.release()
    limiter.admit(key)
    with pytest.raises(RateLimitError):
        limiter.admit(key)


def test_refused_requests_do_not_count_against_requests_per_minute():
    clock = Clock()
    limiter, key = KeyLimiter(clock), limited(rpm=1)
    limiter.admit(key)
    for _ in range(3):
        clock.now_s += 10
        with pytest.raises(RateLimitError) as refused:
            limiter.admit(key)
    assert refused.value.retry_after_s == 30
    clock.now_s += 30
    limiter.admit(key)


def test_retry_after_is_when_enough_tokens_leave_the_window():
    clock = Clock()
    limiter, key = KeyLimiter(clock), limited(tpm=100)
    lease = limiter.admit(key)
    lease.charge(30)  # at 0 s
    clock.now_s += 10
    lease.charge(50)  # at 10 s
    clock.now_s += 10
    lease.charge(40)  # at 20 s: 120 in the window
    with pytest.raises(RateLimitError) as refused:
        limiter.admit(key)
    # Without the first charge the window holds 90 < 100: free at 0 + 60 s, 40 s from now.
    assert refused.value.retry_after_s == 40
    clock.now_s += 40
    limiter.admit(key)


# -- the access log under hostile paths ----------------------------------------------


FORGED = "/v1/models%0Aforged-id%20%22POST%20/v1/completions%22%20200%20prompt_tokens=99999%0D%1B%C2%85%E2%80%A8%20key=batch"


def test_control_characters_in_a_path_never_forge_an_access_log_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    clock = Clock()
    with serve(tmp_path, clock) as live, httpx2.Client(base_url=live.url) as client:
        assert client.get(FORGED).status_code == 401  # no key: refused, still logged
        headers = {"Authorization": f"Bearer {SECRETS['chat']}"}
        assert client.get(FORGED, headers=headers).status_code == 404
        assert client.post(FORGED, headers=headers).status_code in (404, 405)
        forged_id = {"X-Request-Id": 'r1 "POST /v1/completions" 200 prompt_tokens=9'}
        response = client.get("/v1/models", headers=forged_id | headers)
        assert response.headers["x-request-id"] != forged_id["X-Request-Id"]
    access = [r.getMessage() for r in caplog.records if r.name == "sluice.access"]
    assert access[3].startswith(response.headers["x-request-id"] + ' "GET /v1/models" 200 ')
    access = access[:3]
    for line in access:
        assert line.isprintable(), line
        assert line.count('"') - line.count('\\"') == 2  # the request's own quotes only
        assert '\\nforged-id \\"POST /v1/completions\\" 200' in line
        assert "\\r\\x1b\\x85\\u2028 key=batch" in line
    assert " 401 " in access[0] and access[0].rsplit(" ", 1)[1].startswith("total_ms=")
    assert access[1].endswith(" key=chat")
