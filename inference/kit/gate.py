"""The gate every inference request passes before it may use a worker: authenticate, refuse a tenant
whose token budget is used up, rate-limit the tenant, read the body under the size limit, parse it,
validate it with the surface's rules and measure its inline media. Each step fails with the spec's
error (a :class:`GatewayError`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from common import telemetry
from inference import errors
from inference.asgi_io import Receive, Scope, header, parse_json_object, read_body
from inference.auth import Identity
from inference.dataplane import DataPlane
from inference.schemas.base import ValidatedRequest
from inference.writers import ResponseClock

__all__ = ["Passed", "Validator", "pass_gate"]

Validator = Callable[[dict[str, Any]], ValidatedRequest]


@dataclass(slots=True)  # not frozen: a frozen __init__ sets each field through object.__setattr__ (D86)
class Passed:
    """A request that passed the gate (never changed once made)."""

    identity: Identity
    raw: bytes  # the body as the client sent it
    checked: ValidatedRequest
    media_bytes: int  # inline media to reserve from the in-flight budget (0: none, or no budget)


async def pass_gate(dp: DataPlane, scope: Scope, receive: Receive, validate: Validator, clock: ResponseClock) -> Passed:
    """Raises GatewayError (401 unauthorized first) or ClientDisconnected while reading the body.
    The rate-limit headers of an allowed request go on ``clock`` for the response."""
    identity = dp.keys.authenticate(header(scope, b"authorization"))
    if identity is None:
        raise errors.unauthorized()
    scope["gateway.identity"] = identity
    budgets = dp.budgets
    if budgets is not None and identity.tenant_id is not None:  # tenant keys only: never the scopes
        spent = budgets.check(identity.tenant_id)  # no I/O: this process's view (admission/budgets.py)
        if spent is not None:
            raise errors.budget_exceeded(spent.budget.period, spent.retry_after)
    limiter = dp.rate_limiter
    if limiter is not None:
        tenant = identity.rate_limited_tenant
        if tenant is not None:
            limited = await limiter.hit(tenant)
            if limited is not None:
                telemetry.record_rate_limit(limited.allowed)
                if not limited.allowed:
                    raise errors.rate_limit_exceeded(limited.headers())
                clock.headers = limited.headers()
    raw = await read_body(scope, receive, dp.config.max_payload_size)
    checked = validate(parse_json_object(raw))
    media_bytes = dp.media.measure(checked.body) if dp.media is not None else 0
    return Passed(identity, raw, checked, media_bytes)
