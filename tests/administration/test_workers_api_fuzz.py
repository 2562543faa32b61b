"""The /workers admin API never answers 500 to bad input: property-based bodies for POST, PATCH and
PUT, built from a valid worker spec with fields replaced by arbitrary JSON, and raw bytes.

Runs inside one test transaction (registration jobs are queued on commit, so none runs): what is
checked is the answer to the request itself, the spec's status and body shape.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from administration.models import Worker

pytestmark = pytest.mark.django_db

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
    | st.sampled_from(["http://w:1", "grpc://w:1", "https://api.openai.com", "regular", "prefill", "decode",
                       "sglang", "engine_a", "external", "", "ftp://x", "http://", "http://w:99999"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
FIELDS = [
    "url", "api_key", "model_id", "models", "worker_type", "runtime_type", "connection_mode", "priority", "cost",
    "labels", "dp_rank", "dp_size", "bootstrap_port", "tool_parser", "reasoning_parser", "health", "resilience",
    "overload", "http2", "max_connection_attempts", "disable_health_check", "kv_connector", "kv_role",
]
BODIES = st.builds(
    lambda port, changes: {"url": f"http://fuzz-worker:{port}", **changes},
    st.integers(min_value=1, max_value=65535),
    st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=4),
)
PAYLOADS = BODIES.map(lambda body: json.dumps(body).encode()) | JSON.map(lambda v: json.dumps(v).encode()) | st.binary(
    max_size=48
)

# What each method may answer (spec 3, worker admin API); anything else, 500 above all, is a defect.
ALLOWED = {
    "post": {202, 400, 409, 415, 422},
    "patch": {202, 400, 404, 409, 415, 422},
    "put": {202, 400, 404, 409, 415, 422},
}


def _check(response: Any, method: str) -> None:
    assert response.status_code in ALLOWED[method], (method, response.status_code, response.content[:300])
    if response.status_code >= 400 and response["Content-Type"].startswith("application/json"):
        body = response.json()
        assert isinstance(body, dict) and body, body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=PAYLOADS, content_type=st.sampled_from(["application/json", "text/plain", "application/json; charset=utf-8"]))
def test_post_never_answers_500(client: Client, payload: bytes, content_type: str) -> None:
    _check(client.post("/workers", data=payload, content_type=content_type), "post")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=PAYLOADS, method=st.sampled_from(["patch", "put"]))
def test_patch_and_put_never_answer_500(client: Client, payload: bytes, method: str) -> None:
    worker, _ = Worker.objects.get_or_create(url="http://existing-worker:8000", defaults={"registered": True})
    response = getattr(client, method)(f"/workers/{worker.pk}", data=payload, content_type="application/json")
    _check(response, method)
