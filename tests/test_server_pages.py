"""The chat page, the dashboard and their static files: served, without the
API key (they hold no data), beside the API that still needs it."""

from __future__ import annotations

import json

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


# The dashboard's script in node, its page stubbed: what it makes of two scrapes.
DASHBOARD_IN_NODE = """
const fs = require("fs"), vm = require("vm");
const [script, before, after] = process.argv.slice(1).map((p) => fs.readFileSync(p, "utf8"));
const element = { appendChild() {}, querySelector: () => ({}), dataset: {}, addEventListener() {} };
const context = { document: { getElementById: () => element, createElement: () => element },
                  fetch: () => new Promise(() => {}), setInterval() {}, performance, console };
vm.runInNewContext(script + "\\nthis.result = keyRows(parseMetrics(after), parseMetrics(before), 2);",
                   Object.assign(context, { before, after }));
console.log(JSON.stringify(context.result));
"""


def test_the_dashboard_shows_each_keys_requests_and_tokens(tmp_path):
    import json
    import shutil
    import subprocess
    from pathlib import Path

    node = shutil.which("node")
    assert node is not None, "node runs the dashboard's script (Debian's nodejs)"
    server = LiveServer(LoopFakeEngine(), ChatFakeTokenizer(), api_key=("sk-a", "sk-b"))
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 3}
    with server as live, httpx2.Client(base_url=live.url) as client:
        before = client.get("/metrics").text
        for key, count in (("sk-a", 2), ("sk-b", 1)):
            for _ in range(count):
                headers = {"Authorization": f"Bearer {key}"}
                assert client.post("/v1/completions", json=body, headers=headers).is_success
        after = client.get("/metrics").text
    static = Path(__file__).resolve().parent.parent / "sluice" / "server" / "http" / "static"
    (tmp_path / "before").write_text(before)
    (tmp_path / "after").write_text(after)
    output = subprocess.run(
        [node, "-e", DASHBOARD_IN_NODE, str(static / "dashboard.js"),
         str(tmp_path / "before"), str(tmp_path / "after")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = {row["key"]: row for row in json.loads(output)}
    assert set(rows) == {"key1", "key2"}
    assert rows["key1"]["requests"] == 2 and rows["key2"]["requests"] == 1
    assert rows["key1"]["tokensPerS"] == 2 * 3 / 2 and rows["key1"]["ttftP50Ms"] is not None
    assert rows["key1"]["promptTokens"] > 0


def test_the_dashboard_shows_the_share_of_drafted_tokens_accepted_in_the_interval(tmp_path):
    import shutil
    import subprocess
    from pathlib import Path

    node = shutil.which("node")
    assert node is not None, "node runs the dashboard's script (Debian's nodejs)"
    script = DASHBOARD_IN_NODE.replace(
        "keyRows(parseMetrics(after), parseMetrics(before), 2)",
        "CARDS.find((c) => c.id === 'spec').series.accepted(parseMetrics(after), "
        "parseMetrics(before))",
    )
    static = Path(__file__).resolve().parent.parent / "sluice" / "server" / "http" / "static"

    def rate(before: tuple[int, int], after: tuple[int, int]) -> float | None:
        for name, (drafted, accepted) in (("before", before), ("after", after)):
            (tmp_path / name).write_text(
                f'sluice:spec_decode_num_draft_tokens_total{{model_name="m"}} {drafted}\n'
                f'sluice:spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}\n'
            )
        output = subprocess.run(
            [node, "-e", script, str(static / "dashboard.js"),
             str(tmp_path / "before"), str(tmp_path / "after")],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return json.loads(output)

    assert rate((10, 4), (30, 19)) == 75.0
    assert rate((30, 19), (30, 19)) is None  # nothing drafted in the interval


def test_the_dashboard_shows_the_chosen_models_series_and_the_servers_own(tmp_path):
    import shutil
    import subprocess
    from pathlib import Path

    node = shutil.which("node")
    assert node is not None, "node runs the dashboard's script (Debian's nodejs)"
    static = Path(__file__).resolve().parent.parent / "sluice" / "server" / "http" / "static"
    scrape = (
        'sluice:num_requests_running{model_name="alpha"} 3\n'
        'sluice:num_requests_running{model_name="beta"} 5\n'
        'sluice:requests_refused_total{reason="queue_full"} 2\n'
    )
    (tmp_path / "before").write_text(scrape)
    (tmp_path / "after").write_text(scrape)

    def shown(model: str) -> list[float]:
        script = DASHBOARD_IN_NODE.replace(
            "keyRows(parseMetrics(after), parseMetrics(before), 2)",
            f"(selectedModel = '{model}', "
            "[sum(parseMetrics(after), 'sluice:num_requests_running'), "
            "sum(parseMetrics(after), 'sluice:requests_refused_total')])",
        )
        output = subprocess.run(
            [node, "-e", script, str(static / "dashboard.js"),
             str(tmp_path / "before"), str(tmp_path / "after")],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return json.loads(output)

    assert shown("") == [8, 2]  # every model
    assert shown("beta") == [5, 2]  # one model's; the server's refusals whatever the choice
