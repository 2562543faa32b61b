"""Per-tenant rate limits stored in the admin console (TenantRateLimit rows).

Writes go through these functions so every gateway process hears of them: once the transaction
commits, the registry notice (administration/notices.py) makes each fleet loop re-read the store,
rows included, and install the limits into its runtime's limiter; the loop's 5 s refresh is the
safety net. The data plane never reads these rows. How rows combine with the flags is decided in
one place, :meth:`inference.admission.rate_limit.TenantLimits.combine`.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet

from administration.models import TenantRateLimit
from administration.notices import publish_registry_changed
from inference.admission.rate_limit import TenantLimits
from common.config import GatewayConfig

__all__ = ["stored_tenant_limits", "save_tenant_rate_limit", "delete_tenant_rate_limits", "flag_tenant_limit"]


def stored_tenant_limits() -> dict[str, int]:
    """tenant id -> requests per minute, for every stored row (one query; the fleet loop's read)."""
    return dict(TenantRateLimit.objects.values_list("tenant_id", "requests_per_minute"))


def save_tenant_rate_limit(row: TenantRateLimit) -> TenantRateLimit:
    """Store an added or changed row (validated by the caller) and tell every gateway process."""
    with transaction.atomic():
        row.save()
        transaction.on_commit(publish_registry_changed)
    return row


def delete_tenant_rate_limits(rows: QuerySet[TenantRateLimit]) -> int:
    """Delete rows (their tenants fall back to the flags) and tell every gateway process."""
    with transaction.atomic():
        deleted, _ = rows.delete()
        transaction.on_commit(publish_registry_changed)
    return deleted


def flag_tenant_limit(config: GatewayConfig, tenant_id: str) -> int:
    """What the command-line flags alone give a tenant (what a stored row overrides)."""
    return TenantLimits.combine(config.default_tenant_rate_limit, config.tenant_rate_limits, {}).limit_for(tenant_id)
