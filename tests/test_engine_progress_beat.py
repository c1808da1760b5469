"""The mid-step heartbeat: sent while decoder layers run, never while one is stuck."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch
import zmq

from sluice.engine.messages import EngineAlive, output_decoder
from sluice.engine.progress_beat import ProgressBeat, decoder_layers, socket_sender


def _layers(n: int = 3) -> torch.nn.ModuleList:
    return torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(n))


def test_a_look_sends_a_beat_only_when_layers_ran_since_the_last_look():
    sent: list[bytes] = []
    layers = _layers()
    beat = ProgressBeat(sent.append, list(layers))
    assert not beat.tick()
    hidden = torch.ones(1, 4)
    for layer in layers:
        hidden = layer(hidden)
    assert beat.tick()
    assert output_decoder.decode(sent[-1]) == EngineAlive(3)
    assert not beat.tick() and len(sent) == 1
    beat.stop()


def test_stopping_removes_the_hooks():
    layers = _layers()
    beat = ProgressBeat(lambda _: None, list(layers))
    beat.stop()
    layers[0](torch.ones(1, 4))
    assert beat.layers_done == 0


def test_the_decoder_layers_are_found_on_the_cores_model_and_absent_elsewhere():
    layers = _layers(2)
    core = SimpleNamespace(runner=SimpleNamespace(model=SimpleNamespace(layers=layers)))
    assert decoder_layers(core) == list(layers)
    assert decoder_layers(SimpleNamespace(runner=object())) == []
    assert decoder_layers(object()) == []


class _GatedLayer(torch.nn.Module):
    """A layer whose forward waits until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.release.wait(30)
        return hidden


def test_a_long_step_beats_over_a_real_socket_between_layers_and_not_while_one_is_stuck():
    context = zmq.Context()
    receiver = context.socket(zmq.PULL)
    port = receiver.bind_to_random_port("tcp://127.0.0.1")
    send, close = socket_sender(context, f"tcp://127.0.0.1:{port}")
    layers = [_GatedLayer() for _ in range(3)]
    beat = ProgressBeat(send, layers, interval_s=0.01)
    beat.start()
    step = threading.Thread(target=lambda: [layer(torch.ones(1)) for layer in layers])
    step.start()
    try:
        for index, layer in enumerate(layers):
            layer.release.set()  # the step finishes layer `index`...
            assert receiver.poll(30_000)  # ...and the beat says so, mid-step
            assert output_decoder.decode(receiver.recv()) == EngineAlive(index + 1)
            if index < len(layers) - 1:
                # The next layer is stuck until released: nothing moves, nothing is sent.
                assert not receiver.poll(200)
        step.join()
        assert not receiver.poll(200)  # idle after the step: the loop's own heartbeat's job
    finally:
        for layer in layers:
            layer.release.set()
        step.join()
        beat.stop()
        close()
        receiver.close(linger=0)
        context.term()
