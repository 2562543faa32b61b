"""The control plane reads JSON bodies with the data plane's reader (orjson: depth and syntax rules
in one place): a body nested deeper than it allows is a 400, never a RecursionError's 500."""

from __future__ import annotations

import pytest
from django.test import Client

DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"url":' + b'{"a":' * 5_000 + b"1" + b"}" * 5_000 + b"}"


@pytest.mark.django_db
@pytest.mark.parametrize("body", [DEEP_ARRAY, DEEP_OBJECT], ids=["array", "object"])
def test_deeply_nested_worker_bodies_are_400(body: bytes) -> None:
    answer = Client().post("/workers", body, content_type="application/json")
    assert answer.status_code == 400 and answer["Content-Type"].startswith("text/plain")
    assert answer.content.decode().startswith("Failed to parse the request body as JSON")


@pytest.mark.django_db
def test_a_deeply_nested_profile_body_is_400() -> None:
    answer = Client().post("/start_profile", DEEP_ARRAY, content_type="application/json")
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"]
