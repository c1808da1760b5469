"""The engine's heartbeat while one step runs long: alive as long as the step moves.

The engine loop sends one message per step and one a second when idle, and
the client kills an engine that stays silent for `--engine-heartbeat-timeout`
(60 s): that is how a hung engine is told from a quiet one. But a single
step can honestly take longer: one 2,048-token prefill chunk of an 8B model
on two loaded cores took about 150 s, and the engine was killed mid-prompt.

`ProgressBeat` lets such a step speak without hiding a hang. Every decoder
layer's forward bumps a counter (a forward hook, so no model code changes);
a daemon thread looks at it every `interval_s` and sends `EngineAlive` on its
own PUSH socket (ZMQ sockets are not shared across threads) only when the
counter moved since its last look. A step stuck inside one layer (a native
kernel that never returns, a deadlock) moves nothing, sends nothing, and is
killed after the timeout exactly as before; a step that finishes a layer at
least once per timeout lives. Where one layer alone can take longer than the
timeout, raise `--engine-heartbeat-timeout`.

The counter is written by the engine thread only (the hook) and read by the
beat thread: a plain int, whose reads and writes are atomic under the GIL.

The same rule covers the load before the first step (`LoadBeat`): an 8B file
on two busy cores loaded for longer than the client's start-up bound, and a
healthy start was refused. While the engine builds its core, the beat looks
at what the loading thread has done (its CPU time and page faults, from
/proc) and sends `EngineAlive` only when that moved: a load that reads,
converts or measures lives, one stuck waiting on a lock is refused after the
bound as before. Where /proc has no such counters there is no load beat.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import zmq

from sluice.engine.messages import EngineAlive, output_encoder


def decoder_layers(core: object) -> list[torch.nn.Module]:
    """The decoder layers of an engine core's model, or [] where it has none
    (a pooling core, a fake)."""
    model = getattr(getattr(core, "runner", None), "model", None)
    layers = getattr(model, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


class _Beat:
    """A daemon thread that sends `EngineAlive` every `interval_s` while
    `progress()` moves, and nothing while it stands still."""

    def __init__(self, send: Callable[[bytes], None], interval_s: float):
        self._send = send
        self._interval_s = interval_s
        self._last_seen = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def progress(self) -> int:
        raise NotImplementedError

    def tick(self) -> bool:
        """One look: send `EngineAlive` if there was progress since the last look."""
        done = self.progress()
        if done == self._last_seen:
            return False
        self._last_seen = done
        self._send(output_encoder.encode(EngineAlive(done)))
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sluice-progress-beat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class ProgressBeat(_Beat):
    """Mid-step: progress is the number of decoder layer forwards so far."""

    def __init__(
        self,
        send: Callable[[bytes], None],
        layers: Sequence[torch.nn.Module],
        *,
        interval_s: float = 1.0,
    ):
        super().__init__(send, interval_s)
        self.layers_done = 0
        self._hooks = [layer.register_forward_hook(self._bump) for layer in layers]

    def _bump(self, *_args: object) -> None:
        self.layers_done += 1

    def progress(self) -> int:
        return self.layers_done

    def stop(self) -> None:
        super().stop()
        for hook in self._hooks:
            hook.remove()


class LoadBeat(_Beat):
    """While the engine loads: progress is what the loading thread has done
    (`thread_work`)."""

    def __init__(
        self, send: Callable[[bytes], None], work: Callable[[], int], *, interval_s: float = 1.0
    ):
        super().__init__(send, interval_s)
        self._work = work
        self._last_seen = work()  # what it did before the load does not count

    def progress(self) -> int:
        return self._work()


def thread_work(native_id: int) -> Callable[[], int] | None:
    """A count that grows while the thread `native_id` of this process runs
    or faults pages in: its user and system clock ticks plus its minor and
    major page faults (/proc/self/task/ID/stat); None where there is no such
    file (not Linux)."""
    path = Path(f"/proc/self/task/{native_id}/stat")
    if not path.exists():
        return None

    def work() -> int:
        # The fields after the command name's ")": state is field 3, so field n is at n - 3.
        fields = path.read_text().rsplit(")", 1)[1].split()
        minflt, majflt, utime, stime = (int(fields[n - 3]) for n in (10, 12, 14, 15))
        return minflt + majflt + utime + stime

    return work


def socket_sender(
    context: zmq.Context, address: str
) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """A PUSH socket connected to the client's output address, for the beat
    thread alone: its send, and its close."""
    socket = context.socket(zmq.PUSH)
    socket.connect(address)
    socket.setsockopt(zmq.SNDHWM, 4)  # a few beats queued at most

    def send(data: bytes) -> None:
        with contextlib.suppress(zmq.Again):  # the client is not reading: a lost beat costs nothing
            socket.send(data, flags=zmq.NOBLOCK)

    return send, lambda: socket.close(linger=0)
