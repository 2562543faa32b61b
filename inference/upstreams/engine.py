"""The engine-client seam: the gateway as the server in front of an inference engine.

An engine client talks to one worker that takes token ids and returns token ids (the gRPC
services of SGLang, vLLM, TensorRT-LLM, TokenSpeed and MLX, or vLLM's EngineCore over ZMQ); the
gateway renders, tokenizes and detokenizes. Everything above the seam speaks the neutral frozen
dataclasses below. Each runtime subclasses :class:`EngineClient` as a codec between them and its own
protobuf or msgpack messages (defaults filled in, the constraint mapped to the engine's oneof, the
finish-reason string mapped to :class:`FinishReason`); no runtime's messages leak upward.

A runtime registers its client by transport and runtime where it is defined, so two transports
may each have a client of the same runtime (vLLM over gRPC and over ZMQ)::

    @ENGINE_CLIENTS.register(EngineKey(Transport.GRPC, "sglang"))
    class SglangClient(GrpcEngineClient[...]):
        runtime = "sglang"
        ...

Each engine transport registers its connector in :data:`ENGINE_CONNECTORS` (gRPC's in
inference/upstreams/grpc/detect.py): a new client on a connection of its own, of the given runtime or
of the one the transport detects (its own detection order or handshake). Registration, the control
fan-outs and the tokenizer fetch call it by the worker's transport; nothing above the seam names one.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, AsyncIterator, Awaitable, Callable, ClassVar, NamedTuple, Protocol

from inference.routing.load_report import EngineLoad
from inference.routing.workers import Transport, WorkerRecord, transport_of
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.registry import KeyedRegistry, UnknownUpstream

__all__ = [
    "ENGINE_CLIENTS", "ENGINE_CONNECTORS", "CommandResult", "Constraint", "ConstraintKind",
    "DisaggregationParams", "EmbedRequest", "EncodeBootstrap", "EmbedResult", "EngineClient", "EngineClients", "EngineConnect",
    "EngineHealth", "EngineKey", "EngineOutput", "EngineRequest", "Finish", "FinishReason", "KvTransfer", "ModelInfo",
    "ENGINE_OUTPUT_STEP", "MAX_TOKENIZER_BYTES", "ProfileOptions", "SamplingParams", "TokenLogprobs", "TokenizerBundle", "connect_engine",
    "engine_connector",
]  # fmt: skip


class ConstraintKind(StrEnum):
    """What a structured-output constraint's value is."""

    JSON_SCHEMA = "json_schema"  # a JSON Schema document, as JSON text
    REGEX = "regex"
    GRAMMAR = "grammar"  # an EBNF grammar
    STRUCTURAL_TAG = "structural_tag"  # a structural-tag specification, as JSON text
    JSON_OBJECT = "json_object"  # any JSON object; no value
    CHOICE = "choice"  # exactly one of the given strings


@dataclass(frozen=True, slots=True)
class Constraint:
    """A constraint on the generated text. ``value`` is a string for every kind except
    ``choice`` (a non-empty tuple of strings) and ``json_object`` (no value, the empty string)."""

    kind: ConstraintKind
    value: str | tuple[str, ...] = ""

    def __post_init__(self) -> None:
        if self.kind is ConstraintKind.CHOICE:
            if not isinstance(self.value, tuple) or not self.value or not all(
                isinstance(item, str) for item in self.value
            ):
                raise ValueError("a choice constraint needs a non-empty tuple of strings")
        elif not isinstance(self.value, str):
            raise ValueError(f"a {self.kind.value} constraint takes a string value")
        elif self.kind is ConstraintKind.JSON_OBJECT and self.value:
            raise ValueError("a json_object constraint takes no value")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample. The defaults change nothing; a codec sends them explicitly, as an engine
    may read a proto3 zero as a setting (temperature 0 is greedy). ``top_k`` -1: no top-k;
    ``max_new_tokens`` None: up to the context length. ``stop`` strings are matched by the gateway
    (a codec may also pass them on). ``logprobs`` asks for the sampled tokens' logprobs,
    ``top_logprobs`` for that many alternatives per token as well."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token_id, bias)
    logprobs: bool = False
    top_logprobs: int = 0
    constraint: Constraint | None = None


@dataclass(frozen=True, slots=True)
class DisaggregationParams:
    """Where a decode worker fetches the KV cache a prefill worker computes (PD serving)."""

    bootstrap_host: str
    bootstrap_port: int
    bootstrap_room: int


@dataclass(frozen=True, slots=True)
class EncodeBootstrap:
    """Where a prefill engine receives one multimodal item's embedding from the encode worker that
    computes it (EPD serving): the item's index in the prompt, the encode worker's bootstrap host and
    port, and the item's room."""

    item_index: int
    bootstrap_host: str
    bootstrap_port: int
    bootstrap_room: int


