"""ZMQ's engine clients and connector.

Every runtime the spec accepts over ``ipc://`` (sglang, vllm, trtllm; sglang when none is given)
is served by the one wire the gateway speaks to a ZMQ worker, vLLM's EngineCore in headless mode
(D64): the runtime name is the operator's label of the engine, not a second dialect. Each is
registered in ``ENGINE_CLIENTS`` under ``(Transport.ZMQ, runtime)``.

:func:`connect` is ZMQ's connector in ``ENGINE_CONNECTORS``. It binds nothing: a ZMQ worker's
sockets are bound by each serving process's own client (the engine pool's), whose first health
check or request binds them (its input and output sockets; the health-checking process also takes
the handshake, D69). The client it returns is unbound,
so a control command or a tokenizer fetch on it answers what a ZMQ worker does not offer (no cache
flush, no profiling, no tokenizer) without taking the addresses from the serving client.
"""

from __future__ import annotations

from inference.routing.workers import Transport
from inference.upstreams.engine import ENGINE_CLIENTS, ENGINE_CONNECTORS, EngineKey
from inference.upstreams.registry import UnknownUpstream
from inference.upstreams.zmq.client import ZmqEngineClient

__all__ = ["ZMQ_RUNTIMES", "DEFAULT_ZMQ_RUNTIME", "connect"]

ZMQ_RUNTIMES: tuple[str, ...] = ("sglang", "vllm", "trtllm")
"""The runtimes a ZMQ worker may be registered as (spec 3: engine_a, engine_b, engine_c)."""

DEFAULT_ZMQ_RUNTIME = "sglang"  # spec 3: ZMQ workers default to engine_a


class SglangZmqClient(ZmqEngineClient):
    runtime = "sglang"


class TrtllmZmqClient(ZmqEngineClient):
    runtime = "trtllm"


ENGINE_CLIENTS.register(EngineKey(Transport.ZMQ, "sglang"))(SglangZmqClient)
ENGINE_CLIENTS.register(EngineKey(Transport.ZMQ, "vllm"))(ZmqEngineClient)
ENGINE_CLIENTS.register(EngineKey(Transport.ZMQ, "trtllm"))(TrtllmZmqClient)


async def connect(
    url: str, runtime: str | None = None, *, api_key: str | None = None, detect_timeout: float = 10.0
) -> ZmqEngineClient:
    """An unbound client of the ZMQ worker at ``url``, of ``runtime`` (sglang when None: a ZMQ
    worker's runtime is given, never detected). Raises UnknownUpstream for a runtime not accepted
    over ZMQ, ZmqAddressError for a URL that is not ipc://PATH."""
    name = runtime or DEFAULT_ZMQ_RUNTIME
    client_class = ENGINE_CLIENTS.get(EngineKey(Transport.ZMQ, name))
    if not issubclass(client_class, ZmqEngineClient):
        raise UnknownUpstream(f"the {name!r} engine client does not speak ZMQ")
    return client_class(url, api_key=api_key)


ENGINE_CONNECTORS.register(Transport.ZMQ)(connect)
