"""Conversation routes are client routes: the data plane's keys (``--api-key``, ``--tenant-api-key``),
not the control plane's. A missing or unknown key is 401 with an empty body, as on the data plane;
with no key configured the routes are open."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication

from common.secrets import header_bytes
from inference.auth import Identity
from inference.dataplane import data_plane

__all__ = ["ClientKeyAuthentication", "header_bytes"]


class ClientKeyAuthentication(BaseAuthentication):
    """Sets ``request.user`` to the caller's :class:`Identity`, or refuses with 401."""

    def authenticate(self, request: Any) -> tuple[Identity, None]:
        identity = data_plane().keys.authenticate(header_bytes(request.META.get("HTTP_AUTHORIZATION")))
        if identity is None:
            raise exceptions.AuthenticationFailed()
        return (identity, None)

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"  # keeps DRF's 401 a 401 (without it DRF answers 403)
