"""The API keys of the HTTP edge: the keys and their names and limits
(api_keys.py), and each key's seats, requests and tokens held per request
(key_limits.py: `KeyLimiter`, `KeyLease`). Imports nothing of its package."""
