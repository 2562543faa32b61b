"""The runtime-neutral engine behind the gRPC stand-in's services (:mod:`standins.grpc_engine`): a
real tokenizer, scripted replies as its token ids, the pacing of chunks, a simulated prefix cache,
aborts, embeddings, the tokenizer archive, and the record of everything received
(:class:`GrpcEngineState`). Each runtime's service (:mod:`standins.grpc_services`) only translates
its messages to and from this engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import math
import time
import zipfile
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any

import grpc
from tokenizers import Tokenizer

from protos import common_pb2

__all__ = [
    "DEFAULT_TEXT",
    "EMBEDDING_DIM",
    "MOCK_ENGINE_VERSION",
    "REASONING",
    "REPLIES",
    "RUNTIMES",
    "TOOL_CALL",
    "TOOL_REASONING",
    "Thinking",
    "AbortRecord",
    "EmbedRecord",
    "GrpcEngineConfig",
    "GrpcEngineState",
    "Sampling",
    "ScriptedEngine",
    "ScriptedModel",
    "ServedRequest",
    "embedding_for",
]

log = logging.getLogger(__name__)

MOCK_ENGINE_VERSION = "0.0.0-mock"
RUNTIMES = ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")
REPLIES = ("text", "tool_call", "reasoning")
MARKER = "[[mock:{}]]"
TOKENIZER_CHUNK_BYTES = 64 * 1024
REQUEST_LOG_SIZE = 1000
EMBEDDING_DIM = 8
_PREFIX_CACHE_SIZE = 64
_EOS_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<|endoftext|>", "<｜end▁of▁sentence｜>")
_ARCHITECTURES = {
    "qwen": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
    "deepseek": "DeepseekV3ForCausalLM",
}  # fmt: skip
# The family by a special token only its vocabulary has (the first that matches).
_FAMILY_TOKENS = (("<tool_call>", "qwen"), ("<|python_tag|>", "llama"), ("[TOOL_CALLS]", "mistral"),
                  ("<｜tool▁calls▁begin｜>", "deepseek"))  # fmt: skip
THINK_START, THINK_END = "<think>", "</think>"
# How an assistant turn the template opened for generation ends, in the families that think: a
# thinking model writes its own <think> right after it (Qwen3 with thinking on, DeepSeek R1).
_ASSISTANT_TURNS = ("<|im_start|>assistant\n", "<｜Assistant｜>")

DEFAULT_TEXT = "Hello! I am a stand-in engine. How can I help you today?"
TOOL_CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
REASONING = "The user wants a short answer; a friendly greeting is enough."
TOOL_REASONING = "The user asks about the weather in Paris; get_weather can tell."


class Thinking(StrEnum):
    """Where the rendered prompt leaves the model's reasoning block, read from its tail the way a
    thinking model's generation continues it (:meth:`ScriptedModel.thinking_of`)."""

    NONE = "none"  # not a thinking model's open assistant turn: a block only for [[mock:reasoning]]
    MODEL = "model"  # a thinking model's turn is open: it writes <think>, reasons, closes, answers
    OPENED = "opened"  # the template opened the block (R1-Distill, V3.1 thinking): reason, </think>, answer
    CLOSED = "closed"  # the template closed an empty block (Qwen3 or V3.1, thinking off): the answer only


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
    dp_size: int = 1  # the data-parallel size GetServerInfo reports, for --dp-aware

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
    thinking: Thinking = Thinking.NONE  # how the prompt left the reasoning block
    outputs: dict[int, list[int]] = field(default_factory=dict)  # choice index → token ids sent
    finish_reasons: dict[int, str] = field(default_factory=dict)
    trace_headers: dict[str, str] = field(default_factory=dict)  # traceparent/tracestate the call carried
    cancelled: bool = False  # the client cancelled the RPC before it ended
    done: bool = False
    data_parallel_rank: int | None = None  # the rank the request named (--dp-aware), if any

    @property
    def prompt_matches(self) -> bool:
        """Whether the ids decode to the rendered prompt the client sent (True when none sent)."""
        return not self.original_text or self.original_text == self.prompt_text


