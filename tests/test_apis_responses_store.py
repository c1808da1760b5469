"""The Responses store as tenants meet it, over HTTP: a stored response is its
API key's alone (GET, DELETE, previous_response_id and input_tokens answer any
other key as if it never existed); metadata is bounded as OpenAI bounds it; the
store is bounded in bytes, whatever a response echoes. Also the store alone,
under random puts, gets and deletes by several owners (hypothesis)."""

from __future__ import annotations

import httpx2
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.apis.responses.store import ResponseStore, StoredResponse
from sluice.errors import NotFoundError
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer

TOKENIZER = ChatFakeTokenizer()
ALICE = {"Authorization": "Bearer sk-alice-1111"}
BOB = {"x-api-key": "sk-bob-2222"}


def serve(tmp_path, **config) -> LiveServer:
    keys = tmp_path / "keys"
    keys.write_text("sk-alice-1111 name=alice\nsk-bob-2222 name=bob\n")
    token_ids = TOKENIZER.encode("Hello there, friend.")
    engine = FakeEngine(lambda *_: iter(token_ids), tokens_per_step=4)
    return LiveServer(engine, TOKENIZER, api_key_file=keys, **config)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("keys")) as server:
        yield server


def post(live: LiveServer, headers: dict, body: dict, path: str = "/v1/responses"):
    body = {"model": "fake-model", "input": "hi"} | body
    return httpx2.post(live.url + path, json=body, headers=headers, timeout=60)


def assert_not_found(response: httpx2.Response, param: str | None = None) -> None:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["type"] == "not_found_error" and error["param"] == param


def test_another_keys_stored_response_is_not_there_for_it(keyed):
    first = post(keyed, ALICE, {"input": "my secret plans"}).json()
    url = f"{keyed.url}/v1/responses/{first['id']}"
    follow = {"input": "and then?", "previous_response_id": first["id"]}
    never_id = f"resp_{'0' * 32}"
    # Bob: exactly what an id never stored gets, on every route that reads the store.
    assert_not_found(httpx2.get(url, headers=BOB))
    unknown = httpx2.get(f"{keyed.url}/v1/responses/{never_id}", headers=BOB).json()
    assert httpx2.get(url, headers=BOB).json() == orjson.loads(
        orjson.dumps(unknown).replace(never_id.encode(), first["id"].encode())
    )
    assert_not_found(post(keyed, BOB, follow), "previous_response_id")
    assert_not_found(post(keyed, BOB, follow | {"stream": True}), "previous_response_id")
    assert_not_found(post(keyed, BOB, follow, "/v1/responses/input_tokens"),
                     "previous_response_id")  # fmt: skip
    assert_not_found(httpx2.delete(url, headers=BOB))
    # Alice still has it, whole.
    assert httpx2.get(url, headers=ALICE).json() == first
    assert post(keyed, ALICE, follow).status_code == 200
    assert httpx2.delete(url, headers=ALICE).status_code == 200
    assert_not_found(httpx2.get(url, headers=ALICE))


def test_each_key_continues_only_its_own_conversations(keyed):
    bobs = post(keyed, BOB, {"input": "bob's turn"}).json()
    continued = post(keyed, BOB, {"previous_response_id": bobs["id"]})
    assert continued.status_code == 200
    assert httpx2.get(f"{keyed.url}/v1/responses/{bobs['id']}", headers=BOB).status_code == 200
    assert_not_found(post(keyed, ALICE, {"previous_response_id": bobs["id"]}),
                     "previous_response_id")  # fmt: skip


def test_without_keys_every_client_shares_the_store(tmp_path):
    token_ids = TOKENIZER.encode("Hi.")
    server = LiveServer(FakeEngine(lambda *_: iter(token_ids)), TOKENIZER)
    with server as live:
        first = post(live, {}, {}).json()
        assert httpx2.get(f"{live.url}/v1/responses/{first['id']}").json() == first
        assert post(live, {}, {"previous_response_id": first["id"]}).status_code == 200


# -- metadata and the store's bytes ----------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ({f"k{i}": "v" for i in range(17)}, "at most 16 key-value pairs, got 17"),
        ({"k" * 65: "v"}, "a key is at most 64 characters, got one of 65"),
        ({"k": "v" * 513}, "a value is at most 512 characters, got one of 513"),
        ({"k": 5}, "string"),
    ],
)
def test_metadata_beyond_openais_bounds_is_a_400_naming_it(keyed, metadata, problem):
    response = post(keyed, ALICE, {"metadata": metadata})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith("metadata") and problem in error["message"]
    assert "k" * 65 not in error["message"]


