"""benchmarks/priority_ttft.py against two live servers on a fake engine (fcfs
and priority): both runs happen, chats are timed, the batch's tokens counted,
the priority field sent to the priority server only, the report side by side.
The fake engine ignores priorities: the figures themselves mean nothing here."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from sluice.config import EngineConfig, SchedulerConfig
from sluice.testing.fake_engine import LoopFakeEngine, parrot
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports its siblings `_load`, `serve`
priority_ttft = importlib.import_module("priority_ttft")


class Priorities:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, request_id, prompt, params):
        self.seen.append(params.priority)
        return parrot(request_id, prompt, params)


def server(script, policy: str) -> LiveServer:
    config = EngineConfig(scheduler=SchedulerConfig(scheduling_policy=policy))
    return LiveServer(LoopFakeEngine(script, step_interval_s=0.001), ChatFakeTokenizer(),
                      engine=config)  # fmt: skip


def test_both_policies_run_side_by_side_with_the_priority_sent_only_where_served(tmp_path, capsys):
    fcfs, priority = Priorities(), Priorities()
    out = tmp_path / "results.json"
    with server(fcfs, "fcfs") as fcfs_live, server(priority, "priority") as priority_live:
        status = priority_ttft.main([
            "--fcfs-url", fcfs_live.url, "--priority-url", priority_live.url,
            "--batch-streams", "4", "--batch-max-tokens", "64", "--chats", "3",
            "--chat-max-tokens", "4", "--chat-priority", "-7", "--out", str(out),
        ])  # fmt: skip
    assert status == 0
    assert -7 not in fcfs.seen and fcfs.seen.count(0) >= 4 + 3
    assert priority.seen.count(-7) == 3 and priority.seen.count(0) >= 4
    rows = json.loads(out.read_text())
    assert [row["policy"] for row in rows] == ["fcfs", "priority"]
    for row in rows:
        assert row["chats"] == 3 and row["chat_errors"] == 0
        assert row["ttft_p50_ms"] > 0 and row["batch_tokens_per_s"] > 0
    table = capsys.readouterr().out
    assert "ttft_p50_ms" in table and "\nfcfs | 3 |" in table and "\npriority | 3 |" in table
