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
thread exports in batches off the request path. The standard environment variables apply:
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``
(default: parent-based always-on), ``OTEL_EXPORTER_OTLP_*`` (endpoint when ``--otlp-traces-endpoint``
is not given, headers, certificate, compression, timeout), ``OTEL_BSP_*`` and ``OTEL_PROPAGATORS``.
Each serving process has its own provider (configured when its lifecycle starts).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

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
    "attempt_span",
    "enter",
    "leave",
    "end",
    "fail",
    "outgoing",
    "carrier",
    "trace_headers",
    "operation_of",
]

log = logging.getLogger(__name__)

ENABLED = False
"""Whether spans are made: the one check the request path pays with tracing off."""

DEFAULT_ENDPOINT = "localhost:4317"
DEFAULT_SERVICE_NAME = "llm-gateway"
INSTRUMENTATION = "llm-gateway"

_tracer: trace.Tracer = trace.NoOpTracer()
_provider: TracerProvider | None = None
# The headers a propagator reads and writes: W3C traceparent/tracestate (and baggage by default).
_FIELDS: frozenset[str] = frozenset(("traceparent", "tracestate"))

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


class _Level1Ids(RandomIdGenerator):
    """Random ids whose traces are not flagged random-trace-id (W3C Trace Context level 2's 0x02):
    what a worker receives is ``traceparent: 00-<trace id>-<span id>-01``, as from the reference
    gateway, for parsers that know level 1 only."""

    def is_trace_id_random(self) -> bool:
        return False


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

    exporter = OTLPSpanExporter(**_endpoint_args(endpoint))
    install(BatchSpanProcessor(exporter))
    log.info("tracing on: spans exported over OTLP/gRPC to %s", endpoint or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT)


def install(processor: SpanProcessor, sampler: Any = None) -> TracerProvider:
    """Turn tracing on with ``processor`` (the exporter's batch processor; tests: a simple processor
    over the SDK's in-memory exporter). ``sampler`` None: OTEL_TRACES_SAMPLER's (parent-based
    always-on by default). Replaces any provider installed before (which is shut down)."""
    global ENABLED, _tracer, _provider, _FIELDS
    shutdown()
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME})
    provider = TracerProvider(resource=resource, sampler=sampler, id_generator=_Level1Ids())
    provider.add_span_processor(processor)
    _provider = provider
    _tracer = provider.get_tracer(INSTRUMENTATION)
    _FIELDS = frozenset(propagate.get_global_textmap().fields) | {"traceparent", "tracestate"}
    ENABLED = True
    return provider


def shutdown() -> None:
    """Export what is pending and stop (the lifecycle's stop; interpreter exit does it too)."""
    global ENABLED, _tracer, _provider
    provider = _provider
    ENABLED = False
    _tracer = trace.NoOpTracer()
    _provider = None
    if provider is not None:
        provider.shutdown()


# -- spans -------------------------------------------------------------------------------------------


def request_span(method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Span:
    """The request's SERVER span, a child of the client's ``traceparent`` when it sent one."""
    found: dict[str, str] = {}
    for key, value in headers:
        name = key.decode("latin-1")
        if name in _FIELDS:
            found[name] = value.decode("latin-1")
    parent = propagate.extract(found) if found else None
    operation = operation_of(path)
    return _tracer.start_span(
        f"{method} {path}", context=parent, kind=SpanKind.SERVER,
        attributes={"gen_ai.operation.name": operation, "http.request.method": method, "http.route": path},
    )  # fmt: skip


def child(name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL) -> Span:
    """A span under the current one (see :func:`enter`)."""
    return _tracer.start_span(name, attributes=attributes, kind=kind)


def attempt_span(worker_url: str, worker_id: str, transport: str, model: str | None, number: int) -> Span:
    """One upstream attempt: a CLIENT span naming the worker (``server.address``/``server.port``)."""
    host, port = _address(worker_url)
    attributes: dict[str, Any] = {
        "server.address": host, "gateway.worker.id": worker_id, "gateway.worker.transport": transport,
        "gateway.attempt": number,
    }  # fmt: skip
    if port:
        attributes["server.port"] = port
    if model:
        attributes["gen_ai.request.model"] = model
    return _tracer.start_span(f"attempt {host}", attributes=attributes, kind=SpanKind.CLIENT)


def _address(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[-1]
    if url.startswith("ipc://"):
        return rest, 0
    authority = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    if authority.startswith("["):
        host, _, tail = authority[1:].partition("]")
        return host, int(tail[1:]) if tail[1:].isdigit() else 0
    host, _, port = authority.partition(":")
    return host, int(port) if port.isdigit() else 0


def enter(span: Span) -> object:
    """Make ``span`` the current one (what children and outgoing headers take); :func:`leave` with
    the token it returns, in the same task."""
    return otel_context.attach(trace.set_span_in_context(span))


def leave(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


def fail(span: Span, error_type: str, description: str | None = None) -> None:
    """Mark ``span`` failed (``error.type`` and an ERROR status)."""
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, description))


def end(span: Span, status: int | None = None) -> None:
    """End ``span``, with the HTTP status it answered (5xx: an error)."""
    if status:
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            fail(span, str(status))
    span.end()


# -- propagation ---------------------------------------------------------------------------------------


def carrier() -> tuple[tuple[str, str], ...]:
    """The current span's trace context as headers (traceparent, tracestate): gRPC metadata."""
    found: dict[str, str] = {}
    propagate.inject(found)
    return tuple(found.items())


def outgoing(headers: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """A worker's forwarded client headers with the client's trace context replaced by the current
    span's (the gateway's span as the worker's parent, the client's trace id kept)."""
    return tuple((k, v) for k, v in headers if k not in _FIELDS) + carrier()


def trace_headers() -> dict[str, str] | None:
    """The current span's trace context for vLLM's EngineCoreRequest ``trace_headers`` (None: off)."""
    if not ENABLED:
        return None
    found: dict[str, str] = {}
    propagate.inject(found)
    return found or None
