"""The project's gRPC engine stand-in: SGLang's ``SglangScheduler`` or vLLM's ``VllmEngine`` served
from the project's protos, driven by a real tokenizer (a fixture's tokenizer.json).

A test aid and a first-time user's engine: ``python manage.py runmockworker --grpc --runtime
sglang|vllm --tokenizer PATH``, or in-process with :class:`GrpcEngineServer`.

What it does, as the engines' own servicers do:

- Generate takes token ids only. It decodes them with the tokenizer and records the text (and
  whether it equals ``tokenized.original_text`` when the client sent one); ids outside the
  vocabulary, or a prompt at or past the context length, fail with INVALID_ARGUMENT.
- It answers with a scripted reply, tokenized with the same tokenizer and ended by the model's EOS
  token (``matched_token_id``, finish ``stop``): plain text; a tool call in the model family's
  format (Qwen ``<tool_call>{...}</tool_call>``, Llama 3 JSON); or ``<think>`` reasoning then an
  answer. The reply is the config's, or chosen per request by a marker in the prompt:
  ``[[mock:tool_call]]``, ``[[mock:reasoning]]``, ``[[mock:text]]``.
- Streaming: chunks of ``chunk_tokens`` new tokens (optional delay before each), then one
  ``complete`` per choice whose ``output_ids`` repeat the last chunk's tokens. SGLang's counts are
  cumulative, vLLM's per chunk. Without streaming: one ``complete`` per choice with every token.
  ``n`` choices are interleaved with their ``index``; ``max_new_tokens`` ends a choice with
  ``length``; a stop token id ends it with that ``matched_token_id``; logprobs are deterministic.
- A simulated prefix cache: ``cached_tokens`` is the longest prefix shared with an earlier prompt;
  FlushCache empties it.
- Abort (and the client cancelling a Generate RPC) is recorded; an Abort of a running request ends
  its stream with finish ``abort``.
- HealthCheck, GetModelInfo, GetServerInfo, GetLoads, FlushCache, StartProfile/StopProfile and
  GetTokenizer (the tokenizer folder as a zip in chunks, the last with the zip's sha256) answer;
  every other RPC, and the other runtime's service, answer UNIMPLEMENTED (so runtime detection by
  HealthCheck sees one engine).

Everything received is in :class:`GrpcEngineState` (``server.state``) for tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import sys
import time
import zipfile
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from tokenizers import Tokenizer

from protos import common_pb2
from protos import sglang_scheduler_pb2 as sg
from protos import vllm_engine_pb2 as vl

__all__ = [
    "MOCK_ENGINE_VERSION",
    "REPLIES",
    "RUNTIMES",
    "AbortRecord",
    "GrpcEngineConfig",
    "GrpcEngineServer",
    "GrpcEngineState",
    "ServedRequest",
    "run_grpc_engine",
]

MOCK_ENGINE_VERSION = "0.0.0-mock"
RUNTIMES = ("sglang", "vllm")
REPLIES = ("text", "tool_call", "reasoning")
MARKER = "[[mock:{}]]"
TOKENIZER_CHUNK_BYTES = 64 * 1024
REQUEST_LOG_SIZE = 1000
_PREFIX_CACHE_SIZE = 64
_SERVICES = {"sglang": "sglang.grpc.scheduler.SglangScheduler", "vllm": "vllm.grpc.engine.VllmEngine"}
_EOS_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<|endoftext|>", "<｜end▁of▁sentence｜>")

DEFAULT_TEXT = "Hello! I am a stand-in engine. How can I help you today?"
TOOL_CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
REASONING = "The user wants a short answer; a friendly greeting is enough."
SERVER_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
)


@dataclass(frozen=True)
class GrpcEngineConfig:
    runtime: str
    tokenizer: str  # a tokenizer.json, or the folder holding it
    model: str = "mock-model"
    reply: str = "text"  # the default reply: text, tool_call or reasoning
    text: str = DEFAULT_TEXT
    chunk_tokens: int = 3
    delay_ms: float = 0.0
    max_context_length: int = 32768

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}")
        if self.reply not in REPLIES:
            raise ValueError(f"reply must be one of {', '.join(REPLIES)}")
        if self.chunk_tokens < 1 or self.delay_ms < 0 or self.max_context_length < 1:
            raise ValueError("chunk_tokens and max_context_length must be >= 1, delay_ms >= 0")

    @property
    def tokenizer_file(self) -> Path:
        path = Path(self.tokenizer)
        return path / "tokenizer.json" if path.is_dir() else path


@dataclass
class ServedRequest:
    """One Generate call as received, and what became of it."""

    request_id: str
    input_ids: tuple[int, ...]
    prompt_text: str  # the ids decoded, special tokens kept
    original_text: str
    sampling: dict[str, Any]
    stream: bool
    n: int
    reply: str
    outputs: dict[int, list[int]] = field(default_factory=dict)  # choice index → token ids sent
    finish_reasons: dict[int, str] = field(default_factory=dict)
    cancelled: bool = False  # the client cancelled the RPC before it ended
    done: bool = False

    @property
    def prompt_matches(self) -> bool:
        """Whether the ids decode to the rendered prompt the client sent (True when none sent)."""
        return not self.original_text or self.original_text == self.prompt_text


@dataclass(frozen=True)
class AbortRecord:
    request_id: str
    reason: str


@dataclass
class GrpcEngineState:
    requests: list[ServedRequest] = field(default_factory=list)
    aborts: list[AbortRecord] = field(default_factory=list)
    health_checks: int = 0
    flushes: int = 0
    profiles: list[str] = field(default_factory=list)  # "start" / "stop"
    healthy: bool = True
    loads: list[dict[str, Any]] = field(default_factory=lambda: [{}])  # SchedulerLoad fields per dp rank
    tokenizer_sha256: str | None = None  # a fault: send this digest instead of the archive's
    prefixes: list[tuple[int, ...]] = field(default_factory=list)
    running: dict[str, asyncio.Event] = field(default_factory=dict)  # request id → abort signal

    def request(self, request_id: str) -> ServedRequest:
        for served in reversed(self.requests):
            if served.request_id == request_id:
                return served
        raise KeyError(request_id)

    def aborted_ids(self) -> list[str]:
        return [record.request_id for record in self.aborts]

    def reset(self) -> None:
        self.requests.clear()
        self.aborts.clear()
        self.health_checks = self.flushes = 0
        self.profiles.clear()
        self.prefixes.clear()


@dataclass(frozen=True)
class _Sampling:
    """What the scripted engine reads of either runtime's request."""

    n: int
    max_new_tokens: int | None
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    logprobs: bool
    top_logprobs: int
    stream: bool


