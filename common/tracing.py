"""OpenTelemetry tracing of inference requests (``--enable-trace``; docs/DECISIONS.md D74).

One SERVER span per inference request (continuing the client's W3C ``traceparent``/``tracestate``),
with children for admission, worker selection and each upstream attempt (a CLIENT span), and on
the served pipeline render, tokenize and engine generate. Attributes follow the OpenTelemetry
GenAI semantic conventions where they apply (``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.response.model``, ``gen_ai.usage.input_tokens``/``output_tokens``,
``gen_ai.response.finish_reasons``, ``server.address``/``server.port``, ``http.response.status_code``,
``error.type``).

The span that calls a worker is the current span while the call is made, so what a worker receives
(``traceparent`` on HTTP, gRPC metadata, vLLM's ``trace_headers`` over ZMQ) names the gateway's span
as its parent: :func:`outgoing`, :func:`carrier`, :func:`trace_headers`.

Off by default, and then free: the request path checks :data:`ENABLED` once per hook and makes no
span object. On: spans go to an OTLP/gRPC exporter through the SDK's BatchSpanProcessor, whose
thread exports in batches off the request path.

Cheap when on (D74): the SDK's own spans cost ~35 us each to make and ~45 us each to encode on this
machine, several times a relayed request's whole cost. The spans here are the SDK's
:class:`ReadableSpan` made lightly (:class:`_Span`: ids from ``random.getrandbits`` as the SDK's
generator, attributes in a plain dict, the span context built only when asked), handed to the
processor when they end, and the OTLP exporter (:class:`_OtlpExporter`, the SDK's with its
``Export`` call given bytes) writes their protobuf wire form directly (:func:`encode_request`): the
resource and scope once, each span's ids (kept as bytes) and times, its name and attributes joined
from fragments encoded once (D81). Spans made alike share a shape (:func:`shape`: name, kind, first
attributes and their wire form, made once a route, a worker or a span name), and the request's own
attributes are on its request span only (D89); the attributes a span ends with are a closing set
made once per set of values (:class:`Closing`, :func:`end_as`: D98). A sampled span goes straight
to the batch processor's queue. The sampler (``OTEL_TRACES_SAMPLER``) decides per request span; its children
follow it, as parent-based sampling does. The standard environment variables apply:
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``
(default: parent-based always-on), ``OTEL_EXPORTER_OTLP_*`` (endpoint when ``--otlp-traces-endpoint``
is not given, headers, certificate, compression, timeout), ``OTEL_BSP_*`` and ``OTEL_PROPAGATORS``.
Each serving process has its own provider (configured when its lifecycle starts).
"""

from __future__ import annotations

import logging
import os
import random
import struct
from collections import deque
from time import time_ns
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

from contextvars import ContextVar, Token

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.resources import Resource as _Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

__all__ = [
    "ENABLED",
    "DEFAULT_ENDPOINT",
    "Span",
    "SpanKind",
    "configure",
    "install",
    "shutdown",
    "request_span",
    "child",
    "shape",
    "start",
    "attempt_span",
    "enter",
    "leave",
    "end",
    "end_as",
    "Closing",
    "fail",
    "outgoing",
    "carrier",
    "trace_headers",
    "operation_of",
    "encode_request",
]

log = logging.getLogger(__name__)

ENABLED = False
"""Whether spans are made: the one check the request path pays with tracing off."""

DEFAULT_ENDPOINT = "localhost:4317"
DEFAULT_SERVICE_NAME = "llm-gateway"
INSTRUMENTATION = "llm-gateway"

_processor: SpanProcessor | None = None
_sampler: sampling.Sampler = sampling.DEFAULT_ON
_resource: _Resource = _Resource.get_empty()
_scope = InstrumentationScope(INSTRUMENTATION)
_getrandbits = random.getrandbits
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)
_UNSET = Status(StatusCode.UNSET)
# The headers a propagator reads and writes: W3C traceparent/tracestate (and baggage by default).
_FIELDS: frozenset[str] = frozenset(("traceparent", "tracestate"))
_FIELD_NAMES: frozenset[bytes] = frozenset((b"traceparent", b"tracestate"))  # the same, as ASGI names them
_W3C_ONLY = True  # the default propagators: carrier() writes the W3C headers itself

# GenAI semantic conventions: gen_ai.operation.name per route.
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "chat",
    "/v1/responses": "chat",
    "/v1/completions": "text_completion",
    "/generate": "text_completion",
    "/v1/embeddings": "embeddings",
}


def operation_of(path: str) -> str:
    """The GenAI operation name of a route (its last segment where none applies: rerank, ...)."""
    return _OPERATIONS.get(path) or path.rstrip("/").rsplit("/", 1)[-1]


