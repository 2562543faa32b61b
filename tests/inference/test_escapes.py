"""An exception escaping a data-plane route or a probe is answered with the spec's 500 envelope
(internal_error, the request id) and logged once, by inference.escapes, with that id; after the
response started it is re-raised (the server closes the connection and logs it) carrying the id."""

from __future__ import annotations

import logging
from typing import Any, Iterator

import pytest
from aiohttp.test_utils import make_mocked_request

from administration.metrics_server import _call_asgi
from inference.asgi_io import Receive, Scope, Send
from inference.escapes import ESCAPE_LOGGER, call_guarded
from tests.conftest import GatewayFactory
from tests.log_watch import watching_escapes

pytestmark = pytest.mark.escapes_expected


class Boom(RuntimeError):
    pass


@pytest.fixture
def escapes() -> Iterator[list[logging.LogRecord]]:
    with watching_escapes() as watch:
        yield watch.records


def _explode(*args: Any, **kwargs: Any) -> Any:
    raise Boom("a bug")


def _only_record(records: list[logging.LogRecord], request_id: str) -> logging.LogRecord:
    assert len(records) == 1, [r.getMessage() for r in records]
    record = records[0]
    assert record.name == ESCAPE_LOGGER and record.levelno == logging.ERROR
    assert request_id in record.getMessage() and record.exc_info is not None and isinstance(record.exc_info[1], Boom)
    return record


@pytest.mark.parametrize("path", ["/v1/models", "/readiness", "/loads"])
async def test_an_escape_on_a_data_plane_route_is_the_500_envelope(
    make_gateway: GatewayFactory, escapes: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    client = make_gateway()
    for module in ("inference.api.models", "inference.api.probes", "inference.api.worker_routes"):
        monkeypatch.setattr(f"{module}.data_plane", _explode)
    answer = await client.get(path, headers={"X-Request-ID": "rid-escape-1"})
    assert answer.status_code == 500 and answer.headers["x-request-id"] == "rid-escape-1"
    assert answer.json()["error"] == {
        "message": "Internal server error", "type": "internal_error", "param": None, "code": "internal_error"
    }
    assert answer.headers["x-gw-error-code"] == "internal_error"
    record = _only_record(escapes, "rid-escape-1")
    assert f"GET {path}" in record.getMessage()


async def test_a_made_request_id_is_the_one_answered_and_logged(
    make_gateway: GatewayFactory, escapes: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_gateway()
    monkeypatch.setattr("inference.api.models.data_plane", _explode)
    answer = await client.get("/v1/models")
    made = answer.headers["x-request-id"]
    assert answer.status_code == 500 and made.startswith("req-")
    _only_record(escapes, made)


async def test_an_escape_after_the_response_started_is_reraised_with_the_request_id(
    escapes: list[logging.LogRecord],
) -> None:
    async def half_answered(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise Boom("mid-body")

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/x", "headers": [(b"x-request-id", b"rid-late")]}
    with pytest.raises(Boom) as raised:
        await call_guarded(half_answered, scope, _no_body, send)
    assert [m["type"] for m in sent] == ["http.response.start"]  # nothing more was sent
    assert any("request rid-late" in note for note in raised.value.__notes__)
    assert escapes == []  # the server logs it, once


async def _no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def test_an_escape_on_the_probe_listener_is_the_500_envelope(escapes: list[logging.LogRecord]) -> None:
    async def broken_probe(scope: Scope, receive: Receive, send: Send) -> None:
        raise Boom("probe")

    request = make_mocked_request("GET", "/readiness", headers={"X-Request-ID": "rid-probe"})
    response = await _call_asgi(broken_probe, request)
    assert response.status == 500 and response.headers["X-GW-Error-Code"] == "internal_error"
    assert response.headers["X-Request-ID"] == "rid-probe"
    _only_record(escapes, "rid-probe")


async def test_nothing_is_logged_when_nothing_escapes(make_gateway: GatewayFactory, escapes: list[logging.LogRecord]) -> None:
    client = make_gateway()
    answers = [await client.get(path) for path in ("/v1/models", "/readiness", "/nowhere", "/v1/chat/completions")]
    assert [a.status_code for a in answers] == [503, 503, 404, 405]
    assert escapes == []
