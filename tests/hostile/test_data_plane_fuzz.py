"""Property-based requests to every route family of the data plane, through the whole ASGI app to a
real mock worker: hostile methods, paths, query strings, header bytes and bodies. Whatever comes in,
an answer the gateway makes itself is never a 5xx of its own making (only the upstream and capacity
5xx the spec names) and always the spec's envelope with X-GW-Error-Code repeating its code; nothing
escapes a route (the suite's log check fails a test on any escape).

tests/inference/schemas/test_fuzz.py covers the chat and completion validators in depth; the bodies
here reuse its JSON strategies for every relayed route.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_project.asgi import application
from inference.api.routes import RELAYED_PATHS, data_plane_paths
from standins.mock_worker import MockWorkerConfig, build_app
from tests.conftest import close_gateways, open_gateway, record_for
from tests.hostile.asgi_call import Answer, call_asgi
from tests.inference.schemas.test_fuzz import CHAT_BODIES, COMPLETION_BODIES, JSON

RELAYED = ("/v1/chat/completions", "/v1/completions", *RELAYED_PATHS)
READ_ONLY = tuple(sorted(data_plane_paths() - set(RELAYED)))
# 5xx the spec names for answers the gateway makes (an upstream failed or timed out, no capacity, a
# transport not served); never internal_error.
NAMED_5XX = {"upstream_unavailable", "upstream_timeout", "no_healthy_workers", "admission_queue_timeout",
             "worker_overload_protection_shed", "endpoint_not_supported"}
# Control-plane and console prefixes (answered by Django in their own envelopes, fuzzed elsewhere).
CONTROL_PREFIXES = ("/workers", "/flush_cache", "/get_loads", "/start_profile", "/stop_profile", "/admin",
                    "/openapi.json")

METHODS = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "CONNECT",
                           "PROPFIND", "QUERY", "G3T"])
HEADER_NAMES = st.sampled_from([b"content-type", b"content-length", b"authorization", b"x-request-id",
                                b"x-gw-routing-key", b"transfer-encoding", b"accept", b"traceparent",
                                b"x-request-id-extra", b"x-correlation-id", b"content-encoding", b"if-modified-since"])
HEADER_VALUES = st.binary(max_size=40) | st.sampled_from(
    [b"application/json", b"text/plain", b"-1", b"99999999999999999999999", b"1e3", b"chunked", b"gzip",
     b"Bearer ", b"Bearer \x00", b"Bearer sk-fuzz", b"Bearer sk-tenant", b"\xff\xfe", b"req-\r\nx: y",
     b"a" * 300]
)
HEADERS = st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=4)
QUERIES = st.binary(max_size=40) | st.sampled_from([b"model=", b"model=%ff", b"model=mock-model&model=x",
                                                    b"model=\x00", b"%%%", b"model=" + b"m" * 500])
BODIES = (
    CHAT_BODIES.map(orjson.dumps)
    | COMPLETION_BODIES.map(orjson.dumps)
    | JSON.map(orjson.dumps)
    | st.binary(max_size=64)
    | st.sampled_from([b"", b"{", b"[" * 5000 + b"]" * 5000, b'{"model": "mock-model", "input": "\\ud800"}',
                       b'{"model": 1e999}', b'{"model": "mock-model", "stream": true}'])
)
PATH_TEXT = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("/.%\\\x00?#;"), max_size=30)
UNKNOWN_PATHS = st.builds(lambda text: "/" + text, PATH_TEXT).filter(
    lambda path: not path.startswith(CONTROL_PREFIXES) and path not in data_plane_paths()
)
STATIC_PATHS = st.builds(lambda text: "/static/" + text, PATH_TEXT | st.sampled_from(
    ["admin/css/base.css", "../settings.py", "admin/../../x", "..\\x", "admin//css"]))


def request(paths: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"method": METHODS, "path": paths, "query": QUERIES, "headers": HEADERS, "body": BODIES}
    )


def check(answer: Answer, sent: dict[str, Any]) -> None:
    """The properties of one answer."""
    code = answer.headers.get(b"x-gw-error-code")
    made_here = code is not None
    if made_here:
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, (sent, error)
        assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
        assert str(error["code"]).encode() == code, (sent, error, code)
        assert code != b"internal_error", (sent, answer.body[:300])
        if answer.status >= 500:
            assert code.decode() in NAMED_5XX, (sent, answer.status, error)
    elif answer.status >= 500:
        # Not the gateway's: a worker's own answer relayed as is (only relayed and forwarded routes),
        # or /v1/models' plain-text 503 with no routable model.
        assert sent["path"] in data_plane_paths(), (sent, answer.status, answer.body[:300])
    if answer.status == 401:
        assert answer.body == b""


async def _answers(requests: list[dict[str, Any]], **config: Any) -> None:
    runner = web.AppRunner(build_app(MockWorkerConfig(model="mock-model")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = open_gateway([record_for(f"http://127.0.0.1:{runner.addresses[0][1]}", model="mock-model")], **config)
    try:
        for sent in requests:
            answer = await call_asgi(application, sent["method"], sent["path"], query=sent["query"],
                                     headers=sent["headers"], body=sent["body"])
            check(answer, sent)
    finally:
        await close_gateways([client])
        await runner.cleanup()


FUZZ = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


@FUZZ
@given(st.lists(request(st.sampled_from(RELAYED)), min_size=10, max_size=10))
def test_relayed_routes(requests: list[dict[str, Any]]) -> None:
    asyncio.run(_answers(requests))


@FUZZ
@given(st.lists(request(st.sampled_from(READ_ONLY)), min_size=10, max_size=10))
def test_models_probes_and_fleet_routes(requests: list[dict[str, Any]]) -> None:
    asyncio.run(_answers(requests))


@FUZZ
@given(st.lists(request(UNKNOWN_PATHS | STATIC_PATHS), min_size=10, max_size=10))
def test_unknown_paths_and_static_files(requests: list[dict[str, Any]]) -> None:
    asyncio.run(_answers(requests))


@FUZZ
@given(st.lists(request(st.sampled_from([*RELAYED, *READ_ONLY])), min_size=10, max_size=10))
def test_every_route_with_client_keys_and_limits(requests: list[dict[str, Any]]) -> None:
    """With keys, a small payload limit and admission limits: 401 with an empty body, 413, 429."""
    asyncio.run(_answers(requests, api_key="sk-fuzz", max_payload_size=256, max_concurrent_requests=1, queue_size=0,
                         tenant_api_keys=(("t", "sk-tenant"),)))