def _endpoint_args(endpoint: str | None) -> dict[str, Any]:
    """The exporter's endpoint arguments: none (its OTEL_EXPORTER_OTLP_* variables or localhost:4317)
    when ``endpoint`` is None; a bare host:port is plaintext, as the reference gateway's flag is."""
    if endpoint is None:
        if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            return {}
        return {"endpoint": DEFAULT_ENDPOINT, "insecure": True}
    if "://" in endpoint:
        return {"endpoint": endpoint}  # http:// plaintext, https:// TLS (the exporter's reading)
    return {"endpoint": endpoint, "insecure": True}


def configure(enabled: bool, endpoint: str | None = None) -> None:
    """Make this process's tracer: spans exported to ``endpoint`` over OTLP/gRPC in batches. Off:
    nothing is made and :data:`ENABLED` stays false."""
    if not enabled:
        return
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    exporter = _otlp_exporter(OTLPSpanExporter, **_endpoint_args(endpoint))
    install(BatchSpanProcessor(exporter))
    log.info("tracing on: spans exported over OTLP/gRPC to %s", endpoint or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT)


def install(processor: SpanProcessor, sampler: sampling.Sampler | None = None) -> None:
    """Turn tracing on with ``processor`` (the exporter's batch processor; tests: a simple processor
    over the SDK's in-memory exporter). ``sampler`` None: OTEL_TRACES_SAMPLER's (parent-based
    always-on by default). Replaces any processor installed before (which is shut down)."""
    global ENABLED, _processor, _ended, _queue, _queue_below, _sampler, _resource, _FIELDS, _FIELD_NAMES, _W3C_ONLY
    shutdown()
    _resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME})
    _sampler = sampler if sampler is not None else sampling._get_from_env_or_default()
    _processor = processor
    batch = getattr(processor, "_batch_processor", None) if type(processor) is BatchSpanProcessor else None
    _ended = getattr(batch, "emit", None) or processor.on_end
    queue = getattr(batch, "_queue", None)
    size = getattr(batch, "_max_export_batch_size", None)
    if type(queue) is deque and type(size) is int:
        # emit's own path while its checks cannot fire: the queue neither full nor at a batch (D89)
        _queue, _queue_below = queue, min(size, queue.maxlen or 1) - 1
    textmap = propagate.get_global_textmap()
    _FIELDS = frozenset(textmap.fields) | {"traceparent", "tracestate"}
    _FIELD_NAMES = frozenset(name.encode("latin-1") for name in _FIELDS)
    _W3C_ONLY = _is_w3c(textmap)
    ENABLED = True


def _is_w3c(textmap: Any) -> bool:
    """Whether ``textmap`` is the W3C trace context propagator, alone or with W3C baggage (the default)."""
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parts = textmap._propagators if type(textmap) is CompositePropagator else [textmap]
    kinds = [type(part) for part in parts]
    return TraceContextTextMapPropagator in kinds and all(
        kind in (TraceContextTextMapPropagator, W3CBaggagePropagator) for kind in kinds
    )


def flush() -> None:
    """Export the spans ended so far, now (benches; the lifecycle's stop is :func:`shutdown`)."""
    if _processor is not None:
        _processor.force_flush()


def shutdown() -> None:
    """Export what is pending and stop (the lifecycle's stop)."""
    global ENABLED, _processor, _ended, _queue
    processor = _processor
    ENABLED = False
    _processor = _ended = _queue = None
    if processor is not None:
        processor.shutdown()


# -- spans -------------------------------------------------------------------------------------------


