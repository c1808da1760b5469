"""The OpenAI-compatible HTTP edge: app factory, launcher, metrics."""

from sluice.server.app import create_app
from sluice.server.launch import run_server, serve

__all__ = ["create_app", "run_server", "serve"]
