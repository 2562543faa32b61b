"""Engine generations as an attempt's answer: every generation's first output arrived (so the worker
took the requests), nothing reached the client yet, and :meth:`EngineAnswer.forward` hands the
outputs to the surface's writer.

One answer usually holds one generation. A completions prompt array holds one per prompt, run at
once; their outputs are merged as they come, each choice renumbered ``prompt * n + choice``.

However the answer ends (the last output, a failure, the client leaving and the task being
cancelled, or a discard before forwarding), every engine stream is closed, which cancels its RPC and
sends Abort when the engine had not finished (:meth:`EngineClient.generate`).

A response written to its end often ended on a stop token the engine also stops at (the model's
end-of-sequence, a stop_token_ids entry), one message before the engine's own end of the request:
the streams are read on for up to :data:`SETTLE_SECS` so the engine ends them itself, instead of an
Abort for a request that was finishing anyway. A stop string (which only the gateway knows) is
aborted once that time is up.

Every answer is bounded by ``--request-timeout-secs`` (D104), one timer from the generations'
dispatch to the engine to the response written (:class:`~inference.upstreams.deadline.Deadline`, as
the HTTP relay's exchange): when it passes it cancels the waiting task, as a client disconnect does,
so every engine stream is closed (gRPC Abort, ZMQ ABORT). Before anything reached the client that is
UpstreamFailure TIMEOUT (504 ``upstream_timeout``, or another worker); after the stream started, the
relay's in-band error (``Worker stream failed: timed out``) and the stream's closing event. A
surface whose writing goes on past the generation (a Responses turn followed by MCP tool rounds and
the turns after them, each with a deadline of its own) ends it with :func:`generation_read`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import aclosing
from contextvars import ContextVar
from typing import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence, cast

from common import tracing
from common.config import current_config
from inference.accounting import Delivered
from inference.upstreams.deadline import Deadline
from inference.upstreams.engine import EngineClient, EngineOutput, EngineRequest
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.writers import ResponseWriter

__all__ = ["EngineAnswer", "Deliver", "SETTLE_SECS", "generation_read", "open_generation", "open_generations"]

SETTLE_SECS = 0.05
"""After the response was written, how long the engine streams are read on for the engine's own end."""

Deliver = Callable[[AsyncIterator[EngineOutput], ResponseWriter], Awaitable[Delivered]]
"""Writes the response from the outputs; what it came to (not clean when the engine broke off after
it started) with the usage the surface tallied for it."""

Outputs = AsyncGenerator[EngineOutput, None]

# The deadline of the answer being forwarded in this task (set by EngineAnswer.forward).
_FORWARDING: ContextVar[Deadline | None] = ContextVar("engine_answer_deadline", default=None)


def generation_read() -> None:
    """The answer being forwarded had its generation read to the end and its writer goes on with
    other work (a Responses turn's MCP tool rounds and the turns after them, each with a deadline
    of its own): its deadline stops here instead of running over that work."""
    deadline = _FORWARDING.get()
    if deadline is not None:
        deadline.cancel()


class _Generation:
    __slots__ = ("outputs", "first", "offset")

    def __init__(self, outputs: Outputs, first: EngineOutput | None, offset: int) -> None:
        self.outputs = outputs
        self.first = first
        self.offset = offset  # added to the choice index of every output

    def all(self) -> Outputs:
        """The first output, then the rest as the engine sends them (choice indexes moved by the offset)."""
        if not self.offset:
            return cast(Outputs, _Unmoved(self.first, self.outputs))
        return self._moved()

    async def _moved(self) -> Outputs:
        offset = self.offset
        if self.first is not None:
            yield dataclasses.replace(self.first, index=self.first.index + offset)
        async for output in self.outputs:
            yield dataclasses.replace(output, index=output.index + offset)


