"""benchmarks/serve.py and benchmarks/_load.py against a fake SSE server.

The fake server (tests/fake_sse_server.py) streams a fixed plan of chunks
with known token counts, so the load generator, the statistics and the
report are checked without a model; on a thread for in-process tests and as
a subprocess for the `--server` path (start, wait, stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # serve.py imports its sibling `_load`
load = importlib.import_module("_load")
serve = importlib.import_module("serve")

from tests.fake_sse_server import CHUNK_PLAN, GAP_S, NUM_TOKENS, fake_server  # noqa: E402


def spec_for(base_url: str, **overrides) -> object:
    fields = dict(
        base_url=base_url,
        model="fake-model",
        api="chat",
        max_tokens=8,
        ignore_eos=False,
        continuous_usage=False,
        request_timeout_s=30.0,
    )
    return load.LoadSpec(**(fields | overrides))


def run_one_level(spec, concurrency: int, num_requests: int):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await load.run_level(session, spec, concurrency, num_requests)

    return asyncio.run(go())


# ---- statistics on hand-built values ----------------------------------------------------


def test_percentile_interpolates_linearly_between_ranks():
    assert load.percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert load.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) == pytest.approx(4.96)
    assert load.percentile([7.0], 99) == 7.0
    assert load.percentile([], 50) is None


def test_apportioned_tokens_follow_characters_and_sum_to_the_total():
    assert load.apportion_tokens(6, [3, 2, 4, 11]) == [1, 1, 2, 2]
    assert load.apportion_tokens(4, [5, 5, 5, 5]) == [1, 1, 1, 1]
    assert load.apportion_tokens(2, [1, 1, 1]) == [1, 1, 1]  # never below one per chunk
    assert sum(load.apportion_tokens(64, [1, 7, 3, 30, 2])) == 64


def test_itl_divides_each_gap_by_the_tokens_of_the_later_chunk_once_per_token():
    record = load.RequestRecord(
        prompt_index=0, chunk_arrivals_s=[0.1, 0.3, 0.9], chunk_num_tokens=[1, 2, 3]
    )
    assert load.inter_token_latencies(record) == pytest.approx([0.1, 0.1, 0.2, 0.2, 0.2])


def test_level_stats_count_tokens_of_successful_requests_over_wall_time():
    ok = [
        load.RequestRecord(
            prompt_index=i,
            ttft_s=0.1 * (i + 1),
            num_output_tokens=n,
            e2e_s=1.0,
            chunk_arrivals_s=[0.1, 0.2],
            chunk_num_tokens=[1, 1],
        )
        for i, n in enumerate((6, 4))
    ]
    failed = load.RequestRecord(prompt_index=2, num_output_tokens=99, error="HTTP 503: busy")
    stats = load.level_stats(4, load.LevelRun(records=[*ok, failed], wall_s=2.0))
    assert (stats.num_requests, stats.num_errors, stats.num_output_tokens) == (3, 1, 10)
    assert stats.output_tokens_per_s == pytest.approx(5.0)
    assert stats.requests_per_s == pytest.approx(1.0)
    assert stats.ttft_p50_s == pytest.approx(0.15)
    assert stats.itl_p50_s == pytest.approx(0.1)
    assert stats.first_error == "HTTP 503: busy"


# ---- the load generator against the fake server ------------------------------------------


def test_a_level_sends_each_request_once_with_at_most_c_in_flight():
    with fake_server() as (base_url, state):
        run = run_one_level(spec_for(base_url), concurrency=3, num_requests=10)
    assert [r.prompt_index for r in run.records] == list(range(10))
    assert state.max_in_flight == 3
    prompts = [b["messages"][0]["content"] for b in state.bodies]
    assert sorted(prompts) == sorted(load.PROMPTS[i] for i in range(10))
    body = state.bodies[0]
    assert body["stream"] is True and body["temperature"] == 0 and body["max_tokens"] == 8
    assert body["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in body


def test_records_carry_ttft_chunk_times_usage_tokens_and_errors():
    with fake_server() as (base_url, _):
        run = run_one_level(spec_for(base_url, ignore_eos=True), concurrency=2, num_requests=8)
    by_index = {r.prompt_index: r for r in run.records}
    assert by_index[2].error.startswith("HTTP 503")
    assert "engine died" in by_index[6].error
    for index in (0, 1, 3, 4, 5, 7):
        record = by_index[index]
        assert record.error is None
        assert record.num_output_tokens == NUM_TOKENS  # from the usage chunk
        assert record.chunk_num_chars == [len(t) for t, _ in CHUNK_PLAN]
        assert record.chunk_num_tokens == [1, 1, 2, 2]  # estimated by characters
        assert record.ttft_s >= 0.9 * GAP_S
        assert record.chunk_arrivals_s[0] == record.ttft_s
        assert record.chunk_arrivals_s == sorted(record.chunk_arrivals_s)
        assert record.e2e_s >= max(record.chunk_arrivals_s)
        itl_total_s = sum(load.inter_token_latencies(record))
        span_s = record.chunk_arrivals_s[-1] - record.chunk_arrivals_s[0]
        assert itl_total_s == pytest.approx(span_s)
    stats = load.level_stats(2, run)
    assert stats.num_errors == 2 and stats.num_output_tokens == 6 * NUM_TOKENS


def test_continuous_usage_gives_exact_tokens_per_chunk_on_completions():
    with fake_server() as (base_url, state):
        spec = spec_for(base_url, api="completions", continuous_usage=True, ignore_eos=True)
        run = run_one_level(spec, concurrency=1, num_requests=2)
    assert state.paths == ["/v1/completions"] * 2
    assert state.bodies[0]["prompt"] == load.PROMPTS[0] and state.bodies[0]["ignore_eos"]
    assert state.bodies[0]["stream_options"]["continuous_usage_stats"] is True
    assert [r.chunk_num_tokens for r in run.records] == [[1, 1, 1, 3]] * 2


def test_a_refused_connection_is_an_error_record_not_an_exception():
    with fake_server() as (base_url, _):
        pass  # the port is closed again
    run = run_one_level(spec_for(base_url), concurrency=2, num_requests=2)
    assert all(r.error and "Connect" in r.error for r in run.records)


def test_a_pooled_connection_the_server_closed_is_retried_once_on_a_fresh_one():
    # As llama-server does: it announces keep-alive, but a second request on
    # the same connection is never read: the socket closes. The client's
    # request then never reached the server; openai-python retries it.
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        await reader.readuntil(b"\r\n\r\n")
        body = (
            b"data: "
            + json.dumps(
                {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}
            ).encode()
        )
        body += b"\n\ndata: [DONE]\n\n"  # fmt: skip
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Connection: keep-alive\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")  # the next request on this connection...
        writer.close()  # ...is dropped unanswered

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        spec = spec_for(f"http://127.0.0.1:{port}")
        connector = aiohttp.TCPConnector(limit=1)
        async with server, aiohttp.ClientSession(connector=connector) as session:
            return [await load.send_request(session, spec, i) for i in range(3)]

    records = asyncio.run(go())
    assert [r.error for r in records] == [None, None, None]
    assert all(r.chunk_num_chars == [2] for r in records)
    assert len(connections) >= 3  # each later request went out again on a new connection


# ---- report ------------------------------------------------------------------------------


def _stats(concurrency: int, tokens_per_s: float, itl_s: float) -> object:
    return load.LevelStats(
        concurrency=concurrency,
        num_requests=4,
        num_errors=0,
        wall_s=1.0,
        num_output_tokens=int(tokens_per_s),
        output_tokens_per_s=tokens_per_s,
        requests_per_s=4.0,
        ttft_p50_s=0.2,
        ttft_p99_s=0.3,
        itl_p50_s=itl_s,
        itl_p99_s=itl_s,
        e2e_p50_s=1.0,
        first_error=None,
    )


def _results() -> list:
    base = serve.ServerResult(
        "base", "http://a", "m", [_stats(1, 100.0, 0.04), _stats(8, 400.0, 0.08)]
    )
    other = serve.ServerResult(
        "other<&>", "http://b", "m", [_stats(1, 250.0, 0.02), _stats(8, 200.0, 0.16)]
    )
    return [base, other]


def test_table_rows_give_ratios_against_the_first_server_at_the_same_level():
    rows = serve.table_rows(_results())
    assert [row[:2] for row in rows] == [
        ("base", "1"),
        ("base", "8"),
        ("other<&>", "1"),
        ("other<&>", "8"),
    ]
    ratios = {(row[0], row[1]): row[-3:] for row in rows}
    assert ratios["base", "1"] == ("1.00", "1.00", "1.00")
    assert ratios["other<&>", "1"][:2] == ("2.50", "0.50")
    assert ratios["other<&>", "8"][:2] == ("0.50", "2.00")
    assert "itl50ms" in serve.format_table(_results())


def test_svg_is_well_formed_with_one_line_per_server_in_each_panel():
    root = ET.fromstring(serve.render_svg(_results()))
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 4  # 2 servers x (tokens/s, ITL)
    assert all(len(line.get("points").split()) == 2 for line in lines)
    texts = [t.text for t in root.findall(f"{ns}text")]
    assert "other<&>" in texts and "output tokens/s" in texts and "ITL p50 (ms)" in texts


# ---- the command end to end --------------------------------------------------------------


def test_main_measures_base_urls_and_writes_json_and_svg(tmp_path, capsys):
    out, plot = tmp_path / "r.json", tmp_path / "p.svg"
    with fake_server() as (base_url, _):
        code = serve.main(
            [
                "--base-url",
                f"one={base_url}",
                "--base-url",
                f"two={base_url}/",
                "--concurrency",
                "1,2",
                "--requests-per-level",
                "3",
                "--warmup",
                "1",
                "--out",
                str(out),
                "--plot",
                str(plot),
            ]
        )
    assert code == 0
    results = json.loads(out.read_text())
    assert [s["name"] for s in results["servers"]] == ["one", "two"]
    assert {s["model"] for s in results["servers"]} == {"fake-model"}  # from GET /v1/models
    levels = results["servers"][1]["levels"]
    assert [(lv["concurrency"], lv["num_requests"]) for lv in levels] == [(1, 3), (2, 3)]
    assert levels[0]["num_errors"] == 1  # prompt 2 answers 503
    assert ET.fromstring(plot.read_text()).tag.endswith("svg")
    assert "first error, one C=1: HTTP 503" in capsys.readouterr().out


def _fake_server_command() -> str:
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        "from tests.fake_sse_server import serve_forever; "
        "serve_forever(int(sys.argv[1]))"
    )
    return subprocess.list2cmdline([sys.executable, "-c", code]) + " {port}"


def test_a_server_command_is_started_on_a_free_port_measured_and_stopped(tmp_path, capsys):
    code = serve.main(
        [
            "--server",
            f"fake={_fake_server_command()}",
            "--concurrency",
            "2",
            "--requests-per-level",
            "2",
            "--warmup",
            "0",
            "--log-dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 0
    (server,) = json.loads((tmp_path / "r.json").read_text())["servers"]
    assert server["base_url"].startswith("http://127.0.0.1:")
    assert server["levels"][0]["num_output_tokens"] == 2 * NUM_TOKENS
    assert (tmp_path / "fake.log").exists()
    port = int(server["base_url"].rsplit(":", 1)[1])
    with pytest.raises(OSError):  # stopped: nothing listens there any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_a_server_that_exits_early_fails_with_its_log_and_exit_status(tmp_path, capsys):
    command = subprocess.list2cmdline(
        [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    )
    code = serve.main(
        ["--server", f"dead={command}", "--concurrency", "1", "--log-dir", str(tmp_path)]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "exited with code 3" in err and "boom" in err


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_period():
    script = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    assert process.stdout.readline() == b"ready\n"
    start_s = time.monotonic()
    serve.stop_server(process, grace_s=0.3)
    # Killed (-9: it ignored SIGTERM), and not before the grace period ran out.
    assert process.returncode == -9
    assert time.monotonic() - start_s >= 0.3
    process.stdout.close()


def test_a_benchmark_stopped_by_sigterm_stops_its_server_first():
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "serve.py"),
        "--server",
        f"fake={_fake_server_command()}",
        "--concurrency",
        "1",
        "--requests-per-level",
        "100000",
        "--warmup",
        "0",
    ]
    bench = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        lines = [bench.stdout.readline() for _ in range(2)]  # "starting: ...", "== fake at URL"
        port = int(lines[1].strip().rsplit(":", 1)[1])
        deadline_s = time.monotonic() + 30
        while time.monotonic() < deadline_s:  # until the server answers, so load is running
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.1)
        bench.terminate()
        assert bench.wait(timeout=20) == 128 + 15
    finally:
        if bench.poll() is None:
            bench.kill()
        bench.stdout.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
