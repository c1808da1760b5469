"""Embeddings throughput: sentences/s at a batch of 1 and of 64, against any
server with an OpenAI-shaped /v1/embeddings (sluice, llama-server --embedding,
vLLM), and optionally sentence-transformers in this process as the reference.

    .venv/bin/python benchmarks/embeddings.py \\
        --server sluice=http://127.0.0.1:8000 \\
        [--server llama=http://127.0.0.1:8080] [--model NAME] \\
        [--batch-sizes 1,64] [--sentences 640] [--concurrency 1] \\
        [--sentence-transformers FOLDER] [--out results.json]
    .venv/bin/python benchmarks/embeddings.py --base-url http://127.0.0.1:8000   # one server

For each server and batch size: one warm-up request, then `--sentences`
distinct sentences (10-30 words, fixed seed: the same texts for every
server) sent `batch` to a request, `--concurrency` requests in flight, the
wall time from the first send to the last answer. Reported: sentences/s,
and the median and p90 request latency. Each answer is checked to hold one
vector per sentence (a server that drops inputs does not get a figure).
The servers are started by hand, each on the same model (llama-server: the
GGUF converted from the same checkpoint); run them one at a time on a quiet
machine, since they compete for the same cores otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import aiohttp

WORDS = [
    "the",
    "a",
    "river",
    "city",
    "model",
    "vector",
    "search",
    "query",
    "document",
    "answer",
    "fast",
    "slow",
    "server",
    "token",
    "engine",
    "batch",
    "cache",
    "memory",
    "light",
    "stone",
    "water",
    "paper",
    "market",
    "music",
    "garden",
    "window",
    "road",
    "winter",
    "summer",
    "learns",
    "builds",
    "finds",
    "keeps",
    "sends",
    "reads",
    "writes",
    "small",
    "large",
    "old",
    "new",
    "green",
]


@dataclass(slots=True)
class Result:
    server: str
    batch_size: int
    num_sentences: int
    sentences_per_s: float
    latency_p50_s: float
    latency_p90_s: float


def sentences(count: int, seed: int = 0) -> list[str]:
    """`count` distinct sentences of 10-30 words, the same for a seed."""
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 30))]
        texts.append(f"{index} " + " ".join(words) + ".")
    return texts


def batches(texts: list[str], batch_size: int) -> list[list[str]]:
    return [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _embed(session: aiohttp.ClientSession, url: str, model: str | None, texts: list[str]):
    body: dict = {"input": texts}
    if model is not None:
        body["model"] = model
    async with session.post(url + "/v1/embeddings", json=body) as response:
        answer = await response.json(content_type=None)
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status} {answer}")
    if len(answer["data"]) != len(texts):
        raise RuntimeError(f"{url}: {len(answer['data'])} vectors for {len(texts)} inputs")


async def measure_server(
    name: str, url: str, model: str | None, texts: list[str], batch_size: int, concurrency: int
) -> Result:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await _embed(session, url, model, texts[:batch_size])  # warm-up
        pending = batches(texts, batch_size)
        latencies: list[float] = []

        async def worker() -> None:
            while pending:
                batch = pending.pop(0)
                start = time.perf_counter()
                await _embed(session, url, model, batch)
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return Result(
        name, batch_size, len(texts), len(texts) / elapsed,
        statistics.median(latencies), percentile(latencies, 0.9),
    )  # fmt: skip


def measure_sentence_transformers(folder: str, texts: list[str], batch_size: int) -> Result:
    """sentence-transformers' own encode in this process: the reference."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu")
    model.encode(texts[:batch_size], batch_size=batch_size)  # warm-up
    latencies = []
    start = time.perf_counter()
    for batch in batches(texts, batch_size):
        begin = time.perf_counter()
        model.encode(batch, batch_size=batch_size)
        latencies.append(time.perf_counter() - begin)
    elapsed = time.perf_counter() - start
    return Result(
        "sentence-transformers", batch_size, len(texts), len(texts) / elapsed,
        statistics.median(latencies), percentile(latencies, 0.9),
    )  # fmt: skip


def report(results: list[Result]) -> str:
    lines = [f"{'server':<24} {'batch':>5} {'sentences/s':>12} {'p50 s':>8} {'p90 s':>8}"]
    for r in results:
        lines.append(
            f"{r.server:<24} {r.batch_size:>5} {r.sentences_per_s:>12.1f} "
            f"{r.latency_p50_s:>8.4f} {r.latency_p90_s:>8.4f}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", action="append", default=[], metavar="NAME=URL",
                        help="a server to measure (repeat for several)")  # fmt: skip
    parser.add_argument("--base-url", help="one server, named after its URL")
    parser.add_argument("--model", help="the `model` field sent (default: none)")
    parser.add_argument("--batch-sizes", default="1,64")
    parser.add_argument("--sentences", type=int, default=640, help="sentences per measurement")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    parser.add_argument("--sentence-transformers", metavar="FOLDER",
                        help="also measure sentence-transformers on this model folder")  # fmt: skip
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.base_url:
        args.server.append(f"{args.base_url}={args.base_url}")
    if not args.server and not args.sentence_transformers:
        parser.error("give --server NAME=URL (or --base-url), or --sentence-transformers")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    texts = sentences(args.sentences)
    results = []
    for spec in args.server:
        name, _, url = spec.partition("=")
        for size in sizes:
            result = asyncio.run(
                measure_server(name, url.rstrip("/"), args.model, texts, size, args.concurrency)
            )
            results.append(result)
            print(report([result]).splitlines()[1], flush=True)
    if args.sentence_transformers:
        for size in sizes:
            results.append(measure_sentence_transformers(args.sentence_transformers, texts, size))
    print(report(results))
    if args.out:
        with open(args.out, "w") as out:
            json.dump([asdict(r) for r in results], out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
