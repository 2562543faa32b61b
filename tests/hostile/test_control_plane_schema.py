"""schemathesis, driven by the published description (GET /openapi.json), against the control plane
in-process (Django's WSGI handler: the same views, URLconf and middleware as under ASGI), with
control-plane auth configured: no answer is a 5xx, every answer's status, content type, headers and
body are the ones the description gives, a request the description forbids is refused with a 4xx,
and one without the credential with 401."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from administration.api.openapi import SCHEMA_PATH
from administration.control_auth import reset_control_plane_auth
from common.config import GatewayConfig, install_config

KEY = "sk-cp-schemathesis"

schema = schemathesis.openapi.from_wsgi(SCHEMA_PATH, get_wsgi_application())


@schema.auth()
class ControlPlaneKey:
    def get(self, case: schemathesis.Case, context: Any) -> str:
        return KEY

    def set(self, case: schemathesis.Case, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture
def as_served() -> Iterator[None]:
    """Django closes the store connection around each request it handles; inside a test's transaction
    that would close the test's own (the test client keeps it open the same way)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def control_plane_keys() -> Iterator[None]:
    install_config(GatewayConfig(control_plane_api_keys=(("fuzz", "fuzzer", "admin", KEY),)), export=False)
    reset_control_plane_auth()
    yield
    install_config(GatewayConfig(), export=False)
    reset_control_plane_auth()


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_control_plane_answers_as_described(
    case: schemathesis.Case, control_plane_keys: None, as_served: None
) -> None:
    # Every check but positive_data_acceptance: a well-typed worker spec may still break a rule the
    # description cannot say (a URL's scheme or host, a URL already registered), which the spec
    # answers 400 or 409.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
