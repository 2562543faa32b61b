"""gRPC runtime detection: call each engine service's own HealthCheck, in the order of
:data:`DETECTION_ORDER` (sglang, vllm, trtllm, tokenspeed, mlx), on the worker's one channel; the
first service that answers (with anything but UNIMPLEMENTED) is the worker's runtime.

:func:`connect` is gRPC's connector in :data:`~inference.upstreams.engine.ENGINE_CONNECTORS`: what
registration, the control fan-outs and the tokenizer fetch call for a gRPC worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from inference.routing.workers import Transport
from inference.upstreams.engine import ENGINE_CLIENTS, ENGINE_CONNECTORS, EngineKey
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.grpc.channel import WorkerChannel, failure_from_rpc_error
from inference.upstreams.grpc.client import GrpcEngineClient
from inference.upstreams.registry import UnknownUpstream
from protos import (
    mlx_engine_pb2,
    mlx_engine_pb2_grpc,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    trtllm_service_pb2,
    trtllm_service_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

__all__ = ["DETECTION_ORDER", "HEALTH_PROBES", "connect", "detect_runtime"]

DETECTION_ORDER: tuple[str, ...] = ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")
"""Runtimes tried, in this order, when a gRPC worker's runtime must be detected."""

_Probe = Callable[[grpc.aio.Channel, tuple[tuple[str, str], ...], float], Awaitable[Any]]

HEALTH_PROBES: dict[str, _Probe] = {
    "sglang": lambda channel, metadata, timeout: sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel).HealthCheck(
        sglang_scheduler_pb2.HealthCheckRequest(), metadata=metadata, timeout=timeout
    ),
    "vllm": lambda channel, metadata, timeout: vllm_engine_pb2_grpc.VllmEngineStub(channel).HealthCheck(
        vllm_engine_pb2.HealthCheckRequest(), metadata=metadata, timeout=timeout
    ),
    "trtllm": lambda channel, metadata, timeout: trtllm_service_pb2_grpc.TrtllmServiceStub(channel).HealthCheck(
        trtllm_service_pb2.HealthCheckRequest(), metadata=metadata, timeout=timeout
    ),
    "tokenspeed": lambda channel, metadata, timeout: tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub(
        channel
    ).HealthCheck(tokenspeed_scheduler_pb2.HealthCheckRequest(), metadata=metadata, timeout=timeout),
    "mlx": lambda channel, metadata, timeout: mlx_engine_pb2_grpc.MlxEngineStub(channel).HealthCheck(
        mlx_engine_pb2.HealthCheckRequest(), metadata=metadata, timeout=timeout
    ),
}
"""Each runtime's HealthCheck call, by runtime name."""

# The call never reached a service, so it says nothing about which one is there.
_UNDECIDED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


async def detect_runtime(channel: WorkerChannel, *, timeout: float = 10.0) -> str:
    """The worker's runtime, by the first HealthCheck service that answers.

    Raises :class:`UpstreamFailure`: CONNECT/TIMEOUT when the worker cannot be reached (nothing
    can be decided), BROKEN when no engine service answers.
    """
    for runtime in DETECTION_ORDER:
        probe = HEALTH_PROBES[runtime]
        try:
            await probe(channel.get(), channel.metadata, timeout)
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                continue
            if error.code() in _UNDECIDED:
                raise failure_from_rpc_error(error, f"runtime detection ({runtime} HealthCheck)") from None
        return runtime  # answered, or failed inside the service: the service is there
    raise UpstreamFailure(
        FailureKind.BROKEN, f"no engine gRPC service ({', '.join(DETECTION_ORDER)}) answers at {channel.url}"
    )


async def connect(
    url: str, runtime: str | None = None, *, api_key: str | None = None, detect_timeout: float = 10.0
) -> GrpcEngineClient[Any]:
    """An engine client for the gRPC worker at ``url`` on one new channel: of ``runtime``, or of
    the runtime detected on that same channel. The client owns the channel (``close()``)."""
    channel = WorkerChannel(url, api_key=api_key)
    try:
        name = runtime if runtime else await detect_runtime(channel, timeout=detect_timeout)
        client_class = ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, name))
        if not issubclass(client_class, GrpcEngineClient):
            raise UnknownUpstream(f"the {name!r} engine client does not speak gRPC")
    except BaseException:
        await channel.close()
        raise
    return client_class(url, api_key=api_key, channel=channel)


ENGINE_CONNECTORS.register(Transport.GRPC)(connect)