class _Span(Span, ReadableSpan):
    """A span made without the SDK's per-span machinery (see the module's docstring): what the SDK's
    processors and exporters read of a :class:`ReadableSpan` is here, the span context made when
    first asked. Not sampled: nothing is recorded or exported, the context still propagates."""

    _shape: _Shape
    _events = ()
    _links = ()
    _instrumentation_scope = _scope
    _instrumentation_info = None
    _built: SpanContext | None = None
    # Made by calling the class with no arguments: object's __init__ (ReadableSpan's builds a
    # Resource), then its fields set by _make; object.__new__ called by name cost ~700 instructions
    # more (D98).
    __init__ = object.__init__

    # Made by _make (ReadableSpan's constructor is not called: it builds a Resource). Fields a span
    # starts with alike are set there too, not left to the class: a class's value read through an
    # instance, or an instance's set over a class's, is not specialized on Python 3.11 (D98).
    _end_time: int | None
    _status: Status
    _closing: _Closing  # the attributes it ended with, found once per set of values (D98)
    _start_time: int
    _attributes: dict[str, Any]  # the span's own (its shape's first ones apart)
    _resource: Resource
    # The ids as their 16 and 8 big-endian bytes (D98): the wire form's, and in hex traceparent's; the
    # SpanContext's integers made from them when asked. A child shares its parent's trace_id.
    trace_id: bytes
    span_id: bytes
    parent_id: bytes  # b"": none
    parent_remote: bool
    sampled: bool
    trace_state: TraceState | None

    # -- what the SDK reads --

    @property
    def _name(self) -> str:  # type: ignore[override]
        return self._shape[0]

    @property
    def _kind(self) -> SpanKind:  # type: ignore[override]
        return self._shape[1]

    @property
    def _context(self) -> SpanContext:  # type: ignore[override]
        built = self._built
        if built is None:
            built = self._built = SpanContext(
                _int(self.trace_id), _int(self.span_id), False, _SAMPLED if self.sampled else _UNSAMPLED,
                self.trace_state,
            )
        return built

    @property
    def _parent(self) -> SpanContext | None:  # type: ignore[override]
        if not self.parent_id:
            return None
        return SpanContext(_int(self.trace_id), _int(self.parent_id), self.parent_remote,
                           _SAMPLED if self.sampled else _UNSAMPLED, self.trace_state)

    @property
    def attributes(self) -> Mapping[str, Any]:
        base = self._shape[2]
        closing = self._closing[0]
        if base or closing:
            return MappingProxyType({**base, **self._attributes, **closing})
        return MappingProxyType(self._attributes)

    def to_json(self, indent: int | None = 4) -> str:
        self._unbase()  # ReadableSpan's reads _attributes itself
        return super().to_json(indent)

    def _unbase(self) -> None:
        """The shape's first attributes and the closing ones copied into the span's own, its shape a
        plain one (before one of them is set again, or the name changes)."""
        shape = self._shape
        closing = self._closing[0]
        self._attributes = {**shape[2], **self._attributes, **closing}  # (a dict of its own: see _NO_OWN)
        if shape[2] or closing:
            self._shape = _plain(shape[0], shape[1])
            self._closing = _NO_CLOSING

    def get_span_context(self) -> SpanContext:
        return self._context

    # -- the API --

    def set_attribute(self, key: str, value: Any) -> None:
        if key in self._shape[2] or key in self._closing[0] or self._attributes is _NO_OWN:
            self._unbase()
        self._attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._shape[2] or self._closing[0] or self._attributes is _NO_OWN:
            self._unbase()
        self._attributes.update(attributes)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        return None

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        return None

    def update_name(self, name: str) -> None:
        self._unbase()
        self._shape = _plain(name, self._shape[1])

    def is_recording(self) -> bool:
        return self.sampled and self._end_time is None

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(self, exception: BaseException, attributes: Any = None, timestamp: int | None = None,
                         escaped: bool = False) -> None:
        return None

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            return
        self._end_time = end_time or time_ns()
        if self.sampled:
            queue = _queue
            if queue is not None and len(queue) < _queue_below:
                queue.appendleft(self)
            else:
                ended = _ended
                if ended is not None:
                    ended(self)




def _int(id_bytes: bytes) -> int:
    return int.from_bytes(id_bytes, "big")


def _trace_bytes(trace_id: int) -> bytes:
    return trace_id.to_bytes(16, "big")


_SPAN_IDS: list[bytes] = []
"""Span ids drawn ahead, taken with ``pop`` (D98): 8 random bytes each (the SDK generator's draw,
``getrandbits``), never all zero; :data:`_TRACE_IDS` the same for trace ids (16 bytes). One draw and
one C-level split make :data:`_DRAWN` ids, where an id drawn and converted alone cost ~900
instructions. Emptied in a forked child, whose ``random`` is seeded anew."""
_TRACE_IDS: list[bytes] = []
_DRAWN = 256


_SPLIT = {size: struct.Struct(f"{size}s" * _DRAWN).unpack for size in (8, 16)}  # one C call: _DRAWN ids


def _draw(pool: list[bytes], size: int) -> bytes:
    """Fill ``pool`` with ids of ``size`` bytes (8 or 16), and take one."""
    drawn = _SPLIT[size](_getrandbits(size * 8 * _DRAWN).to_bytes(size * _DRAWN))
    zero = bytes(size)
    pool[:] = drawn if zero not in drawn else [id for id in drawn if id != zero]
    return pool.pop() if pool else _draw(pool, size)


def _new_span_id() -> bytes:
    return _SPAN_IDS.pop() if _SPAN_IDS else _draw(_SPAN_IDS, 8)


def _forget_ids() -> None:
    _SPAN_IDS.clear()
    _TRACE_IDS.clear()


os.register_at_fork(after_in_child=_forget_ids)


def _make(
    shape: _Shape, trace_id: bytes, span_id: bytes, parent_id: bytes, parent_remote: bool, sampled: bool,
    trace_state: TraceState | None, attributes: dict[str, Any],
) -> _Span:  # fmt: skip
    """A started span: its fields set here, without a constructor's call (a class's ``__init__``
    runs in a frame of its own, a plain function's is inlined: D89); name, kind and first attributes
    are the shape's."""
    span = _Span()
    span._shape = shape
    span._closing = _NO_CLOSING
    span._status = _UNSET
    span._end_time = None
    span._start_time = time_ns()
    span._attributes = attributes
    span._resource = _resource
    span.trace_id = trace_id
    span.span_id = span_id
    span.parent_id = parent_id
    span.parent_remote = parent_remote
    span.sampled = sampled
    span.trace_state = trace_state
    return span