class _Unmoved:
    """:meth:`_Generation.all` without an offset: the first output, then the engine generator's own
    awaitables handed out as they are (no generator frame of its own resumed per output). Closing
    it ends it and leaves the engine generator open, as closing a generator suspended in an ``async
    for`` over it does (:meth:`EngineAnswer.discard` closes that one)."""

    __slots__ = ("_first", "_outputs", "_closed")

    def __init__(self, first: EngineOutput | None, outputs: Outputs) -> None:
        self._first = first
        self._outputs = outputs
        self._closed = False

    def __aiter__(self) -> _Unmoved:
        return self

    def __anext__(self) -> Awaitable[EngineOutput]:
        if self._closed:
            return _stop()
        first = self._first
        if first is not None:
            self._first = None
            return _ready(first)
        return self._outputs.__anext__()

    async def aclose(self) -> None:
        self._closed = True
        self._first = None


async def _ready(output: EngineOutput) -> EngineOutput:
    return output


async def _stop() -> EngineOutput:
    raise StopAsyncIteration


async def _merged(generations: Sequence[_Generation], settling: asyncio.Event) -> Outputs:
    """Every generation's outputs, as they arrive. Once closed with ``settling`` set (the response
    was written), the generations are read on for up to :data:`SETTLE_SECS` before they are closed."""
    queue: asyncio.Queue[EngineOutput | BaseException | None] = asyncio.Queue()

    async def pump(generation: _Generation) -> None:
        try:
            async with aclosing(generation.all()) as outputs:
                async for output in outputs:
                    await queue.put(output)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # handed to the consumer
            await queue.put(error)
            return
        await queue.put(None)

    tasks = [asyncio.ensure_future(pump(generation)) for generation in generations]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        if settling.is_set():
            await asyncio.wait(tasks, timeout=SETTLE_SECS)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _timed_out(seconds: float) -> UpstreamFailure:
    """The engine outlived --request-timeout-secs: worded as the HTTP relay's timeout."""
    return UpstreamFailure(FailureKind.TIMEOUT, "timed out", seconds)


class EngineAnswer:
    __slots__ = ("status", "_generations", "_deliver", "span", "_deadline")

    def __init__(self, generations: Sequence[_Generation], deliver: Deliver, deadline: Deadline) -> None:
        self.status = 200
        self._generations = generations
        self._deliver = deliver
        self._deadline = deadline  # --request-timeout-secs from the dispatch (D104), cancelled by discard
        self.span: tracing.Span | None = None  # the engine generate span (--enable-trace), ended by discard

    async def forward(self, writer: ResponseWriter) -> Delivered:
        generations = self._generations
        deadline = self._deadline
        deadline.follow()
        settling = asyncio.Event()
        forwarding = _FORWARDING.set(deadline)
        try:
            source = generations[0].all() if len(generations) == 1 else _merged(generations, settling)
            if self.span is not None:
                source = _observed(source, self.span)
            try:
                async with aclosing(source) as outputs:
                    delivered = await self._deliver(outputs, writer)
                    settling.set()
            except asyncio.CancelledError:
                if not deadline.absorb():
                    raise
                delivered = await _break_off(writer, deadline.seconds)
            deadline.cancel()
            await self._settle()
            return delivered
        finally:
            _FORWARDING.reset(forwarding)
            await self.discard()

    async def _settle(self) -> None:
        """Read what the engine still sends, up to :data:`SETTLE_SECS` (the response is written). One
        generation is read in this task (usually it ended with the last output and stops at once: no
        task and no gather made per request for it)."""

        async def drain(generation: _Generation) -> None:
            async for _ in generation.outputs:
                pass

        generations = self._generations
        try:
            async with asyncio.timeout(SETTLE_SECS):
                if len(generations) == 1:
                    await drain(generations[0])
                else:
                    await asyncio.gather(*(drain(generation) for generation in generations))
        except Exception:  # timed out (closed with an Abort next) or the stream failed: nothing to tell
            return

    async def discard(self) -> None:
        self._deadline.cancel()
        for generation in self._generations:
            await generation.outputs.aclose()
        span = self.span
        if span is not None:
            self.span = None
            span.end()


