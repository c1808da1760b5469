"""The `sluice` command: serve, generate, audit, cache.

Builds the frozen config tree from flags (the one place flags become config)
and hands each component its part. The flags are derived from the config
dataclasses' fields (sluice/cli_flags.py), so each default is written once,
in sluice/config.py, and each value is checked where its dataclass is built.
Whatever the user got wrong (a value out of range, a model that does not
load, a prompt `generate` refuses) is printed as one `sluice: error:` line,
without a traceback, and the status is 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from sluice.cli_cache import add_cache_command, run_cache_command
from sluice.cli_flags import add_flags, flag_of, parse_size, values_of
from sluice.config import (
    EMBEDDED_MODEL,
    CacheConfig,
    ConfigError,
    DataParallelConfig,
    EngineConfig,
    ModelConfig,
    RequestLimits,
    SchedulerConfig,
    ServerConfig,
)
from sluice.errors import ModelLoadError, SluiceError
from sluice.settings import check_settings, setting
from sluice.tools.parsers import TOOL_CALL_PARSER_NAMES
from sluice.tools.reasoning import NO_REASONING_PARSER, REASONING_PARSER_NAMES
from sluice.tools.tool_format import NO_TOOL_CALL_PARSER

__all__ = ["build_parser", "engine_config_from", "main", "parse_size", "server_config_from"]

_SERVE_MODEL_HELP = (
    "'embedded' (SmolLM2-135M-Instruct), an HF folder, or a .gguf file; repeat it to serve "
    "several models (NAME=PATH serves PATH as NAME)"
)
# ServerConfig's flags, by help group ("": the command's own).
_SERVER_GROUPS = {
    "": ("host", "port", "served_model_name", "api_key", "api_key_file",
         "cors_allowed_origins"),
    "chat outputs": ("tool_call_parser", "reasoning_parser", "reasoning_effort_budgets",
                     "generation_defaults"),
    "several models": ("models_dir", "models_max", "models_memory_bytes", "preload"),
    "reliability": ("max_connections", "send_timeout_s", "send_buffer_bytes",
                    "queue_timeout_s", "drain_timeout_s", "on_engine_death",
                    "responses_store_bytes"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    """`sluice generate`'s own flags (the engine's come from EngineConfig)."""

    prompt: str = setting(help_text="a user message, or with --raw the text to continue")
    max_tokens: int = setting(64, "the most tokens to generate", at_least=1)
    temperature: float = setting(0.0, "0: greedy", at_least=0)
    seed: int | None = setting(None, "seed of the sampler (default: random)")
    raw: bool = setting(False, "no chat template: the prompt as /v1/completions takes it")

    def __post_init__(self) -> None:
        check_settings(self)


def add_engine_flags(parser: argparse.ArgumentParser, *, is_serving: bool = False) -> None:
    group = parser.add_argument_group("model and engine")
    # `serve` takes several models: --model is repeatable (server_config_from).
    several = {"model": {"action": "append", "default": None, "help": _SERVE_MODEL_HELP}}
    for config_type in (ModelConfig, CacheConfig, SchedulerConfig, EngineConfig):
        add_flags(group, config_type, **(several if is_serving else {}))
    # llama.cpp's name for the RAM tier, in MiB (-1: no bound, 0: off).
    group.add_argument(
        "--cache-ram",
        type=_mebibytes,
        dest="kv_offload_bytes",
        default=argparse.SUPPRESS,
        metavar="MiB",
        help="--kv-offload-bytes in MiB, as llama.cpp's --cache-ram (-1: no bound, 0: off)",
    )


def _mebibytes(text: str) -> int:
    try:
        mib = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of MiB: {text!r}") from None
    if mib < -1:
        raise argparse.ArgumentTypeError(f"--cache-ram takes -1, 0 or more MiB, got {mib}")
    return sys.maxsize if mib == -1 else mib << 20


def engine_config_from(args: argparse.Namespace, *, multiprocess: bool) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(**values_of(args, ModelConfig)),
        cache=CacheConfig(**values_of(args, CacheConfig)),
        scheduler=SchedulerConfig(**values_of(args, SchedulerConfig)),
        multiprocess=multiprocess,
        **values_of(args, EngineConfig),
    )


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ServerConfig, _SERVER_GROUPS[""])
    parser.add_argument(
        "--in-process", action="store_true", help="run the engine on a thread of the server process"
    )
    add_flags(
        parser.add_argument_group("chat outputs"),
        ServerConfig,
        _SERVER_GROUPS["chat outputs"],
        tool_call_parser={"choices": [*sorted(TOOL_CALL_PARSER_NAMES), NO_TOOL_CALL_PARSER]},
        reasoning_parser={"choices": [*sorted(REASONING_PARSER_NAMES), NO_REASONING_PARSER]},
    )
    add_data_parallel_flags(parser)
    add_flags(
        parser.add_argument_group("several models (docs/OPERATIONS.md)"),
        ServerConfig,
        _SERVER_GROUPS["several models"],
    )
    add_flags(parser.add_argument_group("reliability"), ServerConfig, _SERVER_GROUPS["reliability"])
    add_flags(parser.add_argument_group("per-request limits"), RequestLimits)


def add_data_parallel_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data parallel (Ray: pip install 'sluice[ray]')")
    # Without --data-parallel there is no Ray at all (not one replica on Ray).
    add_flags(group, DataParallelConfig, num_replicas={"default": None, "metavar": "N"})


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
    return DataParallelConfig(**values_of(args, DataParallelConfig))


def server_config_from(args: argparse.Namespace) -> ServerConfig:
    server_flags = [name for names in _SERVER_GROUPS.values() for name in names]
    from sluice.server.served_models.model_catalog import split_name

    models = tuple(args.model or ())  # every --model; the first is the engine's
    args.model = split_name(models[0])[1] if models else EMBEDDED_MODEL
    return ServerConfig(
        models=models,
        **values_of(args, ServerConfig, server_flags),
        engine=engine_config_from(args, multiprocess=not args.in_process),
        limits=RequestLimits(**values_of(args, RequestLimits)),
        data_parallel=data_parallel_config_from(args),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the OpenAI-compatible server")
    add_engine_flags(serve, is_serving=True)
    add_server_flags(serve)

    generate = commands.add_parser("generate", help="generate offline, no server")
    add_engine_flags(generate)
    add_flags(generate, GenerateOptions)

    commands.add_parser("audit", help="check an OpenAI-compatible server's streams", add_help=False)
    add_cache_command(commands)
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
        if args.command == "cache":
            return run_cache_command(args)
        return _serve(args)
    except ConfigError as error:
        flag = flag_of(error.config_type, error.field_name)
        return _error(str(error) if flag is None else f"{flag} {error.problem}")
    except SluiceError as error:
        return _error(str(error))


def _error(message: str) -> int:
    print(f"sluice: error: {message}", file=sys.stderr)
    return 2


def _generate(args: argparse.Namespace) -> int:
    from sluice.engine.sampling_params import SamplingParams
    from sluice.offline import LLM

    options = GenerateOptions(**values_of(args, GenerateOptions))
    config = engine_config_from(args, multiprocess=False)
    llm = LLM(config.model.model, config=config)
    if not options.raw and not llm.tokenizer.has_chat_template:
        return _error(f"{llm.core.loaded.name} has no chat template; add --raw to continue text")
    params = SamplingParams(
        temperature=options.temperature, max_tokens=options.max_tokens, seed=options.seed
    )
    (output,) = llm.generate(options.prompt, params, use_chat_template=not options.raw)
    print(output.text)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from sluice.server.http.launch import run_server

    return run_server(server_config_from(args))


if __name__ == "__main__":
    sys.exit(main())
