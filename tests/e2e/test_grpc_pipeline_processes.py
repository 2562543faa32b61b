"""The gRPC pipeline as a user runs it: the engine stand-in (`runmockworker --grpc`) and the gateway
(`rungateway --worker-urls grpc://...`) as real processes, driven by the openai SDK in strict mode.
The gateway registers the worker (runtime detection, GetModelInfo), loads the tokenizer the engine
names, and serves chat, streaming, tool calls and reasoning itself."""

from __future__ import annotations

import json
import socket

import httpx
import openai
import pytest

from tests.conftest import free_port
from tests.e2e.conftest import wait_for
from standins.fixtures import FIXTURE_MODELS

pytestmark = [pytest.mark.e2e, pytest.mark.embedded]  # also in CI's SQLite pass

QWEN = str(FIXTURE_MODELS / "qwen3")
MODEL = "Qwen/Qwen3-8B"
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("server", ["uvicorn"], indirect=True)
def test_chat_stream_tools_and_reasoning_through_a_grpc_engine(spawn, start_gateway) -> None:
    port = free_port()
    engine = spawn(
        "grpc-engine",
        ["runmockworker", "--grpc", "--runtime", "sglang", "--tokenizer", QWEN, "--model", MODEL, "--host", "127.0.0.1",
         "--port", str(port)],
        None,
    )  # fmt: skip
    wait_for(lambda: _accepts(port), 30, "the engine's port", engine)
    gateway = start_gateway("--worker-urls", f"grpc://127.0.0.1:{port}")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", _strict_response_validation=True, max_retries=0)

    def chat(**body: object) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(model=MODEL, **body)  # type: ignore[call-overload, no-any-return]

    # The tokenizer loads on first use (503 tokenizer_not_ready with Retry-After: 1 meanwhile).
    wait_for(
        lambda: httpx.post(gateway.url + "/v1/tokenize", json={"model": MODEL, "prompt": "hi"}, timeout=5).status_code == 200,
        60, "the tokenizer", gateway,
    )  # fmt: skip
    assert [m.id for m in client.models.list().data] == [MODEL]

    answer = chat(messages=[{"role": "user", "content": "[[mock:reasoning]] Hello"}])
    assert answer.choices[0].message.content and answer.choices[0].finish_reason == "stop"
    assert (answer.choices[0].message.model_extra or {}).get("reasoning_content")
    assert answer.usage is not None and answer.usage.prompt_tokens > 0

    chunks = list(chat(messages=[{"role": "user", "content": "Hello"}], stream=True, stream_options={"include_usage": True},
                       extra_body={"chat_template_kwargs": {"enable_thinking": False}}))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].choices == []

    tools = chat(messages=[{"role": "user", "content": "[[mock:tool_call]] weather?"}], tools=[WEATHER],
                 extra_body={"chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    (call,) = tools.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    assert tools.choices[0].finish_reason == "tool_calls"

    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert completion.choices[0].finish_reason == "length" and completion.usage is not None

    overflow = httpx.post(gateway.url + "/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "word " * 40_000}]}, timeout=30)  # fmt: skip
    assert overflow.status_code == 400 and overflow.json()["error"]["code"] == "context_length_exceeded"
