"""The data-parallel client's stats: the replicas' snapshots summed, without
Ray (the replicas here are stand-ins that only report a snapshot)."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.engine.messages import EngineStatsSnapshot
from sluice.scaleout.client import DataParallelEngineClient


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
