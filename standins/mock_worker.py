"""The project's mock OpenAI-compatible HTTP worker: a stand-in for an SGLang/vLLM HTTP server.

A test aid for tests, benchmarks and first-time users; the gateway never routes to it on its own.
Start it with ``python manage.py runmockworker --port P --model M`` or in-process with
:func:`build_app` (any aiohttp runner). Payloads come from :mod:`standins.mock_responses`.

Besides the OpenAI routes it answers the Anthropic Messages API as an engine's server does:
``POST /v1/messages`` (one text block, whole or as Anthropic's event sequence: message_start,
content_block_start, ping, text_delta per token, content_block_stop, message_delta with the usage,
message_stop) and ``POST /v1/messages/count_tokens`` (``{"input_tokens"}``, words of system and texts).

Per-request controls, in an optional body field ``"mock": {...}``:

* ``status``: answer with this HTTP status (>= 400) and an OpenAI-style error JSON, streaming too;
* ``tokens``: completion tokens for this request (default: the config's; max tokens still cap it);
* ``delay_ms``: delay before each generated token (a non-streaming answer waits tokens x delay);
* ``fail_after``: streaming: close the connection abruptly after N tokens, without ``[DONE]``;
  non-streaming: close it without any response (after N x delay).

Introspection, behind the same API key as the rest (/_mock requests are not recorded):

* ``GET /_mock/requests``: the last 100 requests, newest last, each ``{method, path, query, headers
  (lowercase names), json, raw, client_port}``; ``?path=`` filters; in-process: ``mock_state(app).requests``;
* ``DELETE /_mock/requests`` clears the log; ``DELETE /_mock/stats`` resets the log and counters;
* ``GET /_mock/stats``: ``{requests, requests_by_path, streams_started, streams_completed, streams_disconnected,
  streams_aborted, in_flight, peak_in_flight}``;
* ``POST /_mock/faults`` ``{"health_status": 503, "status": 500, "hang": true, "drop": true}`` (any
  subset): fail health probes, answer every inference POST with that status, hang every inference
  POST, or close its connection without an answer;
  ``DELETE /_mock/faults`` clears them; ``POST /_mock/exit`` kills the process at once;
  the faults ``load_status``, ``metrics_status``, ``flush_status`` and ``profile_status`` make
  ``/get_load``, ``/metrics``, ``/flush_cache`` and ``/start_profile`` / ``/stop_profile`` answer
  with that status;
* ``POST /_mock/load`` ``{"ranks": [{"num_waiting_reqs": 5, "token_usage": 0.5, ...}, ...]}`` (or one
  rank's object) sets the engine load reported by ``/get_load`` (SGLang) and ``/metrics``, one entry
  per data-parallel rank; in-process: ``mock_state(app).engine_loads``.

Engine load and operations routes: ``GET /get_load`` (SGLang workers only: a JSON list with one
object per dp rank), ``GET /metrics`` (Prometheus text; ``sglang:*`` or ``vllm:*`` gauges),
``POST /flush_cache``, ``POST /start_profile``, ``POST /stop_profile``.

A stream whose client went away before it finished counts as ``streams_disconnected``; one cut by
``fail_after`` as ``streams_aborted``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from standins import mock_responses as mr

__all__ = [
    "MOCK_VERSION",
    "MockWorkerConfig",
    "MockWorkerState",
    "build_app",
    "mock_state",
    "run_mock_worker",
]

MOCK_VERSION = "0.0.0-mock"
REQUEST_LOG_SIZE = 100
_MAX_N = 128
_MAX_TOTAL_TOKENS = 100_000
_FAULT_STATUSES = ("load_status", "metrics_status", "flush_status", "profile_status")
_JSON_HEADERS = {"Content-Type": "application/json"}
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Middleware = Callable[[web.Request, _Handler], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class MockWorkerConfig:
    model: str
    owned_by: str = "sglang"
    tokens: int = 16
    delay_ms: float = 0
    api_key: str | None = None
    max_model_len: int = 4096
    dp_size: int = 1  # the data-parallel size /server_info reports (SGLang), for --dp-aware

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must not be empty")
        if self.tokens < 0 or self.delay_ms < 0 or self.max_model_len < 1 or self.dp_size < 1:
            raise ValueError("tokens and delay_ms must be >= 0, max_model_len and dp_size >= 1")

    @property
    def runtime(self) -> str:
        """``sglang``, ``vllm``, or ``generic`` for any other owned_by."""
        return self.owned_by if self.owned_by in ("sglang", "vllm") else "generic"


@dataclass
class MockWorkerState:
    """The request log and counters behind the /_mock routes."""

    requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=REQUEST_LOG_SIZE))
    total_requests: int = 0
    requests_by_path: dict[str, int] = field(default_factory=dict)
    streams_started: int = 0
    streams_completed: int = 0
    streams_disconnected: int = 0
    streams_aborted: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0  # the most requests in flight at once since the last reset
    # Process-wide faults set through /_mock/faults (tests of health checks, breakers, retries).
    health_status: int = 200
    fault_status: int | None = None
    fault_hang: bool = False
    fault_drop: bool = False
    load_status: int | None = None
    metrics_status: int | None = None
    flush_status: int | None = None
    profile_status: int | None = None
    # Engine load per data-parallel rank (fields of an SGLang load entry; missing ones default to 0).
    engine_loads: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    # The responses this worker made (id → (created_at, model)), the latest 1000: what it can cancel.
    responses: dict[str, tuple[int, str]] = field(default_factory=dict)

    def made_response(self, response_id: str, created: int, model: str) -> None:
        self.responses[response_id] = (created, model)
        if len(self.responses) > 1000:
            del self.responses[next(iter(self.responses))]

    def faults(self) -> dict[str, Any]:
        return {
            "health_status": self.health_status,
            "status": self.fault_status,
            "hang": self.fault_hang,
            "drop": self.fault_drop,
            "load_status": self.load_status,
            "metrics_status": self.metrics_status,
            "flush_status": self.flush_status,
            "profile_status": self.profile_status,
        }

    def rank_loads(self) -> list[dict[str, Any]]:
        """The engine load of every dp rank, with the defaults filled in."""
        ranks = []
        for rank, given in enumerate(self.engine_loads or [{}]):
            entry: dict[str, Any] = {
                "dp_rank": rank,
                "num_running_reqs": 0,
                "num_waiting_reqs": 0,
                "num_used_tokens": 0,
                "max_total_num_tokens": _MAX_TOTAL_TOKENS,
                "token_usage": 0.0,
                "gen_throughput": 0.0,
                "cache_hit_rate": 0.0,
                "max_running_requests": 256,
            }
            entry.update(given)
            if "token_usage" not in given and entry["max_total_num_tokens"]:
                entry["token_usage"] = entry["num_used_tokens"] / entry["max_total_num_tokens"]
            entry["num_reqs"] = entry["num_running_reqs"] + entry["num_waiting_reqs"]
            entry["num_tokens"] = entry["num_used_tokens"]
            ranks.append(entry)
        return ranks

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.total_requests,
            "requests_by_path": dict(self.requests_by_path),
            "streams_started": self.streams_started,
            "streams_completed": self.streams_completed,
            "streams_disconnected": self.streams_disconnected,
            "streams_aborted": self.streams_aborted,
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
        }

    def reset(self) -> None:
        """Clears the log and the counters, except ``in_flight``."""
        self.requests.clear()
        self.requests_by_path.clear()
        self.total_requests = self.streams_started = self.streams_completed = 0
        self.streams_disconnected = self.streams_aborted = 0
        self.peak_in_flight = self.in_flight


_STATE = web.AppKey("mock_worker_state", MockWorkerState)
_BODY = web.RequestKey("mock_worker_body", object)


def mock_state(app: web.Application) -> MockWorkerState:
    """The live request log and counters of an app made by :func:`build_app`."""
    return app[_STATE]


# --- responses ----------------------------------------------------------------------------------


def _client_port(request: web.Request) -> int | None:
    """The port the caller's connection comes from (tells reused keep-alive connections apart)."""
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    return int(peer[1]) if peer else None


