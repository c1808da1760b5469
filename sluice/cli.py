"""The `sluice` command: serve, generate, audit.

Builds the frozen config tree from flags (the one place flags become config)
and hands each component its part. A ModelLoadError is printed as one line,
without a traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from sluice.config import (
    EMBEDDED_MODEL,
    CacheConfig,
    DataParallelConfig,
    EngineConfig,
    ModelConfig,
    RequestLimits,
    SchedulerConfig,
    ServerConfig,
    default_cache_dir,
)
from sluice.errors import ModelLoadError
from sluice.tools.parsers import TOOL_CALL_PARSERS
from sluice.tools.reasoning import REASONING_PARSERS

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}


def parse_size(text: str) -> int:
    """'512MiB', '2GiB', '1000000' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512MiB or 2GiB)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model and engine")
    group.add_argument(
        "--model",
        default=EMBEDDED_MODEL,
        help="'embedded' (SmolLM2-135M-Instruct), an HF folder, or a .gguf file",
    )
    group.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="auto: bfloat16 where the hardware has it, else float32",
    )
    group.add_argument("--device", default="cpu", help="cpu or cuda")
    group.add_argument(
        "--quantization",
        default="auto",
        choices=["auto", "none", "int8", "int4"],
        help="weight-only quantization of the decoder matrices (CPU): faster small-batch "
        "decode; auto: int4 when the weights came in 4 bits (the embedded model), else none",
    )
    group.add_argument(
        "--activation-quantization",
        default="auto",
        choices=["auto", "none", "int8"],
        help="int8 activations times int8 weights (VNNI) in steps of more than a few tokens "
        "(CPU; q/k/v, o, gate/up); auto: int8 on a CPU with VNNI when the weights are "
        "quantized, else none",
    )
    group.add_argument(
        "--batch-invariant",
        action="store_true",
        help="greedy tokens and logprobs bitwise the same alone or in any batch, chunking, "
        "preemption or prefix-cache hit; slower decode steps (docs/BENCHMARKS.md)",
    )
    group.add_argument("--max-model-len", type=int, default=None)
    group.add_argument("--cache-dir", default=None, help="where converted GGUF models are kept")
    group.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        default=None,
        help="bytes for the KV cache pool, e.g. 1GiB (CPU default 1GiB)",
    )
    group.add_argument(
        "--kv-cache-memory-fraction",
        type=float,
        default=0.5,
        help="share of free GPU memory for the KV pool when no size is given",
    )
    group.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    group.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="compute every prompt in full (by default full KV blocks of earlier requests' "
        "tokens are reused)",
    )
    group.add_argument("--max-num-batched-tokens", type=int, default=2048)
    group.add_argument("--max-num-seqs", type=int, default=64)
    group.add_argument("--no-chunked-prefill", action="store_true")
    group.add_argument(
        "--max-waiting-requests",
        type=int,
        default=1024,
        help="requests allowed to wait; beyond it new ones get 503",
    )
    group.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="torch threads of the engine (default: all cores; 1 avoids contention on 2 cores)",
    )
    group.add_argument(
        "--engine-heartbeat-timeout",
        type=float,
        default=60.0,
        help="seconds of engine silence, with requests pending, before it is "
        "declared hung and restarted",
    )


def engine_config_from(args: argparse.Namespace, *, multiprocess: bool) -> EngineConfig:
    model = ModelConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        quantization=None if args.quantization == "none" else args.quantization,
        activation_quantization=(
            None if args.activation_quantization == "none" else args.activation_quantization
        ),
        batch_invariant=args.batch_invariant,
        cache_dir=default_cache_dir() if args.cache_dir is None else Path(args.cache_dir),
    )
    cache = CacheConfig(
        block_size_tokens=args.block_size,
        kv_cache_memory_bytes=args.kv_cache_memory,
        memory_fraction=args.kv_cache_memory_fraction,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    scheduler = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        enable_chunked_prefill=not args.no_chunked_prefill,
        max_waiting_requests=args.max_waiting_requests,
    )
    return EngineConfig(
        model=model,
        cache=cache,
        scheduler=scheduler,
        multiprocess=multiprocess,
        heartbeat_timeout_s=args.engine_heartbeat_timeout,
        num_threads=args.num_threads,
    )


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--cors-allowed-origins", default="", help="comma-separated origins; empty disables CORS"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="run the engine on a thread of the server process"
    )
    chat = parser.add_argument_group("chat outputs")
    chat.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_CALL_PARSERS),
        default=None,
        help="how tool calls are read from outputs (default: guessed from the chat template)",
    )
    chat.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSERS),
        default=None,
        help="split <think>…</think> into reasoning_content",
    )
    add_data_parallel_flags(parser)
    reliability = parser.add_argument_group("reliability")
    reliability.add_argument("--max-connections", type=int, default=4096)
    reliability.add_argument(
        "--send-timeout",
        type=float,
        default=30.0,
        help="seconds a stream's write may block before it is aborted",
    )
    reliability.add_argument(
        "--send-buffer-bytes",
        type=int,
        default=64 * 1024,
        help="kernel send buffer and transport high-water mark per connection (0: the defaults)",
    )
    reliability.add_argument(
        "--queue-timeout",
        type=float,
        default=None,
        help="default seconds a request may wait for its first token",
    )
    reliability.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds running requests get to finish after SIGTERM",
    )
    reliability.add_argument("--on-engine-death", choices=["restart", "exit"], default="restart")
    limits = parser.add_argument_group("per-request limits")
    limits.add_argument("--max-prompt-tokens", type=int, default=None)
    limits.add_argument("--max-n", type=int, default=128)
    limits.add_argument(
        "--max-tokens-limit",
        type=int,
        default=None,
        help="the largest max_tokens a client may ask for",
    )
    limits.add_argument("--max-stop-strings", type=int, default=16)
    limits.add_argument(
        "--max-stop-string-chars",
        type=int,
        default=1024,
        help="the longest stop string a client may send, in characters",
    )
    limits.add_argument("--max-logit-bias", type=int, default=1024)
    limits.add_argument(
        "--max-chat-messages",
        type=int,
        default=10_000,
        help="the most messages one chat request may hold",
    )
    limits.add_argument("--max-request-body", type=parse_size, default=4 << 20)


