"""The Responses API's store: what `previous_response_id` continues and
`GET /v1/responses/{id}` reads back, in memory, on the event loop (its owner).

Invariants:
- A stored response belongs to the API key that made it (its digest): for
  any other key it is not there, the same 404 as an id never stored, so ids
  cannot be probed. Without keys every client is the one owner (None).
- The store holds at most `max_bytes` of stored responses, counted as their
  JSON (the response object with everything it echoes: metadata, user,
  tools; and the conversation a follow-up continues), and at most
  `capacity` of them; the least recently used go first. A response larger
  than `max_bytes` alone is not kept at all.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from sluice.apis.responses.input_items import input_messages
from sluice.errors import NotFoundError

DEFAULT_STORE_CAPACITY = 1024
DEFAULT_STORE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoredResponse:
    # The response object, as GET /v1/responses/{id} returns it.
    response: dict[str, Any]
    # The chat messages of its conversation before its output (no instructions).
    messages: tuple[dict[str, Any], ...]
    # The digest of the API key that made it (None: a server without keys);
    # only that key finds it.
    owner: bytes | None = None

    def conversation(self) -> list[dict[str, Any]]:
        """Its input and its output, as the messages a follow-up continues."""
        return [*self.messages, *input_messages(self.response["output"])]

    def num_bytes(self) -> int:
        """What it holds, as JSON: the response and the conversation before it."""
        return len(orjson.dumps(self.response)) + len(orjson.dumps(self.messages))


class ResponseStore:
    """Stored responses by id and owner; bounded in bytes and count, LRU eviction."""

    def __init__(
        self, max_bytes: int = DEFAULT_STORE_BYTES, capacity: int = DEFAULT_STORE_CAPACITY
    ):
        self.max_bytes = max_bytes
        self.capacity = capacity
        # Each stored response and its size in bytes, least recently used first.
        self._responses: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, stored: StoredResponse) -> None:
        response_id = stored.response["id"]
        num_bytes = stored.num_bytes()
        self._forget(response_id)
        if num_bytes > self.max_bytes:
            return  # it would evict everything and still not fit
        self._responses[response_id] = (stored, num_bytes)
        self.num_bytes += num_bytes
        while self.num_bytes > self.max_bytes or len(self._responses) > self.capacity:
            self._forget(next(iter(self._responses)))

    def get(
        self, response_id: str, owner: bytes | None, param: str | None = None
    ) -> StoredResponse:
        """The response `response_id` of `owner`; NotFoundError if it is not
        stored, or is another owner's (the same error: nothing to tell them apart)."""
        entry = self._responses.get(response_id)
        if entry is None or entry[0].owner != owner:
            raise NotFoundError(
                f"No response with id {response_id[:100]!r} is stored (stored responses: "
                f"the most recent, up to {self.capacity} and {self.max_bytes} bytes, in memory)",
                param=param,
            )
        self._responses.move_to_end(response_id)
        return entry[0]

    def delete(self, response_id: str, owner: bytes | None) -> None:
        self.get(response_id, owner)
        self._forget(response_id)

    def _forget(self, response_id: str) -> None:
        entry = self._responses.pop(response_id, None)
        if entry is not None:
            self.num_bytes -= entry[1]