def test_metadata_at_openais_bounds_is_stored_and_echoed(keyed):
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    response = post(keyed, ALICE, {"metadata": metadata})
    assert response.status_code == 200, response.text
    stored = httpx2.get(f"{keyed.url}/v1/responses/{response.json()['id']}", headers=ALICE)
    assert stored.json()["metadata"] == metadata


def test_the_store_keeps_its_byte_bound_whatever_a_response_echoes(tmp_path):
    bulky = {"user": "u" * 20_000, "tools": [{"type": "web_search", "note": "n" * 20_000}]}
    with serve(tmp_path, responses_store_bytes=200_000) as live:
        ids = []
        for _ in range(8):  # ~40 KB each as JSON: the store holds the last four
            response = post(live, ALICE, bulky)
            assert response.status_code == 200, response.text
            ids.append(response.json()["id"])
        found = [httpx2.get(f"{live.url}/v1/responses/{i}", headers=ALICE).status_code for i in ids]
    assert found[:3] == [404] * 3 and found[-4:] == [200] * 4


def stored(response_id: str, num_chars: int, owner: bytes | None = None) -> StoredResponse:
    response = {"id": response_id, "output": [], "user": "u" * num_chars}
    return StoredResponse(response, ({"role": "user", "content": "hi"},), owner)


def test_the_least_recently_used_go_first_until_the_bytes_fit():
    size = stored("a", 1000).num_bytes()
    store = ResponseStore(max_bytes=3 * size)
    for response_id in "abc":
        store.put(stored(response_id, 1000))
    store.get("a", None)  # now the most recently used
    store.put(stored("d", 1000))
    assert store.num_bytes == 3 * size and len(store) == 3
    for response_id in "acd":
        assert store.get(response_id, None).response["id"] == response_id
    with pytest.raises(NotFoundError):
        store.get("b", None)
    store.put(stored("e", 2000))  # twice the bytes: two leave
    assert store.num_bytes <= 3 * size and len(store) == 2


def test_a_response_larger_than_the_store_is_not_kept_and_evicts_nothing():
    store = ResponseStore(max_bytes=stored("a", 100).num_bytes())
    store.put(stored("a", 100))
    store.put(stored("huge", 10_000))
    assert len(store) == 1 and store.get("a", None) is not None
    with pytest.raises(NotFoundError):
        store.get("huge", None)


def test_replacing_and_deleting_keep_the_byte_count():
    store = ResponseStore(max_bytes=10**6)
    store.put(stored("a", 100, b"k"))
    store.put(stored("a", 300, b"k"))
    assert store.num_bytes == stored("a", 300).num_bytes()
    with pytest.raises(NotFoundError):
        store.delete("a", b"other")
    store.delete("a", b"k")
    assert store.num_bytes == 0 and len(store) == 0


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["put", "get", "delete"]), st.sampled_from("xyz"),
                  st.sampled_from([None, b"alice", b"bob"]), st.integers(0, 300)),
        max_size=40,
    )
)  # fmt: skip
def test_a_response_is_found_by_its_owner_only_and_the_bytes_stay_bounded(operations):
    max_bytes = 3 * stored("x", 150).num_bytes()
    store = ResponseStore(max_bytes=max_bytes)
    owners: dict[str, bytes | None] = {}  # who last stored each id (it may be evicted since)
    for operation, response_id, owner, num_chars in operations:
        if operation == "put":
            store.put(stored(response_id, num_chars, owner))
            owners[response_id] = owner
        elif response_id not in owners or owners[response_id] != owner:
            with pytest.raises(NotFoundError):
                getattr(store, operation)(response_id, owner)
        elif _is_kept(store, response_id, owner) and operation == "delete":
            store.delete(response_id, owner)
            del owners[response_id]
        assert store.num_bytes <= max_bytes
    kept = [i for i, owner in owners.items() if _is_kept(store, i, owner)]
    assert len(store) == len(kept)
    assert store.num_bytes == sum(store.get(i, owners[i]).num_bytes() for i in kept)


def _is_kept(store: ResponseStore, response_id: str, owner: bytes | None) -> bool:
    try:
        store.get(response_id, owner)
    except NotFoundError:
        return False
    return True


def test_the_store_bound_is_a_size_flag():
    from sluice.cli import build_parser, server_config_from

    args = build_parser().parse_args(["serve", "--responses-store-memory", "64MiB"])
    assert server_config_from(args).responses_store_bytes == 64 << 20
    assert server_config_from(build_parser().parse_args(["serve"])).responses_store_bytes == (
        256 << 20
    )
