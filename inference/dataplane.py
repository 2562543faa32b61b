"""The data plane of this process, built once from the config: client keys, routing policies, the
worker registry, one relay per transport (from the relay registry), retries, and admission (permits,
media budget, rate limiter)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

from django.conf import settings

from common.config import GatewayConfig, current_config
from inference import errors
from inference.accounting import AccountingEntry, UsageLedger
from inference.admission import MediaBudget, PermitPool, RateLimiter
from inference.admission.budgets import BudgetCounter, TenantBudgets, refit_budget_counter
from inference.admission.rate_limit import TenantLimits, refit_rate_limiter
from inference.auth import KeyRing
from inference.routing.policies import PolicySet, SelectionPolicy, make_policy
from inference.routing.registry import REGISTRY, WorkerRegistry
from inference.routing.retry import RetryPolicy
from inference.upstreams import RELAYS, Relay
from inference.upstreams.engine_pool import EnginePool
from inference.upstreams.http import HttpRelay
from inference.upstreams.pd_http import PdHttpDispatch

__all__ = ["DataPlane", "data_plane", "reset_data_plane"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DataPlane:
    config: GatewayConfig
    keys: KeyRing
    policies: PolicySet
    registry: WorkerRegistry
    relays: dict[str, Relay]  # by name: a transport, or external
    retry: RetryPolicy
    # One engine client (gRPC channel) per engine worker, shared with the health checks and loads.
    engines: EnginePool = field(default_factory=EnginePool)
    # Traffic control; each is None when its limit is 0 (the default), so the hot path only checks.
    permits: PermitPool | None = None
    media: MediaBudget | None = None
    rate_limiter: RateLimiter | None = None
    # On SIGTERM: /readiness answers 503 while requests in flight finish.
    draining: bool = False
    # What the first registry snapshot waits for ("store": it did not answer at start-up); /readiness
    # answers 503 and names it until the snapshot is loaded. None once it is (or never waited).
    waiting_for: str | None = None
    # The limits in force (flags + rows stored in the console), and the limiter kept while they come
    # and go so its counters and Redis connections live on; rate_limiter is it, or None while no
    # tenant has a limit. Installed on the event loop by install_tenant_limits, never per request.
    tenant_limits: TenantLimits = field(default_factory=lambda: TenantLimits(0, ()))
    _limiter: RateLimiter | None = None
    # Token budgets (inference.admission.budgets), installed like the limits: budgets is the counter,
    # or None while no tenant has a budget (admission only checks); _budget_counter outlives that.
    tenant_budgets: TenantBudgets = field(default_factory=lambda: TenantBudgets.combine("0/day", (), {}))
    budgets: BudgetCounter | None = None
    _budget_counter: BudgetCounter | None = None
    # Prefill/decode disaggregation: each side's policy (--prefill-policy, --decode-policy, default
    # --policy) and the HTTP dual dispatch over the HTTP relay.
    prefill_policy: SelectionPolicy | None = None
    decode_policy: SelectionPolicy | None = None
    encode_policy: SelectionPolicy | None = None  # EPD: which encode worker takes an image (--policy)
    pd_http: PdHttpDispatch | None = None
    # What this process's requests used since the last flush (inference.accounting); the control side
    # drains it into the store every --usage-flush-interval-secs.
    ledger: UsageLedger = field(default_factory=UsageLedger)

    @classmethod
    def build(cls, config: GatewayConfig) -> DataPlane:
        built = cls(
            config=config,
            keys=KeyRing(config.api_key, config.tenant_api_keys),
            policies=PolicySet.from_config(config),
            registry=REGISTRY,
            relays={name: relay.from_config(config) for name, relay in RELAYS.items()},
            retry=RetryPolicy.from_config(config),
            permits=(
                PermitPool(config.max_concurrent_requests, config.queue_size, config.queue_timeout_secs)
                if config.max_concurrent_requests > 0
                else None
            ),
            media=(
                MediaBudget(config.multimodal_max_inflight_bytes, request_limit=config.media_request_limit or None)
                if config.multimodal_max_inflight_bytes > 0
                else None
            ),
        )
        built.prefill_policy = make_policy(config.prefill_policy or config.policy, config)
        built.decode_policy = make_policy(config.decode_policy or config.policy, config)
        built.encode_policy = make_policy(config.policy, config)
        http = built.relays.get("http")
        if isinstance(http, HttpRelay):
            built.pd_http = PdHttpDispatch(http)
        built.install_tenant_limits({})
        built.install_tenant_budgets({})
        return built

    def install_tenant_limits(self, stored: Mapping[str, int]) -> None:
        """Apply the limits stored in the console (tenant -> requests per minute) over the flags.
        Called by the fleet loop after it read the rows; a change counts on in the current window."""
        config = self.config
        limits = TenantLimits.combine(
            config.default_tenant_rate_limit, config.tenant_rate_limits, stored, config.rate_limit_share
        )
        if limits == self.tenant_limits:
            return
        log.info("tenant rate limits (requests/min): default %d, per tenant %s", limits.default, limits.by_tenant)
        self.tenant_limits = limits
        if limits.any:
            self._limiter = refit_rate_limiter(self._limiter, limits, getattr(settings, "REDIS_URL", None))
        self.rate_limiter = self._limiter if limits.any else None

    def install_tenant_budgets(self, stored: Mapping[str, str]) -> None:
        """Apply the token budgets stored in the console (tenant -> TOKENS/day|month) over the flags.
        Called by the fleet loop after it read the rows; the period's use counts on."""
        config = self.config
        budgets = TenantBudgets.combine(config.default_tenant_budget, config.tenant_budgets, stored)
        if budgets == self.tenant_budgets:
            return
        log.info("tenant token budgets: %r", budgets)
        self.tenant_budgets = budgets
        if budgets.any:
            self._budget_counter = refit_budget_counter(
                self._budget_counter, budgets, getattr(settings, "REDIS_URL", None)
            )
        self.budgets = self._budget_counter if budgets.any else None

    def account(self, entry: AccountingEntry) -> None:
        """Record one finished request: the one place every surface's turn runner reports to."""
        self.ledger.add(entry)
        if self.budgets is not None:  # its tokens count against its tenant's budget (none: the scopes)
            self.budgets.charge(entry.tenant, entry.usage.total, entry.at)

    def relay_for(self, name: str, path: str) -> Relay:
        """The relay called ``name`` (a transport, or external); 501 for one this gateway does not have."""
        relay = self.relays.get(name)
        if relay is None:
            raise errors.endpoint_not_supported(path, str(name))
        return relay

    async def aclose(self) -> None:
        for relay in self.relays.values():
            await relay.close()
        await self.engines.aclose()
        if self._limiter is not None:
            await self._limiter.aclose()
        if self._budget_counter is not None:
            await self._budget_counter.aclose()


_data_plane: DataPlane | None = None


def data_plane() -> DataPlane:
    global _data_plane
    if _data_plane is None:
        _data_plane = DataPlane.build(current_config())
    return _data_plane


def reset_data_plane(config: GatewayConfig | None = None) -> DataPlane:
    """Rebuild the data plane (tests, and a server started after the config was installed)."""
    global _data_plane
    _data_plane = DataPlane.build(config or current_config())
    return _data_plane