@dataclass
class _Choice:
    tokens: list[int]
    finish: str
    matched: int | None
    sent: int = 0


@lru_cache(maxsize=8)
def _load_tokenizer(path: str) -> Tokenizer:
    """Tokenizers by file, loaded once per process (a large tokenizer.json takes ~0.4 s)."""
    return Tokenizer.from_file(path)


class ScriptedModel:
    """The tokenizer, the model's special ids, and the scripted replies as token ids."""

    def __init__(self, config: GrpcEngineConfig) -> None:
        self.config = config
        self.tokenizer = _load_tokenizer(str(config.tokenizer_file))
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        settings = self._tokenizer_config()
        self.eos_token_id = self._special_id(settings.get("eos_token"), _EOS_CANDIDATES)
        self.bos_token_id = self._special_id(settings.get("bos_token"), ())
        self.pad_token_id = self._special_id(settings.get("pad_token"), ())
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        self.family = "qwen" if "<tool_call>" in vocab else "llama" if "<|python_tag|>" in vocab else "other"
        self._replies = {kind: self.encode(self.reply_text(kind)) for kind in REPLIES}

    def _tokenizer_config(self) -> dict[str, Any]:
        path = self.config.tokenizer_file.with_name("tokenizer_config.json")
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def _special_id(self, token: Any, fallbacks: tuple[str, ...]) -> int | None:
        if isinstance(token, dict):
            token = token.get("content")
        for name in ((token,) if isinstance(token, str) else ()) + fallbacks:
            token_id = self.tokenizer.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        return None

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def reply_text(self, kind: str) -> str:
        text = self.config.text
        if kind == "reasoning":
            return f"<think>\n{REASONING}\n</think>\n\n{text}"
        if kind == "tool_call":
            if self.family == "llama":
                call = {"name": TOOL_CALL["name"], "parameters": TOOL_CALL["arguments"]}
                return json.dumps(call)
            return f"<tool_call>\n{json.dumps(TOOL_CALL)}\n</tool_call>"
        return text

    def reply_for(self, prompt_text: str) -> str:
        for kind in REPLIES:
            if MARKER.format(kind) in prompt_text:
                return kind
        return self.config.reply

    def choice(self, kind: str, sampling: _Sampling) -> _Choice:
        script = list(self._replies[kind])
        if not sampling.ignore_eos and self.eos_token_id is not None:
            script.append(self.eos_token_id)
        limit = sampling.max_new_tokens
        if sampling.ignore_eos and limit is not None:
            while len(script) < limit:  # keep going past the end of the reply
                script.extend(self._replies[kind] or (0,))
        tokens: list[int] = []
        for token in script:
            if limit is not None and len(tokens) >= limit:
                return _Choice(tokens, "length", None)
            tokens.append(token)
            if token in sampling.stop_token_ids or (token == self.eos_token_id and not sampling.ignore_eos):
                return _Choice(tokens, "stop", token)
        return _Choice(tokens, "stop", None)

    def logprobs(self, tokens: list[int], top: int) -> tuple[list[float], list[list[int]], list[list[float]]]:
        """Deterministic logprobs: the sampled token first among its alternatives."""
        values = [-0.05 * (1 + position % 7) for position in range(len(tokens))]
        top_ids = [[token] + [(token + k) % self.vocab_size for k in range(1, top)] for token in tokens] if top else []
        top_values = [[value - 1.5 * k for k in range(top)] for value in values] if top else []
        return values, top_ids, top_values


