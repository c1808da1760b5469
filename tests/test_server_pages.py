"""The chat page, the dashboard and their static files: served, without the
API key (they hold no data), beside the API that still needs it."""

from __future__ import annotations

import httpx2
import pytest

from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer


@pytest.fixture(scope="module")
def http():
    server = LiveServer(LoopFakeEngine(), ChatFakeTokenizer(), api_key="secret")
    with server as live, httpx2.Client(base_url=live.url, timeout=10) as client:
        yield client


@pytest.mark.parametrize(
    ("path", "kind", "needle"),
    [
        ("/", "text/html", b'src="/static/chat.js"'),
        ("/dashboard", "text/html", b'src="/static/dashboard.js"'),
        ("/static/chat.js", "javascript", b"/v1/chat/completions"),
        ("/static/dashboard.js", "javascript", b'fetch("/metrics")'),
        ("/static/style.css", "text/css", b"#conversation"),
    ],
)
def test_pages_and_their_files_are_served_without_the_api_key(http, path, kind, needle):
    response = http.get(path)
    assert response.status_code == 200
    assert kind in response.headers["content-type"]
    assert needle in response.content


def test_the_api_still_needs_the_key(http):
    assert http.get("/v1/models").status_code == 401
    assert http.get("/static/../v1/models").status_code in (401, 404)


def test_an_unknown_static_file_is_a_404(http):
    assert http.get("/static/nothing.js").status_code == 404
