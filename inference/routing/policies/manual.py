"""manual: sticky sessions by x-gw-routing-key."""

from __future__ import annotations

from collections import OrderedDict
from hashlib import blake2b
from typing import Sequence

from inference.routing.policies.base import SelectionRequest, least_loaded
from inference.routing.workers import WorkerHandle

__all__ = ["Manual"]

MAX_ENTRIES = 100_000
_LONG_KEY = 64


class Manual:
    """The first request with a routing key goes to the least loaded worker, and later requests with
    that key (for the same model) follow it while it is a candidate. When it is not (gone, not
    ready), the key is placed anew the same way. The key -> worker table is an LRU of
    ``max_entries``; keys longer than 64 characters are stored as a digest. Requests without a key
    go to the least loaded worker."""

    name = "manual"
    needs_text = False

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._sticky: OrderedDict[tuple[str, str], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sticky)

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        key = request.routing_key
        if not key:
            return least_loaded(candidates)
        if len(key) > _LONG_KEY:
            key = blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        entry = (request.model, key)
        worker_id = self._sticky.get(entry)
        if worker_id is not None:
            for handle in candidates:
                if handle.id == worker_id:
                    self._sticky.move_to_end(entry)
                    return handle
        chosen = least_loaded(candidates)
        self._sticky[entry] = chosen.id
        self._sticky.move_to_end(entry)
        if len(self._sticky) > self.max_entries:
            self._sticky.popitem(last=False)
        return chosen

    def forget(self, worker_id: str) -> None:
        for entry in [entry for entry, owner in self._sticky.items() if owner == worker_id]:
            del self._sticky[entry]
