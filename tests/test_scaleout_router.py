"""The data-parallel router alone: load in outstanding tokens, prefix affinity,
healthy replicas only, and the bookkeeping of each request's progress."""

from __future__ import annotations

from sluice.engine.outputs import RequestDelta
from sluice.scaleout.router import ReplicaRouter

BLOCK = 16
BOTH = [0, 1]


def delta(request_id: str, num_tokens: int, finish: str | None = None) -> RequestDelta:
    return RequestDelta(request_id, tuple(range(num_tokens)), None, finish, None, 0)


def prompt(first_token: int, length: int) -> list[int]:
    return [first_token + i for i in range(length)]


def loads(router: ReplicaRouter) -> list[int]:
    return [load.num_outstanding_tokens for load in router.loads]


def test_equal_requests_alternate_between_idle_replicas():
    router = ReplicaRouter(2, BLOCK)
    chosen = [router.route(f"r{i}", [7, 8], 10, BOTH) for i in range(4)]
    assert chosen == [0, 1, 0, 1]
    assert loads(router) == [24, 24]


def test_load_is_outstanding_tokens_not_request_count():
    router = ReplicaRouter(2, BLOCK)
    assert router.route("long", prompt(1000, 900), 100, BOTH) == 0
    # Three short requests together are less work than the long one: all go to 1.
    assert [router.route(f"s{i}", [1, 2, 3], 50, BOTH) for i in range(3)] == [1, 1, 1]
    assert loads(router) == [1000, 159]


def test_a_first_delta_clears_the_prompt_and_each_token_counts_down():
    router = ReplicaRouter(1, BLOCK)
    router.route("a", prompt(0, 40), 10, [0])
    router.on_delta(delta("a", 1))
    assert loads(router) == [9]
    router.on_delta(delta("a", 3))
    assert loads(router) == [6]
    router.on_delta(delta("a", 2, finish="stop"))
    assert loads(router) == [0] and router.replica_of("a") is None
    router.finish("a")  # idempotent
    assert loads(router) == [0]


def test_a_failed_or_aborted_request_leaves_the_load():
    router = ReplicaRouter(2, BLOCK)
    router.route("a", prompt(0, 20), 30, BOTH)
    router.route("b", prompt(0, 5), 30, BOTH)
    router.finish("a")
    router.finish("b")
    assert loads(router) == [0, 0]


def test_a_shared_prefix_goes_back_to_the_replica_that_cached_it():
    router = ReplicaRouter(2, BLOCK)
    system = prompt(500, 4 * BLOCK)
    first = router.route("a", [*system, 1, 2], 16, BOTH)
    router.on_delta(delta("a", 16, finish="length"))  # a conversation's first turn
    router.route("other", [1, 2, 3], 20, [first])
    # The other replica is less loaded, but the 64 cached tokens outweigh the
    # difference in load: the next turn goes back.
    assert router.route("b", [*system, 3, 4, 5], 16, BOTH) == first
    assert router.loads[first].num_routed_by_prefix == 1


def test_affinity_yields_when_the_cached_replica_is_much_busier():
    router = ReplicaRouter(2, BLOCK)
    system = prompt(500, 2 * BLOCK)
    first = router.route("a", [*system, 1], 16, BOTH)
    router.route("busy", [1, 2], 1000, [first])  # only `first` is eligible here
    other = 1 - first
    assert router.route("b", [*system, 2], 16, BOTH) == other
    assert router.loads[other].num_routed_by_prefix == 0


def test_the_deepest_matching_prefix_wins():
    router = ReplicaRouter(2, BLOCK)
    system = prompt(100, BLOCK)
    turn = prompt(900, 2 * BLOCK)
    router.route("short", [*system, 1], 0, [0])
    router.route("long", [*system, *turn, 1], 0, [1])
    assert router.route("next", [*system, *turn, 7, 8], 0, BOTH) == 1


def test_a_prompt_shorter_than_a_block_and_one_token_has_no_affinity():
    router = ReplicaRouter(2, BLOCK)
    exactly_one_block = prompt(0, BLOCK)  # its last token is always computed
    assert router.route("a", exactly_one_block, 4, BOTH) == 0
    assert router.route("b", exactly_one_block, 4, BOTH) == 1


def test_unhealthy_replicas_are_never_chosen_even_with_the_prefix():
    router = ReplicaRouter(3, BLOCK)
    system = prompt(0, 3 * BLOCK)
    assert router.route("a", [*system, 1], 8, [0, 1, 2]) == 0
    assert router.route("b", [*system, 1], 8, [1, 2]) in (1, 2)
    assert all(router.route(f"c{i}", [i, 1], 8, [2]) == 2 for i in range(3))


def test_a_restarted_replica_loses_its_prefixes():
    router = ReplicaRouter(2, BLOCK)
    system = prompt(0, 3 * BLOCK)
    router.route("a", [*system, 1], 8, BOTH)
    router.finish("a")
    router.forget(0)
    router.route("x", [1, 2], 8, [0])  # replica 0 is now the busier one
    assert router.route("b", [*system, 2], 8, BOTH) == 1
    assert router.loads[1].num_routed_by_prefix == 0


def test_the_prefix_table_is_bounded():
    router = ReplicaRouter(2, BLOCK, max_prefixes=10)
    for i in range(20):
        router.route(f"r{i}", prompt(1000 * i, 3 * BLOCK + 1), 1, BOTH)
    assert len(router._prefixes) == 10
