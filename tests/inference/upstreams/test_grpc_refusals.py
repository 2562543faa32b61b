"""The one mapping of gRPC statuses (inference/upstreams/grpc/channel.py): INVALID_ARGUMENT and
OUT_OF_RANGE mean "this request is invalid", a refusal that is the client's error (400, code 400);
every other status is the worker's failure (unreachable, timed out, broken off). The event-loop
reader and grpc.aio give the same answer for the same refusal of the real engine stand-in, on
Generate and on Embed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from common.config import GatewayConfig, install_config
from inference.upstreams.engine import EmbedRequest, EngineRequest
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.grpc import SglangClient
from inference.upstreams.grpc.channel import failure_from_status
from inference.upstreams.grpc.h2 import GrpcStatus
from standins.fixtures import FIXTURE_MODELS as FIXTURES
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer

QWEN = str(FIXTURES / "qwen3")

WORKER_FAILURES = {
    "UNAVAILABLE": FailureKind.CONNECT,
    "DEADLINE_EXCEEDED": FailureKind.TIMEOUT,
    "INTERNAL": FailureKind.BROKEN,
    "UNKNOWN": FailureKind.BROKEN,
    "CANCELLED": FailureKind.BROKEN,
    "RESOURCE_EXHAUSTED": FailureKind.BROKEN,
    "UNIMPLEMENTED": FailureKind.BROKEN,
    "UNAUTHENTICATED": FailureKind.BROKEN,
    "PERMISSION_DENIED": FailureKind.BROKEN,
    "DATA_LOSS": FailureKind.BROKEN,
}


@pytest.mark.parametrize("name", ["INVALID_ARGUMENT", "OUT_OF_RANGE"])
def test_a_status_meaning_the_request_is_invalid_is_the_clients_400(name: str) -> None:
    failure = failure_from_status(name, "input_ids must not be empty", "sglang Generate")
    assert failure.rejected and failure.kind is FailureKind.BROKEN  # the worker answered, with a refusal
    error = failure.to_error()
    assert (error.status, error.code, error.error_type, error.param) == (400, 400, "invalid_request_error", None)
    assert error.message == f"The worker refused the request as invalid: sglang Generate: {name}: input_ids must not be empty"


@pytest.mark.parametrize(("name", "kind"), WORKER_FAILURES.items())
def test_every_other_status_is_the_workers_failure(name: str, kind: FailureKind) -> None:
    failure = failure_from_status(name, "details", "sglang Generate")
    assert failure.kind is kind and not failure.rejected
    assert failure.to_error().status in (502, 504)


def test_a_refusal_after_the_answer_started_is_the_worker_breaking_off() -> None:
    failure = failure_from_status("INVALID_ARGUMENT", "late", "sglang Generate").broke_off()
    assert not failure.rejected and failure.kind is FailureKind.BROKEN
    assert failure.to_error().status == 502


def test_every_named_status_is_mapped_one_way_or_the_other() -> None:
    names = set(GrpcStatus.NAMES.values()) - {"OK", "INVALID_ARGUMENT", "OUT_OF_RANGE"}
    assert all(not failure_from_status(name, "", "x").rejected for name in names)


@pytest.fixture(params=["native", "grpcio"])
def reader(request: pytest.FixtureRequest) -> Iterator[str]:
    install_config(GatewayConfig(grpc_stream_reader=request.param), export=False)
    yield str(request.param)
    install_config(GatewayConfig(), export=False)


@pytest.mark.parametrize(
    "input_ids",
    [(), (10**7,), tuple([9707] * 64)],
    ids=["empty", "outside-the-vocabulary", "past-the-context-length"],
)
async def test_the_engines_refusal_is_the_same_on_both_readers(reader: str, input_ids: tuple[int, ...]) -> None:
    server = GrpcEngineServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, max_context_length=32))
    await server.start()
    client = SglangClient(server.url)
    try:
        assert (client.channel.native is not None) is (reader == "native")
        with pytest.raises(UpstreamFailure) as generated:
            async for _ in client.generate(EngineRequest(request_id="bad", input_ids=input_ids)):
                pass
        with pytest.raises(UpstreamFailure) as embedded:
            await client.embed(EmbedRequest("bad", input_ids))
        for failure in (generated.value, embedded.value):
            assert failure.rejected and "INVALID_ARGUMENT" in failure.detail
            assert failure.to_error().status == 400
        assert server.state.requests == [] and server.state.embeds == [] and server.state.aborts == []
    finally:
        await client.close()
        await server.stop()