_ended: Callable[[_Span], None] | None = None
"""Where a sampled span goes when it ends: the batch processor's queue (its ``emit``: the processor's
``on_end`` would build the span's context to read the sampled flag this module already knows), or
another processor's ``on_end``; None: tracing off."""
_queue: deque[Any] | None = None
"""The batch processor's queue, which a span ends onto directly (``appendleft``, what ``emit`` does)
while it holds fewer than :data:`_queue_below` spans: below its batch size and its bound, none of
``emit``'s other steps applies (a full queue's warning and drop count, the exporter thread's wake-up
at a full batch; its shutdown check is this module's ``_queue = None``; a forked child's queue is
remade by the processor's own fork hook). At that length and above, ``emit`` as before (D89)."""
_queue_below = 0

_Shape = tuple[str, SpanKind, Mapping[str, Any], bytes, bytes, frozenset[str]]
"""What spans made alike share (D89): name, kind, first attributes (read-only: a span's own are in
its ``_attributes``, set after), and their wire form made once: the name's and kind's fields, the
first attributes' fields; and the first attributes' names (D98: what a closing set is checked against)."""
_NO_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})
_NO_OWN = cast("dict[str, Any]", _NO_ATTRIBUTES)
"""A span's own attributes while it has none (read-only: a span gets a dict of its own when one is
set, :meth:`_Span._unbase`), so a child span made without any allocates none (D98)."""

_Closing = tuple[Mapping[str, Any], bytes, frozenset[str]]
"""Attributes a span ends with (read-only), their wire form and their names, made once per set of
values (D98)."""
_NO_CLOSING: _Closing = (_NO_ATTRIBUTES, b"", frozenset())


class Closing(dict[tuple[Any, ...], _Closing]):
    """The attributes named ``names`` that spans end with, by their values (a tuple, in the order of
    ``names``; None: that attribute not set): each set's mapping and wire form made the first time
    (:func:`end_as`). Before, each ended span's attributes were looked up one by one when encoded
    (~1.6k instructions each). The values are of the types the names call for (a boolean or a float
    given where an integer was would find the integer's set: 1 == True == 1.0). Read with ``get``:
    a dict subclass's ``[]`` calls its ``__getitem__`` as a Python method (~1k instructions)."""

    __slots__ = ("names",)

    def __init__(self, *names: str) -> None:
        super().__init__()
        self.names = names

    def __missing__(self, values: tuple[Any, ...]) -> _Closing:
        attributes = {name: value for name, value in zip(self.names, values) if value is not None}
        encoded = b"".join(_attribute(k, v) for k, v in attributes.items())
        found = (MappingProxyType(attributes), encoded, frozenset(attributes))
        if len(self) < _MEMO_SIZE:
            self[values] = found
        return found


_STATUS_NAME = "http.response.status_code"
_STATUSES: dict[int, _Closing] = {}  # end(span, status)'s closing sets, by status (a plain dict: an int key)


def _status(status: int) -> _Closing:
    found = _STATUSES[status] = Closing(_STATUS_NAME)[(status,)]
    return found


def shape(name: str, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None) -> _Shape:
    """The shape of spans named ``name`` whose first attributes are ``attributes`` (made once by the
    caller, kept: see :func:`start`). Those attributes are sent once a span (the OTLP form has no
    other place for them), encoded once a shape."""
    first = MappingProxyType(dict(attributes)) if attributes else _NO_ATTRIBUTES
    encoded = b"".join(_attribute(k, v) for k, v in first.items())
    return name, kind, first, _name_and_kind(name, kind), encoded, frozenset(first)


_PLAIN: dict[str, _Shape] = {}  # by name alone: hashing a SpanKind is a Python call


def _plain(name: str, kind: SpanKind) -> _Shape:
    """The shape of spans named ``name`` without first attributes."""
    found = _PLAIN.get(name)
    if found is None or found[1] is not kind:
        found = shape(name, kind)
        if len(_PLAIN) >= _MEMO_SIZE:
            _PLAIN.clear()
        _PLAIN[name] = found
    return found


_ROUTES: dict[tuple[str, str], _Shape] = {}  # (method, path): the request span's shape


def _route(method: str, path: str) -> _Shape:
    """The request span's shape for ``method`` and ``path``: its name and first attributes (made once
    a route)."""
    found = _ROUTES.get((method, path))
    if found is None:
        found = shape(f"{method} {path}", SpanKind.SERVER, {
            "gen_ai.operation.name": operation_of(path), "http.request.method": method, "http.route": path,
        })  # fmt: skip
        if len(_ROUTES) < 1024:
            _ROUTES[(method, path)] = found
    return found


