"""Engine clients over ``grpc.aio``, one module per runtime behind :class:`EngineClient`.

- :mod:`.channel`: the worker's one channel (keepalive, unbounded message sizes), error mapping;
- :mod:`.client`: what the runtimes share (stream folding, Abort on early exit, tokenizer stream,
  the control RPCs, Embed, and ``UpstreamFailure`` for an RPC the runtime's service lacks);
- :mod:`.sglang`, :mod:`.vllm`, :mod:`.trtllm`, :mod:`.tokenspeed`, :mod:`.mlx`: the codecs,
  registered in ``ENGINE_CLIENTS`` under ``(Transport.GRPC, runtime)``;
- :mod:`.detect`: runtime detection by each engine's HealthCheck in :data:`DETECTION_ORDER`, and
  :func:`connect`, registered as gRPC's connector in ``ENGINE_CONNECTORS``.

Importing this package registers the clients and the connector.
"""

from __future__ import annotations

from inference.upstreams.grpc import mlx, sglang, tokenspeed, trtllm, vllm  # noqa: F401  (register the clients)
from inference.upstreams.grpc.channel import WorkerChannel
from inference.upstreams.grpc.client import GrpcEngineClient
from inference.upstreams.grpc.detect import DETECTION_ORDER, connect, detect_runtime
from inference.upstreams.grpc.mlx import MlxClient
from inference.upstreams.grpc.sglang import SglangClient
from inference.upstreams.grpc.tokenspeed import TokenSpeedClient
from inference.upstreams.grpc.trtllm import TrtllmClient
from inference.upstreams.grpc.vllm import VllmClient

__all__ = [
    "DETECTION_ORDER", "GrpcEngineClient", "MlxClient", "SglangClient", "TokenSpeedClient", "TrtllmClient", "VllmClient",
    "WorkerChannel", "connect", "detect_runtime",
]  # fmt: skip
