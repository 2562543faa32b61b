"""HTTP prefill/decode dual dispatch over the HTTP relay (:mod:`inference.upstreams.http`).

One request goes to a prefill worker and its decode worker at once, with the same body (the
bootstrap fields already injected, :func:`inference.routing.pd.inject_bootstrap`). The client gets
the decode worker's answer (status, body, stream); the prefill answer is drained, and kept only for
its ``meta_info.input_token_logprobs`` when logprobs were asked (merged in front of the decode's).

No side is left waiting for the other: a transport failure of either side before the decode's
answer is known cancels the other at once (closing its connection, which aborts the request on the
worker) and fails the attempt; a decode error status cancels the prefill; a prefill that fails
(transport, or an error status) while the decode answer is being relayed ends the relay (the error
in-band once the response started) and closes the decode connection; and a prefill still running
when the decode answer ended is cancelled. The total request timeout of the relay bounds each side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from time import perf_counter
from typing import Any

import orjson

from common import pd_metrics
from inference import errors
from inference.accounting import BROKEN, CLEAN, Delivered
from inference.errors import GatewayError
from inference.routing.dp_ranks import give_back
from inference.upstreams.base import RelayAnswer, RelayRequest
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.http import HttpRelay
from inference.upstreams.usage_scan import StreamUsage, usage_in_body, usage_key
from inference.writers import ResponseWriter

__all__ = ["HeldAnswer", "PdHttpDispatch", "PdAnswer", "PdFailure", "PdTimings"]

log = logging.getLogger(__name__)

_ERROR_DETAIL_BYTES = 2048


class PdFailure(UpstreamFailure):
    """An upstream failure of one side of a PD pair: ``side`` (prefill or decode) and that side's
    worker, so the failure is counted against the worker that failed, not its partner."""

    def __init__(self, side: str, worker_id: str, failure: UpstreamFailure) -> None:
        super().__init__(failure.kind, f"{side} {failure.detail}", failure.timeout_secs, rejected=failure.rejected)
        self.side = side
        self.worker_id = worker_id


def _sided(side: str, request: RelayRequest, failure: BaseException) -> BaseException:
    if isinstance(failure, UpstreamFailure) and not isinstance(failure, PdFailure):
        return PdFailure(side, request.worker.id, failure)
    return failure


class PdTimings:
    """When each side answered, for the gw_pd_* metrics: seconds from dispatch to the decode's
    answer head (the PD time to first byte) and to the prefill's whole answer."""

    __slots__ = ("started", "decode_head_secs", "prefill_secs")

    def __init__(self) -> None:
        self.started = perf_counter()
        self.decode_head_secs: float | None = None
        self.prefill_secs: float | None = None


