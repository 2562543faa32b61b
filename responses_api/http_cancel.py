"""POST /v1/responses/{id}/cancel for responses HTTP workers made (spec 2, "Cancel on HTTP workers"):
the gateway stores nothing of those, so a cancel for an id it does not have is sent to every
registered HTTP worker (regular and PD; not external providers, whose responses the gateway stores,
nor engines); the first success is the answer, otherwise the last error."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import orjson

from common.http_clients import http_client
from inference import errors
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerHandle, WorkerKind

__all__ = ["CANCEL_TIMEOUT_SECS", "WorkerAnswer", "acancel_on_http_workers"]

CANCEL_TIMEOUT_SECS = 30.0
_MAX_ANSWER_BYTES = 1 << 20  # a worker's cancel answer is one response object


@dataclass(frozen=True, slots=True)
class WorkerAnswer:
    status: int
    content_type: str
    body: bytes


def _http_workers() -> list[WorkerHandle]:
    return [
        handle for handle in REGISTRY.snapshot.workers
        if handle.record.kind is WorkerKind.RELAYED
    ]  # fmt: skip


def _failed(detail: str) -> WorkerAnswer:
    """A worker that gave no usable answer, in the standard envelope (502 upstream_unavailable)."""
    return WorkerAnswer(502, "application/json", orjson.dumps(errors.upstream_unavailable(detail).to_dict()))


async def _cancel_on(client: httpx.AsyncClient, handle: WorkerHandle, path: str) -> WorkerAnswer:
    headers = {"Authorization": f"Bearer {handle.record.api_key}"} if handle.record.api_key else {}
    try:
        async with client.stream("POST", handle.url + path, headers=headers, timeout=CANCEL_TIMEOUT_SECS) as answer:
            body = bytearray()
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > _MAX_ANSWER_BYTES:
                    return _failed(f"{handle.url} answered more than {_MAX_ANSWER_BYTES} bytes")
            return WorkerAnswer(answer.status_code, answer.headers.get("content-type", "application/json"), bytes(body))
    except httpx.HTTPError as exc:
        return _failed(f"{handle.url} did not answer ({type(exc).__name__})")


async def acancel_on_http_workers(response_id: str) -> WorkerAnswer | None:
    """The answer of the first worker that cancelled ``response_id``, else the last one's error;
    None when no HTTP worker is registered."""
    handles = _http_workers()
    if not handles:
        return None
    path = f"/v1/responses/{quote(response_id, safe='')}/cancel"
    client = http_client()
    answers = await asyncio.gather(*(_cancel_on(client, handle, path) for handle in handles))
    for answer in answers:
        if 200 <= answer.status < 300:
            return answer
    return answers[-1]
