"""The tenant scope of stored responses and conversations: who may see a record.

The data plane knows the caller as an :class:`inference.auth.Identity`; the scope is a string
derived from it and stored on every record:

- a tenant key (``--tenant-api-key TENANT:KEY``): ``tenant:<TENANT>``, shared by every key of that
  tenant (a tenant id too long for the column is kept as ``tenant#<sha256 of it>``);
- the shared ``--api-key``: ``shared``;
- open mode (no key configured): ``open``.

Tenant ids cannot contain ":" (the flag splits on the first one), so no tenant scope equals another
or one of the two fixed scopes. A record of another scope behaves as unknown (404).
"""

from __future__ import annotations

import hashlib

from inference.auth import Identity, IdentityKind
from responses_api.limits import SCOPE_MAX

__all__ = ["SHARED_SCOPE", "OPEN_SCOPE", "scope_of", "tenant_scope"]

SHARED_SCOPE = "shared"
OPEN_SCOPE = "open"
_TENANT = "tenant:"


def tenant_scope(tenant_id: str) -> str:
    scope = _TENANT + tenant_id
    if len(scope) <= SCOPE_MAX:
        return scope
    return "tenant#" + hashlib.sha256(tenant_id.encode()).hexdigest()


def scope_of(identity: Identity) -> str:
    """The scope of records the caller creates and may read, update or delete."""
    if identity.kind is IdentityKind.TENANT and identity.tenant_id is not None:
        return tenant_scope(identity.tenant_id)
    if identity.kind is IdentityKind.SHARED:
        return SHARED_SCOPE
    return OPEN_SCOPE
