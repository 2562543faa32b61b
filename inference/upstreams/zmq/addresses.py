"""Where a ZMQ worker's sockets are: the data plane from its ``ipc://PATH`` URL, the handshake
address derived from the path (or given), and binding them with the spec's registration failures.

- input ROUTER ``ipc://PATH-in.sock`` (requests to the engines), output PULL
  ``ipc://PATH-out.sock`` (their outputs); the gateway binds both, engines dial in. A gateway of
  several serving processes (``rungateway --workers N``) is N clients of the engines, as vLLM's API
  server scale-out: client 0 keeps those two, client ``i`` > 0 binds ``ipc://PATH-in-i.sock`` and
  ``ipc://PATH-out-i.sock``, and the INIT message lists all N of each (D69);
- handshake ROUTER ``tcp://127.0.0.1:PORT``, PORT = 20000 + (FNV-1a 64-bit of the PATH bytes mod
  10000), unless the worker spec gives ``zmq_handshake_address`` (which must be tcp://).

Registration fails (:class:`ZmqAddressError`) when the handshake address is not tcp:// or is
already bound.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

import zmq

__all__ = [
    "HANDSHAKE_PORT_BASE",
    "HANDSHAKE_PORT_SPAN",
    "ZmqAddressError",
    "ZmqAddresses",
    "bind",
    "client_paths",
    "fnv1a_64",
    "handshake_port",
    "ipc_path",
    "zmq_addresses",
]

HANDSHAKE_PORT_BASE = 20000
HANDSHAKE_PORT_SPAN = 10000
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF


class ZmqAddressError(ValueError):
    """A ZMQ worker's addresses cannot be used (a registration failure)."""


def fnv1a_64(data: bytes) -> int:
    """FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3)."""
    value = _FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return value


def handshake_port(path: str) -> int:
    """The derived handshake port of an ipc:// path, in 20000-29999."""
    return HANDSHAKE_PORT_BASE + fnv1a_64(path.encode("utf-8")) % HANDSHAKE_PORT_SPAN


def ipc_path(url: str) -> str:
    """The PATH of ``ipc://PATH``; ZmqAddressError for another scheme or an empty path."""
    if not url.startswith("ipc://") or len(url) == len("ipc://"):
        raise ZmqAddressError(f"a ZMQ worker's URL is ipc://<path>, not {url!r}")
    return url[len("ipc://") :]


@dataclass(frozen=True, slots=True)
class ZmqAddresses:
    input: str  # ROUTER: this client's requests to the engines
    output: str  # PULL: the engines' outputs to this client
    handshake: str  # ROUTER: HELLO / INIT / READY
    inputs: tuple[str, ...] = ()  # every client's input address, by client index (INIT's ``inputs``)
    outputs: tuple[str, ...] = ()  # every client's output address, by client index (INIT's ``outputs``)


def client_paths(path: str, index: int) -> tuple[str, str]:
    """Client ``index``'s input and output addresses for the worker at ``ipc://path``."""
    suffix = "" if index == 0 else f"-{index}"
    return f"ipc://{path}-in{suffix}.sock", f"ipc://{path}-out{suffix}.sock"


def zmq_addresses(
    url: str, handshake_address: str | None = None, client_index: int = 0, client_count: int = 1
) -> ZmqAddresses:
    """The worker's addresses as client ``client_index`` of ``client_count`` sees them (the
    serving process's place); ZmqAddressError for a handshake address that is not tcp://."""
    if not 0 <= client_index < client_count:
        raise ValueError(f"client index {client_index} is outside {client_count} clients")
    path = ipc_path(url)
    if handshake_address is None:
        handshake = f"tcp://127.0.0.1:{handshake_port(path)}"
    elif not handshake_address.startswith("tcp://") or len(handshake_address) == len("tcp://"):
        raise ZmqAddressError(f"zmq_handshake_address must be a tcp:// address, not {handshake_address!r}")
    else:
        handshake = handshake_address
    pairs = [client_paths(path, index) for index in range(client_count)]
    inputs, outputs = tuple(pair[0] for pair in pairs), tuple(pair[1] for pair in pairs)
    return ZmqAddresses(inputs[client_index], outputs[client_index], handshake, inputs, outputs)


def bind(socket: zmq.Socket[Any], address: str) -> None:
    """Bind ``socket``; ZmqAddressError when the address is already bound (or cannot be)."""
    try:
        socket.bind(address)
    except zmq.ZMQError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ZmqAddressError(f"{address} is already bound") from None
        raise ZmqAddressError(f"cannot bind {address}: {exc}") from None
