"""Run the app under uvicorn (uvloop + httptools), and assemble it for `sluice serve`.

`serve(app, config)` blocks until the server stops, logs the address it
actually bound (port 0 picks a free one) and returns the exit status. It
first tunes the garbage collector for serving (`tune_gc_for_serving`).
`run_server(config)` is what the CLI calls: it describes the model in this
process (tokenizer, name, context length: cheap, no weights), builds the
engine client (its own process by default, else a thread here), and serves.
The engine starts and stops in the app's lifespan, on uvicorn's event loop.

A startup the app refuses with a SluiceError (the engine's model does not
load: a KV pool too small, a missing or truncated tensor) is raised from
`serve` as itself, without uvicorn's traceback and exit status 3, so the CLI
prints it as its one `sluice: error:` line.

Signals (main thread only): SIGTERM or a first SIGINT drain the app
(`sluice.server.http.shutdown`) and then stop, exit status 0; a second SIGINT
exits at once. Unlike plain uvicorn, the signal is not re-raised afterwards,
so a drained server exits 0. SIGHUP reads the API key file again
(sluice/server/keys/api_keys.py). Connections beyond `max_connections` get 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import signal
import socket
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sluice.config import EngineConfig, ModelConfig, ServerConfig
from sluice.engine.client_base import EngineClient
from sluice.engine.pooling_params import PoolingSpec
from sluice.errors import ModelLoadError, SluiceError
from sluice.server.http.connection import AbortableHttpToolsProtocol
from sluice.server.http.shutdown import GracefulShutdown
from sluice.server.served_models.served_model import ServedModel
from sluice.tokenizer import Tokenizer

logger = logging.getLogger("sluice.server")

# After the app's own drain, connections still open get this long to flush.
GRACEFUL_SHUTDOWN_S = 5
# Tracked allocations (net of frees) between two young-generation collections;
# CPython's default is 700. See `tune_gc_for_serving`.
GC_GEN0_THRESHOLD = 20_000
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RefusedStartup:
    """The app as uvicorn runs it, but for a refused startup: when the app's
    lifespan raises a SluiceError before it started, uvicorn is told the
    startup failed without the traceback, and `error` keeps it."""

    def __init__(self, app: FastAPI):
        self.app = app
        self.error: SluiceError | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[dict] = []

        async def hold_failure(message: dict) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)  # told once we know why
            else:
                await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except SluiceError as error:
            if held:
                self.error = error
                held = [{"type": "lifespan.startup.failed", "message": ""}]
            raise
        finally:
            for message in held:
                await send(message)

    def is_not_its_echo(self, record: logging.LogRecord) -> bool:
        """A logging filter: drops uvicorn's own line about a refused startup."""
        return self.error is None or not record.getMessage().startswith("Application startup")


class SluiceServer(uvicorn.Server):
    """uvicorn's server: logs the bound address, drains the app on SIGTERM,
    raises the SluiceError its app's startup refused with."""

    def __init__(
        self,
        config: uvicorn.Config,
        shutdown: GracefulShutdown | None = None,
        send_buffer_bytes: int | None = None,
        refused: RefusedStartup | None = None,
        on_hangup: Callable[[], object] | None = None,
    ):
        super().__init__(config)
        self.shutdown_plan = shutdown
        # What SIGHUP does (reload the API keys), on the loop.
        self.on_hangup = on_hangup
        self.send_buffer_bytes = send_buffer_bytes
        self.refused = refused
        self._loop: asyncio.AbstractEventLoop | None = None
        self._num_signals = 0

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        if not self.config.loaded:
            self.config.load()
        if self.config.http_protocol_class is HttpToolsProtocol:
            # Same protocol, plus a way for the app to drop a stuck connection.
            self.config.http_protocol_class = functools.partial(
                AbortableHttpToolsProtocol, send_buffer_bytes=self.send_buffer_bytes
            )
        if self.shutdown_plan is not None:
            self.shutdown_plan.bind(self._stop)
        await self._start_app(sockets)
        for address in self.bound_addresses():
            logger.info("sluice listening on http://%s:%d", address[0], address[1])
            url = f"http://{address[0]}:{address[1]}"
            logger.info("chat at %s/ and dashboard at %s/dashboard", url, url)

    async def _start_app(self, sockets) -> None:
        if self.refused is None:
            await super().startup(sockets)
            return
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addFilter(self.refused.is_not_its_echo)
        try:
            await super().startup(sockets)
        except SystemExit:
            if self.refused.error is None:
                raise
            raise self.refused.error from None
        finally:
            uvicorn_log.removeFilter(self.refused.is_not_its_echo)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop it serves on, once started (for work scheduled from other threads)."""
        return self._loop

    def bound_addresses(self) -> list[tuple[str, int]]:
        return [sock.getsockname()[:2] for server in self.servers for sock in server.sockets]

    @property
    def exit_code(self) -> int:
        return 0 if self.shutdown_plan is None else self.shutdown_plan.exit_code

    def begin_graceful_shutdown(self) -> None:
        """What SIGTERM does; callable from any thread."""
        if self._loop is None or self.shutdown_plan is None:
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self.shutdown_plan.begin)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn re-raises the signal after stopping (exit status -15);
        # a drained server exits 0 instead.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self.handle_hangup)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._num_signals += 1
        if self._num_signals == 1:
            logger.info("signal %d: draining, then stopping", sig)
            self.begin_graceful_shutdown()
        elif sig == signal.SIGINT:
            if self._loop is None or self.shutdown_plan is None:
                self.force_exit = self.should_exit = True
            else:
                self._loop.call_soon_threadsafe(self.shutdown_plan.force)

    def handle_hangup(self, sig: int, frame: FrameType | None) -> None:
        if self.on_hangup is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.on_hangup)

    def _stop(self, force: bool) -> None:
        self.force_exit = self.force_exit or force
        self.should_exit = True


def make_server(app: FastAPI, config: ServerConfig) -> SluiceServer:
    """A uvicorn server for `app` on config.host:config.port (not yet running)."""
    refused = RefusedStartup(app)
    uvicorn_config = uvicorn.Config(
        refused,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http="httptools",
        # sluice.access writes one line per request with tokens and timings.
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        limit_concurrency=config.max_connections,
    )
    # create_app leaves its drain plan here; other apps stop the uvicorn way.
    shutdown = getattr(app.state, "shutdown", None)
    keys = getattr(app.state, "api_keys", None)
    on_hangup = None if keys is None else keys.reload
    return SluiceServer(uvicorn_config, shutdown, config.send_buffer_bytes, refused, on_hangup)


def serve(app: FastAPI, config: ServerConfig, sockets: list[socket.socket] | None = None) -> int:
    """Serve `app` until stopped (on `sockets` if given, else config.host:port); the exit status."""
    server = make_server(app, config)
    tune_gc_for_serving()
    server.run(sockets=sockets)
    return server.exit_code


def tune_gc_for_serving() -> None:
    """Make garbage collection cheap for a server whose long-lived objects now exist.

    Call once the app, tokenizer and engine client are built. Streaming
    allocates a few container objects per token (deltas, chunk dicts,
    futures); with CPython's default thresholds that meant a young collection
    every few hundred tokens and, now and then, a full collection walking
    every object of the process (modules, FastAPI, pydantic, the tokenizer's
    tables): ~270 ms each, ~14 us per streamed token at 512 streams.
    `gc.freeze()` moves everything alive now into a permanent generation the
    collector never walks again, and a larger young generation makes
    collections rarer (their cost grows with what survives, not with the
    threshold). Cyclic garbage is still collected; reference counting frees
    everything else at once, as always.
    """
    gc.collect()
    gc.freeze()
    _, gen1_threshold, gen2_threshold = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1_threshold, gen2_threshold)


@dataclass(frozen=True, slots=True)
class EngineAssembly:
    engine: EngineClient
    model: ServedModel


def describe_model(config: ModelConfig) -> ServedModel:
    """Tokenizer, display name and context length of the model `config` names.

    Reads only small files (converting a GGUF to its cache folder on first
    use), so the server process never holds the weights the engine process loads.
    """
    # The loader pulls in torch: imported here, so `make_server` stays light.
    from sluice.loader import resolve_max_model_len, resolve_source
    from sluice.loader.block_default import resolve_quantization
    from sluice.loader.choices import GGUF_BLOCKS
    from sluice.loader.gguf_convert import converted_folder
    from sluice.loader.loaded_model import read_config_json
    from sluice.loader.pooling_model import pooling_spec_of
    from sluice.models.families.registry import parse_hf_config

    source = resolve_source(config.model)
    if (pooling := pooling_spec_of(config)) is not None:
        return _describe_pooling_model(config, source.path, source.name, pooling)
    # The engine's own folder: with weights, or config and tokenizer only
    # where it reads the GGUF's blocks itself (never a float copy it won't read).
    with_weights = resolve_quantization(config.quantization, source)[0] != GGUF_BLOCKS
    folder = (
        source.path
        if source.kind == "hf_folder"
        else converted_folder(source.path, config.cache_dir, with_weights, config.cache_max_bytes)
    )
    model_config = parse_hf_config(read_config_json(folder))
    return ServedModel(
        name=source.name,
        tokenizer=Tokenizer.from_folder(folder),
        max_model_len=resolve_max_model_len(config.max_model_len, model_config),
    )


def _describe_pooling_model(
    config: ModelConfig, folder: Path, name: str, pooling: PoolingSpec
) -> ServedModel:
    """An embedder or reranker (sluice/loader/pooling_model.py), as `describe_model`."""
    from sluice.loader import resolve_max_model_len
    from sluice.loader.loaded_model import read_config_json
    from sluice.loader.pooling_model import pooling_max_model_len
    from sluice.models.bert import BERT_ARCHITECTURES
    from sluice.models.families.registry import parse_hf_config

    max_model_len = pooling_max_model_len(folder, config.max_model_len)
    config_json = read_config_json(folder)
    if (config_json.get("architectures") or [""])[0] not in BERT_ARCHITECTURES:
        decoder_limit = resolve_max_model_len(config.max_model_len, parse_hf_config(config_json))
        max_model_len = min(max_model_len, decoder_limit)
    return ServedModel(name, Tokenizer.from_folder(folder), max_model_len, pooling)


def build_engine(config: EngineConfig) -> EngineAssembly:
    """The engine client `config` asks for (own process by default), not yet started."""
    if config.multiprocess:
        from sluice.engine.process_client import MultiprocessEngineClient

        client = MultiprocessEngineClient(config)
        return EngineAssembly(client, describe_model(config.model))
    from sluice.engine.inproc_client import InProcessEngineClient
    from sluice.engine.pooling_core import engine_core_for

    core = engine_core_for(config)
    loaded = core.loaded
    pooling = core.info.pooling
    description = ServedModel(loaded.name, loaded.tokenizer, loaded.max_model_len, pooling)
    client = InProcessEngineClient(core)
    return EngineAssembly(client, description)


def build_data_parallel_engine(config: ServerConfig) -> EngineAssembly:
    """Engine replicas on Ray (sluice/scaleout); a ModelLoadError now if Ray is missing."""
    from sluice.scaleout.client import DataParallelEngineClient

    client = DataParallelEngineClient(config.engine, config.data_parallel)
    return EngineAssembly(client, describe_model(config.engine.model))


def run_server(config: ServerConfig) -> int:
    """`sluice serve`: build the engine and the app from `config`, serve; the exit status."""
    _configure_logging()
    from sluice.server.http.app import create_app
    from sluice.server.keys.api_keys import KeyRing
    from sluice.server.served_models.model_catalog import model_paths, model_specs

    KeyRing(config.api_key, config.api_key_file)  # a broken key file fails before any load
    is_one_model = len(model_paths(config)) == 1
    if config.data_parallel is not None or not config.engine.multiprocess:
        if not is_one_model:
            raise ModelLoadError("several models run in engine processes: no --in-process "
                                 "or --data-parallel with them")  # fmt: skip
        engine = dataclasses.replace(
            config.engine,
            model=dataclasses.replace(config.engine.model, model=model_paths(config)[0][1]),
        )
        config = dataclasses.replace(config, engine=engine)
        built = build_engine(config.engine) if config.data_parallel is None else (
            build_data_parallel_engine(config))  # fmt: skip
        return serve(create_app(config, built.engine, built.model), config)
    # Every model in its own engine process, the only one started with the server.
    app = create_app(config, models=model_specs(config, describe_model))
    return serve(app, config)


def _configure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
