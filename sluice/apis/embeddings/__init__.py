"""Embeddings, rerank and score (`/v1/embeddings`, `/v1/rerank`, `/v1/score`,
Ollama's `/api/embed` and `/api/embeddings`): their request bodies
(protocol.py), their inputs as token sequences (inputs.py), the answers
(bodies.py) and the routes (routes.py), over a pooling model's engine
(sluice/engine/pooling_core.py). Imports nothing of its package
(sluice/lazy_exports.py)."""
