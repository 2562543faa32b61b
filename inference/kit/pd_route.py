"""Whether a request goes through prefill/decode disaggregation, and its pair.

A model is served by PD when no regular worker serves it and the registry's PD pool has prefill or
decode workers for it (registered with --pd-disaggregation, or through the admin API with
worker_type prefill/decode). The pair is chosen with --prefill-policy and --decode-policy (default
--policy) among prefill and decode workers with equal pairing keys; none: 503 no_prefill_servers.
"""

from __future__ import annotations

from typing import Any, Mapping

from inference.dataplane import DataPlane
from inference.routing.pd import PdPair, select_pair
from inference.routing.policies import SelectionRequest
from inference.routing.request_text import request_text

__all__ = ["pd_pair_for", "serves_by_epd", "serves_by_pd"]


def serves_by_pd(dp: DataPlane, model: str | None) -> bool:
    """Whether requests for ``model`` (as the client named it; None: any) go through PD."""
    snapshot = dp.registry.snapshot
    pool = snapshot.pd
    if not pool:
        return False
    canonical = snapshot.aliases.get(model, model) if model else None
    if canonical is None:
        if snapshot.routable:
            return False
    elif snapshot.routable_by_model.get(canonical) or snapshot.routable_any_model:
        return False
    prefills, decodes = pool.members(canonical)
    return bool(prefills or decodes)


def serves_by_epd(dp: DataPlane, model: str | None) -> bool:
    """Whether requests for ``model`` (None: any) land on a gRPC EPD deployment: no regular worker
    serves it and a ready engine encode worker does (surfaces the spec refuses there answer 501)."""
    snapshot = dp.registry.snapshot
    canonical = snapshot.aliases.get(model, model) if model else None
    if canonical is None:
        if snapshot.routable:
            return False
    elif snapshot.routable_by_model.get(canonical) or snapshot.routable_any_model:
        return False
    return snapshot.pd.encodes(canonical)


def pd_pair_for(
    dp: DataPlane,
    model: str | None,
    routing_key: str | None,
    body: Mapping[str, Any] | None,
    exclude: frozenset[str] = frozenset(),
) -> PdPair:
    """The pair for a PD request (:func:`serves_by_pd`). Raises 503 no_prefill_servers or
    no_healthy_workers."""
    snapshot = dp.registry.snapshot
    canonical = snapshot.aliases.get(model, model) if model else None
    prefills, decodes = snapshot.pd.members(canonical)
    prefill_policy, decode_policy = dp.prefill_policy, dp.decode_policy
    assert prefill_policy is not None and decode_policy is not None
    needs_text = prefill_policy.needs_text or decode_policy.needs_text
    request = SelectionRequest(canonical or "", routing_key, request_text(body) if needs_text and body else None)
    return select_pair(prefills, decodes, canonical, prefill_policy, decode_policy, request, exclude)
