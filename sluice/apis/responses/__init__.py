"""OpenAI's Responses API (`/v1/responses`, its `input_tokens`, GET and
DELETE of a stored response): its request bodies (protocol.py), their
conversion into the chat request the other APIs run (to_internal.py, reading
input items and tools with input_items.py), the store of past responses
(store.py), the events and body projected from the choice deltas (events.py
over items.py), and its routes (routes.py). Imports nothing of its package
(sluice/lazy_exports.py)."""
