"""What every gRPC engine client shares: the worker's one channel, folding the engine's stream of
``chunk`` and ``complete`` messages into neutral :class:`EngineOutput`, the Abort sent when a
generation ends early, and the mapping of RPC errors to :class:`UpstreamFailure`.

A runtime module (sglang.py, vllm.py, ...) is only a codec: it builds its GenerateRequest from an
:class:`EngineRequest`, turns each GenerateResponse into a :class:`WireChunk` or
:class:`WireComplete`, and maps its control messages.

Wire facts the fold relies on (the engines' own servicers):

- chunks carry only the tokens new since the previous chunk (and the logprobs of those tokens);
- when streaming, the final chunk's tokens come again in ``complete.output_ids``: they are never
  counted twice; without streaming there are no chunks and ``complete`` carries every token;
- SGLang, TokenSpeed and TensorRT-LLM report cumulative completion counts, vLLM and MLX the count
  of the chunk's own tokens (the client accumulates): ``counts_cumulative`` says which;
- n > 1 is one request; ``index`` tells the choices apart and each ends with its own ``complete``.

An operation is available when the runtime's service declares its RPC in the proto
(:meth:`GrpcEngineClient.declares`): GetLoads, FlushCache and StartProfile/StopProfile exist on
SGLang, vLLM and TokenSpeed only; on TensorRT-LLM and MLX they raise ``UpstreamFailure``.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Generic, TypeVar, cast

import grpc
from google.protobuf.json_format import MessageToDict

from common import tracing
from inference.routing.load_report import EngineLoad
from inference.upstreams import engine as engine_limits
from inference.upstreams.engine import (
    ENGINE_OUTPUT_STEP,
    CommandResult,
    EmbedResult,
    EngineClient,
    EngineHealth,
    EngineOutput,
    EngineRequest,
    Finish,
    FinishReason,
    ModelInfo,
    ProfileOptions,
    TokenizerBundle,
    TokenLogprobs,
)
from inference.upstreams.failures import EngineEndedWithError, FailureKind, UpstreamFailure
from inference.upstreams.grpc.channel import WorkerChannel, failure_from_rpc_error, failure_from_status
from inference.upstreams.grpc.h2 import GrpcStatusError, H2Call
from inference.upstreams.grpc.wire import NO_FIELD, ChunkTable, chunk_reader
from protos import common_pb2

__all__ = [
    "GrpcEngineClient",
    "WireChunk",
    "WireComplete",
    "finish_reason",
    "tokenized",
    "input_logprobs",
    "model_info_from",
    "output_logprobs",
    "profile_request",
    "scheduler_load",
]

logger = logging.getLogger(__name__)

ResponseT = TypeVar("ResponseT")
T = TypeVar("T")
StubT = TypeVar("StubT")

ABORT_REASON = "aborted by the gateway"


@dataclass(slots=True)
class WireChunk:
    """One streamed chunk as the runtime sent it (counts as reported, not yet folded). Not frozen: one
    is made per engine message, and a frozen dataclass's constructor (``object.__setattr__`` per
    field) costs about twice a plain one's; nothing keeps or shares it past :meth:`_pieces`."""

    index: int
    token_ids: tuple[int, ...]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    logprobs: tuple[TokenLogprobs, ...] | None = None
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None


ChunkFields = tuple[
    int, tuple[int, ...], int, int, int, int, "tuple[TokenLogprobs, ...] | None", "tuple[TokenLogprobs | None, ...] | None"
]
"""A chunk's fields in :class:`WireChunk`'s order, read without building one (:meth:`GrpcEngineClient._chunk_fields`)."""


@dataclass(frozen=True, slots=True)
class WireComplete:
    """A choice's closing message as the runtime sent it."""

    index: int
    output_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    matched_token_id: int | None = None
    matched_stop_str: str | None = None
    logprobs: tuple[TokenLogprobs, ...] | None = None
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None
    spec_accepted_tokens: int = 0  # speculative decoding: draft tokens accepted, and proposed
    spec_draft_tokens: int = 0
    kv_transfer_params: str | None = None  # JSON text (vLLM's sequential PD: the prefill's handoff)


