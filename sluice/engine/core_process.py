"""The engine process: an engine core (generation's `EngineCore`, or a
`PoolingCore` for an embedder or reranker: `engine_core_for`) driven by a loop
that reads requests from ZMQ, steps, and pushes every step's deltas back as
one message.

The loop blocks on input only when it has nothing to run; otherwise it drains
whatever arrived and steps at once. While idle it sends a heartbeat so the
client can tell a hung engine from a quiet one; during a long step a thread
sends one whenever decoder layers ran since its last (`ProgressBeat`).

Signals: SIGINT is ignored (Ctrl+C reaches the whole process group; the server
decides how to stop, draining first). If the server process disappears
without telling it, the engine exits by itself at its next heartbeat instead
of living on as an orphan.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import zmq

from sluice.config import EngineConfig
from sluice.engine.messages import (
    EngineFailed,
    StepOutputs,
    input_decoder,
    output_encoder,
)
from sluice.engine.outputs import EngineError, RequestDelta
from sluice.engine.pooling_core import Core, engine_core_for
from sluice.engine.progress_beat import (
    LoadBeat,
    ProgressBeat,
    decoder_layers,
    socket_sender,
    thread_work,
)
from sluice.loader.memory_plan import release_free_heap

logger = logging.getLogger("sluice.engine")

HEARTBEAT_INTERVAL_S = 1.0


def run_engine_process(config: EngineConfig, input_address: str, output_address: str) -> None:
    """Entry point of the engine process (spawned by the client)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)
    inputs.connect(input_address)
    outputs = context.socket(zmq.PUSH)
    outputs.connect(output_address)
    try:
        serve_engine(config, inputs, outputs, beat=lambda: socket_sender(context, output_address))
    finally:
        outputs.close(linger=1000)
        inputs.close(linger=0)
        context.term()


def serve_engine(
    config: EngineConfig,
    inputs: zmq.Socket,
    outputs: zmq.Socket,
    beat: Callable[[], tuple[Callable[[bytes], None], Callable[[], None]]] | None = None,
) -> None:
    """Build the engine core, say ready (or why not), run the loop until Shutdown.

    Shared by the engine process and a Ray replica (sluice/scaleout), which
    differ only in who binds the sockets; the caller closes them. `beat`
    opens a second sender to the client for the mid-step heartbeat
    (engine/progress_beat.py); a replica, whose end binds, has none.
    """
    try:
        core = _load_core(config, beat)
    except Exception as error:  # noqa: BLE001 - reported to the client, then we exit
        outputs.send(output_encoder.encode(EngineFailed(f"engine failed to start: {error}")))
        return
    # The load's freed temporaries, back to the system (~0.8 GiB of a 3B GGUF).
    release_free_heap()
    outputs.send(output_encoder.encode(core.info))
    progress = None
    if beat is not None:
        send, close = beat()
        progress = ProgressBeat(send, decoder_layers(core), interval_s=HEARTBEAT_INTERVAL_S)
        progress.start()
    try:
        EngineLoop(core, inputs, outputs).run()
    except Exception as error:  # noqa: BLE001
        logger.exception("engine step failed")
        outputs.send(output_encoder.encode(EngineFailed(f"engine failed: {error}")))
    finally:
        if progress is not None:
            progress.stop()
            close()


def _load_core(
    config: EngineConfig,
    beat: Callable[[], tuple[Callable[[bytes], None], Callable[[], None]]] | None,
) -> Core:
    """The engine core `config` describes, beating to the client while the
    load makes progress (`LoadBeat`) so that a long honest load is not taken
    for a hung one."""
    work = thread_work(threading.get_native_id()) if beat is not None else None
    if beat is None or work is None:
        return engine_core_for(config)
    send, close = beat()
    load_beat = LoadBeat(send, work, interval_s=HEARTBEAT_INTERVAL_S)
    load_beat.start()
    try:
        return engine_core_for(config)
    finally:
        load_beat.stop()
        close()


class EngineLoop:
    def __init__(self, core: Core, inputs: zmq.Socket, outputs: zmq.Socket):
        self.core = core
        self.inputs = inputs
        self.outputs = outputs
        self.poller = zmq.Poller()
        self.poller.register(inputs, zmq.POLLIN)
        self.is_shutting_down = False
        self.parent_pid = os.getppid()

    def run(self) -> None:
        last_sent = time.monotonic()
        while not self.is_shutting_down:
            # 1. Take every input that arrived; block only when there is no work.
            is_idle = not self.core.has_unfinished_requests()
            deltas, errors = self._drain_inputs(HEARTBEAT_INTERVAL_S if is_idle else 0.0)
            # 2. One step for the whole batch.
            if self.core.has_unfinished_requests():
                deltas.extend(self.core.step())
                errors.extend(self.core.take_errors())
            # 3. One message with everything this step produced (or a heartbeat).
            now = time.monotonic()
            if deltas or errors or now - last_sent >= HEARTBEAT_INTERVAL_S:
                if os.getppid() != self.parent_pid:
                    logger.error("the server process is gone; the engine exits")
                    return
                self._send(deltas, errors)
                last_sent = now

    def _drain_inputs(self, timeout_s: float) -> tuple[list[RequestDelta], list[EngineError]]:
        deltas: list[RequestDelta] = []
        errors: list[EngineError] = []
        events = dict(self.poller.poll(int(timeout_s * 1000)))
        while events.get(self.inputs):
            self._handle(input_decoder.decode(self.inputs.recv()), deltas, errors)
            events = dict(self.poller.poll(0))
        return deltas, errors

    def _handle(self, message, deltas: list[RequestDelta], errors: list[EngineError]) -> None:
        if not self.core.handle(message, deltas, errors):
            self.is_shutting_down = True

    def _send(self, deltas: list[RequestDelta], errors: list[EngineError]) -> None:
        message = StepOutputs(deltas, errors, self.core.stats())
        self.outputs.send(output_encoder.encode(message))
