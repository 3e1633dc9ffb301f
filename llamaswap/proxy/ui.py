"""The web dashboard's files: ``/ui`` → ``/ui/``, ``/ui/`` → ``index.html``, ``/ui/<asset>``;
and llama-swap's ways to the dashboard, ``/`` and ``/upstream``.

The dashboard is static: plain ES modules, one stylesheet and an icon under
``llamaswap/ui/`` (package data), read by the browser as they are, with no build step.
Everything it shows comes from the API (``/api/events`` above all), which it calls with
the user's key. So these three views, and nothing else, are served without a key
(``PUBLIC_ENDPOINTS``, read by the app's ``check_key``): the page must load to ask for
one. They hold no data; every request the page makes for data carries the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from quart import Response, send_from_directory
from quart_trio import QuartTrio
from werkzeug.exceptions import NotFound

__all__ = ["PUBLIC_ENDPOINTS", "UI_DIRECTORY", "register"]

#: Where the dashboard's files are (installed with the package).
UI_DIRECTORY: Final = Path(__file__).resolve().parent.parent / "ui"

#: The Quart endpoints (view names) that need no API key: the dashboard's files only.
PUBLIC_ENDPOINTS: Final = frozenset({"ui_redirect", "to_ui", "ui_index", "ui_asset"})

_TYPES: Final = {  # text types get "; charset=utf-8" from Quart
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}

# The page runs only its own files and talks only to this server: no inline script,
# no third-party origin, no framing.
_HEADERS: Final = {
    "cache-control": "no-cache",  # revalidated (ETag, Last-Modified): an upgrade shows at once
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def register(quart: QuartTrio) -> None:
    """Add the dashboard's routes to ``quart``."""

    @quart.get("/ui")
    async def ui_redirect() -> Response:
        # Relative, so that the page also works behind a proxy that adds a path prefix.
        return Response("", status=308, headers={"location": "ui/"})

    @quart.get("/")
    @quart.get("/upstream")  # llama-swap's list of models to open a server's own page in
    async def to_ui() -> Response:
        return Response("", status=302, headers={"location": "ui/"})  # as llama-swap's

    @quart.get("/ui/")
    async def ui_index() -> Response:
        return await _file("index.html")

    @quart.get("/ui/<path:asset>")
    async def ui_asset(asset: str) -> Response:
        return await _file(asset)


async def _file(name: str) -> Response:
    suffix = Path(name).suffix
    if suffix not in _TYPES:
        raise NotFound()
    # send_from_directory refuses names that leave the directory (NotFound).
    response = await send_from_directory(UI_DIRECTORY, name, mimetype=_TYPES[suffix])
    response.headers.update(_HEADERS)
    response.headers.pop("expires", None)  # send_file's 12 h; the files are revalidated
    return response