def _cached_prefix(state: GrpcEngineState, ids: tuple[int, ...]) -> int:
    best = 0
    for previous in state.prefixes:
        length = 0
        for a, b in zip(previous, ids):
            if a != b:
                break
            length += 1
        best = max(best, length)
    state.prefixes.append(ids)
    del state.prefixes[:-_PREFIX_CACHE_SIZE]
    return min(best, max(0, len(ids) - 1))


class _Engine:
    """The runtime-neutral part: check the prompt, script the choices, pace the chunks."""

    def __init__(self, config: GrpcEngineConfig, state: GrpcEngineState) -> None:
        self.config = config
        self.state = state
        self.model = ScriptedModel(config)
        self.started = time.time()

    async def run(
        self,
        request_id: str,
        ids: tuple[int, ...],
        original_text: str,
        sampling: _Sampling,
        sampling_seen: dict[str, Any],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncGenerator[tuple[ServedRequest, int, list[int], _Choice, bool], None]:
        """Yield (served, index, new tokens, choice, finished) steps; record everything."""
        if not ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input_ids must not be empty")
        if any(token >= self.model.vocab_size for token in ids):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a prompt token id is outside the vocabulary")
        if len(ids) >= self.config.max_context_length:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the prompt ({len(ids)} tokens) does not fit the context length {self.config.max_context_length}",
            )
        prompt_text = self.model.decode(ids)
        kind = self.model.reply_for(prompt_text)
        served = ServedRequest(
            request_id=request_id,
            input_ids=ids,
            prompt_text=prompt_text,
            original_text=original_text,
            sampling=sampling_seen,
            stream=sampling.stream,
            n=sampling.n,
            reply=kind,
        )
        self.state.requests.append(served)
        del self.state.requests[:-REQUEST_LOG_SIZE]
        aborted = asyncio.Event()
        self.state.running[request_id] = aborted
        choices = [self.model.choice(kind, sampling) for _ in range(sampling.n)]
        for index in range(sampling.n):
            served.outputs[index] = []
        try:
            if not sampling.stream:
                await self._pause(sum(len(c.tokens) for c in choices) // self.config.chunk_tokens)
                for index, choice in enumerate(choices):
                    served.outputs[index] = list(choice.tokens)
                    served.finish_reasons[index] = choice.finish
                served.done = True  # before the last answer leaves: a client may look right after
                for index, choice in enumerate(choices):
                    yield served, index, list(choice.tokens), choice, True
                return
            while len(served.finish_reasons) < len(choices):
                await self._pause(1)
                for index, choice in enumerate(choices):
                    if index in served.finish_reasons:
                        continue
                    if aborted.is_set():
                        choice.finish, choice.matched = "abort", None
                        served.finish_reasons[index] = "abort"
                        served.done = len(served.finish_reasons) == len(choices)
                        yield served, index, [], choice, True
                        continue
                    new = choice.tokens[choice.sent : choice.sent + self.config.chunk_tokens]
                    choice.sent += len(new)
                    served.outputs[index].extend(new)
                    finished = choice.sent >= len(choice.tokens)
                    if finished:
                        served.finish_reasons[index] = choice.finish
                        served.done = len(served.finish_reasons) == len(choices)
                    yield served, index, new, choice, finished
        except (asyncio.CancelledError, GeneratorExit):
            served.cancelled = not served.done  # the client cancelled the RPC (or went away)
            raise
        finally:
            self.state.running.pop(request_id, None)

    async def _pause(self, steps: int) -> None:
        if self.config.delay_ms > 0 and steps > 0:
            await asyncio.sleep(self.config.delay_ms * steps / 1000)
        else:
            await asyncio.sleep(0)

    def abort(self, request_id: str, reason: str) -> bool:
        self.state.aborts.append(AbortRecord(request_id, reason))
        signal = self.state.running.get(request_id)
        if signal is not None:
            signal.set()
        return signal is not None

    def tokenizer_zip(self) -> bytes:
        folder = self.config.tokenizer_file.parent
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(folder.iterdir()):
                if path.is_file() and (path.suffix in (".json", ".jinja", ".model", ".txt") or path.name == "LICENSE"):
                    archive.write(path, path.name)
        return buffer.getvalue()

    def loads(self) -> list[dict[str, Any]]:
        running = len(self.state.running)
        ranks = []
        for rank, given in enumerate(self.state.loads or [{}]):
            entry: dict[str, Any] = {
                "dp_rank": rank,
                "num_running_reqs": running if rank == 0 else 0,
                "num_waiting_reqs": 0,
                "num_total_reqs": running if rank == 0 else 0,
                "num_used_tokens": 0,
                "max_total_num_tokens": self.config.max_context_length * 4,
                "token_usage": 0.0,
                "gen_throughput": 0.0,
                "cache_hit_rate": 0.0,
                "utilization": 0.0,
                "max_running_requests": 256,
                "num_waiting_uncached_tokens": 0,
            }
            entry.update(given)
            ranks.append(entry)
        return ranks

    def tokenizer_chunks(self) -> list[common_pb2.GetTokenizerChunk]:
        data = self.tokenizer_zip()
        digest = self.state.tokenizer_sha256 or hashlib.sha256(data).hexdigest()
        pieces = [data[i : i + TOKENIZER_CHUNK_BYTES] for i in range(0, len(data), TOKENIZER_CHUNK_BYTES)] or [b""]
        return [
            common_pb2.GetTokenizerChunk(data=piece, sha256=digest if i == len(pieces) - 1 else "")
            for i, piece in enumerate(pieces)
        ]


def _seen(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def _output_logprobs(module: Any, engine: _Engine, tokens: list[int], top: int) -> Any:
    values, top_ids, top_values = engine.model.logprobs(tokens, top)
    return module.OutputLogProbs(
        token_logprobs=values,
        token_ids=tokens,
        top_logprobs=[module.TopLogProbs(values=v, token_ids=i) for v, i in zip(top_values, top_ids)],
    )


class _CommonService:
    """The RPCs both engines' services answer alike (``smg.grpc.common`` messages)."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine

    async def FlushCache(self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext[Any, Any]) -> common_pb2.FlushCacheResponse:
        return _flush(self.engine)

    async def StartProfile(self, request: common_pb2.StartProfileRequest, context: grpc.aio.ServicerContext[Any, Any]) -> common_pb2.ProfileResponse:
        self.engine.state.profiles.append("start")
        return common_pb2.ProfileResponse(success=True, message="profiling started (mock)")

    async def StopProfile(self, request: common_pb2.StopProfileRequest, context: grpc.aio.ServicerContext[Any, Any]) -> common_pb2.ProfileResponse:
        self.engine.state.profiles.append("stop")
        return common_pb2.ProfileResponse(success=True, message="profiling stopped (mock)")

    async def GetTokenizer(self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        for chunk in self.engine.tokenizer_chunks():
            yield chunk

    def common_methods(self) -> dict[str, tuple[_Method, type[Message], bool]]:
        return {
            "FlushCache": (self.FlushCache, common_pb2.FlushCacheRequest, False),
            "StartProfile": (self.StartProfile, common_pb2.StartProfileRequest, False),
            "StopProfile": (self.StopProfile, common_pb2.StopProfileRequest, False),
            "GetTokenizer": (self.GetTokenizer, common_pb2.GetTokenizerRequest, True),
        }


class _SglangService(_CommonService):
    """``sglang.grpc.scheduler.SglangScheduler``: cumulative counts, request_id on every response."""

    async def Generate(self, request: sg.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[sg.GenerateResponse]:
        p = request.sampling_params
        sampling = _Sampling(
            n=max(1, p.n),
            max_new_tokens=p.max_new_tokens if p.HasField("max_new_tokens") else None,
            stop_token_ids=frozenset(p.stop_token_ids),
            ignore_eos=p.ignore_eos,
            logprobs=request.return_logprob,
            top_logprobs=request.top_logprobs_num,
            stream=request.stream,
        )
        ids = tuple(request.tokenized.input_ids)
        cached = _cached_prefix(self.engine.state, ids)
        steps = self.engine.run(request.request_id, ids, request.tokenized.original_text, sampling, _seen(request), context)
        async with aclosing(steps):
            async for served, index, new, choice, finished in steps:
                total = len(served.outputs[index])
                logprobs = (
                    _output_logprobs(sg, self.engine, new, sampling.top_logprobs) if sampling.logprobs and new else None
                )
                if request.stream and new:
                    yield sg.GenerateResponse(
                        request_id=request.request_id,
                        chunk=sg.GenerateStreamChunk(
                            token_ids=new, prompt_tokens=len(ids), completion_tokens=total, cached_tokens=cached,
                            output_logprobs=logprobs, index=index,
                        ),
                    )
                if finished:
                    complete = sg.GenerateComplete(
                        output_ids=new, finish_reason=choice.finish, prompt_tokens=len(ids), completion_tokens=total,
                        cached_tokens=cached, output_logprobs=logprobs, index=index,
                    )
                    if choice.matched is not None:
                        complete.matched_token_id = choice.matched
                    yield sg.GenerateResponse(request_id=request.request_id, complete=complete)

    async def HealthCheck(self, request: sg.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]) -> sg.HealthCheckResponse:
        state = self.engine.state
        state.health_checks += 1
        return sg.HealthCheckResponse(healthy=state.healthy, message="ok" if state.healthy else "unhealthy (mock fault)")

    async def Abort(self, request: sg.AbortRequest, context: grpc.aio.ServicerContext[Any, Any]) -> sg.AbortResponse:
        found = self.engine.abort(request.request_id, request.reason)
        return sg.AbortResponse(success=found, message=f"Request {request.request_id} {'aborted' if found else 'not found'}")

    async def GetModelInfo(self, request: sg.GetModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]) -> sg.GetModelInfoResponse:
        model, config = self.engine.model, self.engine.config
        return sg.GetModelInfoResponse(
            model_path=config.model,
            tokenizer_path=str(config.tokenizer_file.parent),
            is_generation=True,
            served_model_name=config.model,
            max_context_length=config.max_context_length,
            vocab_size=model.vocab_size,
            model_type=model.family,
            eos_token_ids=[model.eos_token_id] if model.eos_token_id is not None else [],
            pad_token_id=model.pad_token_id or 0,
            bos_token_id=model.bos_token_id or 0,
            max_req_input_len=config.max_context_length - 1,
            architectures=[_ARCHITECTURES.get(model.family, "MockForCausalLM")],
        )

    async def GetServerInfo(self, request: sg.GetServerInfoRequest, context: grpc.aio.ServicerContext[Any, Any]) -> sg.GetServerInfoResponse:
        config = self.engine.config
        answer = sg.GetServerInfoResponse(
            active_requests=len(self.engine.state.running),
            uptime_seconds=time.time() - self.engine.started,
            sglang_version=MOCK_ENGINE_VERSION,
            server_type="grpc",
            max_total_num_tokens=config.max_context_length * 4,
        )
        answer.server_args.update(
            {"model_path": config.model, "tokenizer_path": str(config.tokenizer_file.parent),
             "context_length": config.max_context_length}
        )
        return answer

    async def GetLoads(self, request: sg.GetLoadsRequest, context: grpc.aio.ServicerContext[Any, Any]) -> sg.GetLoadsResponse:
        loads = [sg.SchedulerLoad(**entry) for entry in self.engine.loads()]
        return sg.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), version=MOCK_ENGINE_VERSION,
            dp_rank_count=len(loads), loads=loads,
        )

    def handler(self) -> grpc.GenericRpcHandler:
        return _handler(
            _SERVICES["sglang"],
            {
                "Generate": (self.Generate, sg.GenerateRequest, True),
                "HealthCheck": (self.HealthCheck, sg.HealthCheckRequest, False),
                "Abort": (self.Abort, sg.AbortRequest, False),
                "GetModelInfo": (self.GetModelInfo, sg.GetModelInfoRequest, False),
                "GetServerInfo": (self.GetServerInfo, sg.GetServerInfoRequest, False),
                "GetLoads": (self.GetLoads, sg.GetLoadsRequest, False),
                **self.common_methods(),
            },
        )


class _VllmService(_CommonService):
    """``vllm.grpc.engine.VllmEngine``: per-chunk counts, no request id on responses."""

    async def Generate(self, request: vl.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[vl.GenerateResponse]:
        if request.WhichOneof("input") != "tokenized":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stand-in takes tokenized input only")
        p = request.sampling_params
        sampling = _Sampling(
            n=max(1, p.n),
            max_new_tokens=p.max_tokens if p.HasField("max_tokens") else None,
            stop_token_ids=frozenset(p.stop_token_ids),
            ignore_eos=p.ignore_eos,
            logprobs=p.HasField("logprobs"),
            top_logprobs=p.logprobs if p.HasField("logprobs") else 0,
            stream=request.stream,
        )
        ids = tuple(request.tokenized.input_ids)
        cached = _cached_prefix(self.engine.state, ids)
        steps = self.engine.run(request.request_id, ids, request.tokenized.original_text, sampling, _seen(request), context)
        async with aclosing(steps):
            async for served, index, new, choice, finished in steps:
                logprobs = (
                    _output_logprobs(vl, self.engine, new, sampling.top_logprobs) if sampling.logprobs and new else None
                )
                if request.stream and new:
                    yield vl.GenerateResponse(
                        chunk=vl.GenerateStreamChunk(
                            token_ids=new, prompt_tokens=len(ids), completion_tokens=len(new), cached_tokens=cached,
                            output_logprobs=logprobs, index=index,
                        )
                    )
                if finished:
                    complete = vl.GenerateComplete(
                        output_ids=new, finish_reason=choice.finish, prompt_tokens=len(ids), completion_tokens=len(new),
                        cached_tokens=cached, output_logprobs=logprobs, index=index,
                    )
                    if choice.matched is not None:
                        complete.matched_token_id = choice.matched
                    yield vl.GenerateResponse(complete=complete)

    async def HealthCheck(self, request: vl.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]) -> vl.HealthCheckResponse:
        state = self.engine.state
        state.health_checks += 1
        return vl.HealthCheckResponse(healthy=state.healthy, message="Health" if state.healthy else "Engine is not alive")

    async def Abort(self, request: vl.AbortRequest, context: grpc.aio.ServicerContext[Any, Any]) -> vl.AbortResponse:
        for request_id in request.request_ids:
            self.engine.abort(request_id, "")
        return vl.AbortResponse()

    async def GetModelInfo(self, request: vl.GetModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]) -> vl.GetModelInfoResponse:
        model, config = self.engine.model, self.engine.config
        return vl.GetModelInfoResponse(
            model_path=config.model,
            is_generation=True,
            max_context_length=config.max_context_length,
            vocab_size=model.vocab_size,
            served_model_name=config.model,
            tokenizer_path=str(config.tokenizer_file.parent),
            model_type=model.family,
            architectures=[_ARCHITECTURES.get(model.family, "MockForCausalLM")],
            eos_token_ids=[model.eos_token_id] if model.eos_token_id is not None else [],
            pad_token_id=model.pad_token_id or 0,
            bos_token_id=model.bos_token_id or 0,
            max_req_input_len=config.max_context_length - 1,
        )

    async def GetServerInfo(self, request: vl.GetServerInfoRequest, context: grpc.aio.ServicerContext[Any, Any]) -> vl.GetServerInfoResponse:
        return vl.GetServerInfoResponse(
            active_requests=len(self.engine.state.running),
            uptime_seconds=time.time() - self.engine.started,
            server_type="vllm-grpc",
            max_num_seqs=256,
        )

    async def GetLoads(self, request: vl.GetLoadsRequest, context: grpc.aio.ServicerContext[Any, Any]) -> vl.GetLoadsResponse:
        fields = set(vl.SchedulerLoad.DESCRIPTOR.fields_by_name)
        loads = [vl.SchedulerLoad(**{k: v for k, v in entry.items() if k in fields}) for entry in self.engine.loads()]
        return vl.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), version=MOCK_ENGINE_VERSION,
            dp_rank_count=len(loads), loads=loads,
        )

    def handler(self) -> grpc.GenericRpcHandler:
        return _handler(
            _SERVICES["vllm"],
            {
                "Generate": (self.Generate, vl.GenerateRequest, True),
                "HealthCheck": (self.HealthCheck, vl.HealthCheckRequest, False),
                "Abort": (self.Abort, vl.AbortRequest, False),
                "GetModelInfo": (self.GetModelInfo, vl.GetModelInfoRequest, False),
                "GetServerInfo": (self.GetServerInfo, vl.GetServerInfoRequest, False),
                "GetLoads": (self.GetLoads, vl.GetLoadsRequest, False),
                **self.common_methods(),
            },
        )


_ARCHITECTURES = {"qwen": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


def _flush(engine: _Engine) -> common_pb2.FlushCacheResponse:
    engine.state.flushes += 1
    engine.state.prefixes.clear()
    return common_pb2.FlushCacheResponse(success=True, message="Cache flushed (mock)")


_Method = Callable[[Any, Any], Any]


def _handler(service: str, methods: dict[str, tuple[_Method, type[Message], bool]]) -> grpc.GenericRpcHandler:
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for name, (method, request_type, streaming) in methods.items():
        make = grpc.unary_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
        handlers[name] = make(
            method,
            request_deserializer=request_type.FromString,
            response_serializer=lambda message: message.SerializeToString(),
        )
    return grpc.method_handlers_generic_handler(service, handlers)


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
        self.engine = _Engine(config, self.state)
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        service = _SglangService(self.engine) if self.config.runtime == "sglang" else _VllmService(self.engine)
        server.add_generic_rpc_handlers((service.handler(),))
        bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot bind {host}:{port}")
        await server.start()
        self._server, self.port = server, bound
        return bound

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

