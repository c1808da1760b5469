"""What reading a long streamed tool call costs the event loop.

    .venv/bin/python benchmarks/tool_call_parsing.py [--parser hermes] [--streams 4]
        [--call-chars 11000] [--steps 50] [--whole-chars 12000] [--delta-chars 3]

Each choice's text goes through its `MessageStream` (reasoning and tool-call
parsing) on the event loop, one delta per engine step. This script drives the
streams as the chat chunk builder does, in this process, without a server:
- per engine step: `--streams` choices whose calls already hold
  `--call-chars` characters each get one delta of `--delta-chars` characters;
  prints the median CPU time of a step (all streams), next to the same for
  plain content of the same length under the same parser;
- whole call: one call of `--whole-chars` characters streamed in deltas of
  `--delta-chars` (about 4,000 for 12 KB); prints the total parse CPU time.
The call's arguments are JSON records (keys, numbers, short strings), as
tools' arguments mostly are: the structural tokens are what a JSON scan
spends its time on. To compare two commits, run it in a checkout of each
with PYTHONPATH=. (so that the checkout's sluice is the one imported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sluice.tools.output_parsing import OutputParsing


def arguments_text(num_chars: int) -> str:
    records, text = [], "{}"
    while len(text) < num_chars:
        index = len(records)
        records.append({"id": index, "name": f"item {index}", "tags": ["a", "b"], "ok": True})
        text = json.dumps({"records": records})
    return text


def call_text(parser: str, num_chars: int) -> str:
    arguments = arguments_text(num_chars)
    if parser == "hermes":
        return f'<tool_call>\n{{"name": "save", "arguments": {arguments}}}\n</tool_call>'
    if parser == "llama3_json":
        return f'<|python_tag|>{{"name": "save", "parameters": {arguments}}}'
    return f'[TOOL_CALLS] [{{"name": "save", "arguments": {arguments}}}]'


def pieces(text: str, delta_chars: int) -> list[str]:
    return [text[i : i + delta_chars] for i in range(0, len(text), delta_chars)]


def step_ms(parser: str, text: str, args: argparse.Namespace) -> float:
    """Median CPU time of one engine step: one delta to each stream, each
    stream's text already `--call-chars` long."""
    deltas = pieces(text, args.delta_chars)
    num_before = args.call_chars // args.delta_chars
    assert len(deltas) > num_before + args.steps, "the text outlasts the timed steps"
    streams = [OutputParsing(parser).message_stream() for _ in range(args.streams)]
    for stream in streams:
        for delta in deltas[:num_before]:
            stream.push(delta, False)
    times = []
    for step in range(args.steps):
        delta = deltas[num_before + step]
        start = time.process_time()
        for stream in streams:
            stream.push(delta, False)
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def whole_call_s(parser: str, args: argparse.Namespace) -> tuple[float, int]:
    deltas = pieces(call_text(parser, args.whole_chars), args.delta_chars)
    stream = OutputParsing(parser).message_stream()
    start = time.process_time()
    for index, delta in enumerate(deltas):
        stream.push(delta, index == len(deltas) - 1)
    return time.process_time() - start, len(deltas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parser", default="hermes", choices=["hermes", "llama3_json", "mistral"])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--call-chars", type=int, default=11_000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--whole-chars", type=int, default=12_000)
    parser.add_argument("--delta-chars", type=int, default=3)
    args = parser.parse_args()
    room = (args.steps + 10) * args.delta_chars
    call = call_text(args.parser, args.call_chars + room)
    plain = ("The weather is fine today, thank you. " * (len(call) // 38 + 1))[: len(call)]
    print(f"{args.parser}: {args.streams} streams, {args.delta_chars}-character deltas")
    print(f"  per engine step, calls at {args.call_chars:,} chars: ", end="")
    print(f"{step_ms(args.parser, call, args):.3f} ms CPU")
    print(
        f"  per engine step, plain content as long: {step_ms(args.parser, plain, args):.3f} ms CPU"
    )
    seconds, num_deltas = whole_call_s(args.parser, args)
    print(f"  one {args.whole_chars:,}-char call in {num_deltas:,} deltas: {seconds:.3f} s CPU")


if __name__ == "__main__":
    main()
