"""The project's gRPC engine stand-in: one engine runtime's service (SGLang's ``SglangScheduler``,
vLLM's ``VllmEngine``, TensorRT-LLM's ``TrtllmService``, TokenSpeed's ``TokenSpeedScheduler`` or
MLX's ``MlxEngine``) served from the project's protos, driven by a real tokenizer (a fixture's
tokenizer.json).

A test aid and a first-time user's engine: ``python manage.py runmockworker --grpc --runtime
sglang|vllm|trtllm|tokenspeed|mlx --tokenizer PATH``, or in-process with :class:`GrpcEngineServer`.
The runtime-neutral engine is :mod:`standins.scripted_engine`, each runtime's messages are
translated by :mod:`standins.grpc_services`.

What it does, as the engines' own servicers do:

- Generate takes token ids only. It decodes them with the tokenizer and records the text (and
  whether it equals ``tokenized.original_text`` when the client sent one); ids outside the
  vocabulary, or a prompt at or past the context length, fail with INVALID_ARGUMENT.
- It answers with a scripted reply, tokenized with the same tokenizer and ended by the model's EOS
  token (``matched_token_id``, finish ``stop``): plain text; a tool call in the model family's
  format (Qwen ``<tool_call>{...}</tool_call>``, Llama 3 JSON, Mistral ``[TOOL_CALLS]``, DeepSeek's
  own tokens); or ``<think>`` reasoning then an answer. The reply is the config's, or chosen per
  request by a marker in the prompt: ``[[mock:tool_call]]``, ``[[mock:reasoning]]``,
  ``[[mock:text]]``.
- It answers as a thinking model does, read from the decoded prompt's tail (:class:`Thinking`): after
  a thinking model's open assistant turn (Qwen3 with thinking on, DeepSeek R1) it writes
  ``<think>`` reasoning ``</think>`` then the reply (text or tool call); after a block the template
  opened, the reasoning and ``</think>`` then the reply; after one the template closed (thinking
  off), the reply alone. Anything else (a raw completion prompt, a model that does not think) gets
  the reply alone, with a ``<think>`` block only for ``[[mock:reasoning]]``.
- Streaming: chunks of ``chunk_tokens`` new tokens (optional delay before each), then one
  ``complete`` per choice whose ``output_ids`` repeat the last chunk's tokens (TensorRT-LLM's: the
  whole choice). SGLang's, TokenSpeed's and TensorRT-LLM's counts are cumulative, vLLM's and MLX's
  per chunk. Without streaming: one ``complete`` per choice with every token. ``n`` choices are
  interleaved with their ``index``; ``max_new_tokens`` ends a choice with ``length``; a stop token
  id ends it with that ``matched_token_id``; logprobs are deterministic.
- A simulated prefix cache: ``cached_tokens`` is the longest prefix shared with an earlier prompt;
  FlushCache empties it.
- Abort (and the client cancelling a Generate RPC) is recorded; an Abort of a running request ends
  its stream with finish ``abort``.
- ``state.stall_after`` (a fault): a request stops being answered after that many outputs (0:
  before its first) until it is aborted or cancelled: an engine that hangs.
- Embed (SGLang, vLLM, TensorRT-LLM) answers a deterministic unit-length vector of
  :data:`EMBEDDING_DIM` values derived from the token ids (:func:`embedding_for`), and is recorded.
- HealthCheck, GetModelInfo, GetServerInfo, GetTokenizer (the tokenizer folder as a zip in chunks,
  the last with the zip's sha256) and, where the runtime's proto declares them, GetLoads,
  FlushCache and StartProfile/StopProfile answer; every other RPC, and every other runtime's
  service, answer UNIMPLEMENTED (so runtime detection by HealthCheck sees one engine).

Everything received is in :class:`GrpcEngineState` (``server.state``) for tests.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from standins.grpc_services import SERVICES
from standins.scripted_engine import (
    EMBEDDING_DIM,
    MOCK_ENGINE_VERSION,
    REPLIES,
    RUNTIMES,
    TOOL_CALL,
    AbortRecord,
    EmbedRecord,
    GrpcEngineConfig,
    GrpcEngineState,
    ScriptedEngine,
    ServedRequest,
    Thinking,
    embedding_for,
)

__all__ = [
    "EMBEDDING_DIM",
    "MOCK_ENGINE_VERSION",
    "REPLIES",
    "RUNTIMES",
    "TOOL_CALL",
    "AbortRecord",
    "EmbedRecord",
    "GrpcEngineConfig",
    "GrpcEngineServer",
    "GrpcEngineState",
    "ServedRequest",
    "Thinking",
    "embedding_for",
    "run_grpc_engine",
    "start_grpc_server",
]

SERVER_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
)


async def start_grpc_server(
    handler: grpc.GenericRpcHandler, host: str, port: int, credentials: grpc.ServerCredentials | None = None
) -> tuple[grpc.aio.Server, int]:
    """A started ``grpc.aio`` server with the stand-ins' options serving ``handler`` on ``host:port``
    (0: a free port); the server and the port it bound. ``credentials``: served over TLS (grpcs://)."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    return server, bound


class GrpcEngineServer:
    """The stand-in as a ``grpc.aio`` server in the running event loop::

        server = GrpcEngineServer(GrpcEngineConfig(runtime="sglang", tokenizer=".../qwen3"))
        port = await server.start()          # 127.0.0.1, a free port unless given
        ... server.state.requests, server.state.aborts ...
        await server.stop()
    """

    def __init__(self, config: GrpcEngineConfig) -> None:
        self.config = config
        self.state = GrpcEngineState()
        self.engine = ScriptedEngine(config, self.state)
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0, credentials: grpc.ServerCredentials | None = None) -> int:
        """Serve (over TLS with ``credentials``: ``grpc.ssl_server_credentials``)."""
        handler = SERVICES[self.config.runtime](self.engine).handler()
        self._server, self.port = await start_grpc_server(handler, host, port, credentials)
        return self.port

    async def stop(self, grace: float | None = 0.5) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def run_grpc_engine(config: GrpcEngineConfig, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM. Once listening, prints one line to stdout (flushed):
    ``mock grpc engine (RUNTIME) serving MODEL on grpc://HOST:PORT``."""

    async def serve() -> None:
        server = GrpcEngineServer(config)
        bound = await server.start(host, port)
        url_host = f"[{host}]" if ":" in host else host
        sys.stdout.write(f"mock grpc engine ({config.runtime}) serving {config.model} on grpc://{url_host}:{bound}\n")
        sys.stdout.flush()
        try:
            await server.wait()
        finally:
            await server.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass

