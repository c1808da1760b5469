"""The real app on a real socket, for tests: uvicorn on 127.0.0.1 in a thread.

`LiveServer` runs `create_app` under `make_server` (uvloop + httptools, as
`sluice serve` does) in a daemon thread on a free port, so streaming is seen
exactly as a client sees it: in-process ASGI transports buffer whole bodies
and never show a disconnect. The app's lifespan starts and stops the engine.

    with LiveServer(engine, tokenizer) as live:
        ... requests to live.url ...

Invariants: `__enter__` returns only once the server listens (the engine has
started), or raises if startup failed; `__exit__` stops the server and waits
for its thread, which shuts the engine down.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sluice.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, ServerConfig
from sluice.engine.client_base import EngineClient
from sluice.server.http.app import create_app
from sluice.server.http.launch import make_server
from sluice.server.served_models.model_entry import ModelSpec
from sluice.server.served_models.served_model import ServedModel, ServedTokenizer

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

DEFAULT_MODEL_NAME = "fake-model"


class LiveServer:
    def __init__(
        self,
        engine: EngineClient | None,
        tokenizer: ServedTokenizer | None,
        /,  # so that `engine=EngineConfig(...)` reaches the ServerConfig
        *,
        # Several models instead (sluice/server/served_models/model_pool.py): engine and tokenizer None.
        model_specs: list[ModelSpec] | None = None,
        model_name: str = DEFAULT_MODEL_NAME,
        max_model_len: int = 4096,
        # Starting a real engine (its own process, loading weights) takes a while.
        startup_timeout_s: float = 10.0,
        # The clock of the API keys' rate windows (default: time.monotonic).
        clock: Callable[[], float] = time.monotonic,
        # Where request spans go (default: none, unless the config names an endpoint).
        tracer: Tracer | None = None,
        **config,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.config = ServerConfig(host="127.0.0.1", port=0, **config)
        served = None if tokenizer is None else ServedModel(model_name, tokenizer, max_model_len)
        self.app = create_app(self.config, engine, served, clock, tracer, models=model_specs)
        self.server = make_server(self.app, self.config)
        self.startup_timeout_s = startup_timeout_s
        self.url = ""
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The server's event loop once it runs (for test-owned tasks on it)."""
        return self.server.loop

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            assert self._thread.is_alive(), "the server stopped during startup"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        ((_, port),) = self.server.bound_addresses()
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(30)


@contextmanager
def in_process_server(
    model: ModelConfig,
    *,
    max_model_len: int = 2048,
    kv_cache_bytes: int = 128 << 20,
    scheduler: SchedulerConfig | None = None,
    **config,
) -> Iterator[LiveServer]:
    """A `LiveServer` over an engine core on `model` in this process (weights
    loaded here: seconds), the tests' real server on a real model."""
    # The engine pulls in torch: imported here, so fake-engine tests stay light.
    from sluice.engine.core import EngineCore
    from sluice.engine.inproc_client import InProcessEngineClient

    engine_config = EngineConfig(
        model=dataclasses.replace(model, max_model_len=max_model_len),
        cache=CacheConfig(kv_cache_memory_bytes=kv_cache_bytes),
        scheduler=scheduler or SchedulerConfig(),
        multiprocess=False,
    )
    core = EngineCore(engine_config)
    with LiveServer(
        InProcessEngineClient(core),
        core.loaded.tokenizer,
        model_name=core.loaded.name,
        max_model_len=core.max_model_len,
        startup_timeout_s=60,
        **config,
    ) as server:
        yield server
