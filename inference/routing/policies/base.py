"""What every selection policy sees and promises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from inference.routing.workers import WorkerHandle

__all__ = ["SelectionRequest", "SelectionPolicy", "least_loaded"]


@dataclass(frozen=True, slots=True)
class SelectionRequest:
    model: str  # canonical model id, "" when the request names none
    routing_key: str | None  # the x-gw-routing-key header value
    text: str | None  # request text, only computed when the chosen policy has needs_text


class SelectionPolicy(Protocol):
    """Picks one worker per request. Policies keep in-process state only and never await, so one
    asyncio event loop needs no locks around them."""

    name: str
    needs_text: bool

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        """Pick one of ``candidates`` (never empty)."""

    def forget(self, worker_id: str) -> None:
        """Drop what is remembered about a worker that left the registry."""


def least_loaded(candidates: Sequence[WorkerHandle]) -> WorkerHandle:
    """The worker with the fewest requests in flight; ties go to the earliest registered."""
    best = candidates[0]
    lowest = best.load.in_flight
    for handle in candidates:
        if handle.load.in_flight < lowest:
            best, lowest = handle, handle.load.in_flight
    return best
