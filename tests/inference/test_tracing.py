"""OpenTelemetry tracing (--enable-trace, issue 26 item 2, D74), spans taken by the SDK's in-memory
exporter: the span tree of a relayed chat (request → select_worker, attempt; the worker's traceparent
names the attempt's span and the client's trace), a retry's two attempt spans, an admission refusal,
the served gRPC chat's render, tokenize and generate under its attempt (the engine's metadata naming
the generate span), vLLM's trace_headers over ZMQ, and nothing made or changed with tracing off.
The OTLP transport itself: tests/e2e/test_tracing_process.py."""

from __future__ import annotations

import asyncio
from typing import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode

from common import tracing
from standins.otlp_receiver import OtlpReceiver
from tests.conftest import GatewayFactory, RunningWorker, WorkerFactory, free_port, record_for
from tests.inference.served.conftest import QWEN_MODEL, Start, start_engine_gateway  # noqa: F401
from tests.inference.served.test_zmq import NO_THINKING, StartZmq, ipc_dir, start_zmq_gateway  # noqa: F401

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello there"}]}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "rojo=00f067aa0ba902b7"}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter), sampler=ALWAYS_ON)
    yield exporter
    tracing.shutdown()


def _hex(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name.split(" ")[0], []).append(span)
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_relayed_chat_is_one_request_span_with_selection_and_attempt_children(
    spans: InMemorySpanExporter, make_gateway: GatewayFactory, worker: RunningWorker
) -> None:
    gateway = make_gateway([record_for(worker)])
    response = await gateway.post("/v1/chat/completions", json=CHAT, headers=TRACEPARENT)
    assert response.status_code == 200
    usage = response.json()["usage"]
    named = by_name(spans)
    [request], [select], [attempt] = named["POST"], named["select_worker"], named["attempt"]
    assert request.kind is SpanKind.SERVER and attempt.kind is SpanKind.CLIENT
    # The client's trace continued: its trace id, its span the request span's parent.
    assert _hex(request.context.trace_id, 32) == CLIENT_TRACE and request.parent is not None
    assert _hex(request.parent.span_id, 16) == CLIENT_SPAN and request.parent.is_remote
    assert parent_of(select) == parent_of(attempt) == request.context.span_id
    assert {span.context.trace_id for span in spans.get_finished_spans()} == {request.context.trace_id}
    attributes = request.attributes or {}
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "mock-model"
    assert attributes["gen_ai.response.model"] == "mock-model" and attributes["http.response.status_code"] == 200
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"]
    )  # fmt: skip
    host, port = worker.url.removeprefix("http://").split(":")
    assert (attempt.attributes or {})["server.address"] == host and (attempt.attributes or {})["server.port"] == int(port)
    assert (select.attributes or {})["gateway.worker.url"] == worker.url
    # The worker's parent is the gateway's attempt span, in the client's trace; tracestate passed on.
    seen = worker.requests()[-1]["headers"]
    assert seen["traceparent"] == f"00-{CLIENT_TRACE}-{_hex(attempt.context.span_id, 16)}-01"
    assert seen["tracestate"] == TRACEPARENT["tracestate"]


async def test_a_request_without_traceparent_starts_a_trace_the_worker_joins(
    spans: InMemorySpanExporter, gateway, worker: RunningWorker
) -> None:
    assert (await gateway.post("/v1/chat/completions", json={**CHAT, "stream": True})).status_code == 200
    named = by_name(spans)
    [request], [attempt] = named["POST"], named["attempt"]
    assert request.parent is None
    trace_id = _hex(request.context.trace_id, 32)
    assert worker.requests()[-1]["headers"]["traceparent"] == f"00-{trace_id}-{_hex(attempt.context.span_id, 16)}-01"
    assert (request.attributes or {})["gen_ai.usage.output_tokens"] == 16  # a stream's usage too


async def test_a_retry_makes_two_attempt_spans(
    spans: InMemorySpanExporter, make_gateway: GatewayFactory, worker: RunningWorker
) -> None:
    dead = record_for(f"http://127.0.0.1:{free_port()}", model="mock-model")
    gateway = make_gateway(
        [dead, record_for(worker)], policy="round_robin", retry_initial_backoff_ms=1, retry_max_backoff_ms=1
    )
    for _ in range(2):  # round robin: one of the two starts on the dead worker
        assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200
    requests = by_name(spans)["POST"]
    retried = [r for r in requests if len([a for a in by_name(spans)["attempt"] if parent_of(a) == r.context.span_id]) == 2]
    assert len(retried) == 1
    attempts = sorted(
        (a for a in by_name(spans)["attempt"] if parent_of(a) == retried[0].context.span_id),
        key=lambda a: (a.attributes or {})["gateway.attempt"],
    )
    failed, answered = attempts
    assert (failed.attributes or {})["gateway.worker.id"] == dead.id and failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "upstream_error"
    assert (answered.attributes or {})["http.response.status_code"] == 200
    assert answered.status.status_code is not StatusCode.ERROR
    parents = [seen["headers"]["traceparent"].split("-")[2] for seen in worker.requests()]
    assert _hex(answered.context.span_id, 16) in parents  # the retried request's worker got its second attempt