@dataclass(frozen=True, slots=True)
class MultimodalSlot:
    """Where one multimodal item sits in the prompt (EPD serving: the prefill engine puts the item's
    embedding there): its content hash, its patch grid (t, h, w), the range of its placeholder tokens
    in the prompt's ids (offset, length) and that placeholder's token id."""

    content_hash: bytes
    grid_thw: tuple[int, int, int]
    offset: int
    length: int
    placeholder_token_id: int


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """The KV handoff a leg of a sequential prefill-then-decode carries (vLLM's kv_transfer_params):
    connector params as JSON text, or the typed host and port of the prefill's KV server, or both."""

    json: str | None = None
    remote_host: str | None = None
    remote_port: int | None = None


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation: the prompt as token ids and how to sample it.

    ``request_id`` names the request to the engine (and to :meth:`EngineClient.abort`);
    ``original_text`` is the rendered prompt, for engines that log or need it;
    ``data_parallel_rank`` pins the request to one dp rank of the worker.
    """

    request_id: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = True
    original_text: str | None = None
    data_parallel_rank: int | None = None
    return_prompt_logprobs: bool = False
    disaggregation: DisaggregationParams | None = None
    kv_transfer: KvTransfer | None = None  # sequential PD (vLLM): this leg's KV handoff
    encode_bootstrap: tuple[EncodeBootstrap, ...] = ()  # EPD: the prefill leg's embeddings, per item
    multimodal: tuple[MultimodalSlot, ...] = ()  # EPD: the prefill leg's items' places in the prompt


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """One embedding of a prompt given as token ids (an embedding model's worker).

    ``original_text`` is the prompt as text, for engines that log or need it;
    ``data_parallel_rank`` pins the request to one dp rank of the worker (SGLang).
    """

    request_id: str
    input_ids: tuple[int, ...]
    original_text: str | None = None
    data_parallel_rank: int | None = None


@dataclass(frozen=True, slots=True)
class EmbedResult:
    """The prompt's embedding vector and how many prompt tokens the engine read."""

    embedding: tuple[float, ...]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The logprob of one token, with the most likely alternatives at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), most likely first


class FinishReason(StrEnum):
    """Why a choice ended. An engine error is not a finish: the client raises instead."""

    STOP = "stop"  # end of sequence, a stop token or a stop string
    LENGTH = "length"  # max_new_tokens or the context length
    ABORT = "abort"  # aborted by the gateway or the engine


