"""Run the app under uvicorn (uvloop + httptools), and assemble it for `sluice serve`.

`serve(app, config)` blocks until the server stops and logs the address it
actually bound (port 0 picks a free one). `run_server(config)` is what the CLI
calls: it describes the model in this process (tokenizer, name, context
length: cheap, no weights), builds the engine client (its own process by
default, else a thread here), and serves. The engine starts and stops in
the app's lifespan, on uvicorn's event loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from sluice.config import EngineConfig, ModelConfig, ServerConfig
from sluice.engine.client_base import EngineClient, EngineStats
from sluice.errors import ModelLoadError
from sluice.tokenizer import Tokenizer

logger = logging.getLogger("sluice.server")

# Streams still open at shutdown get this long to finish before they are cut.
GRACEFUL_SHUTDOWN_S = 5


class SluiceServer(uvicorn.Server):
    """uvicorn's server, logging the bound address once it listens."""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        for address in self.bound_addresses():
            logger.info("sluice listening on http://%s:%d", address[0], address[1])

    def bound_addresses(self) -> list[tuple[str, int]]:
        return [socket.getsockname()[:2] for server in self.servers for socket in server.sockets]


def make_server(app: FastAPI, config: ServerConfig) -> SluiceServer:
    """A uvicorn server for `app` on config.host:config.port (not yet running)."""
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http="httptools",
        # sluice.access writes one line per request with tokens and timings.
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    return SluiceServer(uvicorn_config)


def serve(app: FastAPI, config: ServerConfig) -> None:
    """Serve `app` until interrupted."""
    make_server(app, config).run()


@dataclass(frozen=True, slots=True)
class ModelDescription:
    """What the HTTP edge needs to know about the model, without its weights."""

    name: str
    tokenizer: Tokenizer
    max_model_len: int


@dataclass(frozen=True, slots=True)
class EngineAssembly:
    engine: EngineClient
    model: ModelDescription
    # The client's stats snapshot, read by /metrics at scrape time.
    stats: Callable[[], EngineStats]


def describe_model(config: ModelConfig) -> ModelDescription:
    """Tokenizer, display name and context length of the model `config` names.

    Reads only small files (converting a GGUF to its cache folder on first
    use), so the server process never holds the weights the engine process loads.
    """
    # The loader pulls in torch: imported here, so `make_server` stays light.
    from sluice.loader import resolve_max_model_len, resolve_source
    from sluice.loader.gguf_convert import converted_folder
    from sluice.models.config import LlamaConfig

    source = resolve_source(config.model)
    folder = (
        source.path
        if source.kind == "hf_folder"
        else converted_folder(source.path, config.cache_dir)
    )
    try:
        hf_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable config.json in {folder}: {exc}") from exc
    model_config = LlamaConfig.from_hf_dict(hf_config)
    return ModelDescription(
        name=source.name,
        tokenizer=Tokenizer.from_folder(folder),
        max_model_len=resolve_max_model_len(config.max_model_len, model_config),
    )


def build_engine(config: EngineConfig) -> EngineAssembly:
    """The engine client `config` asks for (own process by default), not yet started."""
    if config.multiprocess:
        from sluice.engine.client import MultiprocessEngineClient

        client = MultiprocessEngineClient(config)
        return EngineAssembly(client, describe_model(config.model), client.stats)
    from sluice.engine.core import EngineCore
    from sluice.engine.inproc_client import InProcessEngineClient

    core = EngineCore(config)
    loaded = core.loaded
    description = ModelDescription(loaded.name, loaded.tokenizer, loaded.max_model_len)
    client = InProcessEngineClient(core)
    return EngineAssembly(client, description, client.stats)


def run_server(config: ServerConfig) -> int:
    """`sluice serve`: build the engine and the app from `config`, serve; the exit status."""
    _configure_logging()
    from sluice.server.app import create_app

    assembly = build_engine(config.engine)
    app = create_app(
        config,
        assembly.engine,
        assembly.model.tokenizer,
        assembly.model.name,
        assembly.model.max_model_len,
        stats=assembly.stats,
    )
    serve(app, config)
    return 0


def _configure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