async def test_an_admission_refusal_is_an_admission_span_in_error(
    spans: InMemorySpanExporter, make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    slow = await start_worker(delay_ms=300)
    gateway = make_gateway([record_for(slow)], max_concurrent_requests=1, queue_size=0)
    first, second = await asyncio.gather(
        gateway.post("/v1/chat/completions", json=CHAT),
        gateway.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "second"}]}),
    )
    statuses = sorted((first.status_code, second.status_code))
    assert statuses[0] == 200 and statuses[1] in (429, 503)
    named = by_name(spans)
    admissions = named["admission"]
    assert len(admissions) == 2
    [refused] = [a for a in admissions if a.status.status_code is StatusCode.ERROR]
    refused_request = next(r for r in named["POST"] if r.context.span_id == parent_of(refused))
    assert (refused.attributes or {})["http.response.status_code"] == statuses[1]
    assert (refused_request.attributes or {})["http.response.status_code"] == statuses[1]
    assert not [a for a in named["attempt"] if parent_of(a) == refused_request.context.span_id]


async def test_a_gate_refusal_ends_its_request_span(spans: InMemorySpanExporter, gateway) -> None:
    assert (await gateway.post("/v1/chat/completions", content=b"{")).status_code == 400
    [request] = spans.get_finished_spans()
    assert (request.attributes or {})["http.response.status_code"] == 400 and (request.attributes or {})["error.type"]


async def test_the_served_grpc_chat_has_render_tokenize_and_generate_under_its_attempt(
    spans: InMemorySpanExporter, start_engine_gateway: Start
) -> None:
    gw = await start_engine_gateway()
    body = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hello"}]}
    answer = (await gw.http.post("/v1/chat/completions", json=body, headers=TRACEPARENT)).json()
    named = by_name(spans)
    [request], [attempt], [render], [tokenize], [generate] = (
        named["POST"], named["attempt"], named["render"], named["tokenize"], named["generate"]
    )  # fmt: skip
    assert parent_of(attempt) == request.context.span_id
    assert parent_of(render) == parent_of(tokenize) == parent_of(generate) == attempt.context.span_id
    assert generate.kind is SpanKind.CLIENT
    attributes = generate.attributes or {}
    assert list(attributes["gen_ai.response.finish_reasons"]) == [answer["choices"][0]["finish_reason"]]
    assert attributes["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"]
    assert attributes["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    # The engine's Generate call carried the generate span as its parent (gRPC metadata).
    seen = gw.engine.state.requests[-1].trace_headers
    assert seen["traceparent"] == f"00-{CLIENT_TRACE}-{_hex(generate.context.span_id, 16)}-01"
    assert seen["tracestate"] == TRACEPARENT["tracestate"]


async def test_a_zmq_engine_gets_the_trace_in_trace_headers(
    spans: InMemorySpanExporter, start_zmq_gateway: StartZmq
) -> None:
    gw = await start_zmq_gateway()
    body = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hello"}], **NO_THINKING}
    assert (await gw.http.post("/v1/chat/completions", json=body, headers=TRACEPARENT)).status_code == 200
    [generate] = by_name(spans)["generate"]
    seen = gw.group.engines[0].state.requests[-1].trace_headers
    assert seen["traceparent"] == f"00-{CLIENT_TRACE}-{_hex(generate.context.span_id, 16)}-01"


async def test_tracing_off_makes_no_span_and_passes_the_clients_headers_as_they_are(
    make_gateway: GatewayFactory, worker: RunningWorker, start_engine_gateway: Start
) -> None:
    assert not tracing.ENABLED
    gateway = make_gateway([record_for(worker)])
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=TRACEPARENT)).status_code == 200
    seen = worker.requests()[-1]["headers"]
    assert (seen["traceparent"], seen["tracestate"]) == (TRACEPARENT["traceparent"], TRACEPARENT["tracestate"])
    gw = await start_engine_gateway()
    body = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hello"}]}
    assert (await gw.http.post("/v1/chat/completions", json=body, headers=TRACEPARENT)).status_code == 200
    assert gw.engine.state.requests[-1].trace_headers == {}


