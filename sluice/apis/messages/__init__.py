"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`): its
request bodies (protocol.py), their conversion into the chat request the
other APIs run (to_internal.py), the events and body projected from the
choice deltas (events.py), and its routes (routes.py). Imports nothing of
its package (sluice/lazy_exports.py)."""
