"""The control plane answers like an API everywhere (issue 22, item 6): every control route of the
URL conf (iterated, so a new route is covered by itself) answers a method it does not serve with 405,
an Allow header naming what it serves, and the gateway's JSON envelope (method_not_allowed); and a
bearer-authenticated call never meets Django's CSRF check, whatever the method."""

from __future__ import annotations

import re
import uuid
from typing import Iterator

import pytest
from django.test import Client
from django.urls import URLPattern, get_resolver

from administration.control_auth import reset_control_plane_auth
from common.config import GatewayConfig, install_config

pytestmark = pytest.mark.django_db  # in a test transaction: no job is started

ADMIN_KEY = "sk-admin-methods"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")
# A value for each path parameter of the control routes (the route answers; what it finds does not matter).
PARAMETERS = {"worker_id": str(uuid.uuid4()), "tokenizer_id": "some/name", "model": "org/model"}


@pytest.fixture(autouse=True)
def _bearer_auth() -> Iterator[None]:
    install_config(GatewayConfig(api_key=ADMIN_KEY), export=False)
    reset_control_plane_auth()
    yield
    install_config(GatewayConfig(), export=False)
    reset_control_plane_auth()


def control_paths() -> list[str]:
    """Every route of the URL conf but the included ones (the console under admin/, the
    Conversations API under v1/, a data-plane surface with its own answers)."""
    paths = []
    for pattern in get_resolver().url_patterns:
        if not isinstance(pattern, URLPattern):
            continue
        paths.append("/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda match: PARAMETERS[match.group(1)], str(pattern.pattern)))
    return paths


def test_the_control_routes_are_all_here() -> None:
    assert {"/workers", "/flush_cache", "/get_loads", "/start_profile", "/stop_profile", "/v1/tokenizers",
            "/parse/reasoning", "/openapi.json"} <= set(control_paths())


def _call(client: Client, method: str, path: str) -> object:
    return client.generic(method, path, b"", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {ADMIN_KEY}")


@pytest.mark.parametrize("path", control_paths())
def test_a_wrong_method_is_405_with_allow_and_the_envelope(path: str) -> None:
    client = Client(enforce_csrf_checks=True)
    probe = _call(client, "OPTIONS", path)  # served by no control route
    assert probe.status_code == 405, (path, probe.content)  # type: ignore[attr-defined]
    allowed = {method.strip() for method in probe["Allow"].split(",")}  # type: ignore[index]
    assert allowed and allowed <= set(METHODS) - {"OPTIONS", "TRACE"}, (path, allowed)
    assert ("GET" in allowed) == ("HEAD" in allowed), (path, allowed)
    for method in METHODS:
        answer = _call(client, method, path)
        status = answer.status_code  # type: ignore[attr-defined]
        if method in allowed:
            assert status != 405, (path, method)
            continue
        assert status == 405, (path, method, status)
        assert answer["Allow"] == probe["Allow"], (path, method)  # type: ignore[index]
        assert answer["Content-Type"] == "application/json", (path, method)  # type: ignore[index]
        if method == "HEAD":
            continue  # the envelope's headers, no body (HTTP)
        assert answer.json() == {  # type: ignore[attr-defined]
            "error": {"message": f"Method {method} is not allowed on {path}", "type": "method_not_allowed",
                      "param": None, "code": "method_not_allowed"}
        }


@pytest.mark.parametrize("path", control_paths())
def test_a_bearer_authenticated_call_never_meets_csrf(path: str) -> None:
    client = Client(enforce_csrf_checks=True)
    client.cookies["sessionid"] = "a-browser-session"  # as a browser with a console session would send
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        answer = _call(client, method, path)
        assert answer.status_code != 403, (path, method, answer.content)  # type: ignore[attr-defined]
        assert answer["Content-Type"].startswith(("application/json", "text/plain")), (path, method)  # type: ignore[index]


def test_the_console_keeps_its_csrf_check() -> None:
    answer = Client(enforce_csrf_checks=True).post("/admin/login/", {"username": "x", "password": "y"})
    assert answer.status_code == 403 and b"CSRF" in answer.content
