"""SinkRouter: each delta to its sink once; a failing sink ends its own request only."""

from __future__ import annotations

from sluice.engine.outputs import EngineError, RequestDelta
from sluice.engine.sink_router import SinkRouter
from sluice.errors import EngineDeadError, InvalidRequestError


class Sink:
    def __init__(self, fails_at: int | None = None) -> None:
        self.deltas: list[RequestDelta] = []
        self.errors: list[BaseException] = []
        self._fails_at = fails_at

    def on_delta(self, delta: RequestDelta) -> None:
        if len(self.deltas) == self._fails_at:
            raise RuntimeError("the sink broke")
        self.deltas.append(delta)

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


def delta(request_id: str, token_id: int, finish: bool = False) -> RequestDelta:
    return RequestDelta(request_id, (token_id,), None, "length" if finish else None, None, 3)


def test_a_sink_that_raises_gets_its_error_and_nothing_more_while_the_others_go_on():
    router = SinkRouter()
    broken, healthy = Sink(fails_at=1), Sink()
    router.register("a", broken)
    router.register("b", healthy)
    failed = [
        router.dispatch([delta("a", step), delta("b", step, finish=step == 2)], [])
        for step in range(3)
    ]
    # Nobody listens to "a" from its failure on: the client aborts it in the engine.
    assert failed == [[], ["a"], []]
    assert [d.new_token_ids for d in broken.deltas] == [(0,)]
    assert [str(e) for e in broken.errors] == ["the sink broke"]
    assert [d.new_token_ids for d in healthy.deltas] == [(0,), (1,), (2,)]
    assert not healthy.errors
    assert len(router) == 0
    router.fail_all("gone")  # nobody left to hear it
    assert len(broken.errors) == 1


def test_finished_and_failed_requests_leave_the_router():
    router = SinkRouter()
    sinks = {name: Sink() for name in "abc"}
    for name, sink in sinks.items():
        router.register(name, sink)
    router.dispatch([delta("a", 1, finish=True)], [EngineError("b", "bad request")])
    assert "a" not in router and "b" not in router and "c" in router
    assert isinstance(sinks["b"].errors[0], InvalidRequestError)
    router.fail_all("the engine died")
    assert isinstance(sinks["c"].errors[0], EngineDeadError)
    assert not sinks["a"].errors