def test_the_exporter_endpoint_follows_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert tracing._endpoint_args(None) == {"endpoint": "localhost:4317", "insecure": True}  # the reference's default
    assert tracing._endpoint_args("collector:4317") == {"endpoint": "collector:4317", "insecure": True}
    assert tracing._endpoint_args("https://collector:4317") == {"endpoint": "https://collector:4317"}
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://from-env:4317")
    assert tracing._endpoint_args(None) == {}  # the exporter reads OTEL_EXPORTER_OTLP_* itself


def test_configure_exports_over_otlp_grpc_in_batches_with_the_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """configure() as the lifecycle calls it, to the stand-in collector: OTEL_SERVICE_NAME and the
    ratio sampler from OTEL_TRACES_SAMPLER honoured (ratio 0: nothing exported, the context still
    propagated)."""
    receiver = OtlpReceiver()
    receiver.start()
    try:
        monkeypatch.setenv("OTEL_SERVICE_NAME", "gw-under-test")
        tracing.configure(True, receiver.endpoint)
        span = tracing.request_span("POST", "/v1/chat/completions", [])
        span.end()
        tracing.shutdown()  # the batch is exported on shutdown
        [received] = receiver.wait_for(lambda found: len(found) == 1)
        assert (received.name, received.kind, received.service_name) == ("POST /v1/chat/completions", "SERVER", "gw-under-test")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
        tracing.configure(True, receiver.endpoint)
        span = tracing.request_span("POST", "/v1/chat/completions", [(b"traceparent", TRACEPARENT["traceparent"].encode())])
        token = tracing.enter(span)
        try:
            # Parent-based by default: a sampled client's trace stays sampled; an unsampled root is not.
            assert dict(tracing.carrier())["traceparent"].startswith(f"00-{CLIENT_TRACE}-")
        finally:
            tracing.leave(token)
        span.end()
        root = tracing.request_span("POST", "/v1/chat/completions", [])
        assert not root.is_recording()
        root.end()
        tracing.shutdown()
    finally:
        tracing.shutdown()
        receiver.stop()


def test_the_wire_encoding_is_the_sdk_encoders(spans: InMemorySpanExporter) -> None:
    """encode_request writes what the SDK's OTLP encoder writes for the same spans (every field and
    attribute type the gateway sets: strings, ints, floats, lists, a remote parent, tracestate, an
    error status), parsed back by the proto."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    headers = [(b"traceparent", TRACEPARENT["traceparent"].encode()), (b"tracestate", b"rojo=1,congo=2")]
    for remote in (True, False):
        request = tracing.request_span("POST", "/v1/chat/completions", headers if remote else [])
        token = tracing.enter(request)
        attempt = tracing.attempt_span("http://[::1]:8000/v1", "w-1", "http", "m", 1)
        tracing.fail(attempt, "timeout", "no answer in 30 s")
        tracing.end(attempt, 504)
        tracing.leave(token)
        request.set_attribute("gen_ai.response.finish_reasons", ["stop", "length"])
        request.set_attribute("gateway.ratio", 0.5)
        request.set_attribute("gateway.flag", True)
        tracing.end(request, 200)
    finished = spans.get_finished_spans()
    assert len(finished) == 4
    assert ExportTraceServiceRequest.FromString(tracing.encode_request(finished)) == encode_spans(finished)


def test_the_default_sampler_follows_the_clients_sampled_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parent-based always-on (no OTEL_TRACES_SAMPLER): a client's unsampled trace is not recorded
    (its context still propagated, flags 00), a sampled one or none is."""
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter))
    try:
        unsampled = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00".encode()
        span = tracing.request_span("POST", "/v1/chat/completions", [(b"traceparent", unsampled)])
        token = tracing.enter(span)
        assert dict(tracing.carrier())["traceparent"].endswith("-00") and not span.is_recording()
        tracing.leave(token)
        span.end()
        for headers in ([(b"traceparent", TRACEPARENT["traceparent"].encode())], []):
            tracing.request_span("POST", "/v1/chat/completions", headers).end()
        assert len(exporter.get_finished_spans()) == 2
    finally:
        tracing.shutdown()


async def test_the_requests_attributes_are_on_its_request_span_only(
    spans: InMemorySpanExporter, make_gateway: GatewayFactory, worker: RunningWorker
) -> None:
    """D89: the request's model is its request span's, the chosen worker's id its attempt span's;
    select_worker and the attempt do not repeat them (the selection names the policy and the worker's
    URL, the attempt the worker's address and id)."""
    record = record_for(worker)
    gateway = make_gateway([record])
    assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200
    named = by_name(spans)
    [request], [select], [attempt] = named["POST"], named["select_worker"], named["attempt"]
    assert (request.attributes or {})["gen_ai.request.model"] == "mock-model"
    assert "gen_ai.request.model" not in (select.attributes or {})
    assert "gen_ai.request.model" not in (attempt.attributes or {})
    assert "gateway.worker.id" not in (select.attributes or {})
    assert (attempt.attributes or {})["gateway.worker.id"] == record.id


