"""ASGI entry point: a Channels ProtocolTypeRouter.

HTTP goes through a Channels URLRouter: data-plane routes (/v1/* inference, /generate, /rerank,
probes) to plain async ASGI handlers, everything else (admin console, control-plane APIs) to Django.
A data-plane path (every one is a fixed path) is looked up in a dict in front of the URLRouter and
its handler called with the scope the URLRouter would give it, without trying the patterns in turn.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

from typing import Any, Awaitable, cast  # noqa: E402

from django.core.asgi import get_asgi_application  # noqa: E402

from gateway_project.static_files import StaticFiles  # noqa: E402

# The admin console's CSS and JS are served from the installed apps (no collectstatic step), by a
# handler that refuses any path climbing out of them with a 404. Bodies are bounded in front of it.
django_asgi = StaticFiles(cast(Any, get_asgi_application()))

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import re_path  # noqa: E402

from administration.lifecycle import LIFECYCLE  # noqa: E402
from inference.api.routes import data_plane_routes  # noqa: E402
from inference import errors  # noqa: E402
from inference.asgi_io import (  # noqa: E402
    ClientDisconnected, Message, Receive, Scope, Send, header, read_body, request_id_for, send_error,
)
from inference.errors import GatewayError  # noqa: E402
from responses_api.background import BACKGROUND  # noqa: E402
from responses_api.routes import responses_routes  # noqa: E402


_NO_HEADERS: Scope = {"headers": ()}


class BoundedBody:
    """Django's ASGI handler reads a whole request body (spooled to a temporary file past 2.5 MB)
    before anything compares it with ``DATA_UPLOAD_MAX_MEMORY_SIZE``. In front of it, the body is read
    here and refused at the limit while it arrives: a larger Content-Length is 413 payload_too_large
    (the control plane's envelope) before any of it is read, and a body with no length (chunked) is
    413 as soon as it passes the limit, the rest left unread. What fits goes to Django whole."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit: int | None = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if scope["type"] != "http" or limit is None:
            return await self.app(scope, receive, send)
        declared = header(scope, b"content-length")
        try:
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise errors.payload_too_large(limit)
            # The length was looked at above; one that is not a number stays Django's to answer, as before.
            body = await read_body(_NO_HEADERS, receive, limit)
        except GatewayError as error:
            return await send_error(send, error, request_id_for(scope))
        except ClientDisconnected:
            return None
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()  # what follows the body: a disconnect, which Django listens for
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


django_app = BoundedBody(django_asgi)

# The data plane: inference's routes and the Responses API's (fixed paths, timed by the gate).
DATA_PLANE_ROUTES = [*data_plane_routes(), *responses_routes()]

# Background responses drain with the requests on shutdown; those still running then stop as failed.
if BACKGROUND not in LIFECYCLE.background:
    LIFECYCLE.background.append(BACKGROUND)


class FixedPaths:
    """In front of a URLRouter: a request for one of ``routes``' fixed paths goes straight to its
    handler, with the scope the URLRouter makes for it (a copy with ``path_remaining`` and
    ``url_route``); any other (and any under a root_path) to the URLRouter."""

    def __init__(self, routes: list[Any], router: Any) -> None:
        self.handlers = {"/" + str(route.pattern): route.callback for route in routes}
        self.router = router

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # A plain function returning the handler's (or router's) coroutine: no frame of its own per
        # request (issue 27, D86). It sits under the lifecycle gate, which awaits it.
        handler = self.handlers.get(scope["path"])
        if handler is None or scope.get("root_path") or "path_remaining" in scope:
            return cast(Awaitable[None], self.router(scope, receive, send))
        return cast(Awaitable[None], handler(
            dict(scope, path_remaining="", url_route={"args": (), "kwargs": {}}), receive, send
        ))  # fmt: skip


async def refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """No route speaks WebSocket: the handshake is refused (the server answers 403), where a missing
    "websocket" entry was an unhandled exception in the log under daphne."""
    if (await receive())["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


application = ProtocolTypeRouter(
    {
        "http": LIFECYCLE.gate(
            FixedPaths(DATA_PLANE_ROUTES, URLRouter([*DATA_PLANE_ROUTES, re_path(r"", cast(Any, django_app))])),
            frozenset("/" + str(route.pattern) for route in DATA_PLANE_ROUTES),
        ),
        "websocket": refuse_websocket,
        "lifespan": LIFECYCLE.lifespan,
    }
)
