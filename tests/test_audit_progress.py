"""The progress display: one rewritten line on a terminal, plain lines otherwise."""

from __future__ import annotations

import asyncio
import io

from sluice.audit.progress import Progress


def test_a_terminal_gets_one_line_rewritten_in_place():
    stream = io.StringIO()
    progress = Progress(stream, is_tty=True, interval_s=0.01)

    async def run() -> None:
        progress.start()
        progress.start_scenario("server", "lag")
        progress.request_started()
        await asyncio.sleep(0.05)
        progress.request_finished(is_ok=False)
        progress.add_findings(2)
        await progress.stop()

    asyncio.run(run())
    text = stream.getvalue()
    assert text.count("\r\x1b[2K") >= 2
    assert text.count("\n") == 1  # only the final newline
    assert "[server] lag" in text and "failed   1" in text and "findings   2" in text


def test_a_pipe_gets_a_plain_line_per_scenario_and_no_control_characters():
    stream = io.StringIO()
    progress = Progress(stream, is_tty=False, interval_s=60)

    async def run() -> None:
        progress.start()
        progress.start_scenario("A", "lag")
        progress.start_scenario("B", "lag")
        await progress.stop()

    asyncio.run(run())
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("[A] lag") and lines[1].startswith("[B] lag")
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