def request_span(method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Span:
    """The request's SERVER span, a child of the client's ``traceparent`` when it sent one; sampled
    as the sampler says (by default: as the client's, else always)."""
    found: dict[str, str] | None = None
    for key, value in headers:
        if key in _FIELD_NAMES:
            if found is None:
                found = {}
            found[key.decode("latin-1")] = value.decode("latin-1")
    made = _ROUTES.get((method, path)) or _route(method, path)
    if found is None and _sampler is sampling.DEFAULT_ON:  # a root, sampled
        return _make(made, _TRACE_IDS.pop() if _TRACE_IDS else _draw(_TRACE_IDS, 16),
                     _SPAN_IDS.pop() if _SPAN_IDS else _draw(_SPAN_IDS, 8), b"", False, True, None, {})  # fmt: skip
    context = propagate.extract(found) if found else None
    parent = trace.get_current_span(context).get_span_context() if context is not None else None
    if parent is not None and parent.is_valid:
        trace_id, parent_id, remote, state = parent.trace_id, parent.span_id, parent.is_remote, parent.trace_state
    else:
        trace_id, parent_id, remote, state, context = _getrandbits(128) or 1, 0, False, None, None
    if _sampler is sampling.DEFAULT_ON:  # parent-based always-on, decided here as it decides
        sampled = parent.trace_flags.sampled if parent_id and parent is not None else True
    else:
        decision = _sampler.should_sample(context, trace_id, made[0], SpanKind.SERVER, made[2], None)
        if decision.trace_state is not None and len(decision.trace_state):
            state = decision.trace_state
        sampled = decision.decision.is_sampled()
    return _make(made, _trace_bytes(trace_id), _new_span_id(), parent_id.to_bytes(8, "big") if parent_id else b"",
                 remote, sampled, state, {})  # fmt: skip


def child(name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL) -> Span:
    """A span under the current one (see :func:`enter`), in its trace and sampled as it is. A dict
    given as ``attributes`` becomes the span's own (callers give a fresh one)."""
    owned: dict[str, Any] = attributes if type(attributes) is dict else dict(attributes) if attributes else {}
    return start(_plain(name, kind), owned)


def start(made: _Shape, attributes: dict[str, Any] | None = None) -> Span:
    """A span of shape ``made`` (see :func:`shape`) under the current one, as :func:`child`;
    ``attributes`` (a fresh dict, or None) its own."""
    owned = _NO_OWN if attributes is None else attributes
    current = _CURRENT.get()
    if current is not None:
        return _make(made, current.trace_id, _SPAN_IDS.pop() if _SPAN_IDS else _draw(_SPAN_IDS, 8), current.span_id,
                     False, current.sampled, current.trace_state, owned)  # fmt: skip
    parent = trace.get_current_span().get_span_context()  # another instrumentation's span, or none
    if not parent.is_valid:  # outside any request: a trace of its own, as the sampler says
        trace_id = _getrandbits(128) or 1
        sampled = _sampler.should_sample(None, trace_id, made[0], made[1], {**made[2], **owned}, None).decision.is_sampled()
        return _make(made, _trace_bytes(trace_id), _new_span_id(), b"", False, sampled, None, owned)
    return _make(made, _trace_bytes(parent.trace_id), _new_span_id(), parent.span_id.to_bytes(8, "big"),
                 parent.is_remote, parent.trace_flags.sampled, parent.trace_state, owned)


def attempt_span(worker_url: str, worker_id: str, transport: str, model: str | None, number: int) -> Span:
    """One upstream attempt: a CLIENT span naming the worker (``server.address``/``server.port``).
    ``model`` is the request's, which its request span carries: not repeated here (D89)."""
    key = (worker_url, worker_id, transport, number)
    return start(_ATTEMPTS.get(key) or _attempt(key))


_ATTEMPTS: dict[tuple[str, str, str, int], _Shape] = {}
"""A worker's attempt span shape (name, first attributes with the attempt's number), by its URL, id,
transport and the number (made once)."""


def _attempt(key: tuple[str, str, str, int]) -> _Shape:
    worker_url, worker_id, transport, number = key
    host, port = _parse_address(worker_url)
    attributes: dict[str, Any] = {
        "server.address": host, "gateway.worker.id": worker_id, "gateway.worker.transport": transport,
    }  # fmt: skip
    if port:
        attributes["server.port"] = port
    attributes["gateway.attempt"] = number
    found = shape(f"attempt {host}", SpanKind.CLIENT, attributes)
    if len(_ATTEMPTS) >= 65536:
        _ATTEMPTS.clear()
    _ATTEMPTS[key] = found
    return found


def _parse_address(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[-1]
    if url.startswith("ipc://"):
        return rest, 0
    authority = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    if authority.startswith("["):
        host, _, tail = authority[1:].partition("]")
        return host, int(tail[1:]) if tail[1:].isdigit() else 0
    host, _, port = authority.partition(":")
    return host, int(port) if port.isdigit() else 0


_CURRENT: ContextVar[_Span | None] = ContextVar("gateway_span", default=None)
"""The current span of this module's (a context variable of its own: cheaper than the OpenTelemetry
context's, which is copied whole on every attach)."""


# enter(span): make ``span`` the current one (what children and outgoing headers take); leave(token)
# with the token it returns, in the same task. The context variable's own methods (no frame of ours).
enter = cast("Callable[[Span], Token[_Span | None]]", _CURRENT.set)
leave: Callable[[Token[_Span | None]], None] = _CURRENT.reset


def fail(span: Span, error_type: str, description: str | None = None) -> None:
    """Mark ``span`` failed (``error.type`` and an ERROR status)."""
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, description))


