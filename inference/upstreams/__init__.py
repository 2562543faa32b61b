"""Upstreams, two kinds behind one registry each (registered by key with a decorator):

- relays (:mod:`inference.upstreams.base`), where the upstream speaks the client's API: HTTP workers
  (:mod:`inference.upstreams.http`) and external providers (:mod:`inference.upstreams.provider`);
- engine clients (:mod:`inference.upstreams.engine`), where the gateway is the server and drives an
  engine with token ids, by (transport, runtime), with one connector per engine transport (gRPC per
  runtime in :mod:`inference.upstreams.grpc`, ZMQ's in :mod:`inference.upstreams.zmq`).

Importing this package registers every built-in upstream (a transport's package registers its
clients and its connector when imported here).
"""

from __future__ import annotations

from inference.upstreams import grpc as _grpc  # noqa: F401  (registers the gRPC engine clients)
from inference.upstreams import http  # noqa: F401  (registers the HTTP relay)
from inference.upstreams import provider  # noqa: F401  (registers the external providers' relay)
from inference.upstreams import zmq as _zmq  # noqa: F401  (registers the ZMQ engine clients)
from inference.upstreams.base import RELAYS, Relay, RelayAnswer, RelayRequest
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    ENGINE_CONNECTORS,
    EngineClient,
    EngineKey,
    connect_engine,
    engine_connector,
)
from inference.upstreams.failures import FailureKind, UpstreamFailure

__all__ = [
    "RELAYS",
    "Relay",
    "RelayAnswer",
    "RelayRequest",
    "ENGINE_CLIENTS",
    "ENGINE_CONNECTORS",
    "EngineClient",
    "EngineKey",
    "connect_engine",
    "engine_connector",
    "FailureKind",
    "UpstreamFailure",
]
