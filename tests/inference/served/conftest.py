"""A gateway in-process whose worker is the project's gRPC engine stand-in (a real grpc.aio server
on loopback, driven by a real fixture tokenizer), and an openai SDK client in strict mode on it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import openai
import pytest

from gateway_project.asgi import application
from inference.pipeline.parsers import choose_parsers
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.workers import EngineSpec, WorkerRecord
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer
from tests.conftest import GatewayFactory
from standins.fixtures import FIXTURE_MODELS as FIXTURES

QWEN = str(FIXTURES / "qwen3")
LLAMA = str(FIXTURES / "llama3")
QWEN_MODEL = "Qwen/Qwen3-8B"
LLAMA_MODEL = "meta-llama/Llama-3.2-3B-Instruct"


@dataclass
class EngineGateway:
    """The gateway, its engine and the record it was given."""

    http: httpx.AsyncClient
    engine: GrpcEngineServer
    record: WorkerRecord

    def sdk(self, strict: bool = True) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url="http://gateway/v1", api_key="x", http_client=self.http, _strict_response_validation=strict,
            max_retries=0,
        )


Start = Callable[..., Awaitable[EngineGateway]]


def engine_record(engine: GrpcEngineServer, model: str, tokenizer: str, **spec: object) -> WorkerRecord:
    """The record registration would give the engine: its tokenizer, and the parsers of the model's
    family (Qwen3's qwen and qwen3 for the default model) unless the test names others."""
    family = choose_parsers(model)
    facts = {"tokenizer": tokenizer, "tool_parser": family.tool_parser, "reasoning_parser": family.reasoning_parser, **spec}
    return WorkerRecord(
        id=str(uuid.uuid4()), url=engine.url, model_id=model, runtime_type=engine.config.runtime, status="ready",  # type: ignore[arg-type]
        engine=EngineSpec(**facts),  # type: ignore[arg-type]
    )


@pytest.fixture
async def start_engine_gateway(make_gateway: GatewayFactory) -> AsyncIterator[Start]:
    servers: list[GrpcEngineServer] = []

    async def start(
        runtime: str = "sglang", model: str = QWEN_MODEL, tokenizer: str = QWEN, gateway: dict | None = None,
        **options: object,
    ) -> EngineGateway:
        spec = {key: options.pop(key) for key in list(options) if key in EngineSpec.__dataclass_fields__}
        engine = GrpcEngineServer(GrpcEngineConfig(runtime=runtime, tokenizer=tokenizer, model=model, **options))  # type: ignore[arg-type]
        await engine.start()
        servers.append(engine)
        record = engine_record(engine, model, tokenizer, **spec)
        TOKENIZERS.cache.get(tokenizer, record.engine.chat_template if record.engine else None)  # loaded up front
        # The in-memory history store unless a test asks for another (the db one needs the test database).
        http = make_gateway([record], **{"history_backend": "memory", **(gateway or {})})
        return EngineGateway(http, engine, record)

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
def asgi_app() -> object:
    return application