def test_a_first_attribute_set_again_or_a_new_name_is_what_is_read_and_sent(spans: InMemorySpanExporter) -> None:
    """A span's first attributes are its shape's, shared and encoded once (D89): one set again
    replaces it, in what the span reads and in the wire form; a renamed span keeps them."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = tracing.request_span("POST", "/v1/chat/completions", [])
    request.set_attribute("http.route", "/v1/other")
    tracing.end(request, 200)
    renamed = tracing.request_span("POST", "/v1/chat/completions", [])
    renamed.update_name("POST /v1/renamed")
    renamed.end()
    untouched = tracing.request_span("POST", "/v1/chat/completions", [])
    untouched.end()
    first, second, third = spans.get_finished_spans()
    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "chat", "http.request.method": "POST", "http.route": "/v1/other",
        "http.response.status_code": 200,
    }  # fmt: skip
    assert second.name == "POST /v1/renamed" and (second.attributes or {})["http.route"] == "/v1/chat/completions"
    assert (third.attributes or {})["http.route"] == "/v1/chat/completions"  # the shape itself unchanged
    finished = spans.get_finished_spans()
    assert ExportTraceServiceRequest.FromString(tracing.encode_request(finished)) == encode_spans(finished)


def test_closing_attributes_and_memoized_integers_are_what_is_read_and_sent(spans: InMemorySpanExporter) -> None:
    """D98: attributes a span ends with are made once per set of values (tracing.Closing) and kept
    apart from its own: one set again after replaces it, in what the span reads and in the wire form;
    a name the span already holds is not sent twice. Integer fields are memoized beside strings: a
    boolean or a float equal to a memoized integer (True == 1 == 1.0) is still sent as itself."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    table = tracing.Closing("gen_ai.response.model", "gen_ai.usage.input_tokens", "http.response.status_code")
    kept = tracing.request_span("POST", "/v1/chat/completions", [])
    tracing.end_as(kept, table, ("m", 1, 200), 200)
    reset = tracing.request_span("POST", "/v1/chat/completions", [])
    tracing.end_as(reset, table, ("m", 1, 200), 200)
    reset.set_attribute("gen_ai.usage.input_tokens", 7)
    held = tracing.request_span("POST", "/v1/chat/completions", [])
    held.set_attribute("gen_ai.response.model", "own")
    tracing.end_as(held, table, ("m", None, 503), 503)
    flagged = tracing.request_span("POST", "/v1/chat/completions", [])
    flagged.set_attribute("gen_ai.usage.input_tokens", True)
    flagged.set_attribute("gateway.ratio", 1.0)
    tracing.end(flagged, 200)
    first, second, third, fourth = spans.get_finished_spans()
    assert {k: v for k, v in (first.attributes or {}).items() if not k.startswith("http.r")} == {
        "gen_ai.operation.name": "chat", "gen_ai.response.model": "m", "gen_ai.usage.input_tokens": 1,
    }  # fmt: skip
    assert (second.attributes or {})["gen_ai.usage.input_tokens"] == 7
    assert (third.attributes or {})["gen_ai.response.model"] == "m" and third.status.status_code is StatusCode.ERROR
    assert "gen_ai.usage.input_tokens" not in (third.attributes or {})
    assert (fourth.attributes or {})["gen_ai.usage.input_tokens"] is True
    finished = spans.get_finished_spans()
    assert ExportTraceServiceRequest.FromString(tracing.encode_request(finished)) == encode_spans(finished)


def test_spans_reach_the_batch_processors_queue_and_a_full_batch_wakes_its_exporter() -> None:
    """Ended spans go onto the batch processor's queue directly while it is below a batch (D89); the
    span that makes a full batch goes through its emit, which wakes the exporter's thread without
    waiting for the schedule delay (an hour here)."""
    import threading

    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    exported: list[ReadableSpan] = []
    batch_seen = threading.Event()

    class Exporter(SpanExporter):
        def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
            exported.extend(batch)
            batch_seen.set()
            return SpanExportResult.SUCCESS

    tracing.install(BatchSpanProcessor(Exporter(), schedule_delay_millis=3_600_000, max_export_batch_size=3),
                    sampler=ALWAYS_ON)  # fmt: skip
    try:
        for _ in range(2):
            tracing.request_span("POST", "/v1/chat/completions", []).end()
        assert not exported
        tracing.request_span("POST", "/v1/chat/completions", []).end()
        assert batch_seen.wait(30)
        assert len(exported) == 3
    finally:
        tracing.shutdown()
