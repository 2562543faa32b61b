"""The control plane reads JSON bodies with the data plane's reader (orjson: depth and syntax rules
in one place): a body nested deeper than it allows is a 400, never a RecursionError's 500."""

from __future__ import annotations

import pytest
from django.test import Client

from administration.models import Worker
from administration.worker_spec import parse_worker_spec
from common.json_text import NO_NUL, nul_free

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


# Postgres refuses U+0000 in text and jsonb: a named string that holds one is the caller's 400 at the
# request, and free-form JSON (labels, metadata) is stored with it replaced (found by the control-plane
# fuzz: a model id with a NUL was a 500 on Postgres).
NUL_MODEL = b'{"url": "http://gpu-9:8000", "models": [{"id": "m\\u0000x"}]}'


@pytest.mark.django_db
def test_a_worker_whose_model_id_holds_a_nul_is_400_and_stores_nothing() -> None:
    answer = Client().post("/workers", NUL_MODEL, content_type="application/json")
    assert answer.status_code == 400 and answer.json()["code"] == "BAD_REQUEST"
    assert answer.json()["error"] == "models[0].id must not contain the NUL character (\\u0000)"
    assert not Worker.objects.exists()


def test_free_form_labels_and_metadata_are_kept_with_the_nul_replaced() -> None:
    spec = parse_worker_spec({
        "url": "http://gpu-9:8000", "labels": {"zone\x00": "a\x00b"},
        "models": [{"id": "m", "metadata": {"k": ["x\x00"]}}],
    })  # fmt: skip
    assert spec.labels == {"zone\ufffd": "a\ufffdb"}
    assert spec.models[0]["metadata"] == {"k": ["x\ufffd"]}
    assert nul_free(spec.labels) and nul_free(spec.models[0])


@pytest.mark.django_db
def test_the_description_marks_the_strings_that_refuse_a_nul() -> None:
    described = Client().get("/openapi.json").json()
    patterns: list[str] = []
    pending: list[object] = [described]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if node.get("pattern") is not None:
                patterns.append(node["pattern"])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    assert NO_NUL in patterns
