"""One stream's decode CPU time a token: sluice (default) against llama-server on one GGUF.

    .venv/bin/python benchmarks/moe_decode.py --model FILE --llama-server BIN [--repeats 3]

For a machine shared with others: each server's CPU time (utime + stime of
every process in its group, from /proc) is read around a greedy completion
of `--short` and of `--long` tokens (ignore_eos, the same tiny prompt); the
difference over the extra tokens is the CPU time of one decode token, the
prompt and the request's fixed costs cancelled. Both servers stay up; their
requests alternate (sluice, llama.cpp, sluice, ...), `--repeats` rounds, and
the report gives each round's ratio and their median. llama-server runs with
`-t 2 -np 1`, sluice with its defaults (speculation off in both). On a
loaded machine both sides' CPU time includes their threads' spin-waits at
barriers (llama.cpp's thread pool spins longer), so a ratio there is an
upper bound on a quiet one's; quote quiet runs.
The file: make_gguf_models.py --shapes qwen3-moe-a3b-3l.

    .venv/bin/python benchmarks/moe_decode.py --model FILE --split

instead splits one MoE layer's work for one token, in process CPU time a call
(all threads): the router and top-k, the experts in one native call
(qblock_moe), the per-expert path (one call a projection a chosen expert,
then the rank-order sum), an empty native call (the ctypes cost of each),
and the rank-order sum alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve import free_port, start_server, stop_server  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process whose process group is `pgid`."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields from the state on: pgrp is the third
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def complete(port: int, tokens: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60) as response:
        model = json.load(response)["data"][0]["id"]
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=900) as response:
        usage = json.load(response)["usage"]
    assert usage["completion_tokens"] == tokens, usage
    return usage["completion_tokens"]


def wait_up(port: int, process, timeout_s: float = 1200.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited"
        try:
            complete(port, 2)
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"no answer on port {port}")


def cpu_per_token(port: int, pgid: int, short: int, long: int) -> float:
    """CPU seconds of one decode token: (CPU of `long` tokens - CPU of `short`) / extra tokens."""
    used = []
    for tokens in (short, long):
        before = group_cpu_seconds(pgid)
        complete(port, tokens)
        used.append(group_cpu_seconds(pgid) - before)
    return (used[1] - used[0]) / (long - short)


def cpu_per_call(function, repeats: int = 200) -> float:
    function()
    start = time.process_time()
    for _ in range(repeats):
        function()
    return (time.process_time() - start) / repeats


def split(model_file: Path) -> None:
    import torch

    from sluice.config import ModelConfig
    from sluice.loader.loaded_model import load_model
    from sluice.models import native

    model = load_model(ModelConfig(model=str(model_file))).model
    layer = model.layers[0]
    moe, swiglu = layer.moe, layer.swiglu
    x = torch.randn(1, model.config.hidden_size).to(model.dtype)
    ids, weights = moe.route(x)
    outputs = torch.randn(1, moe.top_k, x.shape[1]).to(x.dtype)
    library = native._library()

    def combine():
        total = outputs[:, 0].float().mul_(weights[:, :1])
        for rank in range(1, moe.top_k):
            total.add_(outputs[:, rank].float().mul_(weights[:, rank : rank + 1]))

    def per_expert():
        kept, moe.kept.expert_array = moe.kept.expert_array, None
        moe(x, swiglu)
        moe.kept.expert_array = kept

    def empty_call():  # returns before any work: tokens 0
        library.qblock_moe(x.data_ptr(), 1, 0, x.shape[1], 0, moe.kept.expert_array, 0,
                           ids.data_ptr(), weights.data_ptr(), 0, x.data_ptr())  # fmt: skip

    pieces = {
        "router + top-k": lambda: moe.route(x),
        "experts, one native call (qblock_moe)": lambda: moe.kept.weighted_sum(
            x, ids, weights, swiglu
        ),
        "whole layer, one call": lambda: moe(x, swiglu),
        "whole layer, per expert (before)": per_expert,
        "an empty ctypes call": empty_call,
        "rank-order sum in torch": combine,
    }
    print(f"{model_file.name}, layer 0, one token, top {moe.top_k} of {moe.num_experts}, "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip
    for name, function in pieces.items():
        print(f"  {name}: {cpu_per_call(function) * 1e6:.0f} us CPU", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument(
        "--llama-server", type=Path, default=Path("/work/peers/build/bin/llama-server")
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--long", type=int, default=72)
    parser.add_argument("--logs", type=Path, default=Path("/tmp"))
    parser.add_argument("--split", action="store_true", help="one MoE layer's split, in process")
    args = parser.parse_args()
    if args.split:
        split(args.model)
        return
    commands = {
        "sluice": f"{sys.executable} -m sluice.cli serve --model {args.model} --port {{port}}",
        "llama.cpp": f"{args.llama_server} -m {args.model} -t 2 -np 1 -c 1024 --port {{port}}",
    }
    servers = {}
    try:
        for name, command in commands.items():
            port = free_port()
            process = start_server(command, port, args.logs / f"moe_decode_{name}.log")
            wait_up(port, process)
            servers[name] = (port, process)
        rounds = []
        for round_index in range(args.repeats):
            cpu = {name: cpu_per_token(port, process.pid, args.short, args.long)
                   for name, (port, process) in servers.items()}  # fmt: skip
            rounds.append(cpu["llama.cpp"] / cpu["sluice"])
            print(f"round {round_index}: sluice {cpu['sluice'] * 1e3:.1f} ms CPU/token, "
                  f"llama.cpp {cpu['llama.cpp'] * 1e3:.1f}; sluice speed / llama.cpp "
                  f"{rounds[-1]:.2f}x", flush=True)  # fmt: skip
        print(f"median: {statistics.median(rounds):.2f}x llama-server (CPU time a decode token)")
    finally:
        for _, process in servers.values():
            stop_server(process)


if __name__ == "__main__":
    main()
