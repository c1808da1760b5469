"""`python -m sluice.testing.fake_server`: the real server on a `FakeEngine`.

The same app and launcher as `sluice serve` (signals, drain, admission,
limits, metrics) with a scripted engine instead of a model, for tests and
benchmarks that need the server in its own process (SIGTERM, RSS, file
descriptors) and where the model adds nothing. The engine parrots the prompt,
one step every `--step-interval-s`; `--tokenizer` is "fake" (the hand-built
`FakeTokenizer` plus a one-line chat template) or a tokenizer folder.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sluice.config import EngineConfig, SchedulerConfig, ServerConfig
from sluice.testing.fake_engine import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer

MODEL_NAME = "fake-model"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sluice.testing.fake_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tokenizer", default="fake", help="'fake' or a tokenizer folder")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--step-interval-s", type=float, default=0.02)
    parser.add_argument("--tokens-per-step", type=int, default=1)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-waiting-requests", type=int, default=1024)
    parser.add_argument("--drain-timeout-s", type=float, default=30.0)
    parser.add_argument("--send-timeout-s", type=float, default=30.0)
    parser.add_argument("--api-key-file", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sluice.server.http.app import create_app
    from sluice.server.http.launch import serve
    from sluice.server.served_models.served_model import ServedModel

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scheduler = SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_waiting_requests=args.max_waiting_requests
    )
    config = ServerConfig(
        host=args.host,
        port=args.port,
        engine=EngineConfig(scheduler=scheduler, multiprocess=False),
        drain_timeout_s=args.drain_timeout_s,
        send_timeout_s=args.send_timeout_s,
        api_key_file=args.api_key_file,
    )
    engine = FakeEngine(
        tokens_per_step=args.tokens_per_step,
        step_interval_s=args.step_interval_s,
        max_model_len=args.max_model_len,
    )
    model = ServedModel(MODEL_NAME, _tokenizer(args.tokenizer), args.max_model_len)
    app = create_app(config, engine, model)
    return serve(app, config)


def _tokenizer(name: str):
    if name == "fake":
        return ChatFakeTokenizer()
    from sluice.tokenizer import Tokenizer

    return Tokenizer.from_folder(Path(name))


if __name__ == "__main__":
    sys.exit(main())
