"""The project's stand-in for vLLM's EngineCore in headless mode, over ZMQ: it dials in to a
gateway's ZMQ worker exactly as a headless vLLM engine does, and answers with the same scripted
replies as the gRPC stand-in (:mod:`standins.scripted_engine`), driven by a fixture tokenizer.

A test aid and a first-time user's engine: ``python manage.py runmockworker --zmq --tokenizer PATH
--zmq-url ipc://PATH [--dp-size N]``, or in-process with :class:`ZmqEngineGroup`. It reads and
writes vLLM's layouts itself, by position (as vLLM's msgspec Structs lay them out), independently
of the gateway's codec, so tests against it check the gateway's wire, not the codec against itself.

What it does, as vLLM's EngineCoreProc does:

- **Startup.** A DEALER with identity ``index.to_bytes(2, "little")`` connects to the handshake
  address and sends ``{"status": "HELLO", "local": False, "headless": True}``; it reads the INIT
  (EngineHandshakeMetadata: the input and output addresses, the parallel config), connects a
  DEALER (same identity) to *every* input address and a PUSH to *every* output address (one of
  each per client: vLLM's API server scale-out), sends ``READY`` with its ``num_gpu_blocks``, and
  registers on each input socket with its ready response (EngineCoreReadyResponse: max_model_len,
  num_gpu_blocks, block_size, dtype, vllm_version, world_size, data_parallel_size,
  data_parallel_rank, max_num_seqs, ...).
- **Several clients.** As vLLM's ``process_output_sockets``: a request's outputs go to the output
  socket of its ADD's ``client_index``, a utility answer to its call's client index, a
  ``wave_complete`` to client 0 (no DP coordinator), ``ENGINE_CORE_DEAD`` to every client.
  ``state.adds_by_client`` counts the ADDs each client sent (and each ADD and ABORT is logged at
  debug level, for a test of a stand-in process: ``GW_LOG_LEVEL=debug``).
- **ADD** runs the request with the scripted reply: outputs of ``chunk_tokens`` new tokens, each an
  EngineCoreOutputs with the scheduler stats piggy-backed; the last with its finish reason (0 stop,
  1 length). Every message is laid out as vLLM's (:mod:`standins.engine_core_wire`: trailing
  defaults left off, SchedulerStats with every field, ``finished_requests`` only in a data-parallel
  group). The engine has no tokenizer: it stops at EOS only when the request's
  ``eos_token_id`` (or a stop token id) names it, and otherwise runs on to ``max_tokens`` (vLLM's
  default 16 when the map leaves it out); a stop token id is reported as the ``stop_reason``; a
  prompt it cannot take (empty, ids outside the vocabulary, at or past the context length) ends
  with finish reason 3 (error).
- **Logprobs** as vLLM sends them (``vllm/v1/outputs.py``, ``vllm/v1/serial_utils.py``): with
  ``logprobs`` N in the sampling params each output's ``new_logprobs`` is a LogprobsLists of numpy
  arrays ``[dtype.str, shape, data]`` (token ids ``<i4`` and logprobs ``<f4`` of
  ``[new tokens, N + 1]``: the sampled token, then the top N; ranks ``<i8``), with
  ``prompt_logprobs`` N the first output's ``new_prompt_logprobs_tensors`` is a LogprobsTensors of
  torch tensors (dtype names ``int32``, ``float32``, ``int64``) for the prompt tokens after the
  first. An array's bytes go inline as extension type 3 below ``zero_copy_threshold`` bytes (vLLM's
  ``VLLM_MSGPACK_ZERO_COPY_THRESHOLD``, 256), otherwise in an aux frame after the payload, its
  index in ``data``. The values are the scripted model's (:meth:`ScriptedModel.logprobs`); rows are
  padded to ``state.logprob_columns`` alternatives when wider (a batch's widest request), and
  ``state.malformed_logprobs`` sends token ids one byte short (a fault).
- **ABORT** (a list of ids) ends those requests without another output (the client ends their
  streams itself, as vLLM's front end does); **UTILITY** calls are answered
  with an empty result (none while ``state.healthy`` is False: a hung engine); **START_DP_WAVE**
  is recorded. With ``dp_size`` > 1 an engine that runs out of requests reports ``wave_complete``.
- :meth:`ZmqEngineCore.die` sends ``ENGINE_CORE_DEAD`` and stops, as a dying engine core does.

Everything received is in :class:`ZmqEngineState` (``engine.state``): the decoded requests as the
gRPC stand-in records them, plus each ADD's raw positional array, the INIT maps, the waves, the
utility calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NoReturn, cast

import msgspec
import zmq
import zmq.asyncio

from standins.engine_core_wire import engine_core_output, engine_core_outputs, prefix_cache_stats, scheduler_stats
from standins.scripted_engine import (
    MOCK_ENGINE_VERSION,
    REPLIES,
    GrpcEngineConfig,
    GrpcEngineState,
    Sampling,
    ScriptedEngine,
    ScriptedModel,
)

__all__ = [
    "REPLIES", "ZmqEngineConfig", "ZmqEngineCore", "ZmqEngineGroup", "ZmqEngineState", "handshake_address_for",
    "run_zmq_engine", "scripted_model",
]  # fmt: skip

log = logging.getLogger(__name__)

# vLLM's wire (vllm/v1/engine/__init__.py, core.py): request types, finish reasons, the death frame.
ADD, ABORT, START_DP_WAVE, UTILITY = b"\x00", b"\x01", b"\x02", b"\x03"
STOP, LENGTH, ABORTED, ERROR = 0, 1, 2, 3
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
_FINISH = {"stop": STOP, "length": LENGTH, "abort": ABORTED}
# EngineCoreRequest's positions, and SamplingParams' default max_tokens when the map leaves it out.
REQUEST_ID, PROMPT_TOKEN_IDS, SAMPLING_PARAMS, EOS_TOKEN_ID, DATA_PARALLEL_RANK, CLIENT_INDEX = 0, 1, 3, 5, 9, 11
TRACE_HEADERS = 14  # EngineCoreRequest.trace_headers
DEFAULT_MAX_TOKENS = 16


def handshake_address_for(url: str) -> str:
    """The handshake address a gateway binds for an ``ipc://PATH`` worker when the worker spec
    gives none: ``tcp://127.0.0.1:PORT``, PORT = 20000 + (FNV-1a 64-bit of the PATH bytes mod 10000)."""
    if not url.startswith("ipc://") or len(url) == len("ipc://"):
        raise ValueError(f"a ZMQ worker's URL is ipc://<path>, not {url!r}")
    value = 0xCBF29CE484222325
    for byte in url[len("ipc://") :].encode("utf-8"):
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"tcp://127.0.0.1:{20000 + value % 10000}"


