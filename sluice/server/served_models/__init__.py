"""The models the HTTP edge serves: one (served_model.py: name, tokenizer,
context length) or several (model_pool.py: engines started on first use,
stopped least recently used; model_starts.py, model_entry.py), named by
--model / --models-dir (model_catalog.py), and what a route uses of the
model it names (model_parts.py). Imports nothing of its package."""
