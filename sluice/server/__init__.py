"""The OpenAI-compatible HTTP edge: app factory, launcher, metrics.

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
