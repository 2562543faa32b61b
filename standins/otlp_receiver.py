"""A stand-in OpenTelemetry collector: an OTLP/gRPC TraceService that keeps every span it is sent.

Served with the opentelemetry-proto stubs the OTLP exporter package ships (the same service and
messages a collector implements), on a gRPC server of its own threads, so a gateway process in
another process exports to it exactly as to a real collector. Spans are kept flattened
(:class:`ReceivedSpan`: ids as hex, attributes as plain values, the resource's service name).

    receiver = OtlpReceiver(); receiver.start()   # receiver.endpoint: "127.0.0.1:PORT"
    ... --enable-trace --otlp-traces-endpoint receiver.endpoint ...
    receiver.wait_for(lambda spans: ...); receiver.stop()
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["OtlpReceiver", "ReceivedSpan"]

SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    kind: str  # SERVER, CLIENT, INTERNAL, ...
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    service_name: str = ""


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {item.key: _value(item.value) for item in value.kvlist_value.values}
    return getattr(value, which) if which else None


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=SPAN_KINDS.get(span.kind, str(span.kind)),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        status_code=span.status.code,
                        service_name=service,
                    ))  # fmt: skip
        self.receiver._add(found)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """The collector stand-in on ``host`` (a free port unless ``port`` is given)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._server: grpc.Server | None = None
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Condition()
        self.exports = 0  # Export calls received

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), server)
        self.port = server.add_insecure_port(f"{self.host}:{self.port}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None

    def _add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.exports += 1
            self._lock.notify_all()

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 15.0) -> list[ReceivedSpan]:
        """The spans received once ``done(spans)`` holds; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not done(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"spans not received in {timeout} s: {[s.name for s in self._spans]}")
                self._lock.wait(left)
            return list(self._spans)


def main() -> None:
    """``python -m standins.otlp_receiver --port N``: serve until stopped, printing a count of the
    spans received every few seconds (a collector for the benches, in a process of its own)."""
    import argparse

    parser = argparse.ArgumentParser(description="stand-in OTLP/gRPC trace collector")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4317)
    args = parser.parse_args()
    receiver = OtlpReceiver(args.host, args.port)
    receiver.start()
    print(f"otlp receiver on {receiver.endpoint}", flush=True)
    try:
        while True:
            time.sleep(5)
            print(f"{len(receiver.spans)} spans in {receiver.exports} exports", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()


if __name__ == "__main__":
    main()