async def _break_off(writer: ResponseWriter, seconds: float) -> Delivered:
    """The deadline passed while the answer was being written. Nothing sent yet: the relay's 504
    (raised, the attempts loop answers it or tries another worker); else its in-band error and the
    stream's end, with the usage the surface tallied so far."""
    failure = _timed_out(seconds)
    if not writer.started:
        raise failure
    await writer.break_stream(failure.in_band())
    so_far = writer.usage_so_far
    writer.usage_so_far = None
    return Delivered(False, so_far() if so_far is not None else None)


async def _observed(source: Outputs, span: tracing.Span) -> Outputs:
    """``source`` as it is, the choices' finish reasons and the token counts put on the generate span
    (GenAI conventions) as they pass."""
    reasons: list[str] = []
    async with aclosing(source):
        async for output in source:
            if output.finish is not None:
                reasons.append(str(output.finish.reason))
                span.set_attribute("gen_ai.response.finish_reasons", reasons)
                span.set_attribute("gen_ai.usage.input_tokens", output.prompt_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", output.completion_tokens)
            yield output


async def _first(client: EngineClient, request: EngineRequest, offset: int) -> _Generation:
    outputs = cast(Outputs, client.generate(request))
    try:
        first = await anext(outputs)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await outputs.aclose()
        raise
    return _Generation(outputs, first, offset)


def open_generations(
    client: EngineClient, requests: Sequence[EngineRequest], deliver: Deliver, *, choices_per_request: int = 1
) -> Awaitable[EngineAnswer]:
    """Start ``requests`` at once; return once each one's first output arrived. Raises
    UpstreamFailure (retryable: nothing was sent to the client) after closing the others. Under
    --enable-trace in an engine generate span, current while the requests start (so the engine
    receives it as its parent: gRPC metadata, ZMQ trace_headers) and ended with the answer."""
    if tracing.ENABLED:
        return _traced(client, requests, deliver, choices_per_request)
    return _opened(client, requests, deliver, choices_per_request)


async def _traced(
    client: EngineClient, requests: Sequence[EngineRequest], deliver: Deliver, choices_per_request: int
) -> EngineAnswer:
    span = tracing.child("generate", {"gen_ai.operation.name": "generate_content"}, tracing.SpanKind.CLIENT)
    entered = tracing.enter(span)
    try:
        answer = await _opened(client, requests, deliver, choices_per_request)
    except BaseException as error:
        tracing.fail(span, type(error).__name__, str(error))
        span.end()
        raise
    finally:
        tracing.leave(entered)
    answer.span = span
    return answer


async def _opened(
    client: EngineClient, requests: Sequence[EngineRequest], deliver: Deliver, choices_per_request: int
) -> EngineAnswer:
    deadline = Deadline(asyncio.get_running_loop(), current_config().request_timeout_secs)
    try:
        return EngineAnswer(await _started(client, requests, choices_per_request), deliver, deadline)
    except asyncio.CancelledError:
        deadline.cancel()
        if deadline.expired:  # the engine did not answer in time (its streams were closed: Abort)
            raise _timed_out(deadline.seconds) from None
        raise
    except BaseException:
        deadline.cancel()
        raise


async def _started(
    client: EngineClient, requests: Sequence[EngineRequest], choices_per_request: int
) -> list[_Generation]:
    if len(requests) == 1:
        return [await _first(client, requests[0], 0)]
    opened = await asyncio.gather(
        *(_first(client, request, k * choices_per_request) for k, request in enumerate(requests)),
        return_exceptions=True,
    )
    failure = next((item for item in opened if isinstance(item, BaseException)), None)
    if failure is not None:
        for item in opened:
            if isinstance(item, _Generation):
                await item.outputs.aclose()
        raise failure
    return [item for item in opened if isinstance(item, _Generation)]


def open_generation(client: EngineClient, request: EngineRequest, deliver: Deliver) -> Awaitable[EngineAnswer]:
    """:func:`open_generations` of one request."""
    return open_generations(client, [request], deliver)