@dataclass(frozen=True)
class AbortRecord:
    request_id: str
    reason: str


@dataclass(frozen=True)
class EmbedRecord:
    """One Embed call as received."""

    request_id: str
    input_ids: tuple[int, ...]
    original_text: str


@dataclass
class GrpcEngineState:
    requests: list[ServedRequest] = field(default_factory=list)
    aborts: list[AbortRecord] = field(default_factory=list)
    embeds: list[EmbedRecord] = field(default_factory=list)
    health_checks: int = 0
    flushes: int = 0
    profiles: list[str] = field(default_factory=list)  # "start" / "stop"
    healthy: bool = True
    loads: list[dict[str, Any]] = field(default_factory=lambda: [{}])  # SchedulerLoad fields per dp rank
    tokenizer_sha256: str | None = None  # a fault: send this digest instead of the archive's
    prefixes: list[tuple[int, ...]] = field(default_factory=list)
    running: dict[str, asyncio.Event] = field(default_factory=dict)  # request id → abort signal
    # A fault: a request stops being answered after this many outputs (0: before its first; None:
    # never), until it is aborted (then it ends with finish abort) or its client cancels it.
    stall_after: int | None = None

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
        self.embeds.clear()
        self.health_checks = self.flushes = 0
        self.profiles.clear()
        self.prefixes.clear()


@dataclass(frozen=True)
class Sampling:
    """What the scripted engine reads of any runtime's request."""

    n: int
    max_new_tokens: int | None
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    logprobs: bool
    top_logprobs: int
    stream: bool