def add_data_parallel_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data parallel (Ray: pip install 'sluice[ray]')")
    group.add_argument(
        "--data-parallel",
        type=int,
        default=None,
        metavar="N",
        help="serve N engine replicas as Ray actors behind this endpoint (docs/SCALING.md)",
    )
    group.add_argument(
        "--ray-address",
        default=None,
        help="a running Ray cluster: 'auto' or the head's host:port (default: a local Ray)",
    )
    group.add_argument("--replica-cpus", type=float, default=1.0, help="Ray CPUs per replica")
    group.add_argument("--replica-gpus", type=float, default=0.0, help="Ray GPUs per replica")


def data_parallel_config_from(args: argparse.Namespace) -> DataParallelConfig | None:
    if args.data_parallel is None:
        if args.ray_address is not None:
            raise ModelLoadError("--ray-address needs --data-parallel N")
        return None
    if args.data_parallel < 1:
        raise ModelLoadError("--data-parallel needs at least 1 replica")
    if args.in_process:
        raise ModelLoadError(
            "--data-parallel runs each engine in its own Ray actor, not in-process"
        )
    return DataParallelConfig(
        num_replicas=args.data_parallel,
        ray_address=args.ray_address,
        replica_cpus=args.replica_cpus,
        replica_gpus=args.replica_gpus,
    )


def server_config_from(args: argparse.Namespace) -> ServerConfig:
    limits = RequestLimits(
        max_prompt_tokens=args.max_prompt_tokens,
        max_n=args.max_n,
        max_tokens=args.max_tokens_limit,
        max_stop_strings=args.max_stop_strings,
        max_stop_string_chars=args.max_stop_string_chars,
        max_logit_bias_entries=args.max_logit_bias,
        max_chat_messages=args.max_chat_messages,
        max_request_body_bytes=args.max_request_body,
    )
    return ServerConfig(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        cors_allowed_origins=tuple(o for o in args.cors_allowed_origins.split(",") if o),
        engine=engine_config_from(args, multiprocess=not args.in_process),
        limits=limits,
        max_connections=args.max_connections,
        send_timeout_s=args.send_timeout,
        send_buffer_bytes=args.send_buffer_bytes or None,
        queue_timeout_s=args.queue_timeout,
        drain_timeout_s=args.drain_timeout,
        on_engine_death=args.on_engine_death,
        data_parallel=data_parallel_config_from(args),
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the OpenAI-compatible server")
    add_engine_flags(serve)
    add_server_flags(serve)

    generate = commands.add_parser("generate", help="generate offline, no server")
    add_engine_flags(generate)
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--raw", action="store_true", help="no chat template")

    commands.add_parser("audit", help="check an OpenAI-compatible server's streams", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "audit":
        from sluice.audit.cli import main as audit_main

        return audit_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        return _serve(args)
    except ModelLoadError as error:
        print(f"sluice: error: {error}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace) -> int:
    from sluice.engine.sampling_params import SamplingParams
    from sluice.offline import LLM

    config = engine_config_from(args, multiprocess=False)
    llm = LLM(config.model.model, config=config)
    params = SamplingParams(
        temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed
    )
    (output,) = llm.generate(args.prompt, params, use_chat_template=not args.raw)
    print(output.text)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from sluice.server.launch import run_server

    return run_server(server_config_from(args))


if __name__ == "__main__":
    sys.exit(main())
