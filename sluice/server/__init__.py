"""The OpenAI-compatible HTTP edge, one package per job: http/ (app factory,
routes, middleware, errors, streamed bodies, launcher), served_models/,
body/ (request bodies and bounds), in_flight/ (the request context,
admission), keys/ (API keys and their limits), observability/ (metrics,
access log, spans, loop lag).

Re-exports lazily (`sluice.lazy_exports`): the edge's modules import each
other, never this package's names.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sluice.server.http.app import create_app
    from sluice.server.http.launch import run_server, serve

__all__ = ["create_app", "run_server", "serve"]
__getattr__ = lazy_exports(
    __name__,
    {
        "create_app": "sluice.server.http.app",
        "run_server": "sluice.server.http.launch",
        "serve": "sluice.server.http.launch",
    },
)