@dataclass
class ScriptedChoice:
    """One choice's scripted tokens, how it ends, and how many were sent."""

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
        self.family = next((family for token, family in _FAMILY_TOKENS if token in vocab), "other")
        self.architecture = _ARCHITECTURES.get(self.family, "MockForCausalLM")
        self.thinks = THINK_START in vocab and THINK_END in vocab  # Qwen3, DeepSeek R1
        self._replies: dict[tuple[str, Thinking], tuple[int, ...]] = {}

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

    def thinking_of(self, prompt_text: str) -> Thinking:
        """How the prompt leaves the reasoning block: closed or opened by the template at its end,
        else open for a thinking model's own block when it ends with an assistant turn."""
        tail = prompt_text.rstrip()
        if tail.endswith(THINK_END):
            return Thinking.CLOSED
        if tail.endswith(THINK_START):
            return Thinking.OPENED
        if self.thinks and prompt_text.endswith(_ASSISTANT_TURNS):
            return Thinking.MODEL
        return Thinking.NONE

    def reply_text(self, kind: str, thinking: Thinking = Thinking.NONE) -> str:
        """The reply of ``kind`` as the model writes it after a prompt that leaves the reasoning
        block as ``thinking`` says: a thinking model reasons first (then answers text or a tool
        call), a closed block leaves just the answer, and [[mock:reasoning]] makes a model that
        does not think write a block anyway."""
        answer = self._tool_call_text() if kind == "tool_call" else self.config.text
        reasoning = TOOL_REASONING if kind == "tool_call" else REASONING
        if thinking is Thinking.CLOSED:
            return answer
        if thinking is Thinking.OPENED:
            return f"{reasoning}\n{THINK_END}\n\n{answer}"
        if thinking is Thinking.MODEL or kind == "reasoning":
            return f"{THINK_START}\n{reasoning}\n{THINK_END}\n\n{answer}"
        return answer

    def _tool_call_text(self) -> str:
        """:data:`TOOL_CALL` in the family's own format."""
        name, arguments = TOOL_CALL["name"], TOOL_CALL["arguments"]
        if self.family == "llama":
            return json.dumps({"name": name, "parameters": arguments})
        if self.family == "mistral":
            return f"[TOOL_CALLS] {json.dumps([TOOL_CALL])}"
        if self.family == "deepseek":
            return (
                f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n"
                f"{json.dumps(arguments)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            )
        return f"<tool_call>\n{json.dumps(TOOL_CALL)}\n</tool_call>"

    def reply_ids(self, kind: str, thinking: Thinking) -> tuple[int, ...]:
        """:meth:`reply_text` as token ids (each reply encoded once)."""
        key = (kind, thinking)
        ids = self._replies.get(key)
        if ids is None:
            ids = self._replies[key] = self.encode(self.reply_text(kind, thinking))
        return ids

    def reply_for(self, prompt_text: str) -> str:
        for kind in REPLIES:
            if MARKER.format(kind) in prompt_text:
                return kind
        return self.config.reply

    def choice(self, kind: str, thinking: Thinking, sampling: Sampling) -> ScriptedChoice:
        reply = self.reply_ids(kind, thinking)
        script = list(reply)
        if not sampling.ignore_eos and self.eos_token_id is not None:
            script.append(self.eos_token_id)
        limit = sampling.max_new_tokens
        if sampling.ignore_eos and limit is not None:
            while len(script) < limit:  # keep going past the end of the reply
                script.extend(reply or (0,))
        tokens: list[int] = []
        for token in script:
            if limit is not None and len(tokens) >= limit:
                return ScriptedChoice(tokens, "length", None)
            tokens.append(token)
            if token in sampling.stop_token_ids or (token == self.eos_token_id and not sampling.ignore_eos):
                return ScriptedChoice(tokens, "stop", token)
        return ScriptedChoice(tokens, "stop", None)

    def logprobs(self, tokens: list[int], top: int) -> tuple[list[float], list[list[int]], list[list[float]]]:
        """Deterministic logprobs: the sampled token first among its alternatives."""
        values = [-0.05 * (1 + position % 7) for position in range(len(tokens))]
        top_ids = [[token] + [(token + k) % self.vocab_size for k in range(1, top)] for token in tokens] if top else []
        top_values = [[value - 1.5 * k for k in range(top)] for value in values] if top else []
        return values, top_ids, top_values


def embedding_for(ids: tuple[int, ...]) -> list[float]:
    """The stand-in's embedding of a prompt: :data:`EMBEDDING_DIM` values derived from the token
    ids (deterministic, order-sensitive), scaled to unit length."""
    raw = [
        sum(math.sin((token + 1) * (dim + 1) * 0.618 + position * 0.1) for position, token in enumerate(ids))
        for dim in range(EMBEDDING_DIM)
    ]
    norm = math.sqrt(sum(value * value for value in raw)) or 1.0
    return [value / norm for value in raw]


class ScriptedEngine:
    """The runtime-neutral part: check the prompt, script the choices, pace the chunks; embed,
    abort, flush, report loads and model facts, and zip the tokenizer."""

    def __init__(self, config: GrpcEngineConfig, state: GrpcEngineState, model: ScriptedModel | None = None) -> None:
        self.config = config
        self.state = state
        self.model = model if model is not None else ScriptedModel(config)  # engines of one config may share one
        self.started = time.time()

    async def run(
        self,
        request_id: str,
        ids: tuple[int, ...],
        original_text: str,
        sampling: Sampling,
        sampling_seen: dict[str, Any],
        context: grpc.aio.ServicerContext[Any, Any],
        data_parallel_rank: int | None = None,
    ) -> AsyncGenerator[tuple[ServedRequest, int, list[int], ScriptedChoice, bool], None]:
        """Yield (served, index, new tokens, choice, finished) steps; record everything."""
        await self.check_prompt(ids, context)
        prompt_text = self.model.decode(ids)
        kind = self.model.reply_for(prompt_text)
        thinking = self.model.thinking_of(prompt_text)
        served = ServedRequest(
            request_id=request_id,
            input_ids=ids,
            prompt_text=prompt_text,
            original_text=original_text,
            sampling=sampling_seen,
            stream=sampling.stream,
            n=sampling.n,
            reply=kind,
            thinking=thinking,
            data_parallel_rank=data_parallel_rank,
            trace_headers=_trace_headers(context),
        )
        self.state.requests.append(served)
        del self.state.requests[:-REQUEST_LOG_SIZE]
        aborted = asyncio.Event()
        self.state.running[request_id] = aborted
        choices = [self.model.choice(kind, thinking, sampling) for _ in range(sampling.n)]
        for index in range(sampling.n):
            served.outputs[index] = []
        stall_after = self.state.stall_after
        sent = 0
        try:
            if not sampling.stream:
                if stall_after is not None:
                    await aborted.wait()
                await self._pause(sum(len(c.tokens) for c in choices) // self.config.chunk_tokens)
                for index, choice in enumerate(choices):
                    served.outputs[index] = list(choice.tokens)
                    served.finish_reasons[index] = choice.finish
                served.done = True  # before the last answer leaves: a client may look right after
                for index, choice in enumerate(choices):
                    yield served, index, list(choice.tokens), choice, True
                return
            while len(served.finish_reasons) < len(choices):
                if stall_after is not None and sent >= stall_after:
                    await aborted.wait()
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
                    sent += 1
                    yield served, index, new, choice, finished
        except (asyncio.CancelledError, GeneratorExit):
            served.cancelled = not served.done  # the client cancelled the RPC (or went away)
            raise
        finally:
            self.state.running.pop(request_id, None)

    async def check_prompt(self, ids: tuple[int, ...], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """End the RPC with INVALID_ARGUMENT for an empty prompt, an id outside the vocabulary, or a
        prompt at or past the context length."""
        if not ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input_ids must not be empty")
        if any(token >= self.model.vocab_size for token in ids):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a prompt token id is outside the vocabulary")
        if len(ids) >= self.config.max_context_length:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the prompt ({len(ids)} tokens) does not fit the context length {self.config.max_context_length}",
            )

    def cached_prefix(self, ids: tuple[int, ...]) -> int:
        """The prompt's longest prefix shared with an earlier one (the simulated prefix cache); the
        prompt is remembered for the next."""
        state = self.state
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

    async def embed(
        self, request_id: str, ids: tuple[int, ...], original_text: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[float]:
        """Check and record an Embed call; its embedding (:func:`embedding_for`)."""
        await self.check_prompt(ids, context)
        self.state.embeds.append(EmbedRecord(request_id, ids, original_text))
        del self.state.embeds[:-REQUEST_LOG_SIZE]
        return embedding_for(ids)

    def health_check(self) -> bool:
        """Count a HealthCheck; whether the engine is healthy (``state.healthy``, a fault switch)."""
        self.state.health_checks += 1
        return self.state.healthy

    def flush(self) -> None:
        self.state.flushes += 1
        self.state.prefixes.clear()

    def model_facts(self) -> dict[str, Any]:
        """What GetModelInfo reports, under SGLang's field names (each runtime keeps its own)."""
        model, config = self.model, self.config
        return {
            "model_path": config.model,
            "tokenizer_path": str(config.tokenizer_file.parent),
            "is_generation": True,
            "served_model_name": config.model,
            "max_context_length": config.max_context_length,
            "max_req_input_len": config.max_context_length - 1,
            "vocab_size": model.vocab_size,
            "model_type": model.family,
            "architectures": [model.architecture],
            "eos_token_ids": [model.eos_token_id] if model.eos_token_id is not None else [],
            "pad_token_id": model.pad_token_id or 0,
            "bos_token_id": model.bos_token_id or 0,
        }

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
        log.info("Abort of %s (%s): %s", request_id, reason, "stopped" if signal is not None else "not running")
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
        for rank, given in enumerate(self.state.loads or [{}] * self.config.dp_size):
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


_TRACE_FIELDS = frozenset(("traceparent", "tracestate"))


def _trace_headers(context: Any) -> dict[str, str]:
    """The W3C trace context a call carried (a gRPC call's metadata; a ZMQ request's trace_headers),
    as an engine that traces reads it."""
    metadata = getattr(context, "invocation_metadata", None)
    pairs = metadata() if metadata is not None else None
    return {str(key): str(value) for key, value in pairs or () if key in _TRACE_FIELDS}
