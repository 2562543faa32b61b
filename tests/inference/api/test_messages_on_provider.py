"""POST /v1/messages on the Anthropic provider backend (spec 1, "Messages-style API" by backend,
"Endpoints", "Authentication" item 5, "Errors"): relayed to our stand-in Anthropic API on loopback,
which checks x-api-key and anthropic-version as Anthropic does and records what it received, so the
exact headers and bodies a real provider would see are checked; streams relayed as they arrive, whole
answers parsed and re-serialized (502 parse_error otherwise), provider errors passed on; 501 for
other providers and for count_tokens. Read with the real anthropic SDK in strict mode."""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator

import anthropic
import httpx2
import orjson
import pytest
from aiohttp import web

from administration.models import Worker
from administration.workers import sync_cli_workers, worker_records
from common.config import GatewayConfig
from gateway_project.asgi import application
from inference.routing.workers import WorkerRecord, WorkerStatus
from standins.mock_provider import ProviderConfig, build_provider_app
from tests.conftest import PROVIDER_KEY, GatewayFactory, Provider

pytestmark = pytest.mark.django_db

GATEWAY_KEY = "gw-secret-key"
MODEL = "claude-stand-in"
BODY: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hello there"}]}
VERSION = {"anthropic-version": "2023-06-01"}


@pytest.fixture
async def claude() -> AsyncIterator[Provider]:
    """The stand-in provider serving an Anthropic model on loopback."""
    app = build_provider_app(ProviderConfig(models=(MODEL,), api_key=PROVIDER_KEY))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield Provider(f"http://127.0.0.1:{runner.addresses[0][1]}", app)
    await runner.cleanup()


def external(provider: Provider, api_key: str | None = PROVIDER_KEY, named: str | None = "anthropic") -> WorkerRecord:
    return WorkerRecord(
        id=str(uuid.uuid4()), url=provider.url, model_id=None, runtime_type="external", status=WorkerStatus.READY,
        api_key=api_key, models=(MODEL,), named_provider=named,
    )  # fmt: skip


def sdk(**auth: str) -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url="http://gateway", timeout=30)
    x_api_key = auth.pop("x_api_key", None)
    headers = {"x-api-key": x_api_key} if x_api_key else None
    return anthropic.AsyncAnthropic(base_url="http://gateway", http_client=http, max_retries=0, default_headers=headers,
                                    _strict_response_validation=True, **auth)  # type: ignore[arg-type]  # fmt: skip


def received(provider: Provider) -> dict[str, Any]:
    return provider.calls("/v1/messages")[-1]


def client_headers(sent: dict[str, Any]) -> dict[str, str]:
    """What the provider got of the client's headers (less the gateway's own transport and id lines)."""
    own = {"host", "content-length", "content-type", "x-request-id", "accept"}
    return {name: value for name, value in sent["headers"].items() if name not in own}


def assert_no_gateway_key(provider: Provider) -> None:
    for request in provider.state.requests:
        assert GATEWAY_KEY not in json.dumps(request["headers"]) and GATEWAY_KEY not in json.dumps(request["json"])


async def test_a_whole_answer_is_parsed_reserialized_and_read_by_the_sdk(make_gateway: GatewayFactory, claude: Provider) -> None:
    make_gateway([external(claude)], api_key=GATEWAY_KEY, ssrf_allow_loopback=True,
                 model_aliases=(("claude", MODEL),))  # fmt: skip
    message = await sdk(auth_token=GATEWAY_KEY).messages.create(
        model="claude", max_tokens=16, messages=[{"role": "user", "content": "hello there"}],
        extra_headers={"anthropic-beta": "context-management-2025-06-27", "traceparent": "00-abc-def-01"},
        extra_body={"context_management": {"edits": []}},
    )  # fmt: skip
    assert message.content[0].type == "text" and message.content[0].text == "heard: hello there"
    assert message.stop_reason == "end_turn" and message.model == MODEL
    sent = received(claude)
    assert sent["json"]["model"] == MODEL and sent["json"]["context_management"] == {"edits": []}
    assert client_headers(sent) == {
        "x-api-key": PROVIDER_KEY, "anthropic-version": sent["headers"]["anthropic-version"],
        "anthropic-beta": "context-management-2025-06-27",
    }  # only the worker's key, never the gateway's; no tracing or SDK headers
    assert_no_gateway_key(claude)


async def test_a_stream_is_relayed_as_it_arrives(make_gateway: GatewayFactory, claude: Provider) -> None:
    make_gateway([external(claude)], api_key=GATEWAY_KEY, ssrf_allow_loopback=True)
    async with sdk(api_key=GATEWAY_KEY).messages.stream(**BODY) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "heard: hello there"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert received(claude)["json"]["stream"] is True
    assert_no_gateway_key(claude)


