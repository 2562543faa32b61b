"""ZMQ workers (``ipc://PATH``): vLLM's EngineCore in headless mode over pyzmq's asyncio sockets.

:mod:`.codec` holds the wire layouts, :mod:`.addresses` the socket and handshake-port derivation,
:mod:`.client` the engine client (:class:`ZmqEngineClient`). The client is not registered in
``ENGINE_CLIENTS`` yet: registration by (transport, runtime) wires it in.
"""

from inference.upstreams.zmq.addresses import ZmqAddressError, ZmqAddresses, zmq_addresses
from inference.upstreams.zmq.client import ZmqEngineClient

__all__ = ["ZmqAddressError", "ZmqAddresses", "ZmqEngineClient", "zmq_addresses"]
