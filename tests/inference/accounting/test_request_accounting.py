"""Every inference request is accounted once, by the turn runner (issue 25 item 1, D66): exact token
sums in the data plane's ledger through the relay (plain, streamed with and without the client asking
for usage, the client's bytes unchanged) and the gRPC pipeline, Responses tool rounds and background
runs summed into one entry, Messages, and the outcomes (rejected, cancelled, upstream error); the token
counters on /metrics (item 7)."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import orjson
import pytest

from administration.models import RequestLogEntry
from administration.usage_flush import write_usage
from common import telemetry
from inference.accounting import OPEN_SCOPE, SHARED_SCOPE, AccountingEntry, EstimatedUsage, Outcome, TokenUsage
from inference.dataplane import data_plane
from inference.routing.workers import WorkerRecord, WorkerStatus
from standins import mock_responses as mr
from standins.mock_provider import ProviderConfig
from tests.conftest import (
    PROVIDER_KEY, GatewayFactory, Provider, RunningWorker, free_port, post_scope, record_for, serving_provider,
)
from tests.inference.mcp.servers import serving
from tests.inference.served.conftest import QWEN_MODEL, Start, asgi_app, start_engine_gateway  # noqa: F401
from tests.inference.served.test_zmq import NO_THINKING, StartZmq, ipc_dir, start_zmq_gateway  # noqa: F401
from tests.responses_api.test_responses_on_grpc import LOOPBACK, PARSERS, mcp_tool, weather_server

MESSAGES = [{"role": "user", "content": "hello there friend"}]
CHAT = {"model": "mock-model", "messages": MESSAGES}
TOKENS = 16  # the mock worker's default completion


def entries() -> list[AccountingEntry]:
    """What the requests so far were accounted as (the ledger drained)."""
    return data_plane().ledger.drain().log


async def settled(count: int) -> list[AccountingEntry]:
    """The ledger once ``count`` requests are accounted (a background run ends after its answer)."""
    found: list[AccountingEntry] = []
    for _ in range(250):
        found += entries()
        if len(found) >= count:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(found)} of {count} requests accounted: {found}")


def _normalized(raw: bytes) -> bytes:
    """A stream with its per-request values (the id, the creation time) made equal."""
    raw = re.sub(rb'"id":"[^"]*"', b'"id":"x"', raw)
    return re.sub(rb'"created":\d+', b'"created":0', raw)


# --- the relay ----------------------------------------------------------------------------------------


async def test_a_relayed_answer_is_accounted_with_its_usage(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], model_aliases=(("fast", worker.model),))
    response = await gateway.post("/v1/chat/completions", json={**CHAT, "model": "fast"})
    assert response.status_code == 200
    usage = response.json()["usage"]
    [entry] = entries()
    assert (entry.usage.prompt, entry.usage.completion) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert (entry.usage.prompt, entry.usage.completion) == (mr.chat_prompt_tokens(MESSAGES), TOKENS)
    assert entry.model == "mock-model"  # canonical, not the alias the client named
    assert (entry.tenant, entry.worker, entry.surface, entry.route) == (OPEN_SCOPE, worker.url, "chat", "/v1/chat/completions")
    assert (entry.status, entry.outcome, entry.error_code) == (200, Outcome.SUCCESS, "")
    assert entry.request_id == response.headers["x-request-id"]
    assert entry.latency_secs > 0 and entry.ttft_secs is None


async def test_a_stream_the_client_asked_no_usage_of_is_accounted_and_passed_on_unchanged(
    gateway: httpx.AsyncClient, worker: RunningWorker
) -> None:
    body = {**CHAT, "stream": True}
    async with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    assert worker.requests()[-1]["json"]["stream_options"] == {"include_usage": True}  # asked of the worker
    async with httpx.AsyncClient() as direct:
        sent = (await direct.post(worker.url + "/v1/chat/completions", json=body)).content
    assert b'"usage"' not in sent
    assert _normalized(received) == _normalized(sent)  # what the worker sends a client who did not ask
    [entry] = entries()
    assert (entry.usage.prompt, entry.usage.completion) == (mr.chat_prompt_tokens(MESSAGES), TOKENS)
    assert entry.outcome is Outcome.SUCCESS and entry.ttft_secs is not None and entry.ttft_secs <= entry.latency_secs


async def test_the_usage_option_asked_of_the_worker_keeps_the_clients_body(
    gateway: httpx.AsyncClient, worker: RunningWorker
) -> None:
    # The option is put into the client's own bytes (D85): the worker reads every other field as sent.
    body = {**CHAT, "stream": True, "temperature": 0.5, "user": "u-1"}
    async with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        b"".join([chunk async for chunk in response.aiter_raw()])
    assert worker.requests()[-1]["json"] == {**body, "stream_options": {"include_usage": True}}


async def test_a_stream_with_include_usage_is_accounted_once(gateway: httpx.AsyncClient, worker: RunningWorker) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line]
    usage = orjson.loads(lines[-2][6:])["usage"]  # the client's usage chunk, kept
    assert worker.requests()[-1]["json"]["stream_options"] == {"include_usage": True}
    [entry] = entries()
    assert (entry.usage.prompt, entry.usage.completion) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert entry.usage.completion == TOKENS


async def test_completions_and_generate_streams_are_accounted(gateway: httpx.AsyncClient) -> None:
    async with gateway.stream("POST", "/v1/completions", json={"model": "mock-model", "prompt": "one two three", "stream": True}) as response:
        lines = [line async for line in response.aiter_lines() if line]
    assert not any('"usage"' in line for line in lines)
    generate = {"text": "one two three", "sampling_params": {"max_new_tokens": 4}, "stream": True}
    async with gateway.stream("POST", "/generate", json=generate) as response:
        [line async for line in response.aiter_lines()]
    completion, native = entries()
    assert (completion.surface, completion.usage.prompt, completion.usage.completion) == ("completions", 3, TOKENS)
    assert (native.surface, native.usage.prompt, native.usage.completion) == ("generate", 3, 4)


async def test_relayed_messages_whole_and_streamed_are_accounted(gateway: httpx.AsyncClient) -> None:
    body = {"model": "mock-model", "max_tokens": 64, "messages": [{"role": "user", "content": "one two three"}]}
    whole = (await gateway.post("/v1/messages", json=body)).json()
    async with gateway.stream("POST", "/v1/messages", json={**body, "stream": True}) as response:
        [line async for line in response.aiter_lines()]
    plain, streamed = entries()
    usage = whole["usage"]
    assert (plain.surface, plain.usage.prompt, plain.usage.completion) == ("messages", usage["input_tokens"], usage["output_tokens"])
    assert (streamed.usage.prompt, streamed.usage.completion) == (plain.usage.prompt, plain.usage.completion) == (3, TOKENS)


async def test_an_upstream_error_and_a_broken_stream_are_upstream_errors(gateway: httpx.AsyncClient) -> None:
    assert (await gateway.post("/v1/chat/completions", json={**CHAT, "mock": {"status": 500}})).status_code == 500
    body = {**CHAT, "stream": True, "mock": {"fail_after": 2, "tokens": 10}}
    async with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        [line async for line in response.aiter_lines()]
    assert (await gateway.post("/v1/chat/completions", json={**CHAT, "mock": {"status": 422}})).status_code == 422
    failed, broken, refused = entries()
    assert (failed.status, failed.outcome) == (500, Outcome.UPSTREAM_ERROR)
    assert (broken.status, broken.outcome, broken.error_code) == (200, Outcome.UPSTREAM_ERROR, "stream_failed")
    assert (refused.status, refused.outcome) == (422, Outcome.CLIENT_ERROR)


async def test_an_unreachable_worker_is_an_upstream_error(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    dead = record_for(f"http://127.0.0.1:{free_port()}", model="mock-model")
    gateway = make_gateway([dead], api_key="sk-shared")
    response = await gateway.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-shared"})
    assert response.status_code == 502
    [entry] = entries()
    assert (entry.tenant, entry.status, entry.outcome) == (SHARED_SCOPE, 502, Outcome.UPSTREAM_ERROR)
    assert entry.error_code == response.headers["x-gw-error-code"] and entry.worker == dead.url


async def test_a_rate_limited_request_is_rejected_and_an_invalid_one_a_client_error(
    make_gateway: GatewayFactory, worker: RunningWorker, settings
) -> None:
    settings.REDIS_URL = None
    gateway = make_gateway(
        [record_for(worker)], tenant_api_keys=(("acme", "sk-acme"),), tenant_rate_limits=(("acme", "2"),)
    )
    acme = {"authorization": "Bearer sk-acme"}
    assert (await gateway.post("/v1/chat/completions", json={"model": "mock-model"}, headers=acme)).status_code == 400
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=acme)).status_code == 200
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=acme)).status_code == 429
    assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 401  # no tenant: not accounted
    invalid, served, limited = entries()
    assert (invalid.tenant, invalid.outcome, invalid.status, invalid.worker) == ("acme", Outcome.CLIENT_ERROR, 400, "")
    assert served.outcome is Outcome.SUCCESS and served.usage.completion == TOKENS
    assert (limited.outcome, limited.status, limited.error_code) == (Outcome.REJECTED, 429, "rate_limit_exceeded")
    assert limited.usage.total == 0 and limited.worker == ""


async def test_a_request_no_worker_serves_is_rejected(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker, status="not_ready")])
    response = await gateway.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    [entry] = entries()
    assert (entry.outcome, entry.status, entry.model, entry.worker) == (Outcome.REJECTED, 503, "mock-model", "")


# --- the gRPC pipeline ----------------------------------------------------------------------------------


async def test_the_grpc_pipeline_accounts_plain_and_streamed_answers(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hello"}]}
    plain = (await gw.http.post("/v1/chat/completions", json=body)).json()
    first = gw.engine.state.requests[-1]
    async with gw.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    second = gw.engine.state.requests[-1]
    assert b'"usage"' not in received  # the client did not ask: none sent, still counted
    whole, streamed = entries()
    assert (whole.usage.prompt, whole.usage.completion) == (len(first.input_ids), len(first.outputs[0]))
    assert whole.usage.prompt == plain["usage"]["prompt_tokens"]
    assert (streamed.usage.prompt, streamed.usage.completion) == (len(second.input_ids), len(second.outputs[0]))
    assert whole.worker == streamed.worker == gw.record.url and whole.model == QWEN_MODEL
    assert whole.ttft_secs is None and streamed.ttft_secs is not None


async def test_a_zmq_worker_accounts_plain_and_streamed_answers(start_zmq_gateway: StartZmq) -> None:
    gw = await start_zmq_gateway()
    body = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hello"}], **NO_THINKING}
    assert (await gw.http.post("/v1/chat/completions", json=body)).status_code == 200
    first = gw.group.engines[0].state.requests[-1]
    async with gw.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        [line async for line in response.aiter_lines()]
    second = gw.group.engines[0].state.requests[-1]
    whole, streamed = entries()
    assert (whole.usage.prompt, whole.usage.completion) == (len(first.input_ids), len(first.outputs[0]))
    assert (streamed.usage.prompt, streamed.usage.completion) == (len(second.input_ids), len(second.outputs[0]))
    assert whole.worker.startswith("ipc://") and whole.outcome is streamed.outcome is Outcome.SUCCESS


async def test_messages_on_the_grpc_pipeline_are_accounted(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {"model": QWEN_MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}
    answer = (await gw.http.post("/v1/messages", json=body)).json()
    [entry] = entries()
    assert entry.surface == "messages" and entry.outcome is Outcome.SUCCESS
    usage = answer["usage"]
    assert (entry.usage.prompt, entry.usage.completion) == (usage["input_tokens"], usage["output_tokens"])
    assert entry.usage.completion == len(gw.engine.state.requests[-1].outputs[0])


async def test_served_embeddings_are_accounted_with_their_prompt_tokens(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.sdk().embeddings.create(model=QWEN_MODEL, input=["hello world", "bonjour"], encoding_format="float")
    [entry] = entries()
    assert (entry.surface, entry.outcome, entry.worker) == ("embeddings", Outcome.SUCCESS, gw.record.url)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 0  # returned as OpenAI returns it
    assert (entry.usage.prompt, entry.usage.completion) == (answer.usage.prompt_tokens, 0)


async def test_a_cancelled_stream_is_accounted_as_cancelled_with_what_it_used(start_engine_gateway: Start, asgi_app: object) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=20)
    body = httpx.Request("POST", "http://gateway", json={"model": QWEN_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}).content
    first_chunk = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await first_chunk.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and b"content" in message.get("body", b""):
            first_chunk.set()

    await asyncio.wait_for(asgi_app(post_scope("/v1/chat/completions"), receive, send), 5)  # type: ignore[operator]
    [entry] = entries()
    assert (entry.outcome, entry.status, entry.worker) == (Outcome.CANCELLED, 499, gw.record.url)
    assert entry.ttft_secs is not None
    served = gw.engine.state.requests[-1]
    # What it used until the client left: the whole prompt, the tokens streamed so far.
    assert entry.usage.prompt == len(served.input_ids) and 0 < entry.usage.completion < 40


# --- Responses: tool rounds and background runs ------------------------------------------------------


async def test_responses_tool_rounds_are_one_entry_with_every_turns_usage(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS, gateway=LOOPBACK)
    with serving(weather_server("sunny [[mock:text]]")) as url:
        response = await gw.sdk().responses.create(
            model=QWEN_MODEL, input="[[mock:tool_call]] weather?", tools=[mcp_tool(url)], reasoning={"effort": "none"},
        )
    turns = gw.engine.state.requests
    assert response.status == "completed" and len(turns) == 2 and response.usage is not None
    [entry] = entries()
    assert entry.surface == "responses" and entry.outcome is Outcome.SUCCESS
    assert entry.usage.prompt == sum(len(turn.input_ids) for turn in turns) == response.usage.input_tokens
    assert entry.usage.completion == sum(len(turn.outputs[0]) for turn in turns) == response.usage.output_tokens


async def test_a_background_run_is_accounted_once_when_it_ends(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    queued = await gw.sdk().responses.create(model=QWEN_MODEL, input="Hello", background=True)
    assert queued.status == "queued"
    [entry] = await settled(1)
    served = gw.engine.state.requests[-1]
    assert entry.request_id and entry.surface == "responses" and entry.outcome is Outcome.SUCCESS
    assert (entry.usage.prompt, entry.usage.completion) == (len(served.input_ids), len(served.outputs[0]))
    assert entry.usage.completion > 0 and entry.worker == gw.record.url
    await asyncio.sleep(0.1)
    assert entries() == []  # the request that queued it is not a second entry


async def test_a_streamed_background_run_the_client_leaves_is_accounted_once_when_it_ends(
    start_engine_gateway: Start, asgi_app: object
) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=10)
    body = orjson.dumps({"model": QWEN_MODEL, "input": "Hello", "background": True, "stream": True})
    queued = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await queued.wait()
        return {"type": "http.disconnect"}  # the client leaves the run's feed; the run goes on

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and b"response.queued" in message.get("body", b""):
            queued.set()

    await asyncio.wait_for(asgi_app(post_scope("/v1/responses"), receive, send), 5)  # type: ignore[operator]
    assert queued.is_set()
    [entry] = await settled(1)
    served = gw.engine.state.requests[-1]
    assert entry.outcome is Outcome.SUCCESS and entry.usage.completion == len(served.outputs[0]) > 0
    await asyncio.sleep(0.1)
    assert entries() == []


# --- /metrics --------------------------------------------------------------------------------------------


def _sample(name: str, **labels: str) -> float:
    value = telemetry.REGISTRY.get_sample_value(name, labels)
    return value or 0.0


@pytest.mark.parametrize("by_tenant", [False, True])
async def test_tokens_are_counted_on_metrics_by_model_and_type(
    make_gateway: GatewayFactory, worker: RunningWorker, by_tenant: bool
) -> None:
    gateway = make_gateway([record_for(worker)], usage_metrics_tenant_label=by_tenant)
    tenant = OPEN_SCOPE if by_tenant else ""
    usage_labels = {"model": "mock-model", "tenant": tenant}
    router = {"router_type": "http", "backend_type": "regular", "model": "mock-model", "endpoint": "/v1/chat/completions"}
    before = (
        _sample("gw_usage_tokens_total", **usage_labels, token_type="prompt"),
        _sample("gw_usage_tokens_total", **usage_labels, token_type="completion"),
        _sample("gw_router_tokens_total", **router, token_type="input"),
        _sample("gw_router_tokens_total", **router, token_type="output"),
    )
    assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200
    prompt = mr.chat_prompt_tokens(MESSAGES)
    after = (
        _sample("gw_usage_tokens_total", **usage_labels, token_type="prompt"),
        _sample("gw_usage_tokens_total", **usage_labels, token_type="completion"),
        _sample("gw_router_tokens_total", **router, token_type="input"),
        _sample("gw_router_tokens_total", **router, token_type="output"),
    )
    assert [b - a for a, b in zip(before, after)] == [prompt, TOKENS, prompt, TOKENS]


# --- what a relayed stream used when its worker never said it (D80) -------------------------------------

# The mock worker's chat prompt as the gateway estimates it: "user:\nhello there friend", 24 characters
# at four a token (the worker reports usage only in its stream's last event).
PROMPT_ESTIMATE = 6


async def _leave_after(app: object, path: str, body: dict, events: int, key: str | None = None) -> int:
    """``body`` streamed through the ASGI app by a client that leaves once it received ``events`` SSE
    data events; how many it received."""
    raw = orjson.dumps(body)
    left = asyncio.Event()
    received = [0]
    messages = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            received[0] += message.get("body", b"").count(b"data:")
            if received[0] >= events:
                left.set()

    headers = [] if key is None else [(b"authorization", f"Bearer {key}".encode())]
    await asyncio.wait_for(app(post_scope(path, headers), receive, send), 5)  # type: ignore[operator]
    return received[0]


@pytest.mark.django_db(transaction=True)
async def test_a_relayed_stream_the_client_leaves_is_charged_an_estimate(
    make_gateway: GatewayFactory, worker: RunningWorker, asgi_app: object, settings
) -> None:
    settings.REDIS_URL = None
    make_gateway([record_for(worker)], tenant_api_keys=(("acme", "sk-acme"),), tenant_budgets=(("acme", "100000/day"),))
    body = {**CHAT, "stream": True, "mock": {"tokens": 40, "delay_ms": 20}}
    received = await _leave_after(asgi_app, "/v1/chat/completions", body, 5, key="sk-acme")
    drained = data_plane().ledger.drain()
    [entry] = drained.log
    assert (entry.outcome, entry.status, entry.tenant, entry.worker) == (Outcome.CANCELLED, 499, "acme", worker.url)
    # One token per chunk the client received (the mock's first chunk carries its first token with the
    # role; vLLM and SGLang send the role alone first, which the estimate leaves out).
    assert 5 <= received < 40
    assert type(entry.usage) is EstimatedUsage
    assert (entry.usage.prompt, entry.usage.completion) == (PROMPT_ESTIMATE, received - 1)
    assert data_plane().budgets.used("acme") == entry.usage.total  # the budget charged the same count
    await asyncio.to_thread(write_usage, drained)
    row = await asyncio.to_thread(lambda: RequestLogEntry.objects.get())
    assert (row.prompt_tokens, row.completion_tokens, row.tokens_estimated) == (PROMPT_ESTIMATE, received - 1, True)


async def test_a_relayed_stream_its_worker_breaks_off_is_charged_an_estimate(gateway: httpx.AsyncClient) -> None:
    body = {**CHAT, "stream": True, "mock": {"fail_after": 3, "tokens": 10}}
    async with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
    assert len(lines) == 5  # three tokens, then the gateway's in-band error and [DONE]
    whole = {**CHAT, "stream": True}  # reported in full: not an estimate
    async with gateway.stream("POST", "/v1/chat/completions", json=whole) as response:
        [line async for line in response.aiter_lines()]
    broken, reported = entries()
    assert (broken.outcome, broken.error_code) == (Outcome.UPSTREAM_ERROR, "stream_failed")
    assert type(broken.usage) is EstimatedUsage and (broken.usage.prompt, broken.usage.completion) == (PROMPT_ESTIMATE, 2)
    assert type(reported.usage) is TokenUsage and reported.usage.completion == TOKENS


# --- external providers: asked for stream usage without changing the client's bytes (D80) -----------------


def _external(provider: Provider, named: str, models: tuple[str, ...] = ("gpt-4o-mini",)) -> WorkerRecord:
    return WorkerRecord(
        id=str(uuid.uuid4()), url=provider.url, model_id=None, runtime_type="external", status=WorkerStatus.READY,
        api_key=PROVIDER_KEY, models=models, named_provider=named,
    )  # fmt: skip


PROVIDER_CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "one two three"}], "stream": True}


async def test_an_openai_stream_is_asked_for_usage_and_relayed_unchanged(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = make_gateway([_external(provider, "openai")], ssrf_allow_loopback=True)
    async with gateway.stream("POST", "/v1/chat/completions", json=PROVIDER_CHAT) as response:
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    assert provider.calls("/v1/chat/completions")[-1]["json"]["stream_options"] == {"include_usage": True}
    async with httpx.AsyncClient() as direct:
        auth = {"authorization": f"Bearer {PROVIDER_KEY}"}
        sent = (await direct.post(provider.url + "/v1/chat/completions", json=PROVIDER_CHAT, headers=auth)).content
    assert b'"usage"' not in sent and b'"usage"' not in received  # neither the null fields nor the usage event
    assert _normalized(received) == _normalized(sent)
    [entry] = entries()
    # "heard: one two three": the provider's own count (words), not an estimate.
    assert type(entry.usage) is TokenUsage and (entry.usage.prompt, entry.usage.completion) == (3, 4)
    # A client that asked gets what it asked for, counted once.
    asked = {**PROVIDER_CHAT, "stream_options": {"include_usage": True}}
    async with gateway.stream("POST", "/v1/chat/completions", json=asked) as response:
        lines = [line async for line in response.aiter_lines() if line]
    assert lines[0].endswith(',"usage":null}') and orjson.loads(lines[-2][6:])["usage"]["completion_tokens"] == 4
    [entry] = entries()
    assert (entry.usage.prompt, entry.usage.completion) == (3, 4)


async def test_an_openai_stream_that_breaks_off_is_charged_an_estimate(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = make_gateway([_external(provider, "openai")], ssrf_allow_loopback=True)
    body = {**PROVIDER_CHAT, "metadata": {"provider_break": "1"}}
    async with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    assert b'"usage"' not in received
    [entry] = entries()
    assert (entry.outcome, entry.error_code) == (Outcome.UPSTREAM_ERROR, "stream_failed")
    # The role chunk and one word went out: one token; the prompt "user:\none two three" at four a token.
    assert type(entry.usage) is EstimatedUsage and (entry.usage.prompt, entry.usage.completion) == (5, 1)


async def test_a_provider_not_asked_is_counted_by_estimate(make_gateway: GatewayFactory) -> None:
    async with serving_provider(ProviderConfig(api_key=PROVIDER_KEY, flavour="xai", models=("grok-4",))) as xai:
        gateway = make_gateway([_external(xai, "xai", ("grok-4",))], ssrf_allow_loopback=True)
        async with gateway.stream("POST", "/v1/chat/completions", json={**PROVIDER_CHAT, "model": "grok-4"}) as response:
            [line async for line in response.aiter_lines()]
        assert "stream_options" not in xai.calls("/v1/chat/completions")[-1]["json"]
    [entry] = entries()
    # Its stream carried no usage: the words it streamed (the role chunk, the finish chunk and [DONE]
    # are not tokens), the prompt at four characters a token.
    assert entry.outcome is Outcome.SUCCESS
    assert type(entry.usage) is EstimatedUsage and (entry.usage.prompt, entry.usage.completion) == (5, 4)


async def test_gemini_interactions_are_counted_from_their_usage(make_gateway: GatewayFactory) -> None:
    config = ProviderConfig(api_key=PROVIDER_KEY, flavour="gemini", models=("gemini-2.5-flash",))
    async with serving_provider(config) as gemini:
        gateway = make_gateway([_external(gemini, "gemini", ("gemini-2.5-flash",))], ssrf_allow_loopback=True)
        body = {"model": "gemini-2.5-flash", "input": "one two three"}
        whole = (await gateway.post("/v1/interactions", json=body)).json()["usage"]
        async with gateway.stream("POST", "/v1/interactions", json={**body, "stream": True}) as response:
            [line async for line in response.aiter_lines()]
    plain, streamed = entries()
    expected = (whole["total_input_tokens"], whole["total_output_tokens"])
    assert expected == (4, 4)  # the stand-in counts words: "heard: one two three"
    assert type(plain.usage) is TokenUsage and (plain.usage.prompt, plain.usage.completion) == expected
    assert type(streamed.usage) is TokenUsage and (streamed.usage.prompt, streamed.usage.completion) == expected
