"""OpenAI's chat completions API (`/v1/chat/completions`): its request body,
and vLLM's /tokenize and /detokenize bodies (protocol.py), their conversion
into the internal request (to_internal.py, which the agent APIs convert
through too), its projection (chunks.py: `ChatChunks`) and its route
(routes.py). What it shares with completions: sluice/apis/openai_protocol.py
and openai_request.py. Imports nothing of its package (sluice/lazy_exports.py)."""
