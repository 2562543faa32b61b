"""schemathesis, driven by the OpenAI API's own description (fixtures/specs/openai/openapi.yaml), against
the served OpenAI routes of a real gateway process in front of a real HTTP mock worker (relayed) and
the gRPC engine stand-in (the gateway is the server). Most requests are turned onto a served model
(a hook of our own), so they reach the pipeline rather than stop at model lookup; the rest keep the
fuzzer's model names. Whatever comes in: no 5xx, every JSON answer of 200 is what the OpenAI
description says it is, every 4xx is the spec's envelope, and no process logs an escaped exception
(the spawn fixture's log check)."""

from __future__ import annotations

from functools import cache
from typing import Any, Callable

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance
from schemathesis.specs.openapi.schemas import OpenApiSchema

from standins.fixtures import FIXTURE_MODELS, FIXTURE_SPECS
from tests.conftest import free_port
from tests.e2e.conftest import Process, wait_for

pytestmark = [pytest.mark.e2e]

OPENAI_DESCRIPTION = FIXTURE_SPECS / "openai" / "openapi.yaml"
ROUTES = {"/chat/completions": "POST", "/completions": "POST", "/embeddings": "POST", "/responses": "POST", "/models": "GET"}
RELAYED_MODEL, SERVED_MODEL = "mock-model", "Qwen/Qwen3-8B"
EXAMPLES = 30  # per route: bounded in count (and so in time) for CI


@cache
def _schema() -> OpenApiSchema:
    with OPENAI_DESCRIPTION.open() as described:
        raw: dict[str, Any] = yaml.load(described, Loader=yaml.CSafeLoader)
    served = {path: raw["paths"][path] for path in ROUTES}
    return schemathesis.openapi.from_dict({**raw, "paths": served, "servers": [{"url": "/v1"}]})


def _fleet(spawn: Callable[..., Process], start_gateway: Callable[..., Process]) -> Process:
    worker_port, engine_port = free_port(), free_port()
    spawn("mockworker", ["runmockworker", "--host", "127.0.0.1", "--port", str(worker_port), "--model", RELAYED_MODEL,
                         "--tokens", "8"], worker_port)  # fmt: skip
    engine = spawn("grpc-engine", ["runmockworker", "--grpc", "--runtime", "sglang", "--tokenizer",
                                   str(FIXTURE_MODELS / "qwen3"), "--model", SERVED_MODEL, "--host", "127.0.0.1",
                                   "--port", str(engine_port)], None)  # fmt: skip
    wait_for(lambda: httpx.get(f"http://127.0.0.1:{worker_port}/health", timeout=2).status_code == 200, 30, "mock")
    gateway = start_gateway(
        "--worker-urls", f"http://127.0.0.1:{worker_port}", f"grpc://127.0.0.1:{engine_port}",
        "--prometheus-port", str(free_port()), wait_ready=False,
    )  # fmt: skip
    wait_for(lambda: _models(gateway) == {RELAYED_MODEL, SERVED_MODEL}, 60, "both workers routable", engine)
    tokenized = {"model": SERVED_MODEL, "prompt": "hi"}
    wait_for(lambda: httpx.post(gateway.url + "/v1/tokenize", json=tokenized, timeout=5).status_code == 200, 60,
             "the tokenizer", gateway)  # fmt: skip
    return gateway


def _models(gateway: Process) -> set[str]:
    answer = httpx.get(gateway.url + "/v1/models", timeout=2)
    return {model["id"] for model in answer.json()["data"]} if answer.status_code == 200 else set()


def _on_a_served_model(case: schemathesis.Case, model: str | None) -> None:
    """The hook keeping most requests on served models: a body's model becomes one the fleet serves."""
    if model is not None and isinstance(case.body, dict):
        case.body["model"] = model


def _check(case: schemathesis.Case, response: Any, model: str | None) -> None:
    content_type = response.headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}"
    if 400 <= response.status_code < 500:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and "type" in error, response.text[:500]
    elif content_type.startswith("application/json") and model == SERVED_MODEL:
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])


@pytest.mark.parametrize("server", ["uvicorn"], indirect=True)
def test_served_openai_routes_answer_as_the_openai_description_says(
    spawn: Callable[..., Process], start_gateway: Callable[..., Process]
) -> None:
    gateway = _fleet(spawn, start_gateway)
    models = st.sampled_from([RELAYED_MODEL, SERVED_MODEL, SERVED_MODEL]) | st.none()
    for route, method in sorted(ROUTES.items()):

        @given(case=_schema()[route][method].as_strategy(), model=models)
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def exchange(case: schemathesis.Case, model: str | None) -> None:
            _on_a_served_model(case, model)
            _check(case, case.call(base_url=gateway.url + "/v1", timeout=60), model)

        exchange()
