"""The control plane's published OpenAPI description: GET /openapi.json, public, valid OpenAPI 3, and
listing every control route of gateway_project/urls.py with every method its view answers (a new
route without a declaration fails here)."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.validation import validate_schema
from rest_framework.views import APIView

from administration.control_auth import reset_control_plane_auth
from administration.api.openapi import ASYNC_VIEW_DECLARATIONS, SCHEMA_PATH
from administration.models import Worker
from administration.store_ranges import column_range
from administration.worker_spec import URL_PATTERN
from common.config import GatewayConfig, install_config
from common.urls import WORKER_URL_MAX_LENGTH
from inference.pipeline.reasoning import REASONING_PARSERS
from inference.pipeline.tools import TOOL_PARSERS

# Not described: the console (HTML pages) and the description itself.
UNDESCRIBED = ("admin/", SCHEMA_PATH.lstrip("/"))
HTTP_METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
def document(client: Client) -> dict[str, Any]:
    answer = client.get(SCHEMA_PATH)
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    return dict(orjson.loads(answer.content))


def _control_routes() -> dict[str, tuple[str, ...]]:
    """Each control route of the URLconf (as an OpenAPI path) and the methods its view answers."""
    routes: dict[str, tuple[str, ...]] = {}
    for pattern in get_resolver().url_patterns:
        if isinstance(pattern, URLResolver) or str(pattern.pattern) in UNDESCRIBED:
            continue
        assert isinstance(pattern, URLPattern)
        path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
        view_class = getattr(pattern.callback, "view_class", None) or ASYNC_VIEW_DECLARATIONS.get(pattern.callback)
        assert view_class is not None and issubclass(view_class, APIView), f"{path} has no declaration"
        routes[path] = tuple(method for method in HTTP_METHODS if hasattr(view_class, method))
    return routes


def test_the_description_is_valid_openapi_3(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.")
    validate_schema(document)
    assert document["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}


def test_every_control_route_and_method_is_described(document: dict[str, Any]) -> None:
    routes = _control_routes()
    assert set(routes) >= {"/workers", "/workers/{worker_id}", "/flush_cache", "/get_loads", "/start_profile",
                           "/stop_profile"}
    assert set(document["paths"]) == set(routes)
    for path, methods in routes.items():
        assert set(document["paths"][path]) - {"parameters"} == set(methods), path
        for method in methods:
            operation = document["paths"][path][method]
            assert operation["security"] == [{"bearerAuth": []}], (path, method)
            assert {"401", "403"} <= set(operation["responses"]), (path, method)


def test_the_worker_spec_is_described_from_its_readers(document: dict[str, Any]) -> None:
    register = document["paths"]["/workers"]["post"]
    spec = register["requestBody"]["content"]["application/json"]["schema"]
    assert spec["required"] == ["url"]
    low, high = column_range(Worker._meta.get_field("priority"))
    assert spec["properties"]["priority"] == {"type": "integer", "minimum": low, "maximum": high}
    assert spec["properties"]["health"]["properties"]["timeout_secs"]["maximum"] == 2**31 - 1
    assert "engine_a" in spec["properties"]["runtime_type"]["enum"]
    assert set(register["responses"]["422"]["content"]) == {"text/plain"}
    assert set(register["responses"]["400"]["content"]) == {"text/plain", "application/json"}
    assert register["responses"]["202"]["content"]["application/json"]["schema"]["required"] == [
        "status", "worker_id", "url", "location", "message"
    ]
    patch = document["paths"]["/workers/{worker_id}"]["patch"]["requestBody"]["content"]["application/json"]["schema"]
    assert "required" not in patch  # PATCH changes these fields only; it ignores every other (spec 3)
    assert set(patch["properties"]) == {"priority", "cost", "labels", "api_key", "health"}
    profile = document["paths"]["/start_profile"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"url", "output_dir", "num_steps"} <= set(profile["properties"])


@pytest.mark.django_db
def test_the_description_is_public_under_control_plane_auth(client: Client) -> None:
    install_config(GatewayConfig(control_plane_api_keys=(("k1", "ops", "admin", "cp-key"),)), export=False)
    reset_control_plane_auth()
    try:
        assert client.get("/workers").status_code == 401
        assert client.get(SCHEMA_PATH).status_code == 200
        assert client.get(SCHEMA_PATH, HTTP_AUTHORIZATION="Bearer wrong").status_code == 200
        assert client.post(SCHEMA_PATH).status_code == 405
    finally:
        install_config(GatewayConfig(), export=False)
        reset_control_plane_auth()


def test_required_bodies_url_rules_and_parser_names_are_marked(document: dict[str, Any]) -> None:
    """What the views refuse is in the description (issue 22, item 6): a generated client sends a
    body where one is required, URLs of the pattern the rules accept, known parser names."""
    paths = document["paths"]
    bodies = {
        (path, method): operation["requestBody"]
        for path, item in paths.items() for method, operation in item.items()
        if isinstance(operation, dict) and "requestBody" in operation
    }
    optional = {("/start_profile", "post"), ("/stop_profile", "post")}
    assert {("/workers", "post"), ("/workers/{worker_id}", "patch"), ("/workers/{worker_id}", "put"),
            ("/v1/tokenizers", "post"), ("/parse/function_call", "post"), ("/parse/reasoning", "post")} <= set(bodies)
    for key, body in bodies.items():
        assert body.get("required") is (key not in optional), key

    for method, path in (("post", "/workers"), ("put", "/workers/{worker_id}"), ("patch", "/workers/{worker_id}")):
        spec = paths[path][method]["requestBody"]["content"]["application/json"]["schema"]["properties"]
        assert spec["api_key"]["pattern"] == "^[!-~]*$"
        assert spec["labels"]["properties"]["tool_parser"]["enum"] == list(TOOL_PARSERS.names())
        assert spec["labels"]["additionalProperties"] == {"type": "string"}
    for method, path in (("post", "/workers"), ("put", "/workers/{worker_id}")):  # PATCH has no url nor models
        spec = paths[path][method]["requestBody"]["content"]["application/json"]["schema"]["properties"]
        assert spec["url"]["pattern"] == URL_PATTERN and spec["url"]["maxLength"] == WORKER_URL_MAX_LENGTH
        card = spec["models"]["items"]["properties"]
        assert card["tool_parser"]["enum"] == [*TOOL_PARSERS.names(), None]  # a card's null is "not given"
        assert card["reasoning_parser"]["enum"] == [*REASONING_PARSERS.names(), None]
    overload = paths["/workers"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]["overload"]
    assert overload["properties"]["waiting_requests"]["minimum"] == 1
    assert overload["properties"]["token_usage"] | {"nullable": True} == {
        "type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "nullable": True
    }
    function_call = paths["/parse/function_call"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert function_call["properties"]["tool_call_parser"]["enum"] == list(TOOL_PARSERS.names())
    reasoning = paths["/parse/reasoning"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert reasoning["properties"]["reasoning_parser"]["enum"] == list(REASONING_PARSERS.names())
