"""vLLM EngineCore's wire messages over ZMQ, as msgspec Structs with vLLM's own layouts.

Followed: the public vLLM sources in the vllm-project/vllm repository, at

- ``vllm/v1/engine/__init__.py`` @ 364631ab07d283c4f08db0544a2653c5b415a427 (EngineCoreRequest,
  EngineCoreOutput(s), UtilityOutput, FinishReason, EngineCoreRequestType);
- ``vllm/sampling_params.py`` @ 00388f6573ccfcffad607b8c9ecdf341a4669ceb (SamplingParams);
- ``vllm/v1/engine/utils.py`` @ 0018dd01c9a9f22622c2373228101b6a1e6dc7f6 (the HELLO / INIT / READY
  handshake, EngineHandshakeMetadata, EngineZmqAddresses, identities);
- ``vllm/v1/engine/core_client.py`` @ 00080ee13c7a451fce071ccb8d0e94d395acf5a7 (the input ROUTER
  and output PULL, ENGINE_CORE_DEAD, the ready response on the input socket);
- ``vllm/v1/engine/core.py`` @ the same commit (several clients, D69: a DEALER to every input
  address with the ready response sent on each, a PUSH to every output address, a request's
  outputs to ``client_index``'s, a utility answer to its caller's, ``ENGINE_CORE_DEAD`` to all,
  ``wave_complete`` to client 0 without a DP coordinator).

The layouts are the contract:

- ``EngineCoreRequest``, ``EngineCoreOutput``, ``EngineCoreOutputs`` and ``UtilityOutput`` are
  ``array_like`` Structs: positional msgpack arrays of every field in field order (msgspec's
  ``omit_defaults`` leaves nothing out of an array-like Struct, jcrist/msgspec#720; a shorter array
  from another encoder still decodes, its missing trailing fields at their defaults).
- ``SamplingParams`` is a Struct without ``array_like``: a msgpack *map* by field name, fields at
  their default omitted. Its defaults are vLLM's (``max_tokens`` 16, ``top_k`` 0), so a value equal
  to vLLM's default is not sent and one that differs always is.
- Dataclasses (the handshake's EngineHandshakeMetadata, the engine's SchedulerStats and
  EngineCoreReadyResponse) are maps by field name (every field, ``None`` ones included); they are
  read here as plain dicts, tolerant of fields newer vLLM versions add and of older ones lacking
  later fields (SchedulerStats before ``kv_cache_eviction_events`` or ``preempted_*``).

A data-plane message from the gateway is ``[identity, type byte, msgpack payload, aux frames...]``
on the input ROUTER; an engine's outputs arrive on the output PULL as ``[msgpack payload, aux
frames...]``, or as the single frame :data:`ENGINE_CORE_DEAD` when the engine core died. Tensors
(logprobs, prompt embeddings) travel as msgpack extension types or aux frames; this codec keeps the
outputs' tensor fields as decoded msgpack (a raw view as bytes) and :mod:`.logprobs` (with
:mod:`.tensors`) decodes the logprobs.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

__all__ = [
    "ENGINE_CORE_DEAD",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreOutputsRawStats",
    "EngineCoreRequest",
    "RequestType",
    "SamplingParams",
    "StructuredOutputsParams",
    "UtilityOutput",
    "WireFinishReason",
    "decode_handshake",
    "decode_outputs",
    "decode_stats",
    "decode_step",
    "has_stats",
    "decode_ready_response",
    "encode",
    "engine_identity",
    "engine_index",
    "handshake_hello",
    "handshake_init",
    "handshake_ready",
]

ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
"""The single frame an engine core sends on its output socket when it dies
(``EngineCoreProc.ENGINE_CORE_DEAD``)."""


class RequestType(bytes, enum.Enum):
    """``EngineCoreRequestType``: the first frame after the identity, a single byte."""

    ADD = b"\x00"
    ABORT = b"\x01"
    START_DP_WAVE = b"\x02"
    UTILITY = b"\x03"


class WireFinishReason(enum.IntEnum):
    """vLLM's ``FinishReason`` (an int for compactness)."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3


class StructuredOutputsParams(msgspec.Struct, omit_defaults=True):
    """vLLM's ``StructuredOutputsParams`` (a dataclass: a map by field name); only the constraint
    fields the gateway sets. ``json`` is the schema as JSON text or a decoded object."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None


class SamplingParams(msgspec.Struct, omit_defaults=True):
    """vLLM's ``SamplingParams`` fields, in its order, with its defaults (a msgpack map). The
    private ``_eos_token_id`` and ``_all_stop_token_ids`` are what vLLM's front end fills in from
    the tokenizer and generation config; the gateway (which holds the tokenizer) fills them."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: int = 0  # RequestOutputKind: 0 cumulative, 1 delta, 2 final only
    output_text_buffer_length: int = 0
    _eos_token_id: int | None = None
    _all_stop_token_ids: list[int] = msgspec.field(default_factory=list)
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One ADD: a positional array in this order."""

    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[Any] | None
    sampling_params: SamplingParams | None
    pooling_params: dict[str, Any] | None
    eos_token_id: int | None
    arrival_time: float
    lora_request: Any
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: Any = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    external_req_id: str | None = None


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request's step: the tokens new since its previous output."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: Any = None
    new_prompt_logprobs_tensors: Any = None
    pooling_output: Any = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    events: Any = None
    kv_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    num_cached_tokens: int = 0
    routed_experts: Any = None
    num_nans_in_logits: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    call_id: int
    failure_message: str | None = None
    result: Any = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's outputs, with the scheduler's stats piggy-backed (a SchedulerStats map:
    num_running_reqs, num_waiting_reqs, step_counter, current_wave, kv_cache_usage, ...)."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = msgspec.field(default_factory=list)
    scheduler_stats: dict[str, Any] | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None


_NIL = b"\xc0"  # msgpack's nil


class EngineCoreOutputsRawStats(EngineCoreOutputs, array_like=True, omit_defaults=True, gc=False):
    """EngineCoreOutputs as the client reads every step: the scheduler stats left as their msgpack
    bytes (nil when absent), decoded only when the loads are asked (:func:`decode_stats`); decoding
    them with every step was a third of a step's decode."""

    scheduler_stats: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(_NIL))  # type: ignore[assignment]


