"""An approximate radix tree over request text, remembering which workers were sent which prefix.

The cache_aware policy keeps one tree per model (the SGLang router's approach). Each node holds an
edge of text and, per worker that was last sent a request through that edge, the time of that
request. Ownership is prefix-closed: a worker that owns a node owns every ancestor (inserts mark the
whole path, eviction removes a worker's leaves first), so the longest prefix some worker owns is
found in one walk from the root.

The tree is "approximate" because it models what the workers' KV caches probably hold, not what they
do hold: engines evict on their own. Memory is bounded by trimming each worker's share to a number of
characters, least recently used leaves first. Each worker keeps a heap of its candidate leaves, so
trimming costs O(log n) per leaf dropped and never walks the tree: on a 35k-node tree a walk took
45-150 ms, an event-loop stall that would grow to seconds at the default 2**26 characters.

Every method is synchronous and never awaits, so a single asyncio event loop needs no lock.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Container

__all__ = ["PrefixTree"]


class _Node:
    __slots__ = ("text", "children", "owners", "owned_children", "parent")

    def __init__(self, text: str, parent: _Node | None) -> None:
        self.text = text  # the edge from the parent; never empty except at the root
        self.children: dict[str, _Node] = {}  # keyed by the first character of the child's text
        self.owners: dict[str, float] = {}  # worker id -> last time a request went through here
        self.owned_children: dict[str, int] = {}  # worker id -> how many children it owns
        self.parent = parent


def _common_length(text: str, pos: int, edge: str) -> int:
    """How many characters of ``edge`` match ``text`` at ``pos``, knowing the first one does.

    Binary search over ``str.startswith`` so long edges are compared in C, not per character."""
    low, high = 1, min(len(edge), len(text) - pos)
    while low < high:
        middle = (low + high + 1) // 2
        if text.startswith(edge[low:middle], pos + low):
            low = middle
        else:
            high = middle - 1
    return low


class PrefixTree:
    def __init__(self) -> None:
        self._root = _Node("", None)
        self._sizes: dict[str, int] = {}  # characters each worker owns
        self._nodes: dict[str, int] = {}  # nodes each worker owns
        # Per worker, candidate leaves oldest first: (last access, tie-break, node). Entries go stale
        # when the node is touched again or loses the worker; they are checked when popped.
        self._heaps: dict[str, list[tuple[float, int, _Node]]] = {}
        self._draining: dict[str, list[tuple[float, int, _Node]]] = {}  # heaps of forgotten workers
        self._order = itertools.count()

    def size(self, worker_id: str) -> int:
        """Characters of text owned by ``worker_id`` (shared edges count for every owner)."""
        return self._sizes.get(worker_id, 0)

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(self._sizes)

    def match(self, text: str, allowed: Container[str]) -> tuple[int, list[str]]:
        """The longest prefix of ``text`` owned by a worker in ``allowed``: its length in characters
        and the allowed workers owning it (empty when nothing matches)."""
        node = self._root
        pos = 0
        end = len(text)
        best = 0
        best_node: _Node | None = None
        while pos < end:
            child = node.children.get(text[pos])
            if child is None:
                break
            for owner in child.owners:
                if owner in allowed:
                    break
            else:
                break
            edge = child.text
            if text.startswith(edge, pos):
                pos += len(edge)
                best, best_node = pos, child
                node = child
                continue
            best, best_node = pos + _common_length(text, pos, edge), child
            break
        if best_node is None:
            return 0, []
        return best, [owner for owner in best_node.owners if owner in allowed]

    def insert(self, text: str, worker_id: str, now: float, max_size: int | None = None) -> None:
        """Record that ``text`` was sent to ``worker_id`` at ``now`` (monotonic seconds); then, given
        ``max_size``, trim the worker back to it (see :meth:`trim`)."""
        if self._draining:
            self._drain(worker_id)
        node = self._root
        pos = 0
        end = len(text)
        added = 0
        new_nodes = 0
        while pos < end:
            first = text[pos]
            child = node.children.get(first)
            if child is None:
                child = _Node(text[pos:], node)
                node.children[first] = child
            elif not text.startswith(child.text, pos):
                child = self._split(node, child, _common_length(text, pos, child.text))
            if worker_id not in child.owners:
                added += len(child.text)
                new_nodes += 1
                node.owned_children[worker_id] = node.owned_children.get(worker_id, 0) + 1
            child.owners[worker_id] = now
            pos += len(child.text)
            node = child
        if node is self._root:
            return
        heap = self._heaps.get(worker_id)
        if heap is None:
            heap = self._heaps[worker_id] = []
        heapq.heappush(heap, (now, next(self._order), node))
        size = self._sizes[worker_id] = self._sizes.get(worker_id, 0) + added
        owned = self._nodes[worker_id] = self._nodes.get(worker_id, 0) + new_nodes
        if max_size is not None and size > max_size:
            self.trim(worker_id, max_size)
            owned = self._nodes[worker_id]
        if len(heap) > 2 * owned + 64:
            self._compact(worker_id)

    def _split(self, parent: _Node, child: _Node, at: int) -> _Node:
        """Cut ``child``'s edge after ``at`` characters; returns the new node holding the head."""
        edge = child.text
        head = _Node(edge[:at], parent)
        head.owners = dict(child.owners)
        head.owned_children = dict.fromkeys(child.owners, 1)
        for owner in head.owners:
            self._nodes[owner] = self._nodes.get(owner, 0) + 1
        head.children[edge[at]] = child
        parent.children[edge[0]] = head
        child.text = edge[at:]
        child.parent = head
        return head

    def trim(self, worker_id: str, max_size: int) -> int:
        """Drop ``worker_id``'s least recently used leaves until it owns at most ``max_size``
        characters. Returns the characters released. Costs O(log n) per leaf dropped, no walk."""
        size = self._sizes.get(worker_id, 0)
        if size <= max_size:
            return 0
        heap = self._heaps[worker_id]
        before = size
        while size > max_size and heap:
            size -= self._pop_leaf(worker_id, heap)
        self._sizes[worker_id] = size
        return before - size

    def evict(self, max_size: int) -> int:
        """Trim every worker to ``max_size`` characters; returns the characters released."""
        return sum(self.trim(worker_id, max_size) for worker_id in list(self._sizes))

    def _pop_leaf(self, worker_id: str, heap: list[tuple[float, int, _Node]]) -> int:
        """Pop one heap entry; when it is a current leaf of the worker, drop the worker from it (and
        the node when nobody owns it). Returns the characters released (0 for a stale entry)."""
        seen, _, node = heapq.heappop(heap)
        if node.owners.get(worker_id) != seen or worker_id in node.owned_children:
            return 0  # touched again since (a newer entry exists) or not a leaf (pushed when it is)
        del node.owners[worker_id]
        self._nodes[worker_id] -= 1
        parent = node.parent
        assert parent is not None  # the root is never pushed
        if not node.owners:
            del parent.children[node.text[0]]  # nobody owns it, so nobody owns anything below it
        remaining = parent.owned_children[worker_id] - 1
        if remaining:
            parent.owned_children[worker_id] = remaining
        else:
            del parent.owned_children[worker_id]
            if parent is not self._root:
                heapq.heappush(heap, (parent.owners[worker_id], next(self._order), parent))
        return len(node.text)

    def _compact(self, worker_id: str) -> None:
        """Drop stale heap entries (repeated identical texts push entries without adding nodes)."""
        heap = [entry for entry in self._heaps[worker_id] if entry[2].owners.get(worker_id) == entry[0]]
        heapq.heapify(heap)
        self._heaps[worker_id] = heap

    def remove_worker(self, worker_id: str) -> None:
        """Forget ``worker_id`` (it left the registry). It stops counting at once; its nodes are
        released a few at a time on later inserts, so a large tree never stalls the caller."""
        if self._sizes.pop(worker_id, None) is None:
            return
        self._draining[worker_id] = self._heaps.pop(worker_id, [])

    def _drain(self, inserting: str, budget: int = 64) -> None:
        if inserting in self._draining:  # it came back: finish forgetting the old state first
            budget = -1
        for worker_id in list(self._draining):
            heap = self._draining[worker_id]
            while heap and budget != 0:
                self._pop_leaf(worker_id, heap)
                budget -= 1
            if not heap:
                del self._draining[worker_id]
                self._nodes.pop(worker_id, None)
            if budget == 0:
                return

    def chars_owned_by(self, worker_id: str) -> int:
        """Recount a worker's characters by walking the tree (for checks; :meth:`size` is O(1))."""
        total = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            for child in node.children.values():
                if worker_id in child.owners:
                    total += len(child.text)
                stack.append(child)
        return total

    def node_count(self) -> int:
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count
