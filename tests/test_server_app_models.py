"""Several models in one server, over HTTP on fake engines behind the real app
and pool (sluice/server/served_models/model_pool.py): each request goes to the model it
names, unknown names are a 404 naming the served ones, a model that does not
load fails its own requests only, and switching under `--models-max 1`
keeps every stream whole."""

from __future__ import annotations

import asyncio
import logging
from itertools import cycle

import aiohttp
import httpx2

from sluice.errors import ModelLoadError
from sluice.server.served_models.model_entry import ModelSpec
from sluice.server.served_models.served_model import ServedModel
from sluice.testing import FakeEngine
from sluice.testing.contract import Expectations, check_stream
from sluice.testing.event_loops import run
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer

TOKENIZER = ChatFakeTokenizer()


def echoing(token_id: int):
    """A script: the model answers `token_id` forever (each model its own)."""
    return lambda request_id, prompt, params: cycle([token_id])


class BrokenEngine(FakeEngine):
    async def start(self) -> None:
        raise ModelLoadError("the GGUF file ends inside tensor blk.3.ffn_up.weight")


def spec(name: str, token_id: int, **fields) -> ModelSpec:
    served = ServedModel(name, TOKENIZER, 256)
    make = fields.pop("make", lambda: FakeEngine(echoing(token_id)))
    return ModelSpec(name, lambda: served, make, **fields)


def completion(http: httpx2.Client, model: str | None, **fields) -> httpx2.Response:
    body = {"prompt": "hello", "max_tokens": 4, "temperature": 0, **fields}
    if model is not None:
        body["model"] = model
    return http.post("/v1/completions", json=body)


def expected_text(token_id: int, num_tokens: int) -> str:
    return TOKENIZER.decode([token_id] * num_tokens)


