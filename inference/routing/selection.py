"""Resolve a request's model and choose the worker that serves it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from inference import errors
from common.config import current_config
from inference.routing.breaker import BreakerState
from inference.routing.policies import PolicySet, SelectionRequest
from inference.routing.registry import RegistrySnapshot
from inference.routing.workers import WorkerHandle
from inference.routing.request_text import request_text

__all__ = ["RoutingDecision", "select_worker"]


@dataclass(slots=True)  # not frozen: a frozen __init__ sets each field through object.__setattr__ (D86)
class RoutingDecision:
    worker: WorkerHandle
    model: str | None  # canonical model id, None when the request named no model
    policy: str = ""  # name of the policy that chose the worker


def select_worker(
    snapshot: RegistrySnapshot,
    model: str | None,
    policies: PolicySet,
    routing_key: str | None = None,
    body: Mapping[str, Any] | None = None,
    exclude: frozenset[str] = frozenset(),
) -> RoutingDecision:
    """Pick a ready worker for ``model`` (an id or alias; None means any worker) with the model's
    policy. ``routing_key`` is the x-gw-routing-key header; ``body`` the parsed request, read for its
    text only when the policy matches on text (cache_aware).

    Workers in ``exclude`` (already tried), workers whose circuit breaker is open and workers the
    load monitor found overloaded are skipped. Raises 404 model_not_found when no worker serves or
    may serve the model, 503 when workers for it exist but none is ready or usable (or the registry
    is not loaded yet: the process started while its store did not answer), and 503
    worker_overload_protection_shed (Retry-After: the load-monitor interval) when every worker left
    is overloaded.
    """
    policies.observe(snapshot)
    candidates: Sequence[WorkerHandle]
    if model is None:
        candidates = snapshot.routable
        if not candidates:
            raise errors.no_healthy_workers(None)
        canonical = None
    else:
        canonical = snapshot.aliases.get(model, model)
        candidates = snapshot.routable_by_model.get(canonical) or snapshot.routable_any_model
        if not candidates:
            if canonical in snapshot.known_models or snapshot.undiscovered or not snapshot.loaded:
                raise errors.no_healthy_workers(canonical)
            raise errors.model_not_found(model)
    policy = policies.for_model(canonical or "")
    request = SelectionRequest(canonical or "", routing_key, request_text(body) if policy.needs_text else None)
    if not exclude:
        # The common case costs what the policy costs, not a scan of the fleet: the pick is checked,
        # and only a pick that may not take traffic sends the choice through the filtered list.
        worker = policy.select(candidates, request)
        load = worker.load
        if not load.overloaded and (load.breaker.state is BreakerState.CLOSED or load.breaker.allows()):
            return RoutingDecision(worker, canonical, policy.name)
    usable = _usable(candidates, exclude)
    if not usable:
        if any(h.load.overloaded and h.id not in exclude for h in candidates):
            raise errors.worker_overload_shed(current_config().load_monitor_interval)
        raise errors.no_healthy_workers(canonical)
    worker = policy.select(usable, request)
    return RoutingDecision(worker, canonical, policy.name)


def _usable(candidates: Sequence[WorkerHandle], exclude: frozenset[str]) -> Sequence[WorkerHandle]:
    """Candidates not yet tried, not overloaded, whose breaker lets traffic through."""
    now = time.monotonic()
    return tuple(
        h for h in candidates if h.id not in exclude and not h.load.overloaded and h.load.breaker.allows(now)
    )
