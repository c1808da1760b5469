"""A request's body, read and checked before any API sees it: size limits,
large bodies parsed off the loop in pieces (body.py over json_pieces.py and
validation_windows.py), and the per-request bounds from `RequestLimits`,
each a 400 naming the field (limits.py). Imports nothing of its package."""
