"""Admission as one async context manager: a concurrency permit, then the request's inline media
reserved from the in-flight budget; both released on every path out (answer, error, cancellation).

    async with Admission(data_plane.permits, data_plane.media, media_bytes):
        ...  # select a worker and run the attempts
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Awaitable, Generator

from inference.admission.media import MediaBudget
from inference.admission.permits import PermitPool

__all__ = ["Admission"]


class Admission:
    """Holds what the request was admitted with; either part is skipped when its limit is off."""

    __slots__ = ("_permits", "_media", "_media_bytes", "_held_permit", "_held_media", "_patient")

    def __init__(
        self, permits: PermitPool | None, media: MediaBudget | None, media_bytes: int, *, patient: bool = False
    ) -> None:
        self._patient = patient  # waits for its permit however long the queue (PermitPool.acquire)
        self._permits = permits
        self._media = media if media_bytes else None
        self._media_bytes = media_bytes
        self._held_permit = False
        self._held_media = False

    # Plain methods returning awaitables: with no limit on (the default) entering and leaving cost no
    # coroutine at all, on every inference request.
    def __aenter__(self) -> Awaitable[None]:
        if self._permits is None and self._media is None:
            return _NOTHING
        return self._acquire()

    def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> Awaitable[None]:
        self._release()
        return _NOTHING

    async def _acquire(self) -> None:
        if self._permits is not None:
            await self._permits.acquire(patient=self._patient)  # 429 queue full, 503 queue timeout
            self._held_permit = True
        if self._media is not None:
            try:
                await self._media.reserve(self._media_bytes)  # 429 when the budget stays full
            except BaseException:
                self._release()
                raise
            self._held_media = True

    def _release(self) -> None:
        if self._held_media and self._media is not None:
            self._held_media = False
            self._media.release(self._media_bytes)
        if self._held_permit and self._permits is not None:
            self._held_permit = False
            self._permits.release()


class _Nothing:
    """An awaitable that is already done (awaiting it returns None at once)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return iter(())  # type: ignore[return-value]


_NOTHING = _Nothing()
