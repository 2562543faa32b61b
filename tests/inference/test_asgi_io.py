"""The raw-ASGI helpers of the data plane."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inference.asgi_io import (
    ClientDisconnected,
    DisconnectWatch,
    parse_json_object,
    read_body,
    request_id_for,
    send_error,
)
from inference.errors import GatewayError, model_not_found, unauthorized


def scope_with(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "headers": headers}


def receiver(*messages: dict[str, Any]):
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return receive


class Sent(list):
    async def __call__(self, message: dict[str, Any]) -> None:
        self.append(message)


async def test_read_body_joins_chunks() -> None:
    receive = receiver(
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    )
    assert await read_body(scope_with([]), receive, 10) == b"abcd"


async def test_read_body_refuses_declared_length_over_limit_without_reading() -> None:
    async def never() -> dict[str, Any]:
        raise AssertionError("body must not be read")

    with pytest.raises(GatewayError) as exc:
        await read_body(scope_with([(b"content-length", b"11")]), never, 10)
    assert exc.value.status == 413


async def test_read_body_refuses_streamed_body_over_limit() -> None:
    receive = receiver(
        {"type": "http.request", "body": b"x" * 6, "more_body": True},
        {"type": "http.request", "body": b"x" * 6, "more_body": False},
    )
    with pytest.raises(GatewayError) as exc:
        await read_body(scope_with([]), receive, 10)
    assert exc.value.status == 413


async def test_read_body_reports_disconnect() -> None:
    receive = receiver({"type": "http.request", "body": b"x", "more_body": True}, {"type": "http.disconnect"})
    with pytest.raises(ClientDisconnected):
        await read_body(scope_with([]), receive, 10)


async def test_bad_content_length_is_400() -> None:
    with pytest.raises(GatewayError) as exc:
        await read_body(scope_with([(b"content-length", b"abc")]), receiver(), 10)
    assert exc.value.status == 400


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        (b"abc-123", True), (b"x" * 256, True), (b"x" * 257, False), (b" padded", False), (b"caf\xc3\xa9", False),
        (b"a\rb", False), (b"a\nb", False), (b"a b", False), (b"a\x00b", False), (b"", False), (None, False),
    ],
)
def test_request_id_is_kept_only_when_sane(given: bytes | None, kept: bool) -> None:
    headers = [] if given is None else [(b"x-request-id", given)]
    request_id = request_id_for(scope_with(headers))
    assert (request_id == given) is kept
    if not kept:
        assert request_id.startswith(b"req-") and len(request_id) == 28


@pytest.mark.parametrize("raw", [b"", b"nope", b"[]", b"1", b"null"])
def test_parse_json_object_rejects_non_objects(raw: bytes) -> None:
    with pytest.raises(GatewayError) as exc:
        parse_json_object(raw)
    assert exc.value.code == "json_parse_error"


async def test_send_error_writes_envelope_and_code_header() -> None:
    sent = Sent()
    await send_error(sent, model_not_found("m"), b"rid")
    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] == 404
    assert headers[b"x-gw-error-code"] == b"model_not_found" and headers[b"x-request-id"] == b"rid"
    assert b'"code":"model_not_found"' in body["body"]


async def test_unauthorized_has_empty_body() -> None:
    sent = Sent()
    await send_error(sent, unauthorized())
    assert sent[0]["status"] == 401 and sent[1]["body"] == b""
    assert dict(sent[0]["headers"]) == {b"content-length": b"0"}


async def test_disconnect_watch_cancels_the_task() -> None:
    gate = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gate.wait()
        return {"type": "http.disconnect"}

    async def handler() -> bool:
        watch = DisconnectWatch(receive)
        try:
            gate.set()
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return watch.fired
        finally:
            watch.stop()
        return False

    assert await asyncio.wait_for(handler(), 2) is True


async def test_stopped_watch_never_cancels() -> None:
    gate = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gate.wait()
        return {"type": "http.disconnect"}

    watch = DisconnectWatch(receive)
    watch.stop()
    gate.set()
    await asyncio.sleep(0.05)
    assert watch.fired is False
