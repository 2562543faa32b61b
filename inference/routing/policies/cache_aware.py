"""cache_aware: send a request where its prefix was sent before, unless the load is lopsided."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from common.config import GatewayConfig
from inference.routing.policies.base import SelectionRequest, least_loaded
from inference.routing.prefix_tree import PrefixTree
from inference.routing.workers import WorkerHandle

__all__ = ["CacheAware"]


class CacheAware:
    """The SGLang router's cache-aware policy over one approximate prefix tree per model.

    Per request:

    1. If the candidates' load is imbalanced (``max - min > balance_abs_threshold`` and
       ``max > min * balance_rel_threshold``, counting requests in flight), take the least loaded.
    2. Else find the longest prefix of the request text some candidate was sent before. When it
       covers at least ``cache_threshold`` of the text, take that candidate (the least loaded of
       several); otherwise the candidate with the smallest tree, to spread distinct prefixes.
    3. Record the text under the chosen worker.

    A request without text (no recognisable prompt) goes to the least loaded worker.

    Memory: each worker's share of each tree is kept at most ``max_tree_size`` characters, trimmed
    on insert by dropping its least recently used leaves (O(log n) per leaf, see
    :mod:`inference.routing.prefix_tree`). The SGLang router trims every ``eviction_interval_secs``
    on a background thread instead; here a periodic pass would stall the event loop for as long as
    it takes to drop a whole interval's growth, so ``--eviction-interval-secs`` is not used.
    """

    name = "cache_aware"
    needs_text = True

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        max_tree_size: int = 2**26,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_tree_size = max_tree_size
        self._clock = clock
        self._trees: dict[str, PrefixTree] = {}

    @classmethod
    def from_config(cls, config: GatewayConfig) -> CacheAware:
        return cls(
            cache_threshold=config.cache_threshold,
            balance_abs_threshold=config.balance_abs_threshold,
            balance_rel_threshold=config.balance_rel_threshold,
            max_tree_size=config.max_tree_size,
        )

    def tree(self, model: str) -> PrefixTree:
        tree = self._trees.get(model)
        if tree is None:
            tree = self._trees[model] = PrefixTree()
        return tree

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        text = request.text or ""
        tree = self.tree(request.model)
        chosen = candidates[0] if len(candidates) == 1 else self._choose(tree, candidates, text)
        if text:
            tree.insert(text, chosen.id, self._clock(), self.max_tree_size)
        return chosen

    def _choose(self, tree: PrefixTree, candidates: Sequence[WorkerHandle], text: str) -> WorkerHandle:
        lowest = highest = candidates[0].load.in_flight
        for handle in candidates:
            load = handle.load.in_flight
            if load < lowest:
                lowest = load
            elif load > highest:
                highest = load
        if not text or (
            highest - lowest > self.balance_abs_threshold and highest > lowest * self.balance_rel_threshold
        ):
            return least_loaded(candidates)
        by_id = {handle.id: handle for handle in candidates}
        matched, owners = tree.match(text, by_id)
        if owners and matched >= self.cache_threshold * len(text):
            return least_loaded([by_id[owner] for owner in owners])
        best = candidates[0]
        smallest = tree.size(best.id)
        for handle in candidates:
            size = tree.size(handle.id)
            if size < smallest or (size == smallest and handle.load.in_flight < best.load.in_flight):
                best, smallest = handle, size
        return best

    def forget(self, worker_id: str) -> None:
        for tree in self._trees.values():
            tree.remove_worker(worker_id)