@dataclass(frozen=True, slots=True)
class Finish:
    """How a choice ended; at most one of the matched token id and stop string is set."""

    reason: FinishReason
    matched_token_id: int | None = None
    matched_stop_str: str | None = None

    def __post_init__(self) -> None:
        if self.matched_token_id is not None and self.matched_stop_str is not None:
            raise ValueError("a finish matches a stop token or a stop string, not both")


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """One step of one choice (``index`` tells the ``n`` choices apart).

    ``token_ids`` are the tokens new since this choice's previous output, never the whole
    completion again. The counts are cumulative. ``logprobs``, when asked for, has one entry per
    new token; ``prompt_logprobs`` one per prompt token (None where the engine gives none, as for
    the first). ``finish`` is set on the choice's last output only.
    """

    index: int = 0
    token_ids: tuple[int, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    logprobs: tuple[TokenLogprobs, ...] | None = None
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None
    finish: Finish | None = None
    spec_accepted_tokens: int = 0  # speculative decoding (the last output only): drafts accepted
    spec_draft_tokens: int = 0  # and drafts proposed; 0 when the engine does not speculate
    # Sequential PD (the last output only): the KV handoff params a prefill engine returned, as JSON text.
    kv_transfer_params: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish is not None


class _EngineOutputStep:
    """The layout of :class:`EngineOutput` without its frozen ``__setattr__``: a mid-stream output
    (no finish, no speculative counts, no KV handoff) is built as one of these with plain slot
    stores instead of ``object.__setattr__`` (~0.9 against ~4 us), then made an :class:`EngineOutput`
    (the same slots in the same order, so the layouts match): what comes out is as frozen as one
    built by the constructor. Never used as a type of its own."""

    __slots__ = EngineOutput.__slots__


def _engine_output_step(
    index: int, token_ids: tuple[int, ...], prompt_tokens: int, completion_tokens: int, cached_tokens: int,
    reasoning_tokens: int, logprobs: tuple[TokenLogprobs, ...] | None,
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None,
    _new: Callable[[type[_EngineOutputStep]], Any] = object.__new__,
) -> EngineOutput:  # fmt: skip
    # A function, not the class's __init__: a class call with a Python __init__ costs ~0.35k
    # instructions more than a function call and object.__new__ (D115); one is made per engine message.
    self: Any = _new(_EngineOutputStep)  # (its slots, set below, are EngineOutput's)
    self.index = index
    self.token_ids = token_ids
    self.prompt_tokens = prompt_tokens
    self.completion_tokens = completion_tokens
    self.cached_tokens = cached_tokens
    self.reasoning_tokens = reasoning_tokens
    self.logprobs = logprobs
    self.prompt_logprobs = prompt_logprobs
    self.finish = None
    self.spec_accepted_tokens = 0
    self.spec_draft_tokens = 0
    self.kv_transfer_params = None
    self.__class__ = EngineOutput
    return self


ENGINE_OUTPUT_STEP: Callable[
    [int, tuple[int, ...], int, int, int, int, tuple[TokenLogprobs, ...] | None, tuple[TokenLogprobs | None, ...] | None],
    EngineOutput,
] = _engine_output_step
"""``ENGINE_OUTPUT_STEP(index, token_ids, prompt_tokens, completion_tokens, cached_tokens,
reasoning_tokens, logprobs, prompt_logprobs)``: an :class:`EngineOutput` with the other fields at
their defaults, equal to the constructor's, built cheaply (see :class:`_EngineOutputStep`)."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the engine says about its model. None: the engine did not report it."""

    model_path: str
    served_model_name: str = ""
    tokenizer_path: str = ""
    max_context_length: int | None = None
    vocab_size: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    architectures: tuple[str, ...] = ()
    model_type: str = ""
    is_generation: bool = True
    supports_vision: bool = False
    max_req_input_len: int | None = None


@dataclass(frozen=True, slots=True)
class EngineHealth:
    healthy: bool
    message: str = ""


@dataclass(frozen=True, slots=True)
class CommandResult:
    """The answer to a control command (cache flush, profiling)."""

    success: bool
    message: str = ""


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """How to profile the engine. None: the engine's own default."""

    output_dir: str | None = None
    start_step: int | None = None
    num_steps: int | None = None
    activities: tuple[str, ...] = ()  # e.g. "CPU", "GPU"; empty: the engine's default
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_by_stage: bool = False


MAX_TOKENIZER_BYTES = 1024 * 1024 * 1024
"""The most a tokenizer may take: a worker's GetTokenizer archive as it arrives (the stream is cut
there) and unpacked, and a hub repository's fetched files (a tokenizer is tens of MiB at most)."""


@dataclass(frozen=True, slots=True)
class TokenizerBundle:
    """The worker's tokenizer files as one zip archive, with the archive's SHA-256 (hex)."""

    data: bytes
    sha256: str

    @property
    def intact(self) -> bool:
        """Whether ``data`` hashes to ``sha256``."""
        return hashlib.sha256(self.data).hexdigest() == self.sha256.lower()


class EngineClient(ABC):
    """The connection to one engine worker; one instance per worker.

    Every method may raise ``UpstreamFailure`` (``inference.upstreams.failures``) when the worker
    cannot be reached or answers with an error. A runtime without an operation (TensorRT-LLM has no
    cache flush, MLX no load report, TokenSpeed no embeddings) raises it too (BROKEN, see
    :meth:`unsupported`), rather than pretending to succeed.
    """

    runtime: ClassVar[str]
    """The runtime's name, as registered in :data:`ENGINE_CLIENTS` (with its transport)."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.url = url
        self.api_key = api_key

    @classmethod
    def for_worker(cls, record: WorkerRecord) -> EngineClient:
        """The client of a registered worker (what the process's engine pool makes): its URL and key
        by default; a transport whose client needs more of the record (ZMQ: dp_size, the handshake
        address, the model) reads it here."""
        return cls(record.url, api_key=record.api_key)

    def use_eos_token_ids(self, eos_token_ids: tuple[int, ...]) -> None:
        """The EOS ids of the model's tokenizer, given before each generation. An engine that knows
        its own (every gRPC runtime) ignores them; an engine without a tokenizer (ZMQ) needs them."""

    @abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Run ``request``; yield each choice's outputs as the engine produces them.

        Implement as an async generator (``async def`` with ``yield``). It raises
        ``UpstreamFailure`` while nothing was yielded, so the caller may retry on another worker;
        once an output was yielded a failure can no longer be retried. It ends after every choice
        yielded an output with ``finish`` set. When the client goes away the caller cancels the
        iteration (cancels the task consuming it, or ``aclose()`` on the generator); the client
        then stops the engine's work itself, before the iteration ends (the gRPC clients cancel
        the RPC and send Abort once, in a ``finally``). :meth:`abort` is for requests the caller
        stops by other means; a second abort of the same id is harmless.
        """

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a running request; an unknown or finished id is not an error."""

    @abstractmethod
    async def health(self) -> EngineHealth:
        """Ask the engine whether it serves (also the runtime detection probe)."""

    @abstractmethod
    async def model_info(self) -> ModelInfo: ...

    @abstractmethod
    async def server_info(self) -> dict[str, Any]:
        """The engine's server information, as JSON-ready values (runtime-specific keys)."""

    @abstractmethod
    async def loads(self) -> tuple[EngineLoad, ...]:
        """The current load, one entry per data-parallel rank."""

    @abstractmethod
    async def flush_cache(self) -> CommandResult:
        """Drop the engine's prefix (KV) cache."""

    @abstractmethod
    async def start_profile(self, options: ProfileOptions) -> CommandResult: ...

    @abstractmethod
    async def stop_profile(self) -> CommandResult: ...

    @abstractmethod
    async def tokenizer(self) -> TokenizerBundle:
        """Fetch the worker's tokenizer (when no local tokenizer path is configured)."""

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Embed ``request``'s prompt. Only runtimes whose service has an Embed RPC implement it."""
        raise self.unsupported("Embed")

    @classmethod
    def offers(cls, rpc: str) -> bool:
        """Whether this runtime has ``rpc`` (e.g. "Embed", "FlushCache"); a caller answers 501 for a
        route a runtime cannot serve instead of counting the refusal as the worker's failure."""
        return True

    def unsupported(self, operation: str) -> UpstreamFailure:
        """The failure for an operation (an RPC, or a request feature) this runtime lacks."""
        return UpstreamFailure(FailureKind.BROKEN, f"{self.runtime} has no {operation}")

    async def close(self) -> None:
        """Release the channel when the worker leaves. Nothing to release by default."""


class EngineKey(NamedTuple):
    """What an engine client is registered under: the transport it speaks and the runtime's name."""

    transport: Transport
    runtime: str


class EngineClients(KeyedRegistry[EngineKey, type[EngineClient]]):
    """Engine client classes by (transport, runtime)."""

    def normalize(self, key: EngineKey) -> EngineKey:
        transport, runtime = key
        return EngineKey(Transport(transport), str(runtime))

    def missing(self, key: EngineKey) -> LookupError:
        transport, runtime = key
        try:
            over = Transport(transport).display_name
        except ValueError:
            over = repr(transport)
        return UnknownUpstream(f"no {self.kind} is registered for {runtime!r} over {over}")

    def serves(self, transport: Transport, runtime: str) -> bool:
        """Whether a client of ``runtime`` over ``transport`` is registered (a dict lookup: asked per
        request)."""
        return (transport, runtime) in self._by_name

    def runtimes(self, transport: Transport) -> tuple[str, ...]:
        """The runtimes with a client over ``transport``, in registration order."""
        return tuple(key.runtime for key in self._by_name if key.transport is transport)


ENGINE_CLIENTS = EngineClients("engine client")
"""Engine clients by :class:`EngineKey` (``(Transport.GRPC, "sglang")``, ``(Transport.GRPC, "vllm")``, ...)."""


class EngineConnect(Protocol):
    """A transport's connector: a new engine client for the worker at ``url`` on a connection of its
    own (the caller closes it), of ``runtime``, or of the runtime the transport detects when None.
    Raises UpstreamFailure (CONNECT or TIMEOUT while the worker cannot be reached, BROKEN when it
    answers but serves no engine the transport knows) or UnknownUpstream (a runtime without a client
    over the transport)."""

    def __call__(
        self, url: str, runtime: str | None = None, *, api_key: str | None = None, detect_timeout: float = 10.0
    ) -> Awaitable[EngineClient]: ...


ENGINE_CONNECTORS: KeyedRegistry[Transport, EngineConnect] = KeyedRegistry("engine connector")
"""Each engine transport's connector, registered by its package (gRPC: inference/upstreams/grpc/detect.py)."""


def engine_connector(transport: Transport) -> EngineConnect:
    """The connector of ``transport``. Raises UnknownUpstream when the gateway has none for it (no
    engine over it can be registered)."""
    if transport not in ENGINE_CONNECTORS:
        raise UnknownUpstream(f"the gateway has no engine connector for {transport.display_name} workers")
    return ENGINE_CONNECTORS.get(transport)


async def connect_engine(
    url: str, runtime: str | None = None, *, api_key: str | None = None, detect_timeout: float = 10.0
) -> EngineClient:
    """A new engine client for the worker at ``url`` (the caller closes it), through the connector of
    the transport its URL names: of ``runtime``, or of the runtime that transport detects. Raises as
    :class:`EngineConnect` does, and UnknownUpstream for a transport without a connector."""
    connect = engine_connector(transport_of(url))
    return await connect(url, runtime, api_key=api_key, detect_timeout=detect_timeout)