def _merged(a: WireChunk, b: WireChunk) -> bool:
    """Fold ``b`` into ``a`` (two chunks of one choice as one: their token ids, logprobs and latest
    counts) when nothing is lost by it (same logprob shape; ``b`` carries no prompt logprobs): True;
    False and ``a`` unchanged otherwise. ``a`` is a chunk :meth:`GrpcEngineClient._pieces` decoded
    itself, so changing it in place is safe."""
    if a.index != b.index or b.prompt_logprobs is not None or (a.logprobs is None) != (b.logprobs is None):
        return False
    a.token_ids = a.token_ids + b.token_ids
    a.prompt_tokens = b.prompt_tokens or a.prompt_tokens
    a.completion_tokens = max(a.completion_tokens, b.completion_tokens)
    a.cached_tokens = max(a.cached_tokens, b.cached_tokens)
    a.reasoning_tokens = max(a.reasoning_tokens, b.reasoning_tokens)
    if a.logprobs is not None and b.logprobs is not None:
        a.logprobs = a.logprobs + b.logprobs
    return True


def tokenized(message: Any, input_ids: tuple[int, ...], original_text: str | None, *, ids_field: str = "input_ids") -> Any:
    """Fill ``message.tokenized`` in place (a nested message built apart and copied in costs a second
    copy of every id: about 130 us for an 8k-token prompt) and return ``message``."""
    target = message.tokenized
    getattr(target, ids_field).extend(input_ids)
    if original_text:
        target.original_text = original_text
    return message


def finish_reason(reason: str) -> FinishReason:
    """An engine's finish-reason string as a neutral reason; an engine error raises."""
    value = reason.strip().lower()
    if value in ("length", "max_tokens"):
        return FinishReason.LENGTH
    if value in ("abort", "aborted", "cancelled", "canceled"):
        return FinishReason.ABORT
    if value in ("error", "failed"):
        raise EngineEndedWithError(f"the engine ended the request with {reason!r}")
    return FinishReason.STOP  # "stop", "eos", "stop_token", "" (proto3's unset)


def output_logprobs(message: Any) -> tuple[TokenLogprobs, ...] | None:
    """``OutputLogProbs`` (token_logprobs, token_ids, top_logprobs[values, token_ids]), the shape the
    SGLang, vLLM, TokenSpeed and MLX protos share; None when it carries no token."""
    ids = list(message.token_ids)
    if not ids:
        return None
    values = list(message.token_logprobs)
    tops = list(message.top_logprobs)
    result = []
    for position, token_id in enumerate(ids):
        top: tuple[tuple[int, float], ...] = ()
        if position < len(tops):
            top = tuple(zip((int(t) for t in tops[position].token_ids), (float(v) for v in tops[position].values)))
        logprob = float(values[position]) if position < len(values) else 0.0
        result.append(TokenLogprobs(int(token_id), logprob, top))
    return tuple(result)


def input_logprobs(message: Any) -> tuple[TokenLogprobs | None, ...] | None:
    """``InputLogProbs`` (each value proto3-optional: the first prompt token has none)."""
    ids = list(message.token_ids)
    if not ids:
        return None
    values = list(message.token_logprobs)
    tops = list(message.top_logprobs)
    result: list[TokenLogprobs | None] = []
    for position, token_id in enumerate(ids):
        entry = values[position] if position < len(values) else None
        if entry is None or not entry.HasField("value"):
            result.append(None)
            continue
        top: tuple[tuple[int, float], ...] = ()
        if position < len(tops):
            top = tuple(zip((int(t) for t in tops[position].token_ids), (float(v) for v in tops[position].values)))
        result.append(TokenLogprobs(int(token_id), float(entry.value), top))
    return tuple(result)