def end(span: Span, status: int | None = None, attributes: Mapping[str, Any] | None = None) -> None:
    """End ``span`` (one of this module's), with ``attributes`` added and the HTTP status it answered
    (5xx: an error)."""
    if attributes:
        span.set_attributes(attributes)
    if status:
        if status >= 500:
            fail(span, str(status))
        closing = _STATUSES.get(status) or _status(status)
        made: _Span = span  # type: ignore[assignment]  # this module's span
        if (made._closing is _NO_CLOSING and _STATUS_NAME not in made._attributes
                and _STATUS_NAME not in made._shape[5]):  # fmt: skip
            made._closing = closing
        else:
            _close(made, closing)
    span.end()


def end_as(span: Span, table: Closing, values: tuple[Any, ...], status: int | None = None) -> None:
    """End ``span`` (one of this module's) with ``table``'s attributes of ``values`` (made once per
    set of values); ``status``: the HTTP status it answered, which ``values`` hold (5xx: an error)."""
    if status and status >= 500:
        fail(span, str(status))
    _close(span, table.get(values) or table[values])  # type: ignore[arg-type]
    span.end()


def _close(span: _Span, closing: _Closing) -> None:
    """``closing`` as ``span``'s closing attributes, or copied into its own where it cannot be kept
    apart: a closing set already there, or one of its names among the span's own or first ones."""
    names = closing[2]
    own = span._attributes
    first = span._shape[5]
    if (span._closing is not _NO_CLOSING or (own and not names.isdisjoint(own))
            or (first and not names.isdisjoint(first))):  # fmt: skip
        span._unbase()
        span._attributes.update(closing[0])
    else:
        span._closing = closing


# -- propagation ---------------------------------------------------------------------------------------


def carrier() -> tuple[tuple[str, str], ...]:
    """The current span's trace context as headers (traceparent, tracestate): gRPC metadata. With
    the default propagators (W3C trace context and baggage; the gateway attaches no baggage) written
    here as the W3C propagator writes them; any other OTEL_PROPAGATORS: by the propagator."""
    current = _CURRENT.get()
    if current is None:
        found: dict[str, str] = {}
        propagate.inject(found)  # another instrumentation's span, or none
        return tuple(found.items())
    if _W3C_ONLY:
        parent = f"00-{current.trace_id.hex()}-{current.span_id.hex()}-{'01' if current.sampled else '00'}"
        state = current.trace_state
        if state:
            return (("traceparent", parent), ("tracestate", state.to_header()))
        return (("traceparent", parent),)
    found = {}
    propagate.inject(found, trace.set_span_in_context(current))
    return tuple(found.items())


def outgoing(headers: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """A worker's forwarded client headers with the client's trace context replaced by the current
    span's (the gateway's span as the worker's parent, the client's trace id kept)."""
    for key, _ in headers:
        if key in _FIELDS:
            return tuple((k, v) for k, v in headers if k not in _FIELDS) + carrier()
    return tuple(headers) + carrier()


def trace_headers() -> dict[str, str] | None:
    """The current span's trace context for vLLM's EngineCoreRequest ``trace_headers`` (None: off)."""
    if not ENABLED:
        return None
    return dict(carrier()) or None


# -- the OTLP wire form ----------------------------------------------------------------------------------
# opentelemetry/proto/collector/trace/v1: ExportTraceServiceRequest{1: ResourceSpans*};
# ResourceSpans{1: Resource, 2: ScopeSpans*}; ScopeSpans{1: InstrumentationScope, 2: Span*};
# Span{1 trace_id, 2 span_id, 3 trace_state, 4 parent_span_id, 5 name, 6 kind, 7/8 start/end (fixed64),
# 9 KeyValue*, 15 Status{2 message, 3 code}, 16 flags (fixed32)}; KeyValue{1 key, 2 AnyValue};
# AnyValue{1 string, 2 bool, 3 int, 4 double, 5 ArrayValue{1 AnyValue*}}.

_HAS_IS_REMOTE = 0x100  # SpanFlags: the parent's remoteness is known ...
_IS_REMOTE = 0x200  # ... and it is remote
_pack_double = struct.Struct("<d").pack
_pack_fixed32 = struct.Struct("<I").pack


_SMALL = [bytes((n,)) for n in range(0x80)]


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]
    if value < 0:
        value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (``tag`` is the field number)."""
    return _varint(tag << 3 | 2) + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An AnyValue's fields, as the SDK's encoder writes them (None: no field)."""
    if value is None:
        return b""
    if isinstance(value, str):
        return _field(1, value.encode())
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, (list, tuple)):
        return _field(5, b"".join(_field(1, _any_value(item)) for item in value))
    return _field(1, str(value).encode())


