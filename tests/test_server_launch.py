"""The launcher: uvicorn with uvloop + httptools, logging the address it bound;
the garbage collector tuned for serving."""

from __future__ import annotations

import gc
import logging
import threading
import time
import urllib.request
from contextlib import asynccontextmanager

import pytest
from fastapi import FastAPI
from starlette.responses import Response

from sluice.config import ServerConfig
from sluice.errors import ModelLoadError
from sluice.server.http.launch import GC_GEN0_THRESHOLD, make_server, tune_gc_for_serving


def hello_app() -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(b"ok")

    return app


def refusing_app(error: BaseException) -> FastAPI:
    """An app whose startup fails as an engine's does when its model cannot load."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        raise error
        yield

    return FastAPI(lifespan=lifespan)


def test_a_startup_refused_with_a_sluice_error_raises_it_without_a_traceback(caplog):
    refused = ModelLoadError("the KV cache holds 32 tokens")
    server = make_server(refusing_app(refused), ServerConfig(host="127.0.0.1", port=0))
    with pytest.raises(ModelLoadError) as raised:
        server.run()
    assert raised.value is refused
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "Traceback" not in logged and "startup failed" not in logged


def test_any_other_startup_failure_is_uvicorns_as_before(caplog):
    server = make_server(refusing_app(RuntimeError("a bug")), ServerConfig(port=0))
    with pytest.raises(SystemExit) as raised:
        server.run()
    assert raised.value.code == 3
    assert "RuntimeError: a bug" in "\n".join(record.getMessage() for record in caplog.records)


def test_the_server_uses_uvloop_and_httptools_without_uvicorns_access_log():
    config = make_server(hello_app(), ServerConfig(host="127.0.0.1", port=0)).config
    assert (config.loop, config.http) == ("uvloop", "httptools")
    assert config.access_log is False


def test_the_server_serves_and_logs_the_port_it_actually_bound(caplog):
    caplog.set_level(logging.INFO, logger="sluice.server")
    server = make_server(hello_app(), ServerConfig(host="127.0.0.1", port=0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        ((host, port),) = server.bound_addresses()
        assert host == "127.0.0.1" and port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            assert response.read() == b"ok"
    finally:
        server.should_exit = True
        thread.join(10)
    messages = [record.getMessage() for record in caplog.records]
    assert f"sluice listening on http://127.0.0.1:{port}" in messages


def test_tuning_gc_freezes_what_exists_and_makes_young_collections_rarer():
    previous = gc.get_threshold()
    try:
        tune_gc_for_serving()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, *previous[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)
