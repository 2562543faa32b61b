"""One gRPC channel per worker: created once (on first use, in the running event loop), reused by
every call, closed when the worker leaves.

The keepalive profile is the engines' own client's (smg): a ping every 30 s, 10 s to answer, also
while idle; the engines' servers accept pings every 10 s without calls. Message sizes are unbounded
both ways, as on the engines' servers (a tokenizer zip or a long prompt must not hit gRPC's 4 MiB
default).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import grpc

from common import tls
from common.config import current_config
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.grpc.h2 import H2Channel

__all__ = [
    "CHANNEL_OPTIONS", "REJECTING_STATUSES", "WorkerChannel", "failure_from_rpc_error", "failure_from_status",
    "grpc_target",
]  # fmt: skip

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
)


def grpc_target(url: str) -> tuple[str, bool]:
    """``grpc://host:port`` → (``host:port``, False); ``grpcs://`` → (…, True). A bare
    ``host:port`` is taken as plaintext."""
    if "://" not in url:
        return url, False
    parts = urlsplit(url)
    if parts.scheme not in ("grpc", "grpcs", "http", "https") or not parts.netloc:
        raise ValueError(f"not a gRPC worker URL: {url!r}")
    return parts.netloc, parts.scheme in ("grpcs", "https")


_RETIRING: set[asyncio.Task[None]] = set()  # channels closing after a TLS reload, kept from the collector

REJECTING_STATUSES = frozenset({"INVALID_ARGUMENT", "OUT_OF_RANGE"})
"""The statuses by which an engine says "this request is invalid": the client's error (400, not
retried, not counted against the worker), never the worker's failure."""


def failure_from_status(name: str, details: str, what: str) -> UpstreamFailure:
    """The upstream failure a call's status stands for: the request refused as invalid (the
    client's error), or the worker unreachable, timed out, or broken off. The one mapping of gRPC
    statuses, for the grpc.aio calls and the event-loop reader (:mod:`.h2`) alike."""
    detail = f"{what}: {name}: {details}".rstrip(": ")
    if name in REJECTING_STATUSES:
        return UpstreamFailure.refused(detail)
    if name == "UNAVAILABLE":
        return UpstreamFailure(FailureKind.CONNECT, detail)
    if name == "DEADLINE_EXCEEDED":
        return UpstreamFailure(FailureKind.TIMEOUT, detail)
    return UpstreamFailure(FailureKind.BROKEN, detail)


def failure_from_rpc_error(error: grpc.aio.AioRpcError, what: str) -> UpstreamFailure:
    code = error.code()
    return failure_from_status(code.name if code is not None else "UNKNOWN", error.details() or "", what)


def _native_channel(target: str, stream_window: int) -> H2Channel | None:
    """The event-loop reader of a plaintext ``host:port`` target (None without an explicit port)."""
    try:
        parts = urlsplit("//" + target)
        port = parts.port
    except ValueError:
        return None
    if parts.hostname is None or port is None:
        return None
    return H2Channel(parts.hostname, port, target, stream_window=stream_window)


class WorkerChannel:
    """The ``grpc.aio`` channel to one worker. ``get()`` creates it on first use and returns the
    same channel afterwards; ``close()`` closes it (a later ``get()`` would open a new one).

    ``native`` is the worker's event-loop reader of generation streams (:mod:`.h2`, a plaintext
    worker with --grpc-stream-reader native), None when grpc.aio reads them too."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.url = url
        self.target, self.secure = grpc_target(url)
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )
        self._channel: grpc.aio.Channel | None = None
        self._tls_generation = 0  # common/tls.py's generation the secure channel was made with
        self.opened = 0  # channels created over this object's life (tests check reuse)
        config = current_config()
        native = not self.secure and config.grpc_stream_reader == "native"
        self.native: H2Channel | None = _native_channel(self.target, config.grpc_stream_window_bytes) if native else None

    def get(self) -> grpc.aio.Channel:
        if self.secure and self._channel is not None and self._tls_generation != tls.generation():
            self._retire()  # the worker TLS files changed: new calls go on a channel made with them
        if self._channel is None:
            if self.secure:
                self._tls_generation = tls.generation()
                credentials = tls.grpc_credentials()  # the public roots, --ca-cert-paths, the client chain
                self._channel = grpc.aio.secure_channel(self.target, credentials, options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
            self.opened += 1
        return self._channel

    def _retire(self) -> None:
        """Close the current channel once the calls on it ended (at most the request timeout)."""
        channel, self._channel = self._channel, None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        closing = loop.create_task(channel.close(grace=current_config().request_timeout_secs))  # type: ignore[union-attr]
        _RETIRING.add(closing)
        closing.add_done_callback(_RETIRING.discard)

    @property
    def is_open(self) -> bool:
        return self._channel is not None

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if self.native is not None:
            self.native.close()
        if channel is not None:
            await channel.close()
