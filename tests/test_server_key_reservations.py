"""A key's limits count what a request asks for, not one per request: each
choice (`n` times the prompts) holds a seat of max_concurrent and a start of
rpm, and tpm holds a reservation of prompt + max_tokens per choice from the
moment a request is tokenized to its end, refunded to what it used. Over HTTP
(a real socket, the fake engine, an injected clock), then the lease alone."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx2
import pytest

from sluice.errors import RateLimitError
from sluice.server.keys.api_keys import ApiKey, KeyLimits, digest_of
from sluice.server.keys.key_limits import KeyLimiter
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

KEYS = {"one": "sk-one-1111", "wide": "sk-wide-2222", "tokens": "sk-tok-3333",
        "seats": "sk-seats-4444"}  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def serve(tmp_path, engine=None, tokenizer=None, clock=None) -> LiveServer:
    path = tmp_path / "keys"
    path.write_text(
        f"{KEYS['one']} name=one max_concurrent=1\n"
        f"{KEYS['wide']} name=wide max_concurrent=4 rpm=3\n"
        f"{KEYS['tokens']} name=tokens tpm=1000\n"
        f"{KEYS['seats']} name=seats max_concurrent=4\n"
    )
    return LiveServer(engine or LoopFakeEngine(), tokenizer or ChatFakeTokenizer(),
                      clock=clock or Clock(), api_key_file=path)  # fmt: skip


def post(client, key: str, path: str = "/v1/chat/completions", **fields) -> httpx2.Response:
    body = {"model": MODEL, "max_tokens": 4, **fields}
    if path == "/v1/chat/completions":
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    else:
        body.setdefault("prompt", "hi")
    return client.post(path, json=body, headers={"Authorization": f"Bearer {KEYS[key]}"})


def refusal(response: httpx2.Response) -> str:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    return error["message"]


def limiter_of(live: LiveServer) -> KeyLimiter:
    (limiter,) = [m.kwargs["limiter"] for m in live.app.user_middleware if "limiter" in m.kwargs]
    return limiter


def test_n_beyond_max_concurrent_is_refused_before_the_engine_sees_it(tmp_path):
    engine = LoopFakeEngine()
    with serve(tmp_path, engine) as live, httpx2.Client(base_url=live.url) as client:
        message = refusal(post(client, "one", n=16))
        assert "16 choices" in message and "max_concurrent 1" in message
        # A prompt list is choices too: two prompts, one choice each.
        message = refusal(post(client, "one", "/v1/completions", prompt=["a", "b"]))
        assert "2 choices" in message and "max_concurrent 1" in message
        assert engine.added_request_ids == []
        assert post(client, "one", n=1).status_code == 200


def test_choices_in_flight_hold_seats_until_their_request_ends(tmp_path):
    # A long "prefill": the first request is still running when the others come.
    engine = LoopFakeEngine(prefill_steps=1, step_interval_s=3600)
    with serve(tmp_path, engine) as live, httpx2.Client(base_url=live.url) as client:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(post, client, "seats", n=3, stream=True)
            engine.wait_until(lambda: len(engine.added_request_ids) == 3)
            message = refusal(post(client, "seats", n=2))
            assert "3 requests in flight" in message and "max_concurrent 4" in message
            engine.die_threadsafe()  # ends the first request (a 503 before its first event)
            assert first.result(30).status_code == 503
        assert len(engine.added_request_ids) == 3
        assert limiter_of(live).usage("seats").num_in_flight == 0


def test_each_choice_is_a_request_per_minute_and_refusals_count_none(tmp_path):
    clock = Clock()
    with serve(tmp_path, clock=clock) as live, httpx2.Client(base_url=live.url) as client:
        assert post(client, "wide", n=2).status_code == 200
        clock.now_s += 10
        message = refusal(response := post(client, "wide", n=2))
        assert "3 requests per minute" in message and "this request has 2" in message
        assert response.headers["retry-after"] == "50"  # the first request's two leave then
        assert post(client, "wide", n=1).status_code == 200  # the refused two never counted
        refusal(post(client, "wide", n=1))
        clock.now_s += 50
        assert post(client, "wide", n=2).status_code == 200


class GatedTokenizer(ChatFakeTokenizer):
    """The fake tokenizer, holding every long text until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if len(text) > 1000:
            assert self.gate.wait(30), "the test never opened the gate"
        return super().encode(text, add_special_tokens)


