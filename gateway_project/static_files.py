"""The admin console's static files (CSS, JS, images), served from the installed apps under
STATIC_URL with no collectstatic step, by the same ASGI app under uvicorn and daphne.

Django's ASGIStaticFilesHandler answered a path that climbs out of the static roots
(``/static/../settings.py``, ``%2e%2e``, a NUL byte) with an unhandled SuspiciousFileOperation: a 500
and a traceback in the log. Here a path is served only when every segment is a plain name: no empty,
``.`` or ``..`` segment, no backslash, no NUL; anything else, and any file the finders do not have, is
the 404 envelope of an unknown route. GET and HEAD only (405 otherwise).
"""

from __future__ import annotations

import asyncio
import mimetypes
import os
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles import finders
from django.core.exceptions import SuspiciousFileOperation

from inference import errors
from inference.asgi_io import ASGIApp, Receive, Scope, Send, header, send_error, send_response

__all__ = ["StaticFiles", "safe_relative_path"]

_REFUSED_CHARACTERS = ("\x00", "\\")


def safe_relative_path(relative: str) -> str | None:
    """``relative`` when each of its segments is a plain name (nothing that climbs, is absolute or
    hides a separator), else None."""
    if not relative or any(character in relative for character in _REFUSED_CHARACTERS):
        return None
    if any(segment in ("", ".", "..") for segment in relative.split("/")):
        return None
    return relative


def _found_file(relative: str) -> Path | None:
    """The file the static finders have at ``relative``, or None (also for a directory)."""
    try:
        found = finders.find(relative)
    except (SuspiciousFileOperation, ValueError):  # the finders' own traversal check; bad bytes
        return None
    if not isinstance(found, str):
        return None
    path = Path(found)
    return path if path.is_file() else None


class StaticFiles:
    """Serves STATIC_URL from the static finders; every other path goes to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.prefix = "/" + settings.STATIC_URL.strip("/") + "/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if scope["type"] != "http" or not path.startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await send_error(send, errors.method_not_allowed(scope["method"], path, "GET, HEAD"))
            return
        relative = safe_relative_path(path[len(self.prefix):])
        found = await asyncio.to_thread(_found_file, relative) if relative is not None else None
        if found is None:
            await send_error(send, errors.endpoint_not_found(path))
            return
        await _send_file(scope, send, found)


async def _send_file(scope: Scope, send: Send, path: Path) -> None:
    stat = await asyncio.to_thread(os.stat, path)
    modified = int(stat.st_mtime)
    since = header(scope, b"if-modified-since")
    if since is not None and _not_modified_since(since, modified):
        await send_response(send, 304, b"", [(b"content-length", b"0")])
        return
    content_type, encoding = mimetypes.guess_type(path.name)
    headers = [
        (b"content-type", (content_type or "application/octet-stream").encode("latin-1")),
        (b"content-length", str(stat.st_size).encode()),
        (b"last-modified", formatdate(modified, usegmt=True).encode()),
    ]
    if encoding:
        headers.append((b"content-encoding", encoding.encode("latin-1")))
    body = b"" if scope["method"] == "HEAD" else await asyncio.to_thread(path.read_bytes)
    await send_response(send, 200, body, headers)


def _not_modified_since(value: bytes, modified: int) -> bool:
    try:
        return modified <= int(parsedate_to_datetime(value.decode("latin-1")).timestamp())
    except (TypeError, ValueError, IndexError, OverflowError):
        return False
