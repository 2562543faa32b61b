"""consistent_hashing: the same x-gw-routing-key goes to the same worker while the fleet holds."""

from __future__ import annotations

import random
from bisect import bisect_right
from hashlib import blake2b
from typing import Sequence

from inference.routing.policies.base import SelectionRequest
from inference.routing.workers import WorkerHandle

__all__ = ["ConsistentHashing", "stable_hash"]

VIRTUAL_NODES = 160
_MAX_RINGS = 256


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process and on every run (unlike ``hash``)."""
    return int.from_bytes(blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class ConsistentHashing:
    """A hash ring over the candidates, looked up with the request's ``x-gw-routing-key``.

    Each worker has ``virtual_nodes`` points on the ring, hashed from its URL (not its id: ids are
    per database, so gateways sharing a fleet but not a database still agree, and a worker
    re-registered at the same URL gets its keys back). A key goes to the first point at or after its
    hash. Adding or removing one of N workers moves about 1/N of the keys, and only to or from that
    worker.

    Requests without a routing key go to a random candidate.
    """

    name = "consistent_hashing"
    needs_text = False

    def __init__(self, virtual_nodes: int = VIRTUAL_NODES) -> None:
        self.virtual_nodes = virtual_nodes
        self._points: dict[str, list[int]] = {}  # worker URL -> its points on the ring
        # candidate ids in order -> (sorted points, index of the candidate owning each point)
        self._rings: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        if len(candidates) == 1:
            return candidates[0]
        if not request.routing_key:
            return random.choice(candidates)
        ids = tuple([handle.id for handle in candidates])
        ring = self._rings.get(ids)
        if ring is None:
            ring = self._build(candidates, ids)
        points, owners = ring
        at = bisect_right(points, stable_hash(request.routing_key))
        return candidates[owners[at if at < len(points) else 0]]

    def _build(self, candidates: Sequence[WorkerHandle], ids: tuple[str, ...]) -> tuple[list[int], list[int]]:
        entries = sorted(
            (point, index) for index, handle in enumerate(candidates) for point in self._points_of(handle.url)
        )
        ring = ([point for point, _ in entries], [index for _, index in entries])
        if len(self._rings) >= _MAX_RINGS:
            self._rings.clear()
        self._rings[ids] = ring
        return ring

    def _points_of(self, url: str) -> list[int]:
        points = self._points.get(url)
        if points is None:
            points = self._points[url] = [stable_hash(f"{url}#{i}") for i in range(self.virtual_nodes)]
        return points

    def forget(self, worker_id: str) -> None:
        for ids in [ids for ids in self._rings if worker_id in ids]:
            del self._rings[ids]
