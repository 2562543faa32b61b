"""No route speaks WebSocket: a handshake is refused (the server turns the close into a 403), not an
unhandled "No application configured for scope type 'websocket'"."""

from __future__ import annotations

from typing import Any

from gateway_project.asgi import application


async def test_a_websocket_handshake_is_refused() -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {"type": "websocket", "path": "/v1/chat/completions", "headers": [], "query_string": b"",
             "subprotocols": []}
    await application(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