_TIME_FIELDS = struct.Struct("<BQBQ").pack  # start_time_unix_nano (7), end_time_unix_nano (8)
_TRACE_ID, _SPAN_ID, _PARENT_ID, _START, _END = b"\x0a\x10", b"\x12\x08", b"\x22\x08", 0x39, 0x41  # tags, lengths
_UNSET_STATUS = _field(15, b"")
_LOCAL_FLAGS = b"\x85\x01" + _pack_fixed32(_HAS_IS_REMOTE)
_REMOTE_FLAGS = b"\x85\x01" + _pack_fixed32(_HAS_IS_REMOTE | _IS_REMOTE)
_LOCAL_TAIL = _UNSET_STATUS + _LOCAL_FLAGS  # an unset status and a local parent (or none): most spans
_REMOTE_TAIL = _UNSET_STATUS + _REMOTE_FLAGS
_MEMO_SIZE = 8192

# Encoded fragments made once and joined per span: an attribute's whole KeyValue field for a string
# value (most attributes: route, model, worker, policy) and for an integer (status, port, attempt,
# token counts), a key's field, a span name's field with its kind, a span's length prefix. Bounded
# (_MEMO_SIZE entries each, about 1 MB for the attributes): past the bound, made per span.


class _Attributes(dict[tuple[str, Any], bytes]):
    """(key, value): the attribute's KeyValue field (span field 9), as the SDK's encoder writes it
    (None: an empty value), looked up with ``get`` (a dict subclass's ``[]`` is a Python call).
    Kept here: string, integer and None values only (integers too since D98: the encoder looks a
    value up here only when its type is one of these, since a boolean or a float equals an integer,
    1 == True == 1.0, and would find its field); other types encoded each time."""

    def __missing__(self, item: tuple[str, Any]) -> bytes:
        key, value = item
        found = _field(9, _key(key) + _field(2, _any_value(value)))
        if type(value) in _KEPT and len(self) < _MEMO_SIZE:
            self[item] = found
        return found


_ATTRIBUTES = _Attributes()
_KEPT = frozenset((str, int, type(None)))  # the value types _ATTRIBUTES holds
_KEYS: dict[str, bytes] = {}
_SPAN_HEADS: dict[int, bytes] = {}  # a span's length: its field's tag and length


def _attribute(key: str, value: Any) -> bytes:
    """Attribute ``key``'s KeyValue field (span field 9)."""
    if type(value) in _KEPT:
        item = (key, value)
        return _ATTRIBUTES.get(item) or _ATTRIBUTES.__missing__(item)
    return _field(9, _key(key) + _field(2, _any_value(value)))


def _key(key: str) -> bytes:
    found = _KEYS.get(key)
    if found is None:
        found = _field(1, key.encode())
        if len(_KEYS) < _MEMO_SIZE:
            _KEYS[key] = found
    return found


def _name_and_kind(name: str, kind: SpanKind) -> bytes:
    """Span fields 5 (name) and 6 (kind)."""
    return _field(5, name.encode()) + b"\x30" + _varint(kind.value + 1)


def _span_head(size: int) -> bytes:
    found = _SPAN_HEADS[size] = b"\x12" + _varint(size)
    if len(_SPAN_HEADS) > _MEMO_SIZE:
        _SPAN_HEADS.clear()
    return found


def _status_and_flags(span: _Span) -> bytes:
    """Span fields 15 (status) and 16 (flags) of a span whose status was set."""
    status = span._status
    code = status.status_code.value
    described = _field(2, status.description.encode()) if status.description else b""
    remote = span.parent_id and span.parent_remote
    return _field(15, described + (b"\x18" + _varint(code) if code else b"")) + (_REMOTE_FLAGS if remote else _LOCAL_FLAGS)


