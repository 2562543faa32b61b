"""This process's engine clients: one per engine worker (one connection each), made on first use,
kept while the worker is registered with the same URL, runtime and key, and closed when it leaves.
The client class is the one registered for the worker's transport and runtime.

The data plane's requests, the health checks and the load monitor of the process all use the same
client, so a worker costs one channel per process whatever asks it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable

from inference.routing.workers import WorkerRecord
from inference.upstreams.engine import ENGINE_CLIENTS, EngineClient, EngineKey
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.registry import UnknownUpstream

__all__ = ["EnginePool"]

log = logging.getLogger(__name__)

_Identity = tuple[str, str, str | None, int | None, str | None]  # url, runtime, api key, ZMQ dp_size and handshake


class EnginePool:
    def __init__(self) -> None:
        self._clients: dict[str, tuple[_Identity, EngineClient]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._clients)

    def client(self, record: WorkerRecord) -> EngineClient:
        """The engine client of ``record``'s worker. Raises UpstreamFailure (BROKEN) when its runtime
        has no engine client over its transport (not detected yet, or not an engine runtime)."""
        spec = record.engine
        identity: _Identity = (
            record.url, record.runtime_type, record.api_key,
            spec.dp_size if spec is not None else None, spec.zmq_handshake_address if spec is not None else None,
        )  # fmt: skip
        held = self._clients.get(record.id)
        if held is not None and held[0] == identity:
            return held[1]
        try:
            client_class = ENGINE_CLIENTS.get(EngineKey(record.transport, record.runtime_type))
        except UnknownUpstream:
            over = record.transport.display_name
            raise UpstreamFailure(
                FailureKind.BROKEN, f"worker {record.url} runs {record.runtime_type!r}, which has no {over} engine client"
            ) from None
        try:
            client = client_class.for_worker(record)
        except ValueError as exc:  # a worker spec the client cannot take (a ZMQ address)
            raise UpstreamFailure(FailureKind.BROKEN, f"worker {record.url}: {exc}") from None
        self._clients[record.id] = (identity, client)
        if held is not None:
            self._close_later(held[1])
        return client

    def retain(self, worker_ids: Iterable[str]) -> None:
        """Close the clients of workers not in ``worker_ids`` (they left the registry)."""
        keep = set(worker_ids)
        for worker_id in [worker_id for worker_id in self._clients if worker_id not in keep]:
            self._close_later(self._clients.pop(worker_id)[1])

    def _close_later(self, client: EngineClient) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._close(client))
        except RuntimeError:  # no loop in this thread: the channel was never opened in one either
            return
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(client: EngineClient) -> None:
        try:
            await client.close()
        except Exception as exc:  # a channel that fails to close has nothing left to release
            log.debug("closing the engine client of %s: %s", client.url, exc)

    async def aclose(self) -> None:
        clients = [client for _, client in self._clients.values()]
        self._clients.clear()
        for client in clients:
            await self._close(client)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
