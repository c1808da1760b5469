"""OpenAI's completions API (`/v1/completions`): its request body
(protocol.py), its conversion into the internal request (to_internal.py),
its projection (chunks.py: `CompletionChunks`) and its route (routes.py).
What it shares with chat: sluice/apis/openai_protocol.py and
openai_request.py. Imports nothing of its package (sluice/lazy_exports.py)."""