async def _cancelled(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait until they ended (their connections closed)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        try:
            result = await task
        except BaseException:  # noqa: BLE001 - each side's own ending is of no interest here
            continue
        if isinstance(result, RelayAnswer):
            await result.discard()


def _input_logprobs(body: bytes | None) -> list[Any] | None:
    if not body:
        return None
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    logprobs = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
    return logprobs if isinstance(logprobs, list) else None


def _merged(answer: Any, prefill_logprobs: list[Any]) -> bool:
    """Put the prefill's input logprobs in front of the decode answer's; False when it has none."""
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    own = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(own, list):
        return False
    assert isinstance(meta, dict)
    meta["input_token_logprobs"] = prefill_logprobs + own
    return True


class PdHttpDispatch:
    """Sends a PD request to both sides; one per process, over the gateway's HTTP relay."""

    def __init__(self, relay: HttpRelay) -> None:
        self._relay = relay

    async def open(
        self, prefill: RelayRequest, decode: RelayRequest, logprobs: bool = False, model: str | None = None
    ) -> PdAnswer:
        """Send both requests concurrently; return once the decode worker's status is known.

        The prefill worker's load (requests in flight) and circuit breaker are kept here, for as
        long as its side runs; the decode worker's are the caller's (the attempts loop's).

        Raises UpstreamFailure when either side could not be reached, timed out or broke off before
        the decode's status was known (the other side cancelled), and GatewayError
        (prefill_failed) when the prefill worker answered an error status first."""
        timings = PdTimings()
        prefill_task = asyncio.create_task(self._prefill(prefill, logprobs, timings))
        _account(prefill_task, prefill, model)
        decode_task = asyncio.create_task(self._relay.open(decode))
        try:
            waiting: set[asyncio.Task[Any]] = {prefill_task, decode_task}
            while not decode_task.done():
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if prefill_task in done:
                    waiting.discard(prefill_task)
                    failure = prefill_task.exception()
                    if failure is not None:
                        log.warning("PD prefill %s failed, decode %s cancelled: %s", prefill.worker.url, decode.worker.url, failure)
                        raise _sided("prefill", prefill, failure)
            try:
                answer = decode_task.result()
            except UpstreamFailure as failure:
                raise _sided("decode", decode, failure) from None
        except BaseException:
            await _cancelled(prefill_task, decode_task)
            raise
        timings.decode_head_secs = perf_counter() - timings.started
        if 200 <= answer.status < 300:
            pd_metrics.record_pd_ttft(model, prefill.worker.record.runtime_type, timings.decode_head_secs)
        if not 200 <= answer.status < 300:
            failed = prefill_task.done() and (prefill_task.cancelled() or prefill_task.exception() is not None)
            # The decode worker refused or failed: its answer is the client's; nothing waits for the prefill.
            await _cancelled(prefill_task)
            if answer.status >= 500 and not failed:
                # Read before it is relayed: what the decode reports ("Decode handshake failed ...",
                # "Decode transfer failed ...") is counted; the prefill's own report, when it failed
                # first, was counted on its side.
                answer = await self._held(answer, decode)
                pd_metrics.record_reported_failure(answer.body[:_ERROR_DETAIL_BYTES].decode("utf-8", "replace"))
            return PdAnswer(answer, None, decode, prefill, logprobs, timings)
        return PdAnswer(answer, prefill_task, decode, prefill, logprobs, timings)

    async def _held(self, answer: RelayAnswer, request: RelayRequest) -> HeldAnswer:
        """An error answer of the decode read whole (past :attr:`HttpRelay.max_answer_bytes` the rest
        is dropped), to be relayed as it came."""
        held: list[bytes] = []
        size = 0
        try:
            async for chunk in answer.chunks():
                if size < self._relay.max_answer_bytes:
                    held.append(chunk)
                    size += len(chunk)
        except UpstreamFailure as failure:
            raise _sided("decode", request, failure) from None
        return HeldAnswer(answer.status, answer.content_type, b"".join(held)[: self._relay.max_answer_bytes])

    async def _prefill(self, request: RelayRequest, keep: bool, timings: PdTimings) -> bytes | None:
        """The prefill side: its answer read to the end (kept when ``keep`` or an error status)."""
        answer = await self._relay.open(request)
        ok = 200 <= answer.status < 300
        limit = self._relay.max_answer_bytes if ok else _ERROR_DETAIL_BYTES
        held: list[bytes] = []
        size = 0
        async for chunk in answer.chunks():
            if (keep or not ok) and size < limit:
                held.append(chunk)
                size += len(chunk)
        timings.prefill_secs = perf_counter() - timings.started
        body = b"".join(held)
        if not ok:
            detail = body[:_ERROR_DETAIL_BYTES].decode("utf-8", "replace")
            pd_metrics.record_reported_failure(detail)  # "Prefill bootstrap failed ...", "Prefill transfer failed ..."
            raise errors.prefill_failed(answer.status, detail)
        return body if keep and size <= limit else None


def _account(task: asyncio.Task[bytes | None], request: RelayRequest, model: str | None) -> None:
    """The prefill worker's in-flight count and breaker while its side runs; its duration."""
    load = request.worker.load
    load.in_flight += 1
    started = perf_counter()

    def ended(done: asyncio.Task[bytes | None]) -> None:
        load.in_flight -= 1
        give_back(request.worker)  # its data-parallel rank, under --dp-aware
        if done.cancelled():
            return
        failure = done.exception()
        if isinstance(failure, UpstreamFailure):
            load.breaker.record(not failure.rejected)
        elif failure is None:
            load.breaker.record(False)
            pd_metrics.record_pd_prefill(model, request.worker.record.runtime_type, perf_counter() - started)
        elif isinstance(failure, GatewayError):  # an error status: an answer, judged as the relay judges one
            load.breaker.record(load.breaker.config.counts_as_failure(failure.status))

    task.add_done_callback(ended)


class HeldAnswer(RelayAnswer):
    """An answer already read whole (a decode's error, read for what it reports), relayed as it came."""

    __slots__ = ("body",)

    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        super().__init__(status, content_type)
        self.body = body

    async def discard(self) -> None:
        return None

    async def forward(self, writer: ResponseWriter) -> Delivered:
        await writer.whole(self.status, self.content_type.encode("latin-1"), self.body)
        return CLEAN

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.body


class PdAnswer(RelayAnswer):
    """The decode worker's answer, relayed while the prefill side is watched."""

    __slots__ = ("_decode", "_prefill", "_request", "_prefill_request", "_logprobs", "timings")

    def __init__(
        self,
        decode: RelayAnswer,
        prefill: asyncio.Task[bytes | None] | None,
        request: RelayRequest,
        prefill_request: RelayRequest,
        logprobs: bool,
        timings: PdTimings,
    ) -> None:
        super().__init__(decode.status, decode.content_type)
        self._decode = decode
        self._prefill = prefill
        self._request = request
        self._prefill_request = prefill_request
        self._logprobs = logprobs
        self.timings = timings

    @property
    def _streamed(self) -> bool:
        return self._request.stream and self.status == 200 and self.content_type.startswith("text/event-stream")

    async def discard(self) -> None:
        if self._prefill is not None:
            await _cancelled(self._prefill)
        await self._decode.discard()

    async def forward(self, writer: ResponseWriter) -> Delivered:
        prefill = self._prefill
        if prefill is None:
            return await self._decode.forward(writer)
        if self._logprobs:
            try:
                prefill_body = await prefill
            except BaseException as broke:
                await self._decode.discard()
                raise _sided("prefill", self._prefill_request, broke) from None
            logprobs = _input_logprobs(prefill_body)
            if logprobs is not None:
                return await self._forward_merged(writer, logprobs)
            return await self._decode.forward(writer)
        forwarding = asyncio.create_task(self._decode.forward(writer))
        try:
            done, _ = await asyncio.wait({forwarding, prefill}, return_when=asyncio.FIRST_COMPLETED)
            if forwarding in done:
                return forwarding.result()
            failure = prefill.exception()
            if failure is None:
                return await forwarding
            log.warning("PD prefill %s failed while its decode answered: %s", self._request.worker.url, failure)
            await _cancelled(forwarding)
            return await self._prefill_broke(writer, failure)
        except BaseException:
            await _cancelled(forwarding)
            raise
        finally:
            if not prefill.done():
                await _cancelled(prefill)  # the decode answer ended: nothing needs the prefill any more

    async def _prefill_broke(self, writer: ResponseWriter, failure: BaseException) -> Delivered:
        """The prefill side failed after the decode answer's status was known."""
        error = failure.in_band() if isinstance(failure, UpstreamFailure) else failure
        if not writer.started:
            raise _sided("prefill", self._prefill_request, failure)
        assert isinstance(error, GatewayError)
        if self._streamed:
            await writer.break_stream(error)
            return BROKEN
        writer.abort(error.message)

    async def _forward_merged(self, writer: ResponseWriter, logprobs: list[Any]) -> Delivered:
        """The decode answer with the prefill's input logprobs in front of its own."""
        if not self._streamed:
            body = b"".join([chunk async for chunk in self._decode.chunks()])
            try:
                answer = orjson.loads(body)
            except orjson.JSONDecodeError:
                answer = None
            if answer is not None and _merged(answer, logprobs):
                body = orjson.dumps(answer)
            await writer.whole(self.status, self.content_type.encode("latin-1"), body)
            return Delivered(True, usage_in_body(body, usage_key(self._request.path)) if self.status == 200 else None)
        await writer.open_stream()
        pending = b""
        scan = StreamUsage(usage_key(self._request.path), self._request.added_usage)
        try:
            async for chunk in self._decode.chunks():
                pending += scan.feed(chunk)
                *events, pending = pending.split(b"\n\n")
                if events:
                    await writer.chunk(b"".join(_merged_event(event, logprobs) + b"\n\n" for event in events))
        except UpstreamFailure as failure:
            await writer.break_stream(failure.in_band())
            return Delivered(False, scan.usage())
        pending += scan.end()
        if pending.strip():
            await writer.chunk(_merged_event(pending, logprobs) + b"\n\n")
        await writer.end_stream()
        return Delivered(True, scan.usage())

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        prefill = self._prefill
        try:
            async for chunk in self._decode.chunks():
                if prefill is not None and prefill.done() and not prefill.cancelled():
                    failure = prefill.exception()
                    if isinstance(failure, UpstreamFailure):
                        raise _sided("prefill", self._prefill_request, failure)
                    if failure is not None:
                        raise UpstreamFailure(FailureKind.BROKEN, f"prefill failed: {failure}")
                yield chunk
        finally:
            if prefill is not None and not prefill.done():
                await _cancelled(prefill)


def _merged_event(event: bytes, logprobs: list[Any]) -> bytes:
    """One SSE event with the prefill's input logprobs merged into its data, if it carries any."""
    if not event.startswith(b"data:"):
        return event
    data = event[5:].strip()
    if data == b"[DONE]":
        return event
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        return event
    if not _merged(answer, logprobs):
        return event
    return b"data: " + orjson.dumps(answer)