@dataclass(slots=True)
class _Choice:
    streamed: bool = False
    completion_tokens: int = 0
    finished: bool = False


class GrpcEngineClient(EngineClient, Generic[ResponseT]):
    """An engine client over ``grpc.aio``: one :class:`WorkerChannel` per worker.

    Pass ``channel`` to reuse the channel runtime detection opened; otherwise one is made from
    ``url``. ``control_timeout`` bounds each control RPC (health, model info, loads, flush,
    profiling, abort); a generation has no deadline here (the caller's timeout cancels it).
    """

    counts_cumulative: ClassVar[bool] = True
    """Whether chunks report cumulative completion counts (else each chunk's own count)."""
    messages: ClassVar[ModuleType]
    """The runtime's generated message module (its HealthCheckRequest, GetModelInfoRequest, ...)."""
    _route: ClassVar[tuple[str, Callable[[bytes], Any]] | None] = None  # per runtime, found once

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        channel: WorkerChannel | None = None,
        control_timeout: float = 30.0,
    ) -> None:
        super().__init__(url, api_key=api_key)
        self.channel = channel if channel is not None else WorkerChannel(url, api_key=api_key)
        self.control_timeout = control_timeout
        self._aborts: set[asyncio.Task[None]] = set()
        self._stub: Any = None
        self._stub_channel: grpc.aio.Channel | None = None

    # -- the codec, per runtime -------------------------------------------------------------

    @abstractmethod
    def encode(self, request: EngineRequest) -> Any:
        """The runtime's GenerateRequest for ``request``."""

    def _encoded(self, request: EngineRequest) -> Any:
        """:meth:`encode`, with a value the runtime's message cannot carry (an integer past its
        field's range: max_tokens or top_k beyond uint32) refused as the engine would refuse it
        (OUT_OF_RANGE: the client's error, 400), not a gateway failure."""
        try:
            return self.encode(request)
        except ValueError as error:
            raise UpstreamFailure.refused(f"{self.runtime} cannot take the request: {error}") from None

    def _open_generate(self, request: EngineRequest) -> grpc.aio.UnaryStreamCall[Any, ResponseT]:
        """Start the Generate RPC for ``request`` on the worker's grpc.aio channel."""
        return cast("grpc.aio.UnaryStreamCall[Any, ResponseT]", self.stub.Generate(self._encoded(request), metadata=self._traced_metadata()))

    def _generate_route(self) -> tuple[str, Callable[[bytes], Any]]:
        """The Generate method's path and its reply's parser (from the runtime's service)."""
        cls = type(self)
        route = cls.__dict__.get("_route")
        if route is None:
            for service in cls.messages.DESCRIPTOR.services_by_name.values():
                method = service.methods_by_name.get("Generate")
                if method is not None:
                    reply = getattr(cls.messages, method.output_type.name)
                    route = (f"/{service.full_name}/Generate", reply.FromString)
                    break
            else:
                raise self.unsupported("Generate")
            cls._route = route
        return cast("tuple[str, Callable[[bytes], Any]]", route)

    async def _start_generate(self, request: EngineRequest) -> Any:
        """The Generate call: read on the event loop for a plaintext worker (:mod:`.h2`), else by
        grpc.aio. Either is iterated with ``async for`` and stopped with ``cancel()``."""
        native = self.channel.native
        if native is None:
            return self._open_generate(request)
        path, parse = self._generate_route()
        return await native.unary_stream(
            path, self._encoded(request).SerializeToString(), self._traced_metadata(), self._wire_decode(request) or parse
        )

    wire_table: ClassVar[ChunkTable | None] = None
    """The runtime's chunk fields for :func:`~.wire.read_chunk` (:func:`~.wire.chunk_table` of its
    messages); None: its chunks are read by :meth:`_decode` from the parsed message."""

    def _wire_decode(self, request: EngineRequest) -> Callable[[bytes], Any] | None:
        """The event-loop reader's decode of one GenerateResponse, when the runtime has a
        :attr:`wire_table`: a chunk of the usual shape as its :data:`ChunkFields` tuple (read from
        the bytes), anything else the parsed message. None (no table, a whole answer: one complete
        message, or a request id too long for a one-byte length): the reply's parser."""
        table = self.wire_table
        if table is None or not request.stream:
            return None
        if table.id_tag == NO_FIELD:  # the runtime's responses carry no request id
            return chunk_reader(table, b"")
        request_id = request.request_id.encode()
        if len(request_id) >= 0x80:
            return None
        return chunk_reader(table, bytes((table.id_tag, len(request_id))) + request_id)

    def _traced_metadata(self) -> tuple[tuple[str, str], ...]:
        """The Generate call's metadata: under --enable-trace with the current span's traceparent and
        tracestate (the gateway's generate span as the engine's parent, D74)."""
        if tracing.ENABLED:
            return self.metadata + tracing.carrier()
        return self.metadata

    @abstractmethod
    def _decode(self, response: ResponseT) -> WireChunk | WireComplete | None:
        """One GenerateResponse as a chunk or a complete (None: nothing in it)."""

    def _chunk_fields(self, response: ResponseT) -> ChunkFields | None:
        """A chunk's fields as :meth:`_decode` would build its :class:`WireChunk` (None: not a chunk,
        read by :meth:`_decode`), for the message of one token, folded without the chunk object.
        Used when :attr:`reads_chunk_fields`."""
        raise NotImplementedError

    reads_chunk_fields: ClassVar[bool] = False

    @abstractmethod
    async def _send_abort(self, request_id: str, reason: str) -> None: ...

    @property
    @abstractmethod
    def stub(self) -> Any:
        """The runtime's async stub on the worker's channel (see :meth:`_stub_on`)."""

    # -- shared ------------------------------------------------------------------------------

    def _stub_on(self, factory: Callable[[grpc.aio.Channel], StubT]) -> StubT:
        """The runtime's stub on the worker's channel, made once per channel."""
        channel = self.channel.get()
        if self._stub_channel is not channel:
            self._stub = factory(channel)
            self._stub_channel = channel
        return cast(StubT, self._stub)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self.channel.metadata

    @classmethod
    def declares(cls, rpc: str) -> bool:
        """Whether the runtime's service declares ``rpc`` in its proto."""
        return any(rpc in service.methods_by_name for service in cls.messages.DESCRIPTOR.services_by_name.values())

    @classmethod
    def offers(cls, rpc: str) -> bool:
        return cls.declares(rpc)

    def _require(self, rpc: str) -> None:
        """Raise :meth:`unsupported` unless the runtime's service has ``rpc``."""
        if not self.declares(rpc):
            raise self.unsupported(rpc)

    async def _control(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run one unary control RPC, mapping its errors to :class:`UpstreamFailure`."""
        try:
            return await call()
        except grpc.aio.AioRpcError as error:
            raise failure_from_rpc_error(error, f"{self.runtime} {what}") from None

    async def abort(self, request_id: str, reason: str = ABORT_REASON) -> None:
        await self._control("Abort", lambda: self._send_abort(request_id, reason))

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Yield each choice's outputs; end when every choice finished.

        When the iteration stops before the engine settled the request (the consumer stopped
        iterating, its task was cancelled, or the stream failed here), the RPC is cancelled and
        Abort is sent for ``request.request_id``, once, before the iteration's exception
        propagates: callers need not abort themselves.
        """
        choices = [_Choice() for _ in range(max(1, request.sampling.n))]
        remaining = len(choices)
        yielded = False
        settled = False  # the engine ended the request itself: nothing to abort
        call: Any = None
        try:
            try:
                call = await self._start_generate(request)
                # The event-loop reader's call (h2.py) is read here, from its queue, waiting on its
                # arrival future when the queue is empty: no ``__anext__`` coroutine made, resumed and
                # finished per message; what else arrived is taken at once (one step for a burst).
                # A grpc.aio call is iterated.
                native: H2Call[ResponseT] | None = call if type(call) is H2Call else None
                if native is not None:
                    waiting = native._messages
                    credit_after = native._connection.credit_after
                    loop = asyncio.get_running_loop()
                else:
                    responses = call.__aiter__()
                decode = self._decode
                chunk_fields = self._chunk_fields if self.reads_chunk_fields else None
                cumulative = self.counts_cumulative
                count = len(choices)
                while True:
                    if native is not None:
                        if not waiting:
                            if native.done:
                                if native.error is not None:
                                    raise native.error
                                break
                            native._waiter = waiter = loop.create_future()
                            await waiter
                            continue
                        response = waiting.popleft()
                        if waiting:
                            more: list[ResponseT] | tuple[()] = native.drain()
                        else:
                            more = ()
                            if native._uncredited >= credit_after:
                                native._credit()  # (its test written out: most messages give nothing back)
                    else:
                        try:
                            response = await responses.__anext__()
                        except StopAsyncIteration:
                            break
                        more = ()
                    if more:
                        pieces: Iterable[WireChunk | WireComplete] = self._pieces(response, more)
                    else:  # one message: the usual case while an engine decodes
                        fields: ChunkFields | None
                        if type(response) is tuple:  # read off the wire as its fields (_wire_decode)
                            fields = response  # type: ignore[assignment]  # (no cast() call per message)
                        else:
                            fields = chunk_fields(response) if chunk_fields is not None else None
                        if fields is None:
                            one = decode(response)
                            if one is None:
                                continue
                            if type(one) is WireChunk:
                                fields = (
                                    one.index, one.token_ids, one.prompt_tokens, one.completion_tokens,
                                    one.cached_tokens, one.reasoning_tokens, one.logprobs, one.prompt_logprobs,
                                )  # fmt: skip
                            else:
                                pieces = (one,)
                        if fields is not None and 0 <= fields[0] < count:
                            # _fold_chunk written out for the message of one token (no call per message).
                            index, ids, prompt, reported, cached, reasoning, logprobs, prompt_logprobs = fields
                            choice = choices[index]
                            if choice.finished:
                                continue
                            if ids:
                                choice.streamed = True
                                if cumulative:
                                    total = choice.completion_tokens + len(ids)
                                    choice.completion_tokens = reported if reported > total else total
                                else:
                                    choice.completion_tokens += len(ids)
                            else:
                                if cumulative and reported > choice.completion_tokens:
                                    choice.completion_tokens = reported
                                if prompt_logprobs is None:
                                    continue
                            yielded = True
                            yield ENGINE_OUTPUT_STEP(
                                index, ids, prompt, choice.completion_tokens, cached, reasoning, logprobs, prompt_logprobs
                            )
                            continue
                        if fields is not None:  # out of range: the loop below says so
                            pieces = (WireChunk(*fields),)
                    for piece in pieces:
                        if not 0 <= piece.index < len(choices):
                            raise UpstreamFailure(
                                FailureKind.BROKEN, f"{self.runtime} Generate: choice index {piece.index} out of range"
                            )
                        choice = choices[piece.index]
                        if choice.finished:
                            continue
                        if isinstance(piece, WireChunk):
                            output = self._fold_chunk(choice, piece)
                        else:
                            try:
                                output = self._fold_complete(choice, piece)
                            except UpstreamFailure:
                                settled = True
                                raise
                            remaining -= 1
                            if remaining == 0:
                                settled = True
                        if output is not None:
                            yielded = True
                            yield output
                        if remaining == 0:
                            return
            except grpc.aio.AioRpcError as error:
                settled = True  # the call ended with a status: the engine is done with it
                failure = failure_from_rpc_error(error, f"{self.runtime} Generate")
                raise (failure.broke_off() if yielded else failure) from None
            except GrpcStatusError as error:
                settled = True
                failure = failure_from_status(error.name, error.details, f"{self.runtime} Generate")
                raise (failure.broke_off() if yielded else failure) from None
            settled = True
            raise UpstreamFailure(
                FailureKind.BROKEN, f"{self.runtime} Generate: the stream ended before every choice finished"
            )
        finally:
            if not settled and call is not None:
                call.cancel()
                await self._abort_after_exit(request.request_id)

    def _pieces(self, first: ResponseT, more: Iterable[ResponseT]) -> list[WireChunk | WireComplete]:
        """The decoded messages that arrived together, each run of chunks of one choice merged into
        one (their token ids, logprobs and latest counts): a burst of tokens costs the pipeline one
        step and the client one write, as an engine's own stream interval would send it."""
        if not more:  # one message: the usual case while an engine decodes
            piece = WireChunk(*cast(ChunkFields, first)) if type(first) is tuple else self._decode(first)
            return [] if piece is None else [piece]
        pieces: list[WireChunk | WireComplete] = []
        for response in (first, *more):
            piece = WireChunk(*cast(ChunkFields, response)) if type(response) is tuple else self._decode(response)
            if piece is None:
                continue
            if pieces and type(piece) is WireChunk:
                last = pieces[-1]
                if type(last) is WireChunk and _merged(last, piece):
                    continue
            pieces.append(piece)
        return pieces

    def _fold_chunk(self, choice: _Choice, chunk: WireChunk) -> EngineOutput | None:
        if chunk.token_ids:
            choice.streamed = True
        if self.counts_cumulative:
            choice.completion_tokens = max(chunk.completion_tokens, choice.completion_tokens + len(chunk.token_ids))
        else:
            choice.completion_tokens += len(chunk.token_ids)
        if not chunk.token_ids and chunk.prompt_logprobs is None:
            return None
        # One per engine message: the cheap builder (positional, in EngineOutput's field order: index,
        # token_ids, prompt, completion, cached and reasoning tokens, logprobs, prompt logprobs).
        return ENGINE_OUTPUT_STEP(
            chunk.index,
            chunk.token_ids,
            chunk.prompt_tokens,
            choice.completion_tokens,
            chunk.cached_tokens,
            chunk.reasoning_tokens,
            chunk.logprobs,
            chunk.prompt_logprobs,
        )

    def _fold_complete(self, choice: _Choice, complete: WireComplete) -> EngineOutput:
        reason = finish_reason(complete.finish_reason)
        choice.finished = True
        # Streamed: the last chunk already carried complete.output_ids (and their logprobs).
        new_ids = () if choice.streamed else complete.output_ids
        logprobs = None if choice.streamed else complete.logprobs
        if self.counts_cumulative:
            total = max(complete.completion_tokens, choice.completion_tokens + len(new_ids))
        else:
            total = choice.completion_tokens + len(new_ids)
        choice.completion_tokens = total
        return EngineOutput(
            index=complete.index,
            token_ids=new_ids,
            prompt_tokens=complete.prompt_tokens,
            completion_tokens=total,
            cached_tokens=complete.cached_tokens,
            reasoning_tokens=complete.reasoning_tokens,
            logprobs=logprobs,
            prompt_logprobs=None if choice.streamed else complete.prompt_logprobs,
            finish=Finish(reason, complete.matched_token_id, complete.matched_stop_str),
            spec_accepted_tokens=complete.spec_accepted_tokens,
            spec_draft_tokens=complete.spec_draft_tokens,
            kv_transfer_params=complete.kv_transfer_params,
        )

    async def _abort_after_exit(self, request_id: str) -> None:
        """Send Abort in a task of its own, so a second cancellation of the consumer cannot stop
        it half-way; wait for it here (shielded)."""
        task = asyncio.ensure_future(self._abort_quietly(request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)
        await asyncio.shield(task)

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await asyncio.wait_for(self._send_abort(request_id, ABORT_REASON), self.control_timeout)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as error:
            logger.warning("%s Abort of %s failed: %s", self.runtime, request_id, error)

    async def _fetch_tokenizer(self, call: grpc.aio.UnaryStreamCall[Any, Any]) -> TokenizerBundle:
        """Collect a GetTokenizer stream (zip bytes in chunks, the sha256 on the last one) and
        check the digest; the stream is cut once it brings more than a tokenizer may take
        (:data:`MAX_TOKENIZER_BYTES`), rather than held whole."""
        parts: list[bytes] = []
        digest = ""
        received = 0
        try:
            async for chunk in call:
                parts.append(bytes(chunk.data))
                received += len(parts[-1])
                if received > engine_limits.MAX_TOKENIZER_BYTES:
                    call.cancel()
                    raise UpstreamFailure(
                        FailureKind.BROKEN,
                        f"{self.runtime} GetTokenizer: the archive is larger than "
                        f"{engine_limits.MAX_TOKENIZER_BYTES} bytes",
                    )
                if chunk.sha256:
                    digest = str(chunk.sha256)
        except grpc.aio.AioRpcError as error:
            raise failure_from_rpc_error(error, f"{self.runtime} GetTokenizer") from None
        bundle = TokenizerBundle(b"".join(parts), digest)
        if not digest or not bundle.intact:
            raise UpstreamFailure(
                FailureKind.BROKEN, f"{self.runtime} GetTokenizer: the archive does not match its sha256"
            )
        return bundle

    # -- control RPCs: the same on every runtime whose messages carry these names ------------

    async def health(self) -> EngineHealth:
        answer = await self._control(
            "HealthCheck",
            lambda: self.stub.HealthCheck(self.messages.HealthCheckRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return EngineHealth(answer.healthy, answer.message)

    async def model_info(self) -> ModelInfo:
        answer = await self._control(
            "GetModelInfo",
            lambda: self.stub.GetModelInfo(self.messages.GetModelInfoRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return model_info_from(answer)

    async def server_info(self) -> dict[str, Any]:
        answer = await self._control(
            "GetServerInfo",
            lambda: self.stub.GetServerInfo(self.messages.GetServerInfoRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return MessageToDict(answer, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)

    async def loads(self) -> tuple[EngineLoad, ...]:
        self._require("GetLoads")
        answer = await self._control(
            "GetLoads",
            lambda: self.stub.GetLoads(self.messages.GetLoadsRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return tuple(scheduler_load(load) for load in answer.loads)

    async def flush_cache(self) -> CommandResult:
        self._require("FlushCache")
        answer = await self._control(
            "FlushCache",
            lambda: self.stub.FlushCache(
                common_pb2.FlushCacheRequest(), metadata=self.metadata, timeout=self.control_timeout
            ),
        )
        return CommandResult(answer.success, answer.message)

    async def start_profile(self, options: ProfileOptions) -> CommandResult:
        self._require("StartProfile")
        answer = await self._control(
            "StartProfile",
            lambda: self.stub.StartProfile(profile_request(options), metadata=self.metadata, timeout=self.control_timeout),
        )
        return CommandResult(answer.success, answer.message)

    async def stop_profile(self) -> CommandResult:
        self._require("StopProfile")
        answer = await self._control(
            "StopProfile",
            lambda: self.stub.StopProfile(
                common_pb2.StopProfileRequest(), metadata=self.metadata, timeout=self.control_timeout
            ),
        )
        return CommandResult(answer.success, answer.message)

    async def tokenizer(self) -> TokenizerBundle:
        return await self._fetch_tokenizer(
            self.stub.GetTokenizer(common_pb2.GetTokenizerRequest(), metadata=self.metadata)
        )

    async def _embed(self, message: Any) -> EmbedResult:
        """Run the Embed RPC with the runtime's EmbedRequest ``message`` (every runtime's answer has
        ``embedding`` and ``prompt_tokens``). Like Generate, no deadline here: the caller's applies."""
        answer = await self._control("Embed", lambda: self.stub.Embed(message, metadata=self.metadata))
        return EmbedResult(tuple(float(value) for value in answer.embedding), int(answer.prompt_tokens))

    async def close(self) -> None:
        await self.channel.close()


def model_info_from(message: Any) -> ModelInfo:
    """A GetModelInfoResponse of the SGLang shape (SGLang, vLLM, TokenSpeed, MLX: the same names,
    some absent from one runtime or another) as :class:`ModelInfo`; proto3 zeros read as unknown."""
    fields = message.DESCRIPTOR.fields_by_name

    def get(name: str, default: Any) -> Any:
        return getattr(message, name) if name in fields else default

    return ModelInfo(
        model_path=message.model_path,
        served_model_name=get("served_model_name", ""),
        tokenizer_path=get("tokenizer_path", ""),
        max_context_length=get("max_context_length", 0) or None,
        vocab_size=get("vocab_size", 0) or None,
        eos_token_ids=tuple(int(token) for token in get("eos_token_ids", ())),
        bos_token_id=get("bos_token_id", 0) or None,
        pad_token_id=get("pad_token_id", 0) or None,
        architectures=tuple(get("architectures", ())),
        model_type=get("model_type", ""),
        is_generation=get("is_generation", True),
        supports_vision=get("supports_vision", False),
        max_req_input_len=get("max_req_input_len", 0) or None,
    )


def profile_request(options: ProfileOptions) -> common_pb2.StartProfileRequest:
    message = common_pb2.StartProfileRequest(
        activities=list(options.activities), profile_by_stage=options.profile_by_stage
    )
    if options.output_dir is not None:
        message.output_dir = options.output_dir
    if options.start_step is not None:
        message.start_step = options.start_step
    if options.num_steps is not None:
        message.num_steps = options.num_steps
    if options.with_stack is not None:
        message.with_stack = options.with_stack
    if options.record_shapes is not None:
        message.record_shapes = options.record_shapes
    return message


def scheduler_load(message: Any) -> EngineLoad:
    """A ``SchedulerLoad`` (SGLang, vLLM and TokenSpeed share its core fields) as an engine load
    entry; the optional sub-reports are kept when the engine sent them."""
    load: EngineLoad = {
        "dp_rank": int(message.dp_rank),
        "num_running_reqs": int(message.num_running_reqs),
        "num_waiting_reqs": int(message.num_waiting_reqs),
        "num_waiting_uncached_tokens": int(message.num_waiting_uncached_tokens),
        "num_total_reqs": int(message.num_total_reqs),
        "num_used_tokens": int(message.num_used_tokens),
        "max_total_num_tokens": int(message.max_total_num_tokens),
        "token_usage": float(message.token_usage),
        "gen_throughput": float(message.gen_throughput),
        "cache_hit_rate": float(message.cache_hit_rate),
        "utilization": float(message.utilization),
        "max_running_requests": int(message.max_running_requests),
    }
    fields = message.DESCRIPTOR.fields_by_name
    if "memory" in fields and message.HasField("memory"):
        load["memory"] = MessageToDict(message.memory, preserving_proto_field_name=True)
    if "queues" in fields and message.HasField("queues"):
        load["queues"] = MessageToDict(message.queues, preserving_proto_field_name=True)
    if "disaggregation" in fields and message.HasField("disaggregation"):
        disaggregation = message.disaggregation
        load["disagg_mode"] = str(disaggregation.mode)
        load["kv_transfer_latency_ms"] = float(disaggregation.kv_transfer_latency_ms)
        load["kv_transfer_speed_gb_s"] = float(disaggregation.kv_transfer_speed_gb_s)
        load["prefill_queue_reqs"] = int(
            disaggregation.prefill_prealloc_queue_reqs + disaggregation.prefill_inflight_queue_reqs
        )
        load["decode_queue_reqs"] = int(
            disaggregation.decode_prealloc_queue_reqs + disaggregation.decode_transfer_queue_reqs
        )
    return load
