"""The rules several APIs share, written once: reasoning controls
(reasoning_fields.py), tools and tool_choice (tool_fields.py; tool_prompt.py
where the chat template shows no tool format) and structured outputs
(structured_fields.py), each a 400 naming the field in the caller's own API.
Imports nothing of its package."""
