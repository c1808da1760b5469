"""The chat page and the dashboard in a real browser (Playwright driving
Debian's chromium, installed by `make test`) against `sluice serve` on the
embedded model, float32 so a greedy stream equals its non-streamed twin.

The chat's streamed greedy reply equals the API's non-streamed answer; its
stop button disconnects and the server aborts the request (its own metrics
say so); the dashboard's charts fill from /metrics. Over two models on fake
engines (no weights), the chat page's picker sends to the model chosen and
the dashboard's selector lists both. Screenshots of both go
to the test's temporary folder, or, with SLUICE_DOCS_SCREENSHOTS=1, to
docs/chat.png and docs/dashboard.png (a plain run leaves the tree clean).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import Page, sync_playwright

from sluice.server.served_models.model_entry import ModelSpec
from sluice.server.served_models.served_model import ServedModel
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.server_process import sluice_serve

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture
def screenshots(tmp_path) -> Path:
    return DOCS if os.environ.get("SLUICE_DOCS_SCREENSHOTS") == "1" else tmp_path


STARTUP_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def server_url(embedded_model_config, tmp_path_factory):
    args = [
        "--cache-dir", str(embedded_model_config.cache_dir), "--max-model-len", "2048",
        "--kv-cache-memory", "512MiB", "--dtype", "float32", "--quantization", "none",
    ]  # fmt: skip
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with sluice_serve(*args, log_path=log_path, startup_timeout_s=STARTUP_TIMEOUT_S) as url:
        assert f"chat at {url}/ and dashboard at {url}/dashboard" in log_path.read_text()
        yield url


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(server_url, browser):
    page = browser.new_page(viewport={"width": 1200, "height": 860})
    page.set_default_timeout(240_000)  # CPU decoding of a whole reply
    yield page
    page.close()


def metric(url: str, name: str) -> float:
    text = httpx2.get(f"{url}/metrics", timeout=10).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


def send(page: Page, text: str, *, max_tokens: int) -> None:
    page.fill("#temperature", "0")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#message", text)
    page.click("#send")


def test_a_streamed_greedy_reply_equals_the_apis_non_streamed_answer(page, server_url, screenshots):
    page.goto(server_url + "/")
    page.wait_for_function("document.getElementById('model-name').textContent.length > 0")
    question = "What are the three primary colors?"
    send(page, question, max_tokens=48)
    reply = page.wait_for_selector(".message.assistant[data-done=true]")
    body = {"messages": [{"role": "user", "content": question}], "temperature": 0,
            "max_tokens": 48}  # fmt: skip
    answer = httpx2.post(f"{server_url}/v1/chat/completions", json=body, timeout=240).json()
    content = answer["choices"][0]["message"]["content"]
    assert content and reply.query_selector(".content").text_content() == content
    stats = reply.query_selector(".stats").inner_text()
    assert "TTFT" in stats and "tokens/chunk" in stats
    assert f"{answer['usage']['completion_tokens']} completion tokens" in stats
    page.screenshot(path=screenshots / "chat.png")


def test_stop_disconnects_and_the_server_aborts_the_request(page, server_url):
    page.goto(server_url + "/")
    aborted_before = metric(server_url, "sluice:request_aborted_total")
    send(page, "Count from 1 to 1000, separated by commas.", max_tokens=1500)
    # At least five chunks in (several may land in one frame: not exactly five).
    page.wait_for_function(
        "Number(document.querySelector('.message.assistant')?.dataset.chunks ?? 0) >= 5"
    )
    page.click("#stop")
    stopped = page.wait_for_selector(".message.assistant[data-done=true]")
    assert stopped.query_selector(".stats").inner_text() == "stopped"
    # The server saw the disconnect: the request counts as aborted, nothing runs.
    page.wait_for_function(
        """async ([before]) => {
            const text = await (await fetch('/metrics')).text();
            const read = (name) => text.split('\\n').filter((l) => l.startsWith(name))
                .reduce((total, l) => total + Number(l.split(' ').pop()), 0);
            return read('sluice:request_aborted_total') > before
                && read('sluice:num_requests_running') === 0;
        }""",
        arg=[aborted_before],
        polling=250,
    )


def test_the_dashboards_charts_fill_from_the_metrics(page, server_url, screenshots):
    page.goto(server_url + "/dashboard")
    # Traffic for as long as the dashboard is watched (the cards show the last
    # interval, so traffic that ended before the charts filled would show zeros):
    # two loops of streamed greedy chats from the page, until the test stops them.
    page.evaluate(
        """() => { window.trafficOn = true;
            const chat = (i) => fetch('/v1/chat/completions', {method: 'POST',
                headers: {'Content-Type': 'application/json'}, body: JSON.stringify({
                messages: [{role: 'user', content: 'Tell me about the sea, number ' + i}],
                max_tokens: 64, temperature: 0, stream: true})}).then((r) => r.text());
            const loop = async (i) => { while (window.trafficOn) await chat(i); };
            loop(0); loop(1); }"""
    )
    page.wait_for_function(
        """() => {
            const value = (id) => document.querySelector(`#card-${id} .value`).textContent;
            const points = document.querySelector('#card-throughput canvas').dataset.points;
            return Number(points) >= 5 && /tokens\\/s [1-9]/.test(value('throughput'))
                && /p50 \\d/.test(value('itl'));
        }""",
        polling=500,
    )
    page.screenshot(path=screenshots / "dashboard.png", full_page=True)
    page.evaluate("() => { window.trafficOn = false; }")


def fake_model(name: str, token_id: int, **fields) -> ModelSpec:
    """A model on a fake engine that answers `token_id` forever (each model its own)."""
    served = ServedModel(name, ChatFakeTokenizer(), 256)
    make = lambda: FakeEngine(lambda request_id, prompt, params: itertools.repeat(token_id))  # noqa: E731
    return ModelSpec(name, lambda: served, make, **fields)


def test_the_chat_page_picks_the_second_model_and_it_answers(browser):
    models = [fake_model("alpha", 40, is_preloaded=True), fake_model("beta", 50)]
    with LiveServer(None, None, model_specs=models) as live:
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(live.url + "/")
        page.wait_for_function("document.getElementById('model-picker').options.length === 2")
        assert page.input_value("#model-picker") == "alpha"  # the first by default
        page.select_option("#model-picker", "beta")
        send(page, "Which model are you?", max_tokens=4)
        reply = page.wait_for_selector(".message.assistant[data-done=true]")
        assert reply.query_selector(".content").text_content() == ChatFakeTokenizer().decode(
            [50] * 4
        )
        # The server says beta served it, and alpha nothing.
        assert metric(live.url, 'sluice:generation_tokens_total{model_name="beta"}') == 4
        assert metric(live.url, 'sluice:generation_tokens_total{model_name="alpha"}') == 0
        # The dashboard offers each model the metrics name.
        page.goto(live.url + "/dashboard")
        page.wait_for_function(
            "[...document.getElementById('model-filter').options].map((o) => o.value)"
            ".join(',') === ',alpha,beta'"
        )
        page.close()
