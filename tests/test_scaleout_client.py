"""The data-parallel client without Ray: its stats (the replicas' snapshots
summed; the replicas here are stand-ins that only report a snapshot) and the
path of a request through it (stand-in replicas behind a real wire format)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sluice.engine.client_base import QueueTimeout
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import EngineRequest, Generation
from sluice.engine.messages import EngineInput, EngineStatsSnapshot, input_decoder, input_encoder
from sluice.engine.routed_client import RoutedEngineClient
from sluice.engine.sampling_params import SamplingParams
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.frontend.serving import engine_requests_of
from sluice.scaleout.client import DataParallelEngineClient
from sluice.scaleout.router import ReplicaRouter
from sluice.server.in_flight.admission import AdmissionGate
from sluice.testing.recording_sink import RecordingSink


@dataclass
class Replica:
    snapshot: EngineStatsSnapshot
    is_alive: bool = True

    def stats(self) -> EngineStatsSnapshot:
        return self.snapshot


def test_speculative_decoding_counters_sum_over_live_replicas_position_by_position():
    client = object.__new__(DataParallelEngineClient)  # no Ray: only the replicas matter
    client.replica_clients = [
        Replica(EngineStatsSnapshot(num_running=1, spec_decode_num_drafts=3,
                                    spec_decode_num_draft_tokens=12,
                                    spec_decode_num_accepted_tokens=5,
                                    spec_decode_num_accepted_tokens_per_pos=(3, 2))),
        Replica(EngineStatsSnapshot(num_running=2, spec_decode_num_drafts=1,
                                    spec_decode_num_draft_tokens=4,
                                    spec_decode_num_accepted_tokens=3,
                                    spec_decode_num_accepted_tokens_per_pos=(1, 1, 1, 0))),
        Replica(EngineStatsSnapshot(spec_decode_num_drafts=50), is_alive=False),
    ]  # fmt: skip
    stats = client.stats()
    assert stats.num_running == 3
    assert stats.spec_decode_num_drafts == 4
    assert stats.spec_decode_num_draft_tokens == 16
    assert stats.spec_decode_num_accepted_tokens == 8
    assert stats.spec_decode_num_accepted_tokens_per_pos == (4, 3, 1, 0)


class WireReplica(RoutedEngineClient):
    """A replica's client whose engine is across a process boundary: each
    input is encoded as the ZMQ client sends it and decoded as the engine
    process receives it, then handed to `core`."""

    def __init__(self, core: EngineCore):
        super().__init__()
        self._is_alive = True
        self.num_starts = 1
        self.core = core

    def _send(self, message: EngineInput) -> None:
        received = input_decoder.decode(input_encoder.encode(message))
        assert self.core.handle(received, [], []), "no input here shuts the engine down"

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...


class RecordingCore(EngineCore):
    """Only what `EngineCore.handle` hands to `add_request`, recorded."""

    def __init__(self) -> None:
        self.added: list[EngineRequest] = []

    def add_request(self, request: EngineRequest) -> None:
        self.added.append(request)


def test_a_request_reaches_the_core_through_gate_router_and_wire_as_the_frontend_built_it():
    async def run() -> list[EngineRequest]:
        cores = [RecordingCore(), RecordingCore()]
        client = object.__new__(DataParallelEngineClient)  # no Ray: two wire replicas
        client.replica_clients = [WireReplica(core) for core in cores]
        client.router = ReplicaRouter(2, block_size_tokens=4)
        client._num_starts_seen = [1, 1]
        gate = AdmissionGate(client, capacity=8)
        for built in sent:
            gate.with_deadline(QueueTimeout(30.0)).add_request(built, RecordingSink())
        return [request for core in cores for request in core.added]

    api_request = GenerationRequest(
        kind="completion", response_id="cmpl-1", created=5, model_name="tiny",
        prompts=(PromptInput((5, 6, 7, 8, 9), "a"), PromptInput((1, 2), "b")), n=2,
        params=SamplingParams(temperature=0.5, seed=7, max_tokens=9, logit_bias={3: -1.5},
                              stop_token_ids=(4,)),
    )  # fmt: skip
    sent = engine_requests_of(api_request, trace_context="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01")
    received = sorted(asyncio.run(run()), key=lambda request: request.request_id)
    assert len(received) == len(sent) == 4
    for built, arrived in zip(sent, received, strict=True):
        assert arrived is not built  # it crossed the wire: a fresh value
        assert arrived.request_id == built.request_id
        assert arrived.trace_context == built.trace_context
        assert isinstance(arrived.payload, Generation) and isinstance(built.payload, Generation)
        assert arrived.payload.prompt_token_ids == built.payload.prompt_token_ids
        assert arrived.payload.params == built.payload.params
        assert arrived == built
    assert [request.payload.params.seed for request in received] == [7, 8, 9, 10]