def _encode_spans(spans: Sequence[_Span], resource: Resource, out: list[bytes]) -> int | None:
    """Each span's field (ScopeSpans field 2) onto ``out``, and their size; None (``out`` as it was)
    when one is not this module's or not of ``resource``. The ids are bytes already, the times packed
    at once, the name and attributes from fragments made once (the shape's, the closing set's; the
    few own attributes looked up one by one), in one loop over the batch."""
    attributes, heads, unset, kind, kept = _ATTRIBUTES, _SPAN_HEADS, _UNSET, _Span, _KEPT
    times, join, append = _TIME_FIELDS, b"".join, out.append
    started = len(out)
    total = 0
    for span in spans:
        if type(span) is not kind or span._resource is not resource:
            del out[started:]
            return None
        parent_id = span.parent_id
        made = span._shape
        if span.trace_state:
            parts = [_TRACE_ID, span.trace_id, _SPAN_ID, span.span_id, _field(3, span.trace_state.to_header().encode())]
            if parent_id:
                parts += (_PARENT_ID, parent_id)
            parts += (made[3], times(_START, span._start_time or 0, _END, span._end_time or 0), made[4])
        elif parent_id:
            parts = [_TRACE_ID, span.trace_id, _SPAN_ID, span.span_id, _PARENT_ID, parent_id, made[3],
                     times(_START, span._start_time or 0, _END, span._end_time or 0), made[4]]  # fmt: skip
        else:
            parts = [_TRACE_ID, span.trace_id, _SPAN_ID, span.span_id, made[3],
                     times(_START, span._start_time or 0, _END, span._end_time or 0), made[4]]  # fmt: skip
        own = span._attributes
        if own:  # few: the request span's model, a failure's error.type (the rest are shapes and closings)
            for key, value in own.items():
                parts.append(attributes.get((key, value)) or _attribute(key, value) if type(value) in kept
                             else _attribute(key, value))  # fmt: skip
        closing = span._closing[1]
        if closing:
            parts.append(closing)
        if span._status is unset:
            parts.append(_REMOTE_TAIL if parent_id and span.parent_remote else _LOCAL_TAIL)
        else:
            parts.append(_status_and_flags(span))
        body = join(parts)
        size = len(body)
        head = heads.get(size) or _span_head(size)
        append(head)
        append(body)
        total += len(head) + size
    return total


_HEADS: dict[int, tuple[Resource, bytes, bytes, bytes]] = {}  # id(resource): it, its field, the scope's, schema


def _head(resource: Resource) -> tuple[Resource, bytes, bytes, bytes]:
    """A resource's encoded Resource field, this module's scope's and the schema URL's (once each)."""
    found = _HEADS.get(id(resource))
    if found is None or found[0] is not resource:
        from opentelemetry.exporter.otlp.proto.common._internal import _encode_instrumentation_scope, _encode_resource

        scope = _encode_instrumentation_scope(_scope).SerializeToString()
        schema = _field(3, resource.schema_url.encode()) if resource.schema_url else b""
        found = resource, _field(1, _encode_resource(resource).SerializeToString()), _field(1, scope), schema
        if len(_HEADS) > 16:
            _HEADS.clear()
        _HEADS[id(resource)] = found
    return found


def _resource_spans(spans: Sequence[_Span], resource: Resource, out: list[bytes]) -> bool:
    """One ResourceSpans field (ExportTraceServiceRequest field 1) of ``spans``, all of ``resource``,
    onto ``out``; False (``out`` as it was) when they are not all this module's spans of it."""
    at = len(out)
    out.append(b"")  # the field's head, once its size is known
    encoded = _encode_spans(spans, resource, out)
    if encoded is None:
        del out[at:]
        return False
    _, resource_field, scope_field, schema = _head(resource)
    scope_spans = len(scope_field) + encoded
    scope_head = b"\x12" + _varint(scope_spans)
    size = len(resource_field) + len(scope_head) + scope_spans + len(schema)
    out[at:at + 1] = (b"\x0a", _varint(size), resource_field, scope_head, scope_field)
    out.append(schema)
    return True


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """The ExportTraceServiceRequest of ``spans`` in protobuf wire form, in one pass: this module's
    spans of one resource (the usual batch) as the resource's and scope's fields, made once, and
    the spans' joined; spans of several resources in one ResourceSpans each; any other span: the
    SDK's encoder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    if not spans:
        return encode_spans(spans).SerializeToString()
    out: list[bytes] = []
    first = spans[0]
    if type(first) is _Span and _resource_spans(cast("Sequence[_Span]", spans), first._resource, out):
        return b"".join(out)  # the usual batch: checked span by span while it is encoded
    if any(type(span) is not _Span for span in spans):
        return encode_spans(spans).SerializeToString()
    by_resource: dict[int, list[_Span]] = {}
    for span in cast("Sequence[_Span]", spans):
        by_resource.setdefault(id(span._resource), []).append(span)
    for group in by_resource.values():
        _resource_spans(group, group[0]._resource, out)
    return b"".join(out)


_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _RawTraceService:
    """The TraceService stub with its Export taking the request's bytes (:func:`encode_request`)."""

    def __init__(self, channel: Any) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        self.Export = channel.unary_unary(
            _EXPORT, request_serializer=bytes, response_deserializer=ExportTraceServiceResponse.FromString
        )


def _otlp_exporter(base: type[SpanExporter], **arguments: Any) -> SpanExporter:
    """The SDK's OTLP/gRPC span exporter (its endpoint, credentials, headers, compression, timeout,
    retries and reconnection) sending :func:`encode_request`'s bytes."""

    class OtlpExporter(base):  # type: ignore[misc,valid-type]
        def __init__(self, **given: Any) -> None:
            super().__init__(**given)
            self._stub = _RawTraceService
            self._client = _RawTraceService(self._channel)

        def _translate_data(self, data: Sequence[ReadableSpan]) -> bytes:
            return encode_request(data)

    return cast(SpanExporter, OtlpExporter(**arguments))
