"""Per-tenant rate limits (spec 1, Authentication and Limits): requests per minute per tenant key.

A fixed one-minute window per tenant. With ``REDIS_URL`` set the counter lives in Redis and is
shared by every gateway process: one Lua script (INCR, and PEXPIRE on the first hit) per request,
one round trip. Without Redis the counter is in-process.

When Redis cannot be reached the limiter fails open to this process's own count: each request is
counted in an in-process window as without Redis, so a tenant still meets its limit in every
process (at most limit x processes a minute across them) and no request is refused because Redis is
down. Redis is an accelerator shared by the processes, not the record; refusing every limited
tenant (failing closed) would turn its outage into an outage of the data plane. The outage is logged
once when it starts and once when it ends (:data:`common.outages.REDIS`).

Coming back: ``REDIS.retry_secs`` after the last failure one request tries Redis again (the others
keep counting here meanwhile), and once it answers every request counts in Redis again. A command
that fails on a pooled connection is sent once more on a new one, so the connections Redis dropped
as it restarted (every one the pool holds is stale then) are replaced instead of each reopening the
outage for another pause. A tenant's count of the outage in the current window is added to the
shared count with its first request that reaches Redis again, so the budget of that minute is the
one budget again at once, not a fresh one beside what each process already let through.

Where a tenant's limit comes from (:meth:`TenantLimits.combine`, the one place that decides): a row
stored in the admin console (table ``administration_tenantratelimit``), else its
``--tenant-rate-limit`` flag, else ``--default-tenant-rate-limit``; 0 means unlimited, so a stored 0
exempts a tenant from the default. The fleet loop reads the stored rows (on notices and every 5 s,
never per request) and installs the result with :func:`refit_rate_limiter`.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from common.outages import REDIS

__all__ = [
    "RateDecision",
    "RateLimiter",
    "LocalRateLimiter",
    "RedisRateLimiter",
    "WindowCounts",
    "TenantLimits",
    "refit_rate_limiter",
]

WINDOW_SECS = 60

# ARGV[2]: this request plus what this process counted for the tenant in this window while Redis was
# out of reach (usually 1). The key is new when the count is what was just added.
_INCR_SCRIPT = """
local n = redis.call('INCRBY', KEYS[1], ARGV[2])
if n == tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
"""


def shared_counter_client(url: str) -> Any:
    """A Redis client for counters shared by every gateway process (rate limits, token budgets):
    half a second to connect or answer, one immediate retry on a dropped connection, so an outage
    is seen at once and the caller falls back to counting locally."""
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    return aredis.Redis.from_url(
        url, socket_connect_timeout=0.5, socket_timeout=0.5,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )


@dataclass(frozen=True, slots=True)
class RateDecision:
    """The outcome of counting one request against its tenant's budget."""

    allowed: bool
    limit: int
    remaining: int
    reset_at: int  # Unix timestamp at which the window ends

    def headers(self, now: float | None = None) -> tuple[tuple[bytes, bytes], ...]:
        """X-RateLimit-* headers, plus Retry-After (seconds) when refused."""
        found = (
            (b"x-ratelimit-limit", str(self.limit).encode()),
            (b"x-ratelimit-remaining", str(self.remaining).encode()),
            (b"x-ratelimit-reset", str(self.reset_at).encode()),
        )
        if self.allowed:
            return found
        wait = max(1, math.ceil(self.reset_at - (time.time() if now is None else now)))
        return ((b"retry-after", str(wait).encode()), *found)


