"""ZMQ workers (``ipc://PATH``): vLLM's EngineCore in headless mode over pyzmq's asyncio sockets.

:mod:`.codec` holds the wire layouts, :mod:`.addresses` the socket and handshake-port derivation,
:mod:`.client` the engine client (:class:`ZmqEngineClient`), :mod:`.connect` its registration in
``ENGINE_CLIENTS`` under ``(Transport.ZMQ, runtime)`` for sglang, vllm and trtllm, and ZMQ's
connector (importing this package registers them).
"""

from inference.upstreams.zmq.addresses import ZmqAddressError, ZmqAddresses, zmq_addresses
from inference.upstreams.zmq.client import ZmqEngineClient
from inference.upstreams.zmq.connect import DEFAULT_ZMQ_RUNTIME, ZMQ_RUNTIMES

__all__ = ["DEFAULT_ZMQ_RUNTIME", "ZMQ_RUNTIMES", "ZmqAddressError", "ZmqAddresses", "ZmqEngineClient", "zmq_addresses"]
