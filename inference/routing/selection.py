"""Resolve a request's model and choose the worker that serves it."""

from __future__ import annotations

from dataclasses import dataclass

from inference import errors
from inference.routing.policies import SelectionPolicy
from inference.routing.registry import RegistrySnapshot, WorkerHandle

__all__ = ["RoutingDecision", "select_worker"]


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    worker: WorkerHandle
    model: str | None  # canonical model id, None when the request named no model


def select_worker(snapshot: RegistrySnapshot, model: str | None, policy: SelectionPolicy) -> RoutingDecision:
    """Pick a ready worker for ``model`` (an id or alias; None means any worker).

    Raises 404 model_not_found when no worker serves or may serve the model, 503 when workers for it
    exist but none is ready.
    """
    if model is None:
        candidates = snapshot.routable
        if not candidates:
            raise errors.no_healthy_workers(None)
        return RoutingDecision(policy.select(candidates, ""), None)
    canonical = snapshot.aliases.get(model, model)
    candidates = snapshot.routable_by_model.get(canonical) or snapshot.routable_any_model
    if candidates:
        return RoutingDecision(policy.select(candidates, canonical), canonical)
    if canonical in snapshot.known_models or snapshot.undiscovered:
        raise errors.no_healthy_workers(canonical)
    raise errors.model_not_found(model)