def _encode(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


def _decode(payload: bytes) -> Any:
    return msgspec.msgpack.decode(payload)


@dataclass(frozen=True)
class ZmqEngineConfig:
    tokenizer: str  # a tokenizer.json, or the folder holding it
    model: str = "mock-model"
    reply: str = "text"
    text: str | None = None
    chunk_tokens: int = 3
    delay_ms: float = 0.0
    max_model_len: int = 32768
    block_size: int = 16
    num_gpu_blocks: int = 4096
    max_num_seqs: int = 256
    zero_copy_threshold: int = 256  # VLLM_MSGPACK_ZERO_COPY_THRESHOLD: smaller arrays go inline

    def scripted(self) -> GrpcEngineConfig:
        extra: dict[str, Any] = {"text": self.text} if self.text is not None else {}
        return GrpcEngineConfig(
            runtime="vllm", tokenizer=self.tokenizer, model=self.model, reply=self.reply,
            chunk_tokens=self.chunk_tokens, delay_ms=self.delay_ms, max_context_length=self.max_model_len, **extra,
        )  # fmt: skip


@dataclass
class ZmqEngineState(GrpcEngineState):
    """The gRPC stand-in's record (requests, aborts, ``healthy``), plus the ZMQ wire's own."""

    adds: list[list[Any]] = field(default_factory=list)  # each ADD's payload as the positional array sent
    adds_by_client: dict[int, int] = field(default_factory=dict)  # client index → ADDs it sent
    abort_messages: list[list[str]] = field(default_factory=list)  # each ABORT's list of ids
    inits: list[dict[str, Any]] = field(default_factory=list)  # the INIT maps received
    waves: list[list[Any]] = field(default_factory=list)  # START_DP_WAVE payloads: [wave, exclude index]
    utility_calls: list[list[Any]] = field(default_factory=list)  # [client index, call id, method, args]
    stats: dict[str, Any] = field(default_factory=dict)  # SchedulerStats fields to report instead
    logprob_columns: int = 0  # pad logprob rows to this many alternatives (a batch's widest request)
    malformed_logprobs: bool = False  # a fault: token id arrays one byte short
    aux_frames_sent: int = 0  # arrays sent in aux frames rather than inline
    outputs_sent: int = 0


class _Tensors:
    """vLLM's MsgpackEncoder for the arrays of one message: ``[dtype, shape, data]``, ``data``
    inline (extension type 3) below the threshold, else the index of an aux frame (frame 0 is
    the payload)."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.aux: list[bytes] = []

    def array(self, dtype: str, shape: list[int], data: bytes) -> list[Any]:
        if not shape or len(data) < self.threshold:
            return [dtype, shape, msgspec.msgpack.Ext(3, data)]
        self.aux.append(data)
        return [dtype, shape, len(self.aux)]

    def logprobs(self, rows: list[list[tuple[int, float]]], ranks: list[int], *, numpy: bool, short: bool = False) -> list[Any]:
        """LogprobsLists (numpy: little-endian ``dtype.str``) or LogprobsTensors (torch: dtype
        names, native byte order) of equal-width rows, the selected token first."""
        width = len(rows[0]) if rows else 0
        flat = [entry for row in rows for entry in row]
        order = "<" if numpy else "="
        ids = struct.pack(f"{order}{len(flat)}i", *(token for token, _ in flat))
        values = struct.pack(f"{order}{len(flat)}f", *(value for _, value in flat))
        rank_bytes = struct.pack(f"{order}{len(ranks)}q", *ranks)
        names = ("<i4", "<f4", "<i8") if numpy else ("int32", "float32", "int64")
        return [
            self.array(names[0], [len(rows), width], ids[:-1] if short else ids),
            self.array(names[1], [len(rows), width], values),
            self.array(names[2], [len(rows)], rank_bytes),
            None,  # cu_num_generated_tokens: None once sliced per request
        ]


@lru_cache(maxsize=8)
def scripted_model(config: ZmqEngineConfig) -> ScriptedModel:
    """The model of a config, shared by its engines (reading a large vocabulary takes ~0.4 s)."""
    return ScriptedModel(config.scripted())


def _client_of(raw: list[Any]) -> int:
    """An ADD's ``client_index`` (0 when a shorter array leaves it out)."""
    return int(raw[CLIENT_INDEX] or 0) if len(raw) > CLIENT_INDEX else 0


class _Refused(Exception):
    pass


class _Refusal:
    """What :meth:`ScriptedEngine.check_prompt` calls to refuse a prompt (a gRPC context's abort), and
    the request's trace_headers as the context's metadata."""

    def __init__(self, trace_headers: dict[str, str] | None = None) -> None:
        self._trace = trace_headers or {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._trace.items())

    async def abort(self, code: Any, details: str) -> NoReturn:
        raise _Refused(details)


class ZmqEngineCore:
    """One engine core (one data-parallel index) dialing in to ``handshake_address``."""

    def __init__(self, config: ZmqEngineConfig, handshake_address: str, index: int = 0, dp_size: int = 1) -> None:
        self.config = config
        self.handshake_address = handshake_address
        self.index = index
        self.dp_size = dp_size
        self.state = ZmqEngineState()
        self.engine = ScriptedEngine(config.scripted(), self.state, scripted_model(config))
        self.identity = index.to_bytes(2, "little")
        self.ready = asyncio.Event()
        self.current_wave = 0
        self._step = 0
        self._prefix = {"requests": 0, "queries": 0, "hits": 0}
        self._context = zmq.asyncio.Context()
        self._inputs: list[zmq.asyncio.Socket] = []
        self._outputs: list[zmq.asyncio.Socket] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._main: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Dial in (in the background); ``ready`` is set once registered."""
        self._main = asyncio.create_task(self._serve(), name=f"zmq stand-in engine {self.index}")

    async def _serve(self) -> None:
        handshake = self._context.socket(zmq.DEALER)
        handshake.setsockopt(zmq.IDENTITY, self.identity)
        handshake.setsockopt(zmq.LINGER, 0)
        handshake.connect(self.handshake_address)
        try:
            await handshake.send(_encode({"status": "HELLO", "local": False, "headless": True}))
            init = _decode(await handshake.recv())
            self.state.inits.append(init)
            addresses = init["addresses"]
            for address in addresses["inputs"]:
                socket = self._context.socket(zmq.DEALER)
                socket.setsockopt(zmq.IDENTITY, self.identity)
                socket.setsockopt(zmq.LINGER, 0)
                socket.connect(address)
                self._inputs.append(socket)
            for address in addresses["outputs"]:
                socket = self._context.socket(zmq.PUSH)
                socket.setsockopt(zmq.LINGER, 1000)
                socket.connect(address)
                self._outputs.append(socket)
            await handshake.send(_encode({"status": "READY", "local": False, "headless": True,
                                          "num_gpu_blocks": self.config.num_gpu_blocks, "dp_stats_address": None}))  # fmt: skip
        finally:
            handshake.close(linger=500)
        for socket in self._inputs:  # registered with every client
            await socket.send(_encode(self.ready_response(init)))
        self.ready.set()
        for socket in self._inputs[1:]:
            self._spawn(self._input_loop(socket))
        await self._input_loop(self._inputs[0])

    def ready_response(self, init: dict[str, Any]) -> dict[str, Any]:
        """EngineCoreReadyResponse, a map by field name."""
        config = self.config
        dp_size = int(init.get("parallel_config", {}).get("data_parallel_size", self.dp_size))
        return {
            "max_model_len": config.max_model_len,
            "num_gpu_blocks": config.num_gpu_blocks,
            "block_size": config.block_size,
            "dp_stats_address": None,
            "dtype": "bfloat16",
            "vllm_version": MOCK_ENGINE_VERSION,
            "world_size": 1,
            "data_parallel_size": dp_size,
            "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1,
            "decode_context_parallel_size": 1,
            "data_parallel_rank": self.index,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_model_len,
            "instance_id": f"mock-{self.index}",
        }

    async def _input_loop(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            kind, payload = frames[0], frames[1]
            if kind == ADD:
                raw = _decode(payload)
                self.state.adds.append(raw)
                client = _client_of(raw)
                self.state.adds_by_client[client] = self.state.adds_by_client.get(client, 0) + 1
                log.debug("engine %d: request %s from client %d", self.index, raw[REQUEST_ID], client)
                self._spawn(self._run(raw))
            elif kind == ABORT:
                ids = [str(i) for i in _decode(payload)]
                self.state.abort_messages.append(ids)
                log.debug("engine %d: abort %s", self.index, " ".join(ids))
                for request_id in ids:
                    self.engine.abort(request_id, "abort")
            elif kind == START_DP_WAVE:
                wave = list(_decode(payload))
                self.state.waves.append(wave)
                if wave[1] != self.index and wave[0] >= self.current_wave:
                    self.current_wave = wave[0]
            elif kind == UTILITY:
                call = list(_decode(payload))
                self.state.utility_calls.append(call)
                if self.state.healthy:  # UtilityOutput: call_id, failure_message, result; to the caller
                    await self._send(utility_output=[call[1], None, None], client=int(call[0]))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def scheduler_stats(self) -> dict[str, Any]:
        """SchedulerStats as vLLM's map (every field): this engine's own counts, ``state.stats`` over them."""
        running, counts = len(self.state.running), self._prefix
        return scheduler_stats(
            num_running_reqs=running, step_counter=self._step, current_wave=self.current_wave,
            kv_cache_usage=min(1.0, running / self.config.max_num_seqs),
            prefix=prefix_cache_stats(counts["requests"], counts["queries"], counts["hits"]), overrides=self.state.stats,
        )  # fmt: skip

    async def _send(self, outputs: list[list[Any]] | None = None, *, finished: list[str] | None = None,
                    utility_output: list[Any] | None = None, wave_complete: int | None = None,
                    aux: list[bytes] | None = None, client: int = 0) -> None:
        """One EngineCoreOutputs to ``client``'s output socket: a step's ``outputs`` (with the
        scheduler stats, and in a data-parallel group the ids ``finished`` in it), or a utility
        answer, or a wave's end (to client 0, as an engine without a DP coordinator sends it)."""
        if not 0 <= client < len(self._outputs):
            return
        step = utility_output is None and wave_complete is None
        if step:
            self._step += 1
        message = engine_core_outputs(
            self.index, outputs, scheduler_stats=self.scheduler_stats() if step else None,
            utility_output=utility_output, finished_requests=(finished or None) if self.dp_size > 1 else None,
            wave_complete=wave_complete,
        )  # fmt: skip
        await self._outputs[client].send_multipart([_encode(message), *(aux or ())])
        self.state.aux_frames_sent += len(aux or ())
        self.state.outputs_sent += 1

    async def _run(self, raw: list[Any]) -> None:
        request_id = str(raw[REQUEST_ID])
        client = _client_of(raw)
        params: dict[str, Any] = dict(raw[SAMPLING_PARAMS] or {})
        ids = tuple(raw[PROMPT_TOKEN_IDS] or ())
        eos = raw[EOS_TOKEN_ID]
        ignore_eos = bool(params.get("ignore_eos", False))
        stop_ids = set(params.get("stop_token_ids") or ())
        if eos is not None and not ignore_eos:
            stop_ids.add(eos)
        model_eos = self.engine.model.eos_token_id
        # The engine knows no EOS of its own: one the request does not name is just another token.
        blind = model_eos is not None and model_eos not in stop_ids
        sampling = Sampling(
            n=1, max_new_tokens=params.get("max_tokens", DEFAULT_MAX_TOKENS), stop_token_ids=frozenset(stop_ids),
            ignore_eos=ignore_eos or blind, logprobs=False, top_logprobs=0, stream=True,
        )  # fmt: skip
        cached = self.engine.cached_prefix(ids) if ids else 0
        self._prefix["requests"] += 1
        self._prefix["queries"] += len(ids)
        self._prefix["hits"] += cached
        trace = raw[TRACE_HEADERS] if len(raw) > TRACE_HEADERS else None
        steps = self.engine.run(request_id, ids, "", sampling, params, cast(Any, _Refusal(trace)))
        sample_top, prompt_top = params.get("logprobs"), params.get("prompt_logprobs")
        try:
            async with contextlib.aclosing(steps):
                async for _served, _index, new, choice, finished in steps:
                    if finished and choice.finish == "abort":
                        break  # an engine core sends nothing for a request its client aborted
                    finish = stop_reason = None
                    if finished:
                        finish = _FINISH[choice.finish]
                        if choice.finish == "stop" and choice.matched is not None and choice.matched != eos:
                            stop_reason = choice.matched  # a stop token id; EOS is no stop reason
                    tensors = _Tensors(self.config.zero_copy_threshold)
                    sampled = prompt = None
                    if sample_top is not None and new:
                        sampled = tensors.logprobs(*self.logprob_rows(list(new), sample_top), numpy=True,
                                                   short=self.state.malformed_logprobs)  # fmt: skip
                    if prompt_top is not None:
                        prompt = tensors.logprobs(*self.logprob_rows(list(ids[1:]), prompt_top), numpy=False)
                        prompt_top = None  # the whole prompt with the first output
                    output = engine_core_output(
                        request_id, list(new), new_logprobs=sampled, new_prompt_logprobs_tensors=prompt,
                        finish_reason=finish, stop_reason=stop_reason, num_cached_tokens=cached,
                    )  # fmt: skip
                    await self._send([output], finished=[request_id] if finished else None, aux=tensors.aux,
                                     client=client)  # fmt: skip
        except _Refused as refused:
            log.info("Request %s refused: %s", request_id, refused)
            await self._send([engine_core_output(request_id, [], finish_reason=ERROR)], finished=[request_id],
                             client=client)  # fmt: skip
        if self.dp_size > 1 and not self.state.running:
            await self._send(wave_complete=self.current_wave)
            self.current_wave += 1

    def logprob_rows(self, tokens: list[int], top: int) -> tuple[list[list[tuple[int, float]]], list[int]]:
        """Each token's row (the token, then the ``top`` most likely, padded to
        ``state.logprob_columns``) and its rank, from the scripted model's logprobs."""
        width = max(top, self.state.logprob_columns)
        values, top_ids, top_values = self.engine.model.logprobs(tokens, width)
        rows = [
            [(token, values[i])] + (list(zip(top_ids[i], top_values[i], strict=True)) if width else [])
            for i, token in enumerate(tokens)
        ]
        return rows, [1] * len(tokens)  # the scripted model ranks the chosen token first

    async def die(self) -> None:
        """Send ENGINE_CORE_DEAD, then stop (the requests in flight are not answered)."""
        for socket in self._outputs:  # every client hears it
            await socket.send(ENGINE_CORE_DEAD)
        await self.stop()

    async def stop(self) -> None:
        tasks = list(self._tasks) + ([self._main] if self._main is not None else [])
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for socket in self._inputs:
            socket.close(linger=0)
        for socket in self._outputs:
            socket.close(linger=1000)  # what was sent (ENGINE_CORE_DEAD) still leaves
        self._inputs, self._outputs = [], []
        await asyncio.to_thread(self._context.term)


class ZmqEngineGroup:
    """``dp_size`` engine cores (indexes 0..N-1) dialing in to one worker::

        group = ZmqEngineGroup(ZmqEngineConfig(tokenizer=".../qwen3"), "tcp://127.0.0.1:PORT", dp_size=2)
        await group.start()          # dials in; await group.ready() once the gateway listens
        ... group.engines[0].state.requests ...
        await group.stop()
    """

    def __init__(self, config: ZmqEngineConfig, handshake_address: str, dp_size: int = 1) -> None:
        self.engines = [ZmqEngineCore(config, handshake_address, index, dp_size) for index in range(dp_size)]

    async def start(self) -> None:
        for engine in self.engines:
            engine.start()

    async def ready(self) -> None:
        await asyncio.gather(*(engine.ready.wait() for engine in self.engines))

    async def stop(self) -> None:
        for engine in self.engines:
            await engine.stop()


def run_zmq_engine(config: ZmqEngineConfig, handshake_address: str, dp_size: int = 1) -> None:
    """Dial in and serve until SIGINT/SIGTERM. Once every engine registered, prints one line to
    stdout (flushed): ``mock zmq engine serving MODEL via HANDSHAKE (dp_size N)``."""

    async def serve() -> None:
        group = ZmqEngineGroup(config, handshake_address, dp_size)
        await group.start()
        try:
            await group.ready()
            sys.stdout.write(f"mock zmq engine serving {config.model} via {handshake_address} (dp_size {dp_size})\n")
            sys.stdout.flush()
            await asyncio.Event().wait()
        finally:
            await group.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
