"""Bad input gets the spec's 400, never a crash: property-based tests of the request validators and
of the relay in front of a real mock worker.

Bodies start from a valid request and have fields replaced, added or nested with arbitrary JSON
(wrong types, huge and negative numbers, empty and odd strings, deep structures), so the generated
cases reach past the first check instead of stopping at "model is missing".
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiohttp import web

from inference.errors import GatewayError
from inference.schemas.chat import validate_chat_completion
from inference.schemas.completions import validate_completion
from standins.mock_worker import MockWorkerConfig, build_app
from tests.conftest import close_gateways, open_gateway, record_for

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what orjson parses (a body with more is a 400)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", "user", "system", "assistant", "tool", "developer", "auto", "none", "required",
                       "json_schema", "json_object", "text", "function", "low", "high"])
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

CHAT_FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
    "stream_options", "stop", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "logit_bias",
    "tools", "tool_choice", "parallel_tool_calls", "response_format", "reasoning_effort", "thinking", "user",
    "seed", "min_tokens", "top_k", "min_p", "repetition_penalty", "regex", "ebnf", "json_schema",
    "separate_reasoning", "stream_reasoning", "chat_template_kwargs", "return_hidden_states", "lora_path",
]
COMPLETION_FIELDS = [
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "best_of", "stream", "stream_options", "stop",
    "logprobs", "echo", "suffix", "presence_penalty", "frequency_penalty", "logit_bias", "seed", "user",
    "min_tokens", "regex", "ebnf", "json_schema",
]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "tools"]

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
COMPLETION = {"model": "mock-model", "prompt": "hello"}


def _mutated(base: dict[str, Any], fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda changes, extra: {**base, **changes, **extra},
        st.dictionaries(st.sampled_from(fields), JSON, max_size=5),
        st.dictionaries(st.text(max_size=6), JSON, max_size=2),
    )


MESSAGE = st.builds(
    lambda changes: {"role": "user", "content": "hi", **changes},
    st.dictionaries(st.sampled_from(MESSAGE_FIELDS), JSON, max_size=3),
)
CHAT_BODIES = _mutated(CHAT, CHAT_FIELDS) | st.builds(
    lambda messages, changes: {**CHAT, "messages": messages, **changes},
    st.lists(MESSAGE | JSON, max_size=4),
    st.dictionaries(st.sampled_from(CHAT_FIELDS[2:]), JSON, max_size=3),
)
COMPLETION_BODIES = _mutated(COMPLETION, COMPLETION_FIELDS)


def _accepts_or_400(validate: Any, body: dict[str, Any]) -> None:
    try:
        checked = validate(body)
    except GatewayError as error:
        assert error.status == 400, (error.status, error)
        assert error.message
        return
    orjson.dumps(checked.body)  # what is forwarded still serializes


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHAT_BODIES)
def test_chat_validation_accepts_or_answers_400(body: dict[str, Any]) -> None:
    _accepts_or_400(validate_chat_completion, body)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(COMPLETION_BODIES)
def test_completion_validation_accepts_or_answers_400(body: dict[str, Any]) -> None:
    _accepts_or_400(validate_completion, body)


async def _statuses_through_the_gateway(bodies: list[bytes]) -> list[tuple[int, str]]:
    runner = web.AppRunner(build_app(MockWorkerConfig(model="mock-model")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = open_gateway([record_for(f"http://127.0.0.1:{runner.addresses[0][1]}", model="mock-model")])
    try:
        statuses = []
        for body in bodies:
            response = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            code = ""
            if response.status_code != 200:
                error = response.json()["error"]  # the envelope, whatever the status
                code = response.headers["x-gw-error-code"]
                assert code == str(error["code"])
            statuses.append((response.status_code, code))
        return statuses
    finally:
        await close_gateways([client])
        await runner.cleanup()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(CHAT_BODIES.map(orjson.dumps) | JSON.map(orjson.dumps) | st.binary(max_size=64), min_size=25, max_size=25))
def test_the_relay_never_answers_500_to_bad_bodies(bodies: list[bytes]) -> None:
    """Through the whole ASGI app to a real mock worker: 200, the gateway's 400 envelope, or (a model
    name the fuzzing made up) its 404 model_not_found."""
    answers = asyncio.run(_statuses_through_the_gateway(bodies))
    assert {status for status, _ in answers} <= {200, 400, 404}, answers
    assert all(code == "model_not_found" for status, code in answers if status == 404), answers