def _ext_hook(code: int, data: memoryview) -> Any:
    """vLLM's tensors and pickled values arrive as extension types: kept opaque (raw bytes)."""
    return bytes(data)


_ENCODER = msgspec.msgpack.Encoder()
_OUTPUTS_DECODER = msgspec.msgpack.Decoder(EngineCoreOutputs, ext_hook=_ext_hook)
_STEP_DECODER = msgspec.msgpack.Decoder(EngineCoreOutputsRawStats, ext_hook=_ext_hook)
_STATS_DECODER = msgspec.msgpack.Decoder(dict[str, Any] | None, ext_hook=_ext_hook)
_REQUEST_DECODER = msgspec.msgpack.Decoder(EngineCoreRequest, ext_hook=_ext_hook)
_ANY_DECODER = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


def encode(message: Any) -> bytes:
    """A message (a Struct, or plain values such as ABORT's list of ids) as msgpack."""
    return _ENCODER.encode(message)


def decode_outputs(payload: bytes | memoryview) -> EngineCoreOutputs:
    return _OUTPUTS_DECODER.decode(payload)


def decode_step(payload: bytes | memoryview) -> EngineCoreOutputsRawStats:
    """An output message with its scheduler stats undecoded (the client's hot path)."""
    return _STEP_DECODER.decode(payload)


def has_stats(raw: msgspec.Raw) -> bool:
    """Stats kept by :func:`decode_step` are there (not nil)."""
    return len(raw) > 1 or (len(raw) == 1 and bytes(raw) != _NIL)


def decode_stats(raw: msgspec.Raw) -> dict[str, Any]:
    """Scheduler stats kept by :func:`decode_step` (``{}`` for nil, or for stats that do not decode:
    they are only read for the loads)."""
    try:
        return _STATS_DECODER.decode(raw) or {}
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}


def decode_request(payload: bytes | memoryview) -> EngineCoreRequest:
    """An ADD's payload (the engine's side)."""
    return _REQUEST_DECODER.decode(payload)


def decode_any(payload: bytes | memoryview) -> Any:
    return _ANY_DECODER.decode(payload)


def engine_identity(index: int) -> bytes:
    """An engine's ZMQ identity: its data-parallel index as 2 bytes, little-endian."""
    return index.to_bytes(2, "little")


def engine_index(identity: bytes) -> int:
    return int.from_bytes(identity, "little")


# The startup handshake (on the handshake ROUTER; maps by key).


def handshake_hello(*, local: bool = False, headless: bool = True) -> bytes:
    """What an engine sends first: ``{"status": "HELLO", "local", "headless"}``."""
    return encode({"status": "HELLO", "local": local, "headless": headless})


def handshake_init(
    inputs: list[str],
    outputs: list[str],
    *,
    data_parallel_size: int,
    data_parallel_master_ip: str = "127.0.0.1",
    data_parallel_master_port: int = 0,
) -> bytes:
    """The gateway's answer to HELLO: EngineHandshakeMetadata (``addresses``: EngineZmqAddresses,
    ``parallel_config``), as vLLM's front end sends it."""
    return encode(
        {
            "addresses": {
                "inputs": inputs,
                "outputs": outputs,
                "coordinator_input": None,
                "coordinator_output": None,
                "frontend_stats_publish_address": None,
            },
            "parallel_config": {
                "data_parallel_master_ip": data_parallel_master_ip,
                "data_parallel_master_port": data_parallel_master_port,
                "data_parallel_size": data_parallel_size,
            },
        }
    )


def handshake_ready(*, num_gpu_blocks: int, local: bool = False, headless: bool = True) -> bytes:
    """What an engine sends once started: ``{"status": "READY", "local", "headless",
    "num_gpu_blocks", "dp_stats_address"}``."""
    return encode(
        {"status": "READY", "local": local, "headless": headless, "num_gpu_blocks": num_gpu_blocks,
         "dp_stats_address": None}
    )  # fmt: skip


def decode_handshake(payload: bytes | memoryview) -> dict[str, Any]:
    """A handshake map; ValueError when it is not one."""
    try:
        message = decode_any(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a msgpack handshake message: {exc}") from None
    if not isinstance(message, dict):
        raise ValueError("a handshake message is a msgpack map")
    return message


def decode_ready_response(payload: bytes | memoryview) -> dict[str, Any]:
    """The engine's first message on the input socket: an EngineCoreReadyResponse map
    (max_model_len, num_gpu_blocks, block_size, dp_stats_address, dtype, vllm_version, world_size,
    data_parallel_size, ..., data_parallel_rank, max_num_seqs, ...); empty from older engines."""
    if not len(payload):
        return {}
    message = decode_any(payload)
    return message if isinstance(message, dict) else {}
