"""The browser pages: a chat at `/` and a live dashboard at `/dashboard`.

Static files shipped in the package (sluice/server/http/static: HTML, CSS and small
vanilla JavaScript; no build step, no CDN, the machines may be offline). The
pages use only the server's public API, as any client would: the chat streams
/v1/chat/completions (stopping aborts the fetch, so the server aborts the
request), the dashboard reads /metrics every second and draws its own charts
from the same registry Prometheus scrapes. The pages hold no data, so they
need no API key; the chat asks for one when the API answers 401.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
STATIC_PREFIX = "/static"
# Paths served without the API key (with everything under STATIC_PREFIX).
PAGE_PATHS = frozenset({"/", "/dashboard"})


def add_pages(app: FastAPI) -> None:
    """Route `/`, `/dashboard` and the static files of `app`."""
    app.add_api_route("/", _page("chat.html"), methods=["GET"], include_in_schema=False)
    app.add_api_route(
        "/dashboard", _page("dashboard.html"), methods=["GET"], include_in_schema=False
    )
    app.mount(STATIC_PREFIX, StaticFiles(directory=STATIC_DIR), name="static")


def is_public_page(path: str) -> bool:
    return path in PAGE_PATHS or path.startswith(STATIC_PREFIX + "/")


def _page(name: str):
    path = STATIC_DIR / name

    async def page() -> FileResponse:
        return FileResponse(path, media_type="text/html")

    return page
