"""DRF adapters for control-plane authentication: they read the header, call
:mod:`administration.control_auth`, and turn its refusals into DRF exceptions (401 / 403)."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions  # type: ignore[import-untyped, unused-ignore]
from rest_framework.authentication import BaseAuthentication  # type: ignore[import-untyped, unused-ignore]
from rest_framework.permissions import BasePermission  # type: ignore[import-untyped, unused-ignore]

from administration.control_auth import ControlPlaneDenied, Principal, control_plane_auth

__all__ = ["ControlPlaneAuthentication", "IsControlPlaneAdmin"]


class ControlPlaneAuthentication(BaseAuthentication):
    """Sets ``request.user`` to the :class:`Principal` (``request.auth`` stays None) or answers 401."""

    def authenticate(self, request: Any) -> tuple[Principal, None]:
        try:
            principal = control_plane_auth().authenticate(request.META.get("HTTP_AUTHORIZATION"))
        except ControlPlaneDenied as denied:
            raise exceptions.AuthenticationFailed(denied.message) from None
        return (principal, None)

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"  # makes DRF answer 401 (with WWW-Authenticate), not 403


class IsControlPlaneAdmin(BasePermission):
    """Allows a control-plane principal whose role may perform the view's action (admin); else 403."""

    action = "admin"

    def has_permission(self, request: Any, view: Any) -> bool:
        principal = request.user
        if not isinstance(principal, Principal):
            return False  # not authenticated by ControlPlaneAuthentication: DRF answers 401
        try:
            control_plane_auth().authorize(principal, getattr(view, "control_plane_action", self.action))
        except ControlPlaneDenied as denied:
            raise exceptions.PermissionDenied(denied.message) from None
        return True
