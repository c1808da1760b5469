"""The Responses store as tenants meet it, over HTTP: a stored response is its
API key's alone (GET, DELETE, previous_response_id and input_tokens answer any
other key as if it never existed)."""

from __future__ import annotations

import httpx2
import orjson
import pytest

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