def test_concurrent_long_prompts_cannot_pass_tpm_more_than_once(tmp_path):
    tokenizer = GatedTokenizer()
    long_prompt = "hello there " * 700  # 2,800 tokens; over 8 KiB: tokenized off the loop
    with serve(tmp_path, tokenizer=tokenizer) as live, httpx2.Client(base_url=live.url) as client:
        usage = limiter_of(live).usage("tokens")
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(post, client, "tokens", "/v1/completions",
                                   prompt=long_prompt, max_tokens=8) for _ in range(12)]  # fmt: skip
            # All twelve passed the key's admission while the window was empty ...
            for _ in range(3000):
                if usage.num_in_flight == 12:
                    break
                assert not any(f.done() for f in futures), futures[0].result().text
                time.sleep(0.01)
            else:
                pytest.fail("the twelve requests never all passed the key's admission")
            tokenizer.gate.set()  # ... and reach the engine one after another.
            responses = [f.result(60) for f in futures]
    served = [r for r in responses if r.status_code == 200]
    assert len(served) == 1, [r.status_code for r in responses]
    for response in responses:
        if response.status_code != 200:
            assert "reservations included" in refusal(response)
    num_used = served[0].json()["usage"]["total_tokens"]
    assert num_used > 1000 and usage.num_window_tokens == num_used  # refunded to what it used


def test_a_reservation_is_refunded_to_what_the_request_used(tmp_path):
    answer = ChatFakeTokenizer().encode("Hi there.")
    engine = LoopFakeEngine(lambda *_: iter(answer))
    with serve(tmp_path, engine) as live, httpx2.Client(base_url=live.url) as client:
        first = post(client, "tokens", "/v1/completions", max_tokens=2000)
        assert first.status_code == 200  # reserved more than tpm: the one that crosses runs
        usage = limiter_of(live).usage("tokens")
        assert usage.num_window_tokens == first.json()["usage"]["total_tokens"] < 1000
        assert post(client, "tokens", "/v1/completions", max_tokens=2000).status_code == 200


# -- the lease alone -------------------------------------------------------------------


def limited(**limits) -> ApiKey:
    return ApiKey("k", digest_of("secret"), KeyLimits(**limits))


def test_seats_widen_to_the_choices_and_all_free_at_release():
    limiter, key = KeyLimiter(Clock()), limited(max_concurrent=4)
    lease = limiter.admit(key)
    lease.seat_choices(3)
    lease.seat_choices(3)  # the same request again: nothing more
    assert limiter.usage("k").num_in_flight == 3
    with pytest.raises(RateLimitError):
        limiter.admit(key).seat_choices(2)
    assert limiter.usage("k").num_in_flight == 4  # the refused one holds its seat until release
    lease.release()
    assert limiter.usage("k").num_in_flight == 1


def test_a_refused_reservation_withdraws_the_requests_starts():
    clock = Clock()
    limiter, key = KeyLimiter(clock), limited(rpm=10, tpm=100)
    first = limiter.admit(key)
    second = limiter.admit(key)  # admitted while the window is empty
    first.seat_choices(2)
    first.reserve(90, 20)
    with pytest.raises(RateLimitError, match="reservations included"):
        second.reserve(5, 5)
    second.release()
    assert len(limiter.usage("k").request_times_s) == 2  # the first request's two choices


def test_delivered_tokens_draw_on_the_reservation_then_count_anew():
    clock = Clock()
    limiter, key = KeyLimiter(clock), limited(tpm=10_000)
    lease = limiter.admit(key)
    lease.reserve(100, 50)
    usage = limiter.usage("k")
    lease.charge(30)
    assert usage.num_window_tokens == 150
    lease.charge(30)  # 10 beyond the reservation
    assert usage.num_window_tokens == 160
    lease.release()
    assert usage.num_window_tokens == 160  # nothing left to refund


def test_a_reservation_that_left_the_window_is_not_refunded_twice():
    clock = Clock()
    limiter, key = KeyLimiter(clock), limited(tpm=10_000)
    lease = limiter.admit(key)
    lease.reserve(100, 50)
    clock.now_s += 61
    limiter.admit(key)  # forgets the expired reservation
    usage = limiter.usage("k")
    assert usage.num_window_tokens == 0
    lease.release()
    assert usage.num_window_tokens == 0
