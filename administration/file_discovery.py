"""File worker discovery (--discovery-provider file --discovery-file PATH; D73).

The manifest, as the reference gateway reads it::

    {"version": 1, "workers": [{"url": "http://10.0.0.5:8000", "id": "a", "worker_type": "prefill",
                                "bootstrap_port": 8998, "model_id": "m", "kv_connector": "...",
                                "kv_role": "...", "kv_engine_id": "..."}]}

Only ``url`` is required; ``id`` (the discovery id) defaults to the url. A manifest of another
version, with an unknown key, a malformed entry, or a repeated id or url is refused and the last
good one kept (a warning says why). The file is read at start (it may also appear later), again as
soon as it changes (its size, mtime or inode, looked at every second) and every
--discovery-check-interval-secs. Each good read is published whole: administration/
discovery_reconcile.py registers the new entries and drains and removes the ones that went; an
entry whose id, url or fields changed is a removal plus a registration.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Mapping

import orjson

from administration.discovery_reconcile import DiscoveredWorker, Publish
from administration.models import WorkerType
from common.config import GatewayConfig

__all__ = ["FileDiscovery", "parse_manifest", "ManifestRefused"]

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
STAT_SECS = 1.0  # how often the file is looked at for a change
_STRING_KEYS = ("id", "model_id", "kv_connector", "kv_role", "kv_engine_id")
_KEYS = frozenset({"url", "worker_type", "bootstrap_port", *_STRING_KEYS})
_WORKER_TYPES = (WorkerType.REGULAR, WorkerType.PREFILL, WorkerType.DECODE)


class ManifestRefused(ValueError):
    """The manifest cannot be used (the message says why)."""


def _entry(index: int, raw: Any) -> DiscoveredWorker:
    where = f"workers[{index}]"
    if not isinstance(raw, dict):
        raise ManifestRefused(f"{where} is not an object")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ManifestRefused(f"{where} has unknown key(s) {', '.join(unknown)}")
    url = raw.get("url")
    if not isinstance(url, str) or not url:
        raise ManifestRefused(f"{where}.url must be a non-empty string")
    for key in _STRING_KEYS:
        if raw.get(key) is not None and (not isinstance(raw[key], str) or not raw[key]):
            raise ManifestRefused(f"{where}.{key} must be a non-empty string")
    worker_type = raw.get("worker_type") or WorkerType.REGULAR
    if worker_type not in _WORKER_TYPES:
        raise ManifestRefused(f"{where}.worker_type must be one of {', '.join(_WORKER_TYPES)}")
    port = raw.get("bootstrap_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise ManifestRefused(f"{where}.bootstrap_port must be a port number")
    return DiscoveredWorker(
        discovery_id=raw.get("id") or url, url=url, worker_type=worker_type, bootstrap_port=port,
        model_id=raw.get("model_id"), kv_connector=raw.get("kv_connector"), kv_role=raw.get("kv_role"),
        kv_engine_id=raw.get("kv_engine_id"),
    )


def parse_manifest(data: bytes) -> dict[str, DiscoveredWorker]:
    """The workers of a manifest by discovery id; raises ManifestRefused."""
    try:
        manifest = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ManifestRefused(f"not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise ManifestRefused("not a JSON object")
    unknown = sorted(set(manifest) - {"version", "workers"})
    if unknown:
        raise ManifestRefused(f"unknown key(s) {', '.join(unknown)}")
    if manifest.get("version") != MANIFEST_VERSION:
        raise ManifestRefused(f"version {manifest.get('version')!r} (this gateway reads version {MANIFEST_VERSION})")
    entries = manifest.get("workers")
    if not isinstance(entries, list):
        raise ManifestRefused("workers must be a list")
    found: dict[str, DiscoveredWorker] = {}
    urls: set[str] = set()
    for index, raw in enumerate(entries):
        worker = _entry(index, raw)
        if worker.discovery_id in found:
            raise ManifestRefused(f"id {worker.discovery_id!r} appears twice")
        if worker.url in urls:
            raise ManifestRefused(f"url {worker.url!r} appears twice")
        urls.add(worker.url)
        found[worker.discovery_id] = worker
    return found


class FileDiscovery:
    """Rereads the manifest when it changes and every check interval, publishing each good read."""

    name = "file"

    def __init__(self, config: GatewayConfig) -> None:
        assert config.discovery_file is not None
        self.path = config.discovery_file
        self.interval = config.discovery_check_interval_secs
        self.reads = 0  # reads of the file (good or refused)
        self.refusals = 0
        self._stamp: tuple[int, int, int] | None = None
        self.missing = False  # the file was not there at the last look (logged once)

    def _read(self) -> Mapping[str, DiscoveredWorker] | None:
        """The manifest's workers, or None when it is missing or refused (the last good one stays)."""
        try:
            with open(self.path, "rb") as manifest:
                stat = os.fstat(manifest.fileno())
                data = manifest.read()
        except FileNotFoundError:
            if not self.missing:
                log.warning("discovery: manifest %s does not exist (yet); the workers stay as they are", self.path)
                self.missing = True
            self._stamp = None
            return None
        except OSError as exc:
            log.warning("discovery: cannot read manifest %s (%s); the last good one is kept", self.path, exc)
            return None
        self.missing = False
        self._stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        self.reads += 1
        try:
            return parse_manifest(data)
        except ManifestRefused as exc:
            self.refusals += 1
            log.warning("discovery: manifest %s refused (%s); the last good one is kept", self.path, exc)
            return None

    def _changed(self) -> bool:
        try:
            stat = os.stat(self.path)
        except OSError:
            return self._stamp is not None
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns) != self._stamp

    async def run(self, publish: Publish) -> None:
        due = 0.0
        while True:
            now = time.monotonic()
            if now >= due or await asyncio.to_thread(self._changed):
                due = now + self.interval
                found = await asyncio.to_thread(self._read)
                if found is not None:
                    publish(found)
            await asyncio.sleep(min(STAT_SECS, self.interval))
