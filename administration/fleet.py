"""The gateway process's side of the worker registry: load stored workers, discover pending ones in
the background, and publish registry snapshots for the data plane.

Discovery retries a worker that is not up yet with a growing pause (0.5 s doubling up to
--worker-startup-check-interval) until --worker-startup-timeout-secs; the gateway serves meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from asgiref.sync import sync_to_async

from administration.discovery import WorkerUnreachable, discover_http_worker
from administration.models import WorkerStatus
from administration.workers import (
    record_discovery,
    record_discovery_failure,
    sync_cli_workers,
    worker_records,
)
from inference.config import GatewayConfig
from inference.routing.registry import REGISTRY, RegistrySnapshot, WorkerRecord

__all__ = ["Fleet"]

log = logging.getLogger(__name__)

_FIRST_RETRY_SECS = 0.5
_DISCOVERY_TIMEOUT = httpx.Timeout(5.0, connect=2.0)


class Fleet:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._client: httpx.AsyncClient | None = None

    async def astart(self) -> RegistrySnapshot:
        """Sync --worker-urls into the store, publish the first snapshot, start discovery."""
        await sync_to_async(sync_cli_workers, thread_sensitive=True)(self.config.worker_urls)
        snapshot = await self.arefresh()
        for handle in snapshot.workers:
            if handle.record.status == WorkerStatus.PENDING:
                self._start_discovery(handle.record)
        return snapshot

    async def arefresh(self) -> RegistrySnapshot:
        records = await sync_to_async(worker_records, thread_sensitive=True)(self.config.api_key)
        return REGISTRY.publish(records, dict(self.config.model_aliases))

    async def astop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _start_discovery(self, record: WorkerRecord) -> None:
        if record.id in self._tasks and not self._tasks[record.id].done():
            return
        self._tasks[record.id] = asyncio.ensure_future(self._discover(record))

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=_DISCOVERY_TIMEOUT, trust_env=False)
        return self._client

    async def _discover(self, record: WorkerRecord) -> None:
        deadline = time.monotonic() + self.config.worker_startup_timeout_secs
        pause = _FIRST_RETRY_SECS
        while True:
            try:
                discovery = await discover_http_worker(self._http(), record.url, record.api_key, record.runtime_type)
            except WorkerUnreachable as exc:
                if time.monotonic() + pause > deadline:
                    message = f"worker did not answer within {self.config.worker_startup_timeout_secs:g} s ({exc})"
                    log.error("giving up on worker %s: %s", record.url, message)
                    await sync_to_async(record_discovery_failure, thread_sensitive=True)(record.id, message)
                    await self.arefresh()
                    return
                log.info("worker %s not reachable yet; retrying in %.1f s", record.url, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.config.worker_startup_check_interval)
                continue
            if await sync_to_async(record_discovery, thread_sensitive=True)(record.id, discovery):
                log.info(
                    "worker %s ready: runtime %s, model %s", record.url, discovery.runtime_type, discovery.model_id
                )
            await self.arefresh()
            return
