"""The stand-in provider's Gemini side (its ``gemini`` flavour, :mod:`standins.mock_provider`): what
Gemini's API answers that OpenAI's does not, so tests see what a real Gemini API would receive.

- ``GET /v1/models``: the OpenAI-compatible list as Gemini gives it, each id ``models/<id>`` and
  ``owned_by: google``.
- ``POST /v1/interactions`` (Gemini's Interactions API): ``model`` (one of the provider's) and
  ``input`` (a string, or a list of turns whose text parts are read) required; the answer is an
  ``interaction`` object with one text output ``"heard: " + input text``, or, with ``stream: true``,
  server-sent events (``interaction.start``, one ``content.delta`` per word, ``interaction.complete``).
  Errors are Google's body, ``{"error": {"code", "message", "status"}}``.

Authentication is the provider's Bearer check (the middleware of :mod:`standins.mock_provider`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson
from aiohttp import web

__all__ = ["gemini_routes"]

_JSON_HEADERS = {"Content-Type": "application/json"}
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND"}


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"code": status, "message": message, "status": _STATUS_NAMES.get(status, "INTERNAL")}}
    return web.Response(body=orjson.dumps(body), status=status, headers=_JSON_HEADERS)


def _input_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return None
    texts: list[str] = []
    for turn in value:
        content = turn.get("content") if isinstance(turn, dict) else None
        parts = content if isinstance(content, list) else [turn]
        texts.extend(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return " | ".join(texts)


def _interaction(model: str, text: str, status: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    words = len(text.split())
    return {
        "id": "v1_" + os.urandom(12).hex(), "object": "interaction", "model": model, "status": status, "role": "model",
        "created": now, "updated": now, "outputs": [{"type": "text", "text": text}] if text else [],
        "usage": {"total_input_tokens": words, "total_output_tokens": words, "total_tokens": 2 * words},
    }  # fmt: skip


def _event(fields: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(fields) + b"\n\n"


def gemini_routes(models: tuple[str, ...]) -> list[web.RouteDef]:
    cards = [{"id": f"models/{m}", "object": "model", "created": 0, "owned_by": "google"} for m in models]

    async def listing(_request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps({"object": "list", "data": cards}), headers=_JSON_HEADERS)

    async def interactions(request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read() or b"null")
        except orjson.JSONDecodeError:
            return _error(400, "Invalid JSON payload received.")
        if not isinstance(body, dict):
            return _error(400, "Invalid JSON payload received.")
        model = str(body.get("model") or "").removeprefix("models/")
        if model not in models:
            return _error(404, f"models/{model} is not found.")
        text = _input_text(body.get("input"))
        if text is None:
            return _error(400, "input: a string or a list of turns is required.")
        heard = "heard: " + text
        if body.get("stream") is not True:
            return web.Response(body=orjson.dumps(_interaction(model, heard, "completed")), headers=_JSON_HEADERS)
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        opening = _interaction(model, "", "in_progress")
        await resp.write(_event({"event_type": "interaction.start", "interaction": opening}))
        for i, word in enumerate(heard.split(" ")):
            delta = {"type": "text", "text": word if i == 0 else " " + word}
            await resp.write(_event({"event_type": "content.delta", "index": 0, "delta": delta}))
        done = {**_interaction(model, heard, "completed"), "id": opening["id"]}
        await resp.write(_event({"event_type": "interaction.complete", "interaction": done}))
        await resp.write_eof()
        return resp

    return [web.get("/v1/models", listing), web.post("/v1/interactions", interactions)]
