"""An exception escaping a Django route (a control-plane view, sync or async, and the console) is the
spec's 500 envelope with the request id, logged once: by inference.escapes with that id, not again by
django.request. What Django refuses before a view (an oversized body) is the envelope too."""

from __future__ import annotations

import logging
from typing import Any, Iterator

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from inference.escapes import ESCAPE_LOGGER
from tests.conftest import GatewayFactory

class Boom(RuntimeError):
    pass


def _explode(*args: Any, **kwargs: Any) -> Any:
    raise Boom("a bug")


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every ERROR record (escapes or not) of the root logger and the gateway's own loggers."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not any(r is record for r in seen):
                seen.append(record)

    handler = Keep(level=logging.ERROR)
    loggers = [logging.getLogger(name) for name in ("", "inference", "administration")]
    for logger in loggers:
        logger.addHandler(handler)
    yield seen
    for logger in loggers:
        logger.removeHandler(handler)


def _check(status: int, headers: Any, body: Any, records: list[logging.LogRecord], request_id: str, path: str) -> None:
    assert status == 500 and body["error"]["code"] == "internal_error" and body["error"]["type"] == "internal_error"
    assert headers["X-GW-Error-Code"] == "internal_error" and headers["X-Request-ID"] == request_id
    assert len(records) == 1, [(r.name, r.getMessage()) for r in records]
    record = records[0]
    assert record.name == ESCAPE_LOGGER and f"{path} (request {request_id})" in record.getMessage()
    assert record.exc_info is not None and isinstance(record.exc_info[1], Boom)


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/workers", "administration.api.workers._listed"),  # a DRF view (sync)
        ("/get_loads", "administration.api.fanout.loads_report"),  # a native async view
    ],
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.escapes_expected
async def test_an_escape_on_a_control_route_is_logged_once_with_its_id(
    make_gateway: GatewayFactory, records: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch,
    path: str, target: str,
) -> None:
    client = make_gateway()
    monkeypatch.setattr(target, _explode)
    answer = await client.get(path, headers={"X-Request-ID": "rid-control"})
    _check(answer.status_code, answer.headers, answer.json(), records, "rid-control", path)


@pytest.mark.django_db
@pytest.mark.escapes_expected
def test_an_escape_in_the_console_is_logged_once_with_a_made_id(
    admin_user: Any, records: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)
    # Called by the changelist on each request (the view itself is bound once, when the admin's URLs are built).
    monkeypatch.setattr("administration.admin.WorkerAdmin.get_changelist_instance", _explode)
    answer = client.get("/admin/administration/worker/")
    made = answer["X-Request-ID"]
    assert made.startswith("req-")
    _check(answer.status_code, answer, answer.json(), records, made, "/admin/administration/worker/")


@pytest.mark.django_db
def test_a_4xx_django_logs_with_its_exception_is_left_alone(client: Client, records: list[logging.LogRecord]) -> None:
    """A PermissionDenied is a 403 that Django logs (WARNING) with its exception: not an escape."""
    User.objects.create_user("vera", password="pw-viewer-123", is_staff=True)
    client.login(username="vera", password="pw-viewer-123")
    assert client.get("/admin/administration/worker/add/").status_code == 403
    assert records == []


@pytest.mark.parametrize("path", ["/workers", "/start_profile"])
@pytest.mark.django_db
def test_a_control_plane_body_over_the_limit_is_413_in_the_envelope(client: Client, path: str) -> None:
    """What Django refuses before the view (RequestDataTooBig) is the standard envelope, not its HTML page."""
    body = b'{"url": "http://x:1", "labels": {"a": "' + b"x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1) + b'"}}'
    answer = client.post(path, body, content_type="application/json")
    assert answer.status_code == 413 and answer["X-GW-Error-Code"] == "payload_too_large"
    assert answer.json()["error"]["code"] == "payload_too_large"
