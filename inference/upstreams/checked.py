"""A relayed whole answer the gateway reads before it reaches the client: a provider's success
answer that a surface parses into its schema and re-serializes (the Messages API on the Anthropic
provider). Any other answer (an error status) is relayed as it is, with its status and body."""

from __future__ import annotations

from time import perf_counter
from typing import Awaitable, Callable

from inference.accounting import Delivered
from inference.upstreams.base import RelayAnswer
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.usage_scan import usage_in_body
from inference.writers import ResponseWriter

__all__ = ["CheckedAnswer", "checked_whole", "read_whole"]

_JSON = b"application/json"


async def read_whole(answer: RelayAnswer, limit: int) -> bytes:
    """``answer``'s whole body, up to ``limit`` bytes (--max-buffered-response-bytes); beyond it the
    connection is dropped and UpstreamFailure raised."""
    body = bytearray()
    async for chunk in answer.chunks():
        body += chunk
        if len(body) > limit:
            await answer.discard()  # the connection is dropped, not read further
            raise UpstreamFailure(FailureKind.BROKEN, f"the answer is larger than {limit} bytes")
    return bytes(body)


class CheckedAnswer:
    """A 200 answer read whole (up to ``limit`` bytes) and passed through ``check``, which returns the
    body to send or raises the GatewayError to answer (nothing has reached the client then)."""

    __slots__ = ("status", "_answer", "_check", "_limit")

    def __init__(self, answer: RelayAnswer, check: Callable[[bytes], bytes], limit: int) -> None:
        self.status = answer.status
        self._answer = answer
        self._check = check
        self._limit = limit

    async def forward(self, writer: ResponseWriter) -> Delivered:
        reading = perf_counter()
        checked = self._check(await read_whole(self._answer, self._limit))
        await writer.whole(self.status, _JSON, checked, perf_counter() - reading)
        return Delivered(True, usage_in_body(checked))

    async def discard(self) -> None:
        await self._answer.discard()


async def checked_whole(
    opening: Awaitable[RelayAnswer], check: Callable[[bytes], bytes], limit: int
) -> RelayAnswer | CheckedAnswer:
    """The answer ``opening`` gives, its body to be checked when its status is 200."""
    answer = await opening
    return CheckedAnswer(answer, check, limit) if answer.status == 200 else answer
