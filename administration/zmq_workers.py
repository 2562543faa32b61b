"""What registering a ZMQ worker (``ipc://PATH``, vLLM's EngineCore in headless mode) checks, and
what it records instead of a probe.

A ZMQ worker is not probed at registration: its engines dial in to the gateway, whose serving
processes each bind their own input and output sockets and one of them (the one running the health
checks) the handshake socket (D64, D69). So the job
checks what the spec makes it refuse (spec 3), records the runtime given (sglang when none) and the
model id, and leaves the worker pending: its health checks, always on for ZMQ, bind the sockets and
pass once every engine finished the handshake (HELLO, INIT, READY and the ready response).

Refused (each a registration failure, spec 3): a runtime other than sglang, vllm or trtllm; a
worker_type other than regular; no model id (a model card, a model label such as model_path, or
--model-path); dp_size above 1 under --dp-aware; a handshake address that is not tcp:// or is
already bound; and, the gateway's own limit, no local tokenizer (the engine has none: a model card
tokenizer_path, a tokenizer_path or model_path label, --tokenizer-path or --model-path). Any number of
serving processes serve a ZMQ worker (``--workers N``: N clients of its engines, D69).
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import zmq

from administration.discovery import Discovery
from administration.models import RuntimeType, Worker, WorkerType
from common.config import GatewayConfig
from inference.upstreams.zmq import DEFAULT_ZMQ_RUNTIME, ZMQ_RUNTIMES, ZmqAddressError, zmq_addresses
from inference.upstreams.zmq.addresses import bind

__all__ = ["zmq_refusal", "zmq_discovery", "handshake_address_refusal"]

_MODEL_LABELS = ("served_model_name", "model_id", "model_path")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _model_id(worker: Worker, config: GatewayConfig) -> str:
    if worker.model_cards:
        return _text(worker.model_cards[0].get("id"))
    for key in _MODEL_LABELS:
        if _text(worker.labels.get(key)):
            return _text(worker.labels[key])
    return config.model_path or ""


def _tokenizer_location(worker: Worker, config: GatewayConfig) -> str:
    card: dict[str, Any] = worker.model_cards[0] if worker.model_cards else {}
    return (
        _text(card.get("tokenizer_path")) or _text(worker.labels.get("tokenizer_path"))
        or _text(worker.labels.get("model_path")) or config.tokenizer_path or config.model_path or ""
    )  # fmt: skip


def _tcp_bind_refusal(address: str) -> str | None | bool:
    """Whether ``tcp://HOST:PORT`` can be bound, by a plain socket bound for a moment and never
    listening: an engine dialing in meanwhile is refused and retries, where a momentary ZMQ socket
    would accept its connection and lose its HELLO (the engine never says it again). None when
    it can, the reason when not, False when the address is not a plain host and port (ZMQ's
    interface names): then ZMQ binds it for a moment instead."""
    host, _, port = address[len("tcp://") :].rpartition(":")
    if not port.isdigit():
        return False  # tcp://HOST:* takes any free port: nothing to collide with
    host = "0.0.0.0" if host == "*" else host.strip("[]")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return False
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZMQ binds
        probe.bind(where)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"the handshake address {address} is already bound"
        return f"the handshake address cannot bind {address}: {exc}"
    finally:
        probe.close()
    return None


def handshake_address_refusal(url: str, handshake_address: str | None) -> str | None:
    """Why the worker's handshake address cannot be used (not tcp://, or already bound on this
    host), else None. Binds it for a moment: a bound address is one another process (or worker)
    holds."""
    try:
        address = zmq_addresses(url, handshake_address).handshake
    except ZmqAddressError as exc:
        return str(exc)
    plain = _tcp_bind_refusal(address)
    if plain is not False:
        return plain if isinstance(plain, str) else None
    context = zmq.Context()
    try:
        probe = context.socket(zmq.ROUTER)
        probe.setsockopt(zmq.LINGER, 0)
        bind(probe, address)
    except ZmqAddressError as exc:
        return f"the handshake address {exc}"
    finally:
        context.destroy(linger=0)
    return None


def _runtime(worker: Worker) -> str:
    given = worker.runtime_type
    return DEFAULT_ZMQ_RUNTIME if not given or given == RuntimeType.UNSPECIFIED else given


def zmq_refusal(worker: Worker, config: GatewayConfig) -> str | None:
    """Why the ZMQ ``worker`` cannot be registered, else None."""
    runtime = _runtime(worker)
    if runtime not in ZMQ_RUNTIMES:
        return f"a ZMQ worker's runtime must be one of {', '.join(ZMQ_RUNTIMES)}, not {runtime!r}"
    if worker.worker_type != WorkerType.REGULAR:
        return f"a ZMQ worker must be a regular worker, not {worker.worker_type}"
    if not _model_id(worker, config):
        return "a ZMQ worker needs a model id: give models, a model label such as model_path, or --model-path"
    dp_size = int(worker.setting("dp_size") or 1)
    if dp_size > 1 and config.dp_aware:
        return f"dp_size {dp_size} above 1 is not supported for ZMQ workers under --dp-aware"
    location = _tokenizer_location(worker, config)
    if not location:
        return ("a ZMQ worker's engine has no tokenizer: give a model card tokenizer_path, a tokenizer_path or "
                "model_path label, --tokenizer-path or --model-path")  # fmt: skip
    if os.path.isabs(location) and not os.path.exists(location):
        return f"the ZMQ worker's tokenizer {location} is not on this host"
    if not worker.registered:  # a registered worker's sockets are held by its own serving client
        refusal = handshake_address_refusal(worker.url, worker.setting("zmq_handshake_address"))
        if refusal is not None:
            return refusal
    return None


def zmq_discovery(worker: Worker, config: GatewayConfig) -> Discovery:
    """What registration records of a ZMQ worker in place of a probe: the runtime given (sglang when
    none), and --model-path as its model_path label when nothing else names the model."""
    labels: dict[str, str] = {}
    if not worker.model_cards and not any(_text(worker.labels.get(key)) for key in _MODEL_LABELS):
        labels["model_path"] = config.model_path or ""
    return Discovery(runtime_type=_runtime(worker), model_ids=(), labels=labels)