async def test_a_keyless_worker_gets_the_callers_x_api_key_as_it_came(make_gateway: GatewayFactory, claude: Provider) -> None:
    client = make_gateway([external(claude, api_key=None)], api_key=GATEWAY_KEY, ssrf_allow_loopback=True)
    headers = {"Authorization": f"Bearer {GATEWAY_KEY}", "x-api-key": PROVIDER_KEY, **VERSION}
    response = await client.post("/v1/messages", json=BODY, headers=headers)
    assert response.status_code == 200 and response.json()["content"][0]["text"] == "heard: hello there"
    assert client_headers(received(claude)) == {"x-api-key": PROVIDER_KEY, **VERSION}
    assert_no_gateway_key(claude)


async def test_in_open_mode_both_credential_headers_go_as_they_came(make_gateway: GatewayFactory, claude: Provider) -> None:
    make_gateway([external(claude, api_key=None)], ssrf_allow_loopback=True)
    await sdk(auth_token="sk-ant-oauth-token", x_api_key=PROVIDER_KEY).messages.create(**BODY)
    sent = client_headers(received(claude))
    assert sent["authorization"] == "Bearer sk-ant-oauth-token" and sent["x-api-key"] == PROVIDER_KEY


async def test_provider_errors_come_back_with_status_and_body_unchanged(make_gateway: GatewayFactory, claude: Provider) -> None:
    client = make_gateway([external(claude, api_key=None)], ssrf_allow_loopback=True)
    refused = await client.post("/v1/messages", json=BODY, headers={"x-api-key": "sk-wrong", **VERSION})
    assert refused.status_code == 401
    assert refused.json() == {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
    no_version = await client.post("/v1/messages", json=BODY, headers={"x-api-key": PROVIDER_KEY})
    assert no_version.status_code == 400 and no_version.json()["error"]["type"] == "invalid_request_error"
    failing = {**BODY, "metadata": {"provider_fail": "529"}}
    overloaded = await client.post("/v1/messages", json=failing, headers={"x-api-key": PROVIDER_KEY, **VERSION})
    assert overloaded.status_code == 529 and overloaded.json()["error"]["type"] == "overloaded_error"
    assert "x-gw-error-code" not in overloaded.headers


async def test_a_whole_answer_that_does_not_parse_is_502_parse_error(make_gateway: GatewayFactory, claude: Provider) -> None:
    client = make_gateway([external(claude)], ssrf_allow_loopback=True)
    response = await client.post("/v1/messages", json={**BODY, "metadata": {"provider_garble": "1"}}, headers=VERSION)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "parse_error" and response.headers["x-gw-error-code"] == "parse_error"


async def test_a_stream_the_provider_breaks_ends_with_the_error_event(make_gateway: GatewayFactory, claude: Provider) -> None:
    client = make_gateway([external(claude)], ssrf_allow_loopback=True)
    body = {**BODY, "stream": True, "metadata": {"provider_break": "1"}}
    async with client.stream("POST", "/v1/messages", json=body, headers=VERSION) as response:
        assert response.status_code == 200
        text = (await response.aread()).decode()
    kind, data = [block for block in text.split("\n\n") if block][-1].split("\n")
    assert kind == "event: error"
    assert orjson.loads(data.removeprefix("data: "))["error"]["type"] == "api_error"


async def test_other_providers_and_count_tokens_answer_501(make_gateway: GatewayFactory, claude: Provider, provider: Provider) -> None:
    openai_like = WorkerRecord(
        id=str(uuid.uuid4()), url=provider.url, model_id=None, runtime_type="external", status=WorkerStatus.READY,
        api_key=PROVIDER_KEY, models=("gpt-4o-mini",),
    )  # fmt: skip
    client = make_gateway([external(claude), openai_like], ssrf_allow_loopback=True)
    other = await client.post("/v1/messages", json={**BODY, "model": "gpt-4o-mini"}, headers=VERSION)
    assert other.status_code == 501 and other.headers["x-gw-error-code"] == "endpoint_not_supported"
    counted = await client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": BODY["messages"]})
    assert counted.status_code == 501
    assert not provider.calls("/v1/messages") and not claude.calls("/v1/messages/count_tokens")


def test_backend_anthropic_names_the_provider_of_command_line_workers(django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks():
        sync_cli_workers(["http://127.0.0.1:9"], backend="anthropic")
    worker = Worker.objects.get(url="http://127.0.0.1:9")
    (record,) = worker_records(GatewayConfig(), [worker])
    assert record.external and record.provider == "anthropic"

