"""The load's heartbeat: a start that keeps working may take longer than the
start-up bound; one that stands still is refused after it."""

from __future__ import annotations

import asyncio
import mmap
import threading

import pytest
import zmq

from sluice.engine import core_process, zmq_client
from sluice.engine.messages import EngineAlive, output_decoder
from sluice.engine.progress_beat import LoadBeat, socket_sender, thread_work
from sluice.errors import ModelLoadError


def _burn(stop: threading.Event) -> None:
    """Work that a thread's counters see: CPU time and fresh pages."""
    while not stop.is_set():
        sum(len(bytearray(1 << 16)) for _ in range(64))


def test_a_look_beats_only_when_the_work_count_moved_since_the_last_look():
    sent: list[bytes] = []
    count = [5]
    beat = LoadBeat(sent.append, lambda: count[0])
    assert not beat.tick()  # what was done before the load does not count
    count[0] = 9
    assert beat.tick() and output_decoder.decode(sent[-1]) == EngineAlive(9)
    assert not beat.tick() and len(sent) == 1


def test_a_threads_work_grows_while_it_runs_and_not_while_it_waits():
    stop, started, native = threading.Event(), threading.Event(), []

    def waiting() -> None:
        native.append(threading.get_native_id())
        started.set()
        stop.wait()

    thread = threading.Thread(target=waiting)
    thread.start()
    assert started.wait(30)
    work = thread_work(native[0])
    assert work is not None
    before = work()
    threading.Event().wait(0.3)  # the thread sleeps on its event meanwhile
    assert work() == before
    stop.set()
    thread.join()
    mine = thread_work(threading.get_native_id())
    assert mine is not None
    before = mine()
    fresh = mmap.mmap(-1, 64 << 20)  # pages no allocator has handed out before
    for offset in range(0, len(fresh), 4096):
        fresh[offset] = 1  # each first write faults a page in
    assert mine() > before
    fresh.close()


class _ThreadEngineClient(zmq_client.ZmqEngineClient):
    """The real client and the real `serve_engine`, the engine on a thread of
    this process instead of a process of its own."""

    def __init__(self, tmp: str) -> None:
        super().__init__(heartbeat_timeout_s=60.0)
        self._addresses = (f"ipc://{tmp}/in", f"ipc://{tmp}/out")
        self._engine: threading.Thread | None = None

    async def _launch(self) -> None:
        self._open_sockets(*self._addresses, bind=True)
        self._engine = threading.Thread(target=self._serve, daemon=True)
        self._engine.start()

    def _serve(self) -> None:
        context = zmq.Context()
        inputs, outputs = context.socket(zmq.PULL), context.socket(zmq.PUSH)
        inputs.connect(self._addresses[0])
        outputs.connect(self._addresses[1])
        try:
            beat = lambda: socket_sender(context, self._addresses[1])  # noqa: E731
            core_process.serve_engine(None, inputs, outputs, beat=beat)  # type: ignore[arg-type]
        finally:
            outputs.close(linger=1000)
            inputs.close(linger=0)
            context.term()

    def _exit_reason(self) -> str | None:
        return None  # a thread that ends without a word is a hang to the client

    def kill(self) -> None:
        pass

    async def _dispose(self) -> None:
        pass


def _start(tmp_path, monkeypatch, load) -> None:
    monkeypatch.setattr(zmq_client, "STARTUP_TIMEOUT_S", 0.5)
    monkeypatch.setattr(core_process, "HEARTBEAT_INTERVAL_S", 0.05)
    monkeypatch.setattr(core_process, "engine_core_for", load)
    client = _ThreadEngineClient(str(tmp_path))

    async def start() -> None:
        try:
            await client.start()
        finally:
            await client.shutdown()

    asyncio.run(start())


def test_a_load_that_works_past_the_start_bound_is_waited_for(tmp_path, monkeypatch):
    finished = threading.Event()

    def slow_load(_config: object) -> object:
        stop = threading.Event()
        threading.Timer(2.0, stop.set).start()  # four times the bound
        _burn(stop)
        finished.set()
        raise RuntimeError("the load ran to its end")  # its own answer, not a timeout

    with pytest.raises(ModelLoadError, match="the load ran to its end"):
        _start(tmp_path, monkeypatch, slow_load)
    assert finished.is_set()


def test_a_load_that_stands_still_is_refused_after_the_bound(tmp_path, monkeypatch):
    release = threading.Event()

    def stuck_load(_config: object) -> object:
        release.wait(60)
        raise RuntimeError("released")

    try:
        with pytest.raises(ModelLoadError, match="silent for 0.5 s"):
            _start(tmp_path, monkeypatch, stuck_load)
    finally:
        release.set()
