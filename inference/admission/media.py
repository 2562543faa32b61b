"""The in-flight media budget (spec 1, Limits: media budget): ``--multimodal-max-inflight-bytes``.

A chat request's inline media (base64 data URLs in ``image_url``, ``video_url`` and ``audio_url``
parts, and base64 ``input_audio`` data) is counted at its decoded size, estimated as
``len(base64) * 3 // 4``. Remote URLs cost nothing: the gateway does not hold their bytes.

A request whose media alone exceeds the budget is refused with 413 multimodal_payload_too_large.
Otherwise it reserves its bytes while in flight. A gRPC EPD request also reserves its images' encoder
input (the preprocessed tensors the gateway makes and holds until they are sent: D91) on top of its
inline bytes, through the same wait (``reserve(size, held=...)``). When the budget is full it waits, FIFO, for at
most :data:`MEDIA_WAIT_SECS` (one second, not the admission queue timeout: media waits while
already holding a concurrency permit, so the wait is kept short), then gets 429
multimodal_inflight_budget.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Mapping

from inference import errors

__all__ = ["MediaBudget", "MEDIA_WAIT_SECS", "inline_media_bytes"]

MEDIA_WAIT_SECS = 1.0

_URL_PARTS = ("image_url", "video_url", "audio_url")


def _data_url_bytes(value: Any) -> int:
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value.startswith("data:"):
        return 0
    comma = value.find(",")
    if comma < 0:
        return 0
    return (len(value) - comma - 1) * 3 // 4


def inline_media_bytes(body: Mapping[str, Any]) -> int:
    """The estimated decoded size of the inline media in a chat request's messages."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    total = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind in _URL_PARTS:
                total += _data_url_bytes(part.get(kind))
            elif kind == "input_audio":
                audio = part.get("input_audio")
                data = audio.get("data") if isinstance(audio, dict) else None
                if isinstance(data, str):
                    total += (len(data) * 3 // 4) if not data.startswith("data:") else _data_url_bytes(data)
    return total


class MediaBudget:
    """Bytes of inline media in flight in this process, at most ``limit``."""

    __slots__ = ("limit", "request_limit", "wait_secs", "in_use", "_waiters")

    def __init__(self, limit: int, wait_secs: float = MEDIA_WAIT_SECS, request_limit: int | None = None) -> None:
        """``request_limit`` (default ``limit``): the most one request may bring. Above ``limit``
        (this process's share of a gateway's budget) such a request waits until it is alone."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.request_limit = max(limit, request_limit or limit)
        self.wait_secs = wait_secs
        self.in_use = 0
        self._waiters: deque[tuple[int, int, asyncio.Future[None]]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def measure(self, body: dict[str, Any]) -> int:
        """The request's media bytes; raises 413 when they alone exceed the budget."""
        size = inline_media_bytes(body)
        if size > self.request_limit:
            raise errors.multimodal_payload_too_large(size, self.request_limit)
        return size

    def _fits(self, size: int, held: int = 0) -> bool:
        return self.in_use + size <= self.limit or self.in_use <= held

    async def reserve(self, size: int, held: int = 0) -> None:
        """Reserve ``size`` bytes, waiting FIFO up to ``wait_secs``; 429 after that. ``held``: bytes the
        same request holds already (a request alone may take more than ``limit``, its own bytes
        included)."""
        if not self._waiters and self._fits(size, held):
            self.in_use += size
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, held, waiter)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait_secs):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release(size)  # granted as we gave up: hand the bytes on
            else:
                waiter.cancel()
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
                self._wake()  # the head may have changed
            if isinstance(exc, TimeoutError):
                raise errors.multimodal_inflight_budget() from None
            raise

    def release(self, size: int) -> None:
        self.in_use -= size
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        """Grant waiters in order while the oldest one fits."""
        waiters = self._waiters
        while waiters:
            size, held, waiter = waiters[0]
            if waiter.done():
                waiters.popleft()
                continue
            if not self._fits(size, held):
                return
            waiters.popleft()
            self.in_use += size
            waiter.set_result(None)
