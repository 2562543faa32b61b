"""Server-sent events as an upstream sends them, read by the gateway itself (a provider's turns it
drives: the Responses API's provider turns, the Messages API's MCP tool loop)."""

from __future__ import annotations

from typing import Any, AsyncIterator

import orjson

from inference.upstreams.failures import FailureKind, UpstreamFailure

__all__ = ["sse_events"]


async def sse_events(chunks: AsyncIterator[bytes], max_event_bytes: int) -> AsyncIterator[dict[str, Any]]:
    """The JSON ``data`` of each server-sent event, in order (comments and non-JSON data skipped).
    An event larger than ``max_event_bytes`` (--max-buffered-response-bytes) fails the turn."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
        if len(buffer) > max_event_bytes and b"\n\n" not in buffer:
            raise UpstreamFailure(FailureKind.BROKEN, f"a provider event is larger than {max_event_bytes} bytes")
        while (end := buffer.find(b"\n\n")) >= 0:
            if end > max_event_bytes:
                raise UpstreamFailure(FailureKind.BROKEN, f"a provider event is larger than {max_event_bytes} bytes")
            block, buffer = buffer[:end], buffer[end + 2 :]
            data = b"\n".join(line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:"))
            if not data or data == b"[DONE]":
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                yield event
