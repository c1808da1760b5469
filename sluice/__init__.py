"""sluice: an OpenAI-compatible LLM inference server whose streams stay exact under load."""