class TenantLimits:
    """Requests per minute for each tenant: its own setting, else the default (0: unlimited)."""

    __slots__ = ("default", "by_tenant")

    def __init__(self, default: int, by_tenant: Iterable[tuple[str, str | int]]) -> None:
        self.default = default
        self.by_tenant = {tenant: int(rpm) for tenant, rpm in by_tenant}

    @classmethod
    def combine(
        cls, default: int, flags: Iterable[tuple[str, str]], stored: Mapping[str, int], share: int = 1
    ) -> TenantLimits:
        """The limits in force: per tenant a stored row overrides its --tenant-rate-limit flag, and
        --default-tenant-rate-limit covers tenants with neither (a stored or flagged 0: unlimited).
        ``share``: the serving processes that count separately; each enforces its part, rounded up."""
        by_tenant: dict[str, str | int] = dict(flags)
        by_tenant.update(stored)
        return cls(_part(default, share), ((tenant, _part(int(rpm), share)) for tenant, rpm in by_tenant.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TenantLimits):
            return NotImplemented
        return self.default == other.default and self.by_tenant == other.by_tenant

    __hash__ = None  # type: ignore[assignment]  # mutable dict inside: equal by value, not hashable

    def __repr__(self) -> str:
        return f"TenantLimits(default={self.default}, by_tenant={self.by_tenant})"

    @property
    def any(self) -> bool:
        return self.default > 0 or any(rpm > 0 for rpm in self.by_tenant.values())

    def limit_for(self, tenant_id: str) -> int:
        return self.by_tenant.get(tenant_id, self.default)


def _part(limit: int, share: int) -> int:
    return limit if limit <= 0 or share <= 1 else -(-limit // share)


def _decision(count: int, limit: int, window: int) -> RateDecision:
    return RateDecision(count <= limit, limit, max(0, limit - count), (window + 1) * WINDOW_SECS)


class RateLimiter:
    """Counts one request for a tenant; ``None`` means the tenant has no limit."""

    def __init__(self, limits: TenantLimits) -> None:
        self.limits = limits

    async def hit(self, tenant_id: str) -> RateDecision | None:
        limit = self.limits.limit_for(tenant_id)
        if limit <= 0:
            return None
        window = int(time.time() // WINDOW_SECS)
        count = await self._count(tenant_id, window)
        if count is None:
            return None
        return _decision(count, limit, window)

    async def _count(self, tenant_id: str, window: int) -> int | None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release connections (lifespan shutdown)."""


class WindowCounts:
    """Requests counted in this process: one window per tenant."""

    __slots__ = ("_windows",)

    def __init__(self) -> None:
        self._windows: dict[str, list[int]] = {}  # tenant -> [window, count]

    def count(self, tenant_id: str, window: int, requests: int = 1) -> int:
        """Add ``requests`` to the tenant's count in ``window``; the count."""
        entry = self._windows.get(tenant_id)
        if entry is None or entry[0] != window:
            entry = self._windows[tenant_id] = [window, 0]
        entry[1] += requests
        return entry[1]

    def take(self, tenant_id: str, window: int) -> int:
        """Remove the tenant's count and return it if it is of ``window`` (else 0): it is to count
        elsewhere now."""
        entry = self._windows.pop(tenant_id, None)
        return entry[1] if entry is not None and entry[0] == window else 0


class LocalRateLimiter(RateLimiter):
    """The in-process counter (no Redis)."""

    def __init__(self, limits: TenantLimits) -> None:
        super().__init__(limits)
        self._counts = WindowCounts()

    async def _count(self, tenant_id: str, window: int) -> int | None:
        return self._counts.count(tenant_id, window)


class RedisRateLimiter(RateLimiter):
    """The counter shared through Redis: key ``<prefix><tenant>:<window>``, expiring after the window.

    Clients are per event loop (redis.asyncio connections are tied to the loop that made them).
    A command is sent again once, on a new connection, when its connection fails (a connection Redis
    closed as it restarted); a timeout is not sent again, so an unanswering Redis costs one
    ``socket_timeout`` of the one request that tries it (:meth:`common.outages.Outage.retry_due`).
    """

    def __init__(self, limits: TenantLimits, url: str, prefix: str = "gw:rl:") -> None:
        super().__init__(limits)
        self.url = url
        self.prefix = prefix
        self._clients: dict[asyncio.AbstractEventLoop, tuple[Any, Any]] = {}
        self._fallback = WindowCounts()  # while Redis is down

    def _script(self) -> Any:
        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None:
            client = shared_counter_client(self.url)
            found = self._clients[loop] = (client, client.register_script(_INCR_SCRIPT))
        return found[1]

    async def _count(self, tenant_id: str, window: int) -> int | None:
        if not REDIS.retry_due():
            return self._fallback.count(tenant_id, window)
        key = f"{self.prefix}{tenant_id}:{window}"
        # What this process counted for the tenant during an outage goes to Redis with this request.
        held = self._fallback.take(tenant_id, window)
        try:
            count = await self._script()(keys=[key], args=[WINDOW_SECS * 1000 + 1000, 1 + held])
        except Exception as exc:  # redis.RedisError, OSError, timeouts: count in this process
            REDIS.failed(exc)
            return self._fallback.count(tenant_id, window, 1 + held)
        REDIS.recovered()
        return int(count)

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        found = self._clients.pop(loop, None)
        if found is not None:
            await found[0].aclose()


def refit_rate_limiter(current: RateLimiter | None, limits: TenantLimits, redis_url: str | None) -> RateLimiter:
    """The limiter that counts under ``limits``: ``current`` with its limits swapped in place (its
    counters and Redis connections carry on; a request already counting finishes under the old
    limits), or a new one when there is none yet."""
    if current is None:
        return RedisRateLimiter(limits, redis_url) if redis_url else LocalRateLimiter(limits)
    current.limits = limits
    return current
