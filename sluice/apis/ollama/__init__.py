"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, ...): its request
bodies (protocol.py), their conversion into the chat request the other APIs
run (to_internal.py), the NDJSON lines and bodies projected from the same
choice deltas (lines.py), and its routes (routes.py). Imports nothing of its
package (sluice/lazy_exports.py)."""
