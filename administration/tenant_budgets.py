"""Per-tenant token budgets stored in the admin console (TenantBudget rows).

Writes go through these functions so every gateway process hears of them, as with tenant rate limits
(administration/tenant_limits.py): once the transaction commits, the registry notice makes each
fleet loop re-read the store, rows included, and install the budgets on its data plane; the loop's
5 s refresh is the safety net. The data plane never reads these rows. How rows combine with the
flags is decided in one place, :meth:`inference.admission.budgets.TenantBudgets.combine`.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import QuerySet

from administration.models import TenantBudget
from administration.notices import publish_registry_changed
from common.config import BUDGET_PERIODS, GatewayConfig
from inference.admission.budgets import Budget, TenantBudgets

__all__ = ["stored_tenant_budgets", "save_tenant_budget", "delete_tenant_budgets", "flag_tenant_budget"]

log = logging.getLogger(__name__)


def stored_tenant_budgets() -> dict[str, str]:
    """tenant id -> ``TOKENS/day|month``, for every stored row (one query; the fleet loop's read). A
    row whose period the store holds but the console would refuse (written around it) is left out
    and logged, so it cannot stop the fleet loop."""
    found: dict[str, str] = {}
    for tenant, tokens, period in TenantBudget.objects.values_list("tenant_id", "tokens", "period"):
        if period in BUDGET_PERIODS:
            found[tenant] = f"{tokens}/{period}"
        else:
            log.warning("tenant budget of %s left out: period %r is not day or month", tenant, period)
    return found


def save_tenant_budget(row: TenantBudget) -> TenantBudget:
    """Store an added or changed row (validated by the caller) and tell every gateway process."""
    with transaction.atomic():
        row.save()
        transaction.on_commit(publish_registry_changed)
    return row


def delete_tenant_budgets(rows: QuerySet[TenantBudget]) -> int:
    """Delete rows (their tenants fall back to the flags) and tell every gateway process."""
    with transaction.atomic():
        deleted, _ = rows.delete()
        transaction.on_commit(publish_registry_changed)
    return deleted


def flag_tenant_budget(config: GatewayConfig, tenant_id: str) -> Budget | None:
    """What the command-line flags alone give a tenant (what a stored row overrides; None: no budget)."""
    return TenantBudgets.combine(config.default_tenant_budget, config.tenant_budgets, {}).budget_for(tenant_id)