def _json(payload: Any) -> web.Response:
    return web.Response(body=orjson.dumps(payload), headers=_JSON_HEADERS)


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.Response(body=mr.error_body(status, message, param), status=status, headers=_JSON_HEADERS)


def _rid(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def _body(request: web.Request) -> dict[str, Any]:
    body = request.get(_BODY)
    if not isinstance(body, dict):
        raise mr.MockError(400, "Request body must be a JSON object")
    return body


def _n(body: dict[str, Any]) -> int:
    return 1 if body.get("n") is None else mr.int_field(body["n"], "n", 1, _MAX_N)


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _abort(request: web.Request) -> None:
    """Closes the connection: buffered bytes are flushed, then FIN, with no chunked terminator."""
    transport = request.transport
    if transport is not None:
        transport.close()


async def _respond(request: web.Request, ctl: mr.Controls, tokens: int, payload: Any) -> web.Response:
    """A non-streaming answer after the simulated generation time, or an abrupt close."""
    wait = tokens if ctl.fail_after is None else min(tokens, ctl.fail_after)
    if ctl.delay_s and wait:
        await asyncio.sleep(ctl.delay_s * wait)
    if ctl.fail_after is not None:
        _abort(request)  # aiohttp then fails to write the response and drops it quietly
    return _json(payload)


async def _stream(
    request: web.Request, steps: list[bytes], tail: bytes, ctl: mr.Controls
) -> web.StreamResponse:
    """Writes ``steps`` (one per token, ``delay`` before each) then ``tail``; counts how it ended."""
    state = request.app[_STATE]
    state.streams_started += 1
    outcome = "disconnected"
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    try:
        await resp.prepare(request)
        delay = ctl.delay_s
        limit = len(steps) if ctl.fail_after is None else min(ctl.fail_after, len(steps))
        for i in range(limit):
            if delay:
                await asyncio.sleep(delay)
            await resp.write(steps[i])
        if ctl.fail_after is not None:
            outcome = "aborted"
            _abort(request)
            return resp
        await resp.write(tail)
        await resp.write_eof()
        outcome = "completed"
    except ConnectionResetError:  # also aiohttp's ClientConnectionResetError: the client went away
        pass
    finally:  # runs on CancelledError too (aiohttp cancels the handler when the client disconnects)
        if outcome == "completed":
            state.streams_completed += 1
        elif outcome == "aborted":
            state.streams_aborted += 1
        else:
            state.streams_disconnected += 1
    return resp


# --- middleware ---------------------------------------------------------------------------------


def _middleware(config: MockWorkerConfig, state: MockWorkerState) -> _Middleware:
    """Parses JSON bodies, records requests, counts in-flight ones, checks the API key, and turns
    errors (ours, aiohttp's 404/405) into OpenAI-style JSON."""
    api_key = config.api_key

    def authorized(request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        return header[:7].lower() == "bearer " and header[7:].strip() == api_key

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        path = request.path
        recorded = not path.startswith("/_mock/")
        if recorded:
            state.total_requests += 1
            state.requests_by_path[path] = state.requests_by_path.get(path, 0) + 1
            state.in_flight += 1
            state.peak_in_flight = max(state.peak_in_flight, state.in_flight)
        try:
            body: Any = None
            raw = b""
            bad_json = False
            if request.method == "POST" and request.can_read_body:
                raw = await request.read()
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    bad_json = True
            request[_BODY] = body
            if recorded:
                state.requests.append(
                    {
                        "method": request.method,
                        "path": path,
                        "query": request.query_string,
                        "headers": {k.lower(): v for k, v in request.headers.items()},
                        "json": body,
                        "raw": raw.decode("utf-8", "replace"),
                        "client_port": _client_port(request),
                    }
                )
            if api_key is not None and path != "/health" and not authorized(request):
                return _error(401, "Invalid or missing API key")
            if recorded:
                if path in ("/health", "/health_generate"):
                    if state.health_status != 200:
                        return _error(state.health_status, "unhealthy (set through /_mock/faults)")
                elif request.method == "POST":
                    if state.fault_hang:
                        await asyncio.sleep(3600)
                    if state.fault_drop:
                        _abort(request)
                        raise web.HTTPServiceUnavailable()  # never sent: the connection is closed
                    if state.fault_status is not None:
                        return _error(state.fault_status, "failing on command (set through /_mock/faults)")
            if bad_json:
                return _error(400, "Malformed JSON in request body")
            return await handler(request)
        except mr.MockError as exc:
            return _error(exc.status, exc.message, exc.param)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(exc.status, f"{exc.reason}: {request.method} {path}")
        finally:
            if recorded:
                state.in_flight -= 1

    return middleware


# --- routes -------------------------------------------------------------------------------------


def _routes(config: MockWorkerConfig) -> list[web.RouteDef]:
    default = mr.Controls(config.tokens, config.delay_ms / 1000)
    created = int(time.time())
    model_card = {
        "id": config.model,
        "object": "model",
        "created": created,
        "owned_by": config.owned_by,
        "root": config.model,
        "parent": None,
        "max_model_len": config.max_model_len,
    }
    server_info = {
        "model_path": config.model,
        "tokenizer_path": config.model,
        "served_model_name": config.model,
        "context_length": config.max_model_len,
        "dp_size": config.dp_size,
        "version": MOCK_VERSION,
    }
    model_info = {"model_path": config.model, "tokenizer_path": config.model, "is_generation": True}
    sglang, vllm = config.runtime == "sglang", config.runtime == "vllm"

    def static(payload: dict[str, Any] | None) -> _Handler:
        body = None if payload is None else orjson.dumps(payload)

        async def handler(_request: web.Request) -> web.Response:
            if body is None:
                raise mr.MockError(404, "Not Found")
            return web.Response(body=body, headers=_JSON_HEADERS)

        return handler

    async def health(_request: web.Request) -> web.Response:
        return web.Response()

    def controls(body: dict[str, Any]) -> mr.Controls:
        ctl = mr.parse_controls(body, default)
        if ctl.status:
            raise mr.MockError(ctl.status, f"mock error (status {ctl.status})")
        return ctl

    async def chat(request: web.Request) -> web.StreamResponse:
        body = _body(request)
        ctl = controls(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise mr.MockError(400, "messages must be a non-empty list", "messages")
        n = _n(body)
        prompt_tokens = mr.chat_prompt_tokens(messages)
        cap_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        cap = body.get(cap_name)
        tokens, finish = mr.budget(config.max_model_len, ctl.tokens, cap, cap_name, prompt_tokens)
        model = body.get("model") or config.model
        rid, now = _rid("chatcmpl-"), int(time.time())
        if body.get("stream"):
            usage = _include_usage(body)
            steps, tail = mr.chat_stream(rid, now, model, n, tokens, finish, prompt_tokens, usage)
            return await _stream(request, steps, tail, ctl)
        payload = mr.chat_completion(rid, now, model, n, tokens, finish, prompt_tokens)
        return await _respond(request, ctl, tokens, payload)

    async def responses(request: web.Request) -> web.StreamResponse:
        """/v1/responses as an engine's own server answers it (the gateway relays it unchanged)."""
        body = _body(request)
        ctl = controls(body)
        prompt_tokens = mr.responses_input_tokens(body.get("input"))
        tokens, finish = mr.budget(config.max_model_len, ctl.tokens, body.get("max_output_tokens"), "max_output_tokens", prompt_tokens)
        model = body.get("model") or config.model
        rid, now = _rid("resp_"), int(time.time())
        mock_state(request.app).made_response(rid, now, model)
        if body.get("stream"):
            steps, tail = mr.response_stream(rid, now, model, tokens, finish, prompt_tokens)
            return await _stream(request, steps, tail, ctl)
        return await _respond(request, ctl, tokens, mr.response_object(rid, now, model, tokens, finish, prompt_tokens))

    async def messages(request: web.Request) -> web.StreamResponse:
        """/v1/messages as an engine's own server answers it (the gateway relays it unchanged)."""
        body = _body(request)
        ctl = controls(body)
        prompt_tokens = mr.messages_input_tokens(body)
        tokens, finish = mr.budget(config.max_model_len, ctl.tokens, body.get("max_tokens"), "max_tokens", prompt_tokens)
        model = body.get("model") or config.model
        rid = _rid("msg_")
        if body.get("stream"):
            steps, tail = mr.message_stream(rid, model, tokens, finish, prompt_tokens)
            return await _stream(request, steps, tail, ctl)
        return await _respond(request, ctl, tokens, mr.message_object(rid, model, tokens, finish, prompt_tokens))

    async def count_message_tokens(request: web.Request) -> web.Response:
        body = _body(request)
        controls(body)
        return _json({"input_tokens": mr.messages_input_tokens(body)})

    async def cancel_response(request: web.Request) -> web.Response:
        """POST /v1/responses/{id}/cancel: a response this worker made comes back cancelled."""
        made = mock_state(request.app).responses.get(request.match_info["response_id"])
        if made is None:
            raise mr.MockError(404, f"Response with id '{request.match_info['response_id']}' not found.")
        cancelled = mr.response_object(request.match_info["response_id"], made[0], made[1], 0, "stop", 0, status="cancelled")
        return _json(cancelled)

    async def completions(request: web.Request) -> web.StreamResponse:
        body = _body(request)
        ctl = controls(body)
        prompts = mr.prompt_list(body.get("prompt"), "prompt")
        choices = len(prompts) * _n(body)
        longest = max(map(mr.count_tokens, prompts))
        cap = body.get("max_tokens")
        tokens, finish = mr.budget(config.max_model_len, ctl.tokens, cap, "max_tokens", longest)
        prompt_tokens = sum(map(mr.count_tokens, prompts))
        model = body.get("model") or config.model
        rid, now = _rid("cmpl-"), int(time.time())
        if body.get("stream"):
            usage = _include_usage(body)
            steps, tail = mr.completion_stream(
                rid, now, model, choices, tokens, finish, prompt_tokens, usage
            )
            return await _stream(request, steps, tail, ctl)
        payload = mr.text_completion(rid, now, model, choices, tokens, finish, prompt_tokens)
        return await _respond(request, ctl, tokens, payload)

    def simple(builder: Callable[[dict[str, Any], str], dict[str, Any]]) -> _Handler:
        """Embeddings, rerank, classify, (de)tokenize: one answer, ``delay_ms`` counted once."""

        async def handler(request: web.Request) -> web.StreamResponse:
            body = _body(request)
            ctl = controls(body)
            return await _respond(request, ctl, 1, builder(body, body.get("model") or config.model))

        return handler

    async def generate(request: web.Request) -> web.StreamResponse:
        body = _body(request)
        ctl = controls(body)
        source = body.get("text") if body.get("text") is not None else body.get("input_ids")
        prompts = mr.prompt_list(source, "text")
        batched = isinstance(source, list) and not isinstance(source[0], int)
        params = body.get("sampling_params")
        cap = params.get("max_new_tokens") if isinstance(params, dict) else None
        prompt_tokens = max(map(mr.count_tokens, prompts))
        tokens, _ = mr.budget(config.max_model_len, ctl.tokens, cap, "max_new_tokens", prompt_tokens)
        rid = body["rid"] if isinstance(body.get("rid"), str) else _rid("")
        if body.get("stream"):
            if batched:
                raise mr.MockError(400, "the mock does not stream batched /generate requests")
            steps, tail = mr.generate_stream(rid, prompt_tokens, tokens)
            return await _stream(request, steps, tail, ctl)
        if not batched:
            return await _respond(request, ctl, tokens, mr.generate_result(rid, prompt_tokens, tokens))
        results = [
            mr.generate_result(f"{rid}-{i}", mr.count_tokens(p), tokens) for i, p in enumerate(prompts)
        ]
        return await _respond(request, ctl, tokens, results)

    def fault(status: int | None, what: str) -> None:
        if status is not None:
            raise mr.MockError(status, f"{what} failing on command (set through /_mock/faults)")

    async def get_load(request: web.Request) -> web.Response:
        state = request.app[_STATE]
        fault(state.load_status, "get_load")
        return _json(state.rank_loads())

    async def metrics(request: web.Request) -> web.Response:
        state = request.app[_STATE]
        fault(state.metrics_status, "metrics")
        return web.Response(text=_metrics_text(config, state), content_type="text/plain")

    async def flush_cache(request: web.Request) -> web.Response:
        fault(request.app[_STATE].flush_status, "flush_cache")
        return web.Response(text="Cache flushed.")

    async def profile(request: web.Request) -> web.Response:
        fault(request.app[_STATE].profile_status, "profile")
        return web.Response(text=f"{request.path.strip('/')} done.")

    tokenize = simple(lambda body, _model: mr.tokenize_payload(body, config.max_model_len))
    detokenize = simple(lambda body, _model: mr.detokenize_payload(body))
    rerank = simple(mr.rerank_payload)
    server_info_handler = static(server_info if sglang else None)
    return [
        web.get("/health", health),
        web.get("/health_generate", health),
        web.get("/v1/models", static({"object": "list", "data": [model_card]})),
        web.get("/get_model_info", static(model_info)),
        web.get("/get_server_info", server_info_handler),
        web.get("/server_info", server_info_handler),
        web.get("/version", static({"version": MOCK_VERSION} if vllm else None)),
        *([web.get("/get_load", get_load)] if sglang else []),
        web.get("/metrics", metrics),
        web.post("/flush_cache", flush_cache),
        web.post("/start_profile", profile),
        web.post("/stop_profile", profile),
        web.post("/v1/chat/completions", chat),
        web.post("/v1/completions", completions),
        web.post("/v1/responses", responses),
        web.post("/v1/messages", messages),
        web.post("/v1/messages/count_tokens", count_message_tokens),
        web.post("/v1/responses/{response_id}/cancel", cancel_response),
        web.post("/v1/embeddings", simple(mr.embeddings_payload)),
        web.post("/v1/rerank", rerank),
        web.post("/rerank", rerank),
        web.post("/v1/classify", simple(mr.classify_payload)),
        web.post("/generate", generate),
        web.post("/v1/tokenize", tokenize),
        web.post("/tokenize", tokenize),
        web.post("/v1/detokenize", detokenize),
        web.post("/detokenize", detokenize),
    ]


def _introspection_routes(state: MockWorkerState) -> list[web.RouteDef]:
    async def requests(request: web.Request) -> web.Response:
        path = request.query.get("path")
        return _json([r for r in state.requests if path is None or r["path"] == path])

    async def clear_requests(_request: web.Request) -> web.Response:
        state.requests.clear()
        return _json({"cleared": True})

    async def stats(_request: web.Request) -> web.Response:
        return _json(state.stats())

    async def reset(_request: web.Request) -> web.Response:
        state.reset()
        return _json(state.stats())

    async def set_faults(request: web.Request) -> web.Response:
        try:
            given = await request.json()
        except ValueError:
            return _error(400, "Malformed JSON in request body")
        if not isinstance(given, dict):
            return _error(400, "faults must be an object")
        if "health_status" in given:
            state.health_status = int(given["health_status"])
        if "status" in given:
            state.fault_status = None if given["status"] is None else int(given["status"])
        if "hang" in given:
            state.fault_hang = bool(given["hang"])
        if "drop" in given:
            state.fault_drop = bool(given["drop"])
        for name in _FAULT_STATUSES:
            if name in given:
                setattr(state, name, None if given[name] is None else int(given[name]))
        return _json(state.faults())

    async def set_load(request: web.Request) -> web.Response:
        try:
            given = await request.json()
        except ValueError:
            return _error(400, "Malformed JSON in request body")
        ranks = given.get("ranks") if isinstance(given, dict) and "ranks" in given else [given]
        if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
            return _error(400, "load must be an object or {ranks: [objects]}")
        state.engine_loads = ranks
        return _json(state.rank_loads())

    async def get_faults(_request: web.Request) -> web.Response:
        return _json(state.faults())

    async def clear_faults(_request: web.Request) -> web.Response:
        state.health_status, state.fault_status, state.fault_hang, state.fault_drop = 200, None, False, False
        for name in _FAULT_STATUSES:
            setattr(state, name, None)
        return _json(state.faults())

    async def exit_now(_request: web.Request) -> web.Response:
        # Die on command, like a crashed engine: no graceful shutdown, open connections drop.
        asyncio.get_running_loop().call_later(0.05, os._exit, 1)
        return _json({"exiting": True})

    return [
        web.post("/_mock/faults", set_faults),
        web.delete("/_mock/faults", clear_faults),
        web.get("/_mock/faults", get_faults),
        web.post("/_mock/exit", exit_now),
        web.post("/_mock/load", set_load),
        web.get("/_mock/requests", requests),
        web.delete("/_mock/requests", clear_requests),
        web.get("/_mock/stats", stats),
        web.delete("/_mock/stats", reset),
    ]


def _metrics_text(config: MockWorkerConfig, state: MockWorkerState) -> str:
    """The engine's Prometheus exposition: SGLang or vLLM gauge names (with colons), one sample per
    dp rank, plus a counter."""
    prefix = "vllm" if config.runtime == "vllm" else "sglang"
    gauges: tuple[tuple[str, str, str], ...]
    if prefix == "vllm":
        gauges = (
            ("num_requests_running", "num_running_reqs", "Number of requests in model execution batches."),
            ("num_requests_waiting", "num_waiting_reqs", "Number of requests waiting to be processed."),
            ("kv_cache_usage_perc", "token_usage", "KV-cache usage. 1 means 100 percent usage."),
        )
    else:
        gauges = (
            ("num_requests_running", "num_running_reqs", "The number of running requests."),
            ("num_queue_reqs", "num_waiting_reqs", "The number of requests in the waiting queue."),
            ("token_usage", "token_usage", "The token usage."),
            ("gen_throughput", "gen_throughput", "The generation throughput (token/s)."),
        )
    ranks = state.rank_loads()
    lines = []
    for name, key, help_text in gauges:
        lines.append(f"# HELP {prefix}:{name} {help_text}")
        lines.append(f"# TYPE {prefix}:{name} gauge")
        for entry in ranks:
            labels = f'model_name="{config.model}",dp_rank="{entry["dp_rank"]}"'
            lines.append(f"{prefix}:{name}{{{labels}}} {float(entry[key])}")
    lines.append(f"# HELP {prefix}:mock_requests_total Requests the mock worker received.")
    lines.append(f"# TYPE {prefix}:mock_requests_total counter")
    lines.append(f'{prefix}:mock_requests_total{{model_name="{config.model}"}} {float(state.total_requests)}')
    return "\n".join(lines) + "\n"


def build_app(config: MockWorkerConfig) -> web.Application:
    """The mock worker as an aiohttp application. Serve it with ``handler_cancellation=True`` (as
    :func:`run_mock_worker` does) to stop a stream the moment its client disconnects; without it the
    disconnect is noticed at the next token write."""
    state = MockWorkerState()
    app = web.Application(
        middlewares=[_middleware(config, state)],  # type: ignore[list-item]  # @web.middleware-decorated
        client_max_size=64 * 1024 * 1024,
    )
    app[_STATE] = state
    app.add_routes(_routes(config))
    app.add_routes(_introspection_routes(state))
    return app


def run_mock_worker(config: MockWorkerConfig, host: str, port: int) -> None:
    """Serves until SIGINT/SIGTERM. Once listening, prints one line to stdout (flushed):
    ``mock worker serving MODEL on http://HOST:PORT``. Port 0 picks a free port, named in that line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=1024)
    url_host = f"[{host}]" if family == socket.AF_INET6 else host
    line = f"mock worker serving {config.model} on http://{url_host}:{sock.getsockname()[1]}\n"

    def announce(*_args: Any, **_kwargs: Any) -> None:  # replaces aiohttp's banner, after start-up
        sys.stdout.write(line)
        sys.stdout.flush()

    try:
        import uvloop  # noqa: PLC0415 - optional, faster for benchmarks

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    web.run_app(
        build_app(config),
        sock=sock,
        access_log=None,
        print=announce,
        shutdown_timeout=1.0,
        handler_cancellation=True,
        loop=loop,
    )