def test_each_request_is_served_by_the_model_it_names_and_the_first_by_default():
    models = [spec("alpha", 40, is_preloaded=True), spec("beta", 50)]
    with (
        LiveServer(None, None, model_specs=models) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        listed = http.get("/v1/models").json()["data"]
        assert [(m["id"], m["status"]) for m in listed] == [
            ("alpha", "loaded"),
            ("beta", "unloaded"),
        ]
        beta = completion(http, "beta")
        assert beta.status_code == 200, beta.text
        assert beta.json()["model"] == "beta"
        assert beta.json()["choices"][0]["text"] == expected_text(50, 4)
        alpha = completion(http, "alpha").json()
        assert alpha["choices"][0]["text"] == expected_text(40, 4)
        assert completion(http, None).json()["model"] == "alpha"
        listed = http.get("/v1/models").json()["data"]
        assert {m["id"]: m["status"] for m in listed} == {"alpha": "loaded", "beta": "loaded"}
        assert all(m["max_model_len"] == 256 for m in listed)


def test_an_unknown_model_is_a_404_naming_the_served_ones_in_each_apis_shape():
    models = [spec("alpha", 40, is_preloaded=True), spec("beta", 50)]
    with (
        LiveServer(None, None, model_specs=models) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        refused = completion(http, "gamma")
        assert refused.status_code == 404
        error = refused.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "`gamma`" in error["message"] and "`alpha`, `beta`" in error["message"]
        chat = http.post("/v1/chat/completions", json={
            "model": "gamma", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert chat.status_code == 404 and "`alpha`, `beta`" in chat.json()["error"]["message"]
        tokenize = http.post("/tokenize", json={"model": "gamma", "prompt": "hi"})
        assert tokenize.status_code == 404
        # Anthropic's API: agents pick their own names; the first model serves them.
        messages = http.post("/v1/messages", json={
            "model": "claude-sonnet-4", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert messages.status_code == 200, messages.text


def test_a_model_that_does_not_load_fails_its_requests_clearly_and_the_others_serve(caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    broken = spec("broken", 60, make=lambda: BrokenEngine())
    models = [spec("alpha", 40, is_preloaded=True), broken]
    with (
        LiveServer(None, None, model_specs=models) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        for _ in range(2):
            refused = completion(http, "broken")
            assert refused.status_code == 503
            message = refused.json()["error"]["message"]
            assert "`broken` failed to load" in message and "blk.3.ffn_up.weight" in message
        assert completion(http, "alpha").status_code == 200
        assert http.get("/health").status_code == 200
        listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert "blk.3.ffn_up.weight" in listed["broken"]["load_error"]
        assert "load_error" not in listed["alpha"]
        (line,) = [r.getMessage() for r in caplog.records if " 503 " in r.getMessage()][:1]
        assert "model_wait_ms=" in line  # it waited for the start that failed


def test_a_model_that_does_not_load_answers_in_each_apis_error_shape_and_is_tried_once():
    engines: list[FakeEngine] = []

    def make_broken() -> FakeEngine:
        engines.append(BrokenEngine())
        return engines[-1]

    models = [spec("alpha", 40, is_preloaded=True), spec("broken", 60, make=make_broken)]
    hi = [{"role": "user", "content": "hi"}]
    with (
        LiveServer(None, None, model_specs=models, models_max=1) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        chat = http.post("/v1/chat/completions", json={"model": "broken", "messages": hi})
        assert chat.status_code == 503 and int(chat.headers["Retry-After"]) >= 1
        assert "blk.3.ffn_up.weight" in chat.json()["error"]["message"]
        messages = http.post(
            "/v1/messages", json={"model": "broken", "max_tokens": 4, "messages": hi}
        )
        assert messages.status_code == 503
        assert messages.json()["type"] == "error"
        assert "blk.3.ffn_up.weight" in messages.json()["error"]["message"]
        ollama = http.post("/api/chat", json={"model": "broken", "messages": hi})
        assert ollama.status_code == 503
        assert "blk.3.ffn_up.weight" in ollama.json()["error"]  # Ollama's {"error": "..."}
        assert completion(http, "alpha").status_code == 200
        # Remembered: the later requests started no engine, the first stopped alpha once.
        assert len(engines) == 1
        assert completion(http, "alpha").status_code == 200
        loads = _metric_values(http.get("/metrics").text, "sluice:model_loads_total")
        assert loads == {"alpha": 2.0, "broken": 0.0}


def test_switching_between_two_loaded_models_costs_no_reload():
    models = [spec("alpha", 40), spec("beta", 50)]
    with (
        LiveServer(None, None, model_specs=models, models_max=2) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        for name, token_id in [("alpha", 40), ("beta", 50)] * 8:
            answer = completion(http, name)
            assert answer.json()["choices"][0]["text"] == expected_text(token_id, 4)
        loads = _metric_values(http.get("/metrics").text, "sluice:model_loads_total")
    assert loads == {"alpha": 1.0, "beta": 1.0}


def _metric_values(text: str, name: str) -> dict[str, float]:
    """{model_name: value} of the series `name` in a Prometheus exposition."""
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            values[labels.split('model_name="')[1].split('"')[0]] = float(value)
    return values


def test_the_access_log_shows_the_wait_for_a_model_to_start(caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    models = [spec("alpha", 40, is_preloaded=True), spec("beta", 50)]
    with (
        LiveServer(None, None, model_specs=models) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        assert completion(http, "beta").status_code == 200
        assert completion(http, "beta").status_code == 200
    lines = [r.getMessage() for r in caplog.records if "/v1/completions" in r.getMessage()]
    assert len(lines) == 2
    assert "model_wait_ms=" in lines[0] and "model_wait_ms=" not in lines[1]


class Clock:
    """The server's seconds, moved by the test (here: by the engines' starts)."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def slow_to_load(clock: Clock, load_s: float):
    """An engine whose start takes `load_s` on `clock`, then never answers."""

    class SlowToLoad(FakeEngine):
        async def start(self) -> None:
            clock.now_s += load_s
            await super().start()

    return lambda: SlowToLoad(echoing(50), prefill_steps=10**9, step_interval_s=0.01)


def test_one_queue_timeout_bounds_the_wait_for_the_model_and_then_for_the_first_token(caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    clock = Clock()
    models = [
        spec("alpha", 40, is_preloaded=True),
        spec("beta", 50, make=slow_to_load(clock, 4.75)),
        spec("gamma", 60, make=slow_to_load(clock, 6.0)),
    ]
    header = {"X-Sluice-Queue-Timeout": "5"}
    with (
        LiveServer(None, None, model_specs=models, clock=clock) as live,
        httpx2.Client(base_url=live.url, headers=header) as http,
    ):
        # 4.75 s of its 5 went to the load: the engine gets the 0.25 s left.
        beta = completion(http, "beta")
        assert beta.status_code == 503, beta.text
        assert "waited 0.25 s without being served" in beta.json()["error"]["message"]
        # The load took longer than the whole timeout: refused before any engine work.
        gamma = completion(http, "gamma")
        assert gamma.status_code == 503, gamma.text
        message = gamma.json()["error"]["message"]
        assert "waited 6 s for its model to load, its whole queue timeout (5 s)" in message
        assert gamma.headers["Retry-After"] == "1"
    lines = [r.getMessage() for r in caplog.records if "/v1/completions" in r.getMessage()]
    assert "model_wait_ms=4750.0" in lines[0] and "model_wait_ms=6000.0" in lines[1]


def test_metrics_carry_each_models_name():
    models = [spec("alpha", 40, is_preloaded=True), spec("beta", 50)]
    with (
        LiveServer(None, None, model_specs=models) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        completion(http, "alpha")
        completion(http, "beta")
        text = http.get("/metrics").text
    for name in ("alpha", "beta"):
        assert f'vllm:generation_tokens_total{{model_name="{name}"}} 4.0' in text
        assert f'vllm:num_requests_running{{model_name="{name}"}}' in text
        # Admission and restarts are each model's too, not one server-wide sum.
        assert f'sluice:num_requests_in_flight{{model_name="{name}"}} 0.0' in text
        refused = f'sluice:requests_refused_total{{model_name="{name}",reason="queue_full"}} 0.0'
        assert refused in text
        assert f'sluice:engine_restarts_total{{model_name="{name}"}} 0.0' in text
        assert f'sluice:model_loads_total{{model_name="{name}"}} 1.0' in text


def test_under_one_loaded_model_switching_keeps_every_stream_whole():
    """Streams on two models at once with `--models-max 1`: each model's
    streams finish before the other starts; every stream passes the contract
    and carries its own model's tokens."""
    models = [
        spec("alpha", 40, make=lambda: FakeEngine(echoing(40), step_interval_s=0.001)),
        spec("beta", 50, make=lambda: FakeEngine(echoing(50), step_interval_s=0.001)),
    ]
    expect = Expectations("completion", 1, include_usage=True)
    with LiveServer(None, None, model_specs=models, models_max=1) as live:

        async def one_stream(session: aiohttp.ClientSession, model: str) -> tuple[str, str]:
            body = {"model": model, "prompt": "hi", "max_tokens": 24, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            async with session.post(live.url + "/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                raw = await response.read()
            return model, check_stream(raw, expect).choices[0].text

        async def mixed_load() -> list[tuple[str, str]]:
            async with aiohttp.ClientSession() as session:
                names = ["alpha", "beta"] * 6
                return await asyncio.gather(*(one_stream(session, n) for n in names))

        results = run(mixed_load())
        for model, text in results:
            assert text == expected_text(40 if model == "alpha" else 50, 24), model
        with httpx2.Client(base_url=live.url) as http:
            listed = http.get("/v1/models").json()["data"]
        assert sum(m["status"] == "loaded" for m in listed) == 1


def test_ollamas_tags_list_every_model_ps_the_running_ones_and_keep_alive_stops_them():
    models = [spec("alpha", 40, is_preloaded=True), spec("beta", 50), spec("gamma", 60)]
    chat = {"messages": [{"role": "user", "content": "hi"}], "stream": False}
    with (
        LiveServer(None, None, model_specs=models) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        tags = http.get("/api/tags").json()["models"]
        assert [model["name"] for model in tags] == ["alpha", "beta", "gamma"]
        answer = http.post("/api/chat", json={**chat, "model": "beta:latest", "keep_alive": "1h"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "beta:latest"
        # keep_alive 0: stopped once its request is done (Ollama's unload).
        http.post("/api/chat", json={**chat, "model": "gamma", "keep_alive": 0})
        running = _ollama_ps(http, {"alpha", "beta"})
        assert running["alpha"].startswith("2318-")  # no keep_alive: loaded for ever
        assert not running["beta"].startswith("2318-")  # in an hour
        # A load call (no messages) starts a model; keep_alive -1 keeps it for ever.
        loaded = http.post("/api/generate", json={"model": "gamma", "keep_alive": -1}).json()
        assert loaded["done_reason"] == "load"
        _ollama_ps(http, {"alpha", "beta", "gamma"})
        unknown = http.post("/api/chat", json={**chat, "model": "llama3"})
        assert unknown.status_code == 404 and "`alpha`, `beta`, `gamma`" in unknown.json()["error"]


def _ollama_ps(http: httpx2.Client, expected: set[str]) -> dict[str, str]:
    """Each running model's expires_at, once the running ones are `expected`
    (a model whose keep_alive ran out stops on the loop, a moment later)."""
    for _ in range(50):
        running = {m["name"]: m["expires_at"] for m in http.get("/api/ps").json()["models"]}
        if set(running) == expected:
            return running
    raise AssertionError(f"running: {sorted(running)}, expected {sorted(expected)}")


def test_a_dead_engine_fails_its_own_model_and_health_names_it_while_the_others_serve():
    engines: list[FakeEngine] = []

    def make_beta() -> FakeEngine:
        engines.append(FakeEngine(echoing(50)))
        return engines[-1]

    models = [spec("alpha", 40, is_preloaded=True), spec("beta", 50, make=make_beta)]
    with (
        LiveServer(None, None, model_specs=models) as live,
        httpx2.Client(base_url=live.url) as http,
    ):
        assert completion(http, "beta").status_code == 200
        assert live.loop is not None
        live.loop.call_soon_threadsafe(engines[0].die)
        health = http.get("/health")
        for _ in range(50):  # the death is handled on the server's loop
            if health.status_code == 503:
                break
            health = http.get("/health")
        assert health.status_code == 503 and "`beta`" in health.json()["error"]["message"]
        refused = completion(http, "beta")
        assert refused.status_code == 503 and "`beta`" in refused.json()["error"]["message"]
        assert completion(http, "alpha").status_code == 200
