"""The engine client of a ZMQ worker (``ipc://PATH``): vLLM's EngineCore in headless mode, over
ZMTP (the handshake on a pyzmq asyncio socket, the data plane on the event loop's own endpoints:
:mod:`.zmtp`). The gateway binds, the engines dial in (wire layouts: :mod:`.codec`, addresses:
:mod:`.addresses`).

One socket set per worker, shared by its ``dp_size`` engines:

- **Startup.** :meth:`ZmqEngineClient.start` binds the handshake ROUTER, the input ROUTER and the
  output PULL and returns at once; background tasks answer each engine's HELLO with INIT (the
  data-plane addresses and the parallel config), take its READY, then its ready response on the
  input socket (max_model_len, block_size, data_parallel_rank, ...). :meth:`wait_ready` waits for
  all ``dp_size`` engines (identities: the 2-byte little-endian index). An engine that says HELLO
  again (a restart) is handshaken again.
- **Requests.** Each generation picks a rank (the request's ``data_parallel_rank``, else the rank
  with the fewest requests in flight from this client) and sends ADD frames to that engine's
  identity; ``n`` choices are ``n`` engine requests ``{index}_{request_id}``, as vLLM's front end
  fans them out. The engine has no tokenizer: the first configured EOS id goes in
  ``eos_token_id``, the others into ``stop_token_ids`` (unless ``ignore_eos``), and ``max_tokens``
  is clamped to the context window the engine reported.
- **Demultiplexing.** One reader (the output socket is a ZMTP endpoint of the event loop itself,
  :mod:`.zmtp`, D95) decodes each step and routes each EngineCoreOutput by request id to that
  generation's inbox (a deque and one waiter); the generator turns them into neutral
  :class:`EngineOutput`: outputs of one choice queued together fold into one, and a request that
  is not streamed gets one output per choice, at its end (as a gRPC engine answers it). Closing or
  cancelling the generator sends ABORT for the choices still running. Logprobs and prompt logprobs
  (vLLM's tensors, inline or in aux frames) are decoded by :mod:`.logprobs`; one that does not
  decode ends the generation with an ``UpstreamFailure``.
- **Death.** ``ENGINE_CORE_DEAD`` on the output socket, an engine's connection to it dropping,
  or :meth:`health` timing out ends every request in flight at once with an
  ``UpstreamFailure`` (BROKEN), and the worker stays unserved until its engines handshake again.
- **Load.** The scheduler stats piggy-backed on each EngineCoreOutputs are kept per rank and
  answered by :meth:`loads` without a call.
- **Data-parallel waves** (``dp_size`` > 1). With no DP coordinator in the INIT message this client
  does the coordinator's part: it stamps each ADD with the current wave, wakes the other engines
  with START_DP_WAVE ``(wave, chosen index)`` when the engines are paused, follows
  ``wave_complete`` and ``start_wave``.

- **Several serving processes** (``rungateway --workers N``, D69): each process's client is one of
  N clients of the engines, as vLLM's API server scale-out: client ``i`` binds its own input
  ROUTER and output PULL (:func:`.addresses.zmq_addresses`), stamps ``client_index`` ``i`` on its
  ADDs and utility calls, and gets its requests' outputs on its own socket. One process binds the
  handshake ROUTER: the one that runs the health checks (the host's leader), whose INIT lists all
  N input and output addresses; the engines connect to every one. The others learn each engine
  from its first message on their input socket, or, after a restart of theirs (the engines'
  sockets reconnect by themselves and say nothing), from a utility call answered on their output
  socket (a probe, also run by a single process, for a gateway restarted under running engines);
  the facts of the handshake (ready response, ``num_gpu_blocks``) are shared through a file in the
  host's run directory. One process (N = 1) binds all three itself, as before.

Nothing here blocks the event loop: the handshake socket is a ``zmq.asyncio`` socket; the input and
output sockets are not libzmq's but Unix socket servers of the event loop speaking ZMTP
(:mod:`.zmtp`, D95): the engines' DEALER and PUSH sockets cannot tell, and a message costs no libzmq
signalling between threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson
import zmq
import zmq.asyncio

from common.serving import serving_place
from inference.routing.load_report import EngineLoad
from inference.routing.workers import EngineSpec, WorkerRecord
from inference.upstreams.engine import (
    ENGINE_OUTPUT_STEP,
    CommandResult,
    EngineClient,
    EngineHealth,
    EngineOutput,
    EngineRequest,
    Finish,
    ModelInfo,
    ProfileOptions,
    TokenizerBundle,
    TokenLogprobs,
)
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.zmq import codec
from inference.upstreams.zmq.addresses import ZmqAddressError, ZmqAddresses, bind, fnv1a_64, ipc_path, zmq_addresses
from inference.upstreams.zmq.logprobs import ChoiceLogprobs, TensorError
from inference.upstreams.zmq.ranks import EngineRank, RankState
from inference.upstreams.zmq.requests import engine_core_request, finish_of
from inference.upstreams.zmq.tensors import inline_aux_frames
from inference.upstreams.zmq.zmtp import PullServer, RouterServer

__all__ = ["EngineRank", "ZmqEngineClient"]

logger = logging.getLogger(__name__)

DEFAULT_HEALTH_TIMEOUT_SECS = 5.0
HEALTH_UTILITY = "is_sleeping"  # a utility every EngineCore answers, cheaply
PROBE_SECS = 0.5  # how often an engine not heard from is asked for
STATS_SHARE_SECS = 1.0  # several serving processes: how often the stats received are shared, at most


@dataclass(slots=True)
class _Flight:
    """One generation in flight: its engine requests (one per choice) and what arrived for them.
    A deque and one waiter rather than an ``asyncio.Queue``: a put is an append, and the generator
    is woken once however many of its outputs one engine step (or one drain) carried.

    A request that is not streamed (``whole``) is answered once per choice, at its end: the reader
    folds each plain step (tokens only: no finish, no logprobs) into ``early`` by itself, without
    waking the generator, while nothing is queued before it; the generator takes a choice's folded
    tokens just before that choice's next queued output (its finish, at the latest). The engine
    core sends every step of every request, so this is one generator step per choice instead of
    one per token."""

    rank: int
    choices: dict[str, int]  # engine request id → choice index
    whole: bool = False
    items: deque[codec.EngineCoreOutput | UpstreamFailure] = field(default_factory=deque)
    waiter: asyncio.Future[None] | None = None
    early: dict[str, codec.EngineCoreOutput] = field(default_factory=dict)  # engine request id → its folded steps

    def put(self, item: codec.EngineCoreOutput | UpstreamFailure) -> None:
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self, output: codec.EngineCoreOutput) -> None:
        """An engine output for this generation, from the reader: folded into ``early`` when the
        generation is not streamed, the output is a plain step and nothing is queued (so folded
        tokens always come before every queued output), else queued (and the generator woken)."""
        if (
            self.whole and not self.items and output.finish_reason is None and output.new_logprobs is None
            and output.new_prompt_logprobs_tensors is None
        ):  # fmt: skip
            folded = self.early.get(output.request_id)
            if folded is None:
                self.early[output.request_id] = output
            else:
                folded.new_token_ids.extend(output.new_token_ids)
                if output.num_cached_tokens > folded.num_cached_tokens:
                    folded.num_cached_tokens = output.num_cached_tokens
            return
        self.put(output)

    def next_queued(self, item: codec.EngineCoreOutput | UpstreamFailure) -> codec.EngineCoreOutput | UpstreamFailure:
        """``item`` (just taken from the queue), or its choice's folded steps first (``item`` put
        back at the head of the queue)."""
        if self.early and not isinstance(item, UpstreamFailure):
            folded = self.early.pop(item.request_id, None)
            if folded is not None:
                self.items.appendleft(item)
                return folded
        return item

    async def get(self) -> codec.EngineCoreOutput | UpstreamFailure:
        while not self.items:
            waiter = self.waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self.waiter = None
        return self.items.popleft()


class _Run:
    """The output the generator holds back while more of the same choice is already queued: the
    engine outputs that arrived together, folded into one (token ids joined, counts the latest), as
    long as none carries logprobs (those keep the engine's own steps) and the run has not finished.
    Mutable, so a fold is an ``extend``, not a new output per engine message."""

    __slots__ = ("index", "token_ids", "completion", "cached", "finish", "logprobs", "prompt_logprobs")

    def __init__(self, index: int, token_ids: list[int], completion: int, cached: int, finish: Finish | None,
                 logprobs: tuple[TokenLogprobs, ...] | None,
                 prompt_logprobs: tuple[TokenLogprobs | None, ...] | None) -> None:  # fmt: skip
        self.index = index
        self.token_ids = token_ids
        self.completion = completion
        self.cached = cached
        self.finish = finish
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs

    def takes(self, index: int, logprobs: object, prompt_logprobs: object) -> bool:
        """The next output of choice ``index`` (with these logprobs) folds into this run."""
        return (
            index == self.index and self.finish is None and logprobs is None and prompt_logprobs is None
            and self.logprobs is None and self.prompt_logprobs is None
        )  # fmt: skip

    def fold(self, token_ids: list[int], completion: int, cached: int, finish: Finish | None,
             logprobs: tuple[TokenLogprobs, ...] | None,
             prompt_logprobs: tuple[TokenLogprobs | None, ...] | None) -> None:  # fmt: skip
        """The choice's next output into this one, whatever it carries (a non-streamed choice:
        logprobs joined, one per token; the prompt's logprobs come once)."""
        self.token_ids.extend(token_ids)
        self.completion, self.cached, self.finish = completion, cached, finish
        if logprobs is not None:
            self.logprobs = logprobs if self.logprobs is None else self.logprobs + logprobs
        if self.prompt_logprobs is None:
            self.prompt_logprobs = prompt_logprobs

    def output(self, prompt_tokens: int) -> EngineOutput:
        if self.finish is None:  # mid-stream: the cheap builder, as the gRPC client's (one per streamed event)
            return ENGINE_OUTPUT_STEP(self.index, tuple(self.token_ids), prompt_tokens, self.completion, self.cached, 0,
                                      self.logprobs, self.prompt_logprobs)  # fmt: skip
        return EngineOutput(
            index=self.index, token_ids=tuple(self.token_ids), prompt_tokens=prompt_tokens,
            completion_tokens=self.completion, cached_tokens=self.cached, logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs, finish=self.finish,
        )  # fmt: skip


class ZmqEngineClient(EngineClient):
    """vLLM's EngineCore over ZMQ, for one ``ipc://PATH`` worker of ``dp_size`` engines."""

    runtime = "vllm"
    transport = "zmq"

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        model_id: str = "",
        dp_size: int = 1,
        handshake_address: str | None = None,
        eos_token_ids: tuple[int, ...] = (),
        tokenizer_path: str = "",
        max_model_len: int | None = None,
        health_timeout_secs: float = DEFAULT_HEALTH_TIMEOUT_SECS,
        client_index: int = 0,
        client_count: int = 1,
        facts_dir: Path | None = None,
    ) -> None:
        super().__init__(url, api_key=api_key)
        if dp_size < 1:
            raise ValueError("dp_size must be at least 1")
        # ZmqAddressError (a ValueError) for an address the spec refuses
        self.addresses: ZmqAddresses = zmq_addresses(url, handshake_address, client_index, client_count)
        self.client_index = client_index
        self.client_count = client_count
        self.shared = client_count > 1  # one of several serving processes' clients (D69)
        self._facts_dir, self._facts_key = facts_dir, f"zmq-{fnv1a_64(url.encode()):016x}"
        self.facts_path = facts_dir / f"{self._facts_key}.json" if facts_dir is not None else None
        # the scheduler stats this client received, for the others (the leader's load monitor)
        self.stats_path = self._stats_file(client_index)
        self.handshake_endpoint = self.addresses.handshake  # the bound one (tcp://HOST:* picks a port)
        self.model_id = model_id
        self.dp_size = dp_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer_path = tokenizer_path
        self.configured_max_model_len = max_model_len
        self.health_timeout_secs = health_timeout_secs
        self.ranks = [EngineRank(index) for index in range(dp_size)]
        self._flights: dict[str, _Flight] = {}  # engine request id → its generation
        self._utility: dict[int, asyncio.Future[codec.UtilityOutput]] = {}
        self._ready = asyncio.Event()
        self._context: zmq.asyncio.Context | None = None
        self._handshake: zmq.asyncio.Socket | None = None
        self._input: RouterServer | None = None  # requests to the engines (ZMTP on the event loop, D95)
        self._output: PullServer | None = None  # the engines' outputs (ZMTP on the event loop, D95)
        self._tasks: list[asyncio.Task[None]] = []
        self._first_handshake: asyncio.Future[None] | None = None  # the first wait for the engines (open)
        self._handshake_busy = False  # the handshake address was held by another process at the last try
        self._rotation = 0
        self.current_wave = 0
        self.engines_running = False

    @classmethod
    def for_worker(cls, record: WorkerRecord) -> ZmqEngineClient:
        """The client of a registered ZMQ worker: its dp_size, handshake address, model, tokenizer
        and context window from the record (EOS ids come with each request). Not bound yet: the
        first health check or request binds (:meth:`open`)."""
        spec = record.engine or EngineSpec()
        place = serving_place()  # under rungateway --workers N, this process is client place.index of N
        if place is None or place.count < 2:
            place = None
        return cls(
            record.url, api_key=record.api_key, model_id=record.model_id or "", dp_size=spec.dp_size or 1,
            handshake_address=spec.zmq_handshake_address, tokenizer_path=spec.tokenizer or "",
            max_model_len=spec.context_length, client_index=place.index if place else 0,
            client_count=place.count if place else 1, facts_dir=place.run_dir if place else None,
        )  # fmt: skip

    def use_eos_token_ids(self, eos_token_ids: tuple[int, ...]) -> None:
        if eos_token_ids and eos_token_ids != self.eos_token_ids:
            self.eos_token_ids = tuple(eos_token_ids)

    # Lifecycle.

    async def open(self, wait_secs: float, *, handshake: bool = False) -> bool:
        """Bind on first use and wait up to ``wait_secs`` for the engines to finish their handshake;
        once bound, answer at once whether they did. ``handshake``: this process answers the
        engines' handshake (one of several serving processes: the one running the health checks;
        a single one always does). Raises ``ZmqAddressError`` when an address is already bound."""
        if self._context is None:
            await self.start()
            if handshake:
                self._take_handshake()
            self._first_handshake = asyncio.ensure_future(self._await_ready_quietly(wait_secs))
        elif handshake:
            self._take_handshake()
        if self._first_handshake is not None and not self._first_handshake.done():
            await asyncio.shield(self._first_handshake)  # callers during the first wait share it
        return self._ready.is_set()

    async def _await_ready_quietly(self, wait_secs: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), wait_secs)

    async def start(self) -> None:
        """Bind the sockets and start answering engines (returns at once): the input and output
        sockets, and the handshake socket unless this is one of several serving processes' clients
        (:meth:`bind_handshake`). Raises ``ZmqAddressError`` when the handshake address (or a
        data-plane path) is already bound."""
        if self._context is not None:
            return
        context = zmq.asyncio.Context()
        try:
            handshake: zmq.asyncio.Socket | None = None
            if not self.shared:
                handshake = self._handshake_socket(context)
            # The data plane: ZMTP endpoints of the event loop, not libzmq sockets (D95). The input
            # ROUTER refuses an identity not connected (libzmq's ROUTER_MANDATORY: a gone engine is
            # an error, not a silent drop) and gives a restarted engine its identity back (HANDOVER).
            inputs = RouterServer(ipc_path(self.addresses.input), self._input_message)
            output = PullServer(ipc_path(self.addresses.output), self._output_message, self._output_lost)
            for server, address in ((inputs, self.addresses.input), (output, self.addresses.output)):
                try:
                    server.start()
                except OSError as exc:
                    inputs.close()
                    raise ZmqAddressError(f"cannot bind {address}: {exc}") from None
        except BaseException:
            context.destroy(linger=0)
            raise
        self._context, self._input, self._output = context, inputs, output
        self._tasks = []
        if handshake is not None:
            self._serve_handshake(handshake)
        self._tasks.append(asyncio.create_task(self._probe_loop(), name=f"zmq-probe {self.url}"))
        if self.stats_path is not None:
            self._tasks.append(asyncio.create_task(self._share_stats_loop(), name=f"zmq-stats {self.url}"))

    def _handshake_socket(self, context: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        handshake = context.socket(zmq.ROUTER)
        handshake.setsockopt(zmq.LINGER, 0)
        try:
            bind(handshake, self.addresses.handshake)
        except ZmqAddressError:
            handshake.close(linger=0)
            raise
        return handshake

    def _serve_handshake(self, handshake: zmq.asyncio.Socket) -> None:
        self._handshake = handshake
        self.handshake_endpoint = handshake.getsockopt_string(zmq.LAST_ENDPOINT)
        self._tasks.append(asyncio.create_task(self._handshake_loop(handshake), name=f"zmq-handshake {self.url}"))

    def bind_handshake(self) -> None:
        """Answer the engines' handshake from this process from now on (bind the handshake
        ROUTER, once; the client is started). One of several serving processes does, the one
        running the health checks; when it changes (the leader died), the next one binds it.
        Raises ``ZmqAddressError`` while the address is still bound (the old binder closing)."""
        if self._handshake is not None or self._context is None:
            return
        self._serve_handshake(self._handshake_socket(self._context))

    def _take_handshake(self) -> None:
        """:meth:`bind_handshake`, or a warning (once) while another process still holds the
        address: the engines in service need no handshake, and the next health check tries again."""
        try:
            self.bind_handshake()
        except ZmqAddressError as exc:
            if not self._handshake_busy:
                logger.warning("ZMQ worker %s: cannot answer its engines' handshake yet: %s", self.url, exc)
            self._handshake_busy = True
        else:
            self._handshake_busy = False

    @property
    def binds_handshake(self) -> bool:
        return self._handshake is not None

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until every engine finished its handshake; ``UpstreamFailure`` (TIMEOUT) after ``timeout``."""
        if self._context is None:
            await self.start()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            waiting = [rank.index for rank in self.ranks if rank.state is not RankState.READY]
            raise UpstreamFailure(
                FailureKind.TIMEOUT, f"engines {waiting} of {self.url} did not finish the handshake", timeout or 0.0
            ) from None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def close(self) -> None:
        if self._first_handshake is not None:
            self._first_handshake.cancel()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for server in (self._input, self._output):
            if server is not None:
                server.close()
        self._fail_all(f"the ZMQ worker {self.url} was closed")
        if self._context is not None:
            self._context.destroy(linger=0)  # closes every socket
        self._context = self._handshake = self._input = self._output = None

    # Background tasks.

    async def _handshake_loop(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            if len(frames) != 2:
                logger.warning("ZMQ handshake on %s: a message of %d frames ignored", self.url, len(frames))
                continue
            identity, payload = frames
            rank = self._rank_of(identity)
            try:
                message = codec.decode_handshake(payload)
            except ValueError as exc:
                logger.warning("ZMQ handshake on %s: %s", self.url, exc)
                continue
            status = message.get("status")
            if rank is None:
                logger.warning("ZMQ handshake on %s: %s from engine %d outside dp_size %d", self.url, status,
                               codec.engine_index(identity), self.dp_size)  # fmt: skip
                continue
            if status == "HELLO":
                if rank.state is not RankState.NEW:  # a restarted engine: it starts over
                    self._rank_gone(rank)
                init = codec.handshake_init(  # every client's addresses: the engine connects to each
                    list(self.addresses.inputs), list(self.addresses.outputs), data_parallel_size=self.dp_size
                )
                await socket.send_multipart((identity, init))
                rank.state = RankState.CONNECTED
            elif status == "READY" and rank.state is RankState.CONNECTED:
                rank.num_gpu_blocks = int(message.get("num_gpu_blocks") or 0)
                rank.state = RankState.STARTED
                self._share_facts()
                self._maybe_ready(rank)
            else:
                logger.warning("ZMQ handshake on %s: unexpected %s from engine %d in state %s", self.url,
                               status, rank.index, rank.state.value)  # fmt: skip

    def _input_message(self, frames: list[bytes]) -> None:
        """The input ROUTER only hears each engine's ready response (its registration): its
        identity, then the response."""
        rank = self._rank_of(frames[0]) if frames else None
        if rank is None or len(frames) < 2:
            return
        try:
            response = codec.decode_ready_response(frames[1])
        except msgspec.DecodeError as exc:
            logger.warning("ZMQ worker %s: engine %d's ready response does not decode: %s", self.url, rank.index, exc)
            return
        if not self.shared:
            rank.ready_response = response
        elif response:
            rank.ready_response = response
            self._share_facts()
        else:  # an engine that says nothing of itself here: what the others learned of it
            self._recall_facts()
        rank.registered = True
        self._maybe_ready(rank)

    async def _probe_loop(self) -> None:
        """An engine that registered with an earlier run of this process (the gateway or this
        serving process restarted; the engine's sockets reconnected by themselves and say
        nothing) is found by a utility call it answers on this process's output socket."""
        while True:
            waiting = [rank for rank in self.ranks if not rank.registered]
            if waiting:
                await asyncio.gather(*(self._probe(rank) for rank in waiting))
            await asyncio.sleep(PROBE_SECS)

    async def _probe(self, rank: EngineRank) -> None:
        try:
            async with asyncio.timeout(PROBE_SECS * 2):
                await self._call_utility(rank.index, HEALTH_UTILITY)
        except (TimeoutError, UpstreamFailure):
            return  # not connected (the input socket refuses the identity) or not answering
        if not rank.registered:
            rank.registered = True
            self._recall_facts()
            self._maybe_ready(rank)

    async def _share_stats_loop(self) -> None:
        """Each second at most, the scheduler stats this client received since, for the other
        serving processes: vLLM gives each step's stats to one client (the first with outputs in
        it), so the leader's load monitor would otherwise see only its own requests' steps."""
        shared = 0.0
        while True:
            await asyncio.sleep(STATS_SHARE_SECS)
            newest = max(rank.stats_at for rank in self.ranks)
            if newest <= shared or self.stats_path is None:
                continue
            ranks = {str(r.index): {"at": r.stats_at, "stats": r.latest_stats()} for r in self.ranks if r.stats_at}
            partial = self.stats_path.with_name(f".{self.stats_path.name}.{os.getpid()}")
            try:
                partial.write_bytes(orjson.dumps(ranks))
                os.replace(partial, self.stats_path)
            except OSError as exc:
                logger.warning("ZMQ worker %s: sharing the engines' stats failed: %s", self.url, exc)
            shared = newest

    def _stats_file(self, client_index: int) -> Path | None:
        if self._facts_dir is None:
            return None
        return self._facts_dir / f"{self._facts_key}-stats-{client_index}.json"

    def _fresher_stats(self) -> dict[int, dict[str, Any]]:
        """Per rank, stats another serving process received after this one's last (from their files)."""
        fresher: dict[int, tuple[float, dict[str, Any]]] = {}
        for index in range(self.client_count):
            path = self._stats_file(index)
            if index == self.client_index or path is None:
                continue
            try:
                ranks = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            for key, entry in (ranks.items() if isinstance(ranks, dict) else ()):
                if not key.isdigit() or int(key) >= self.dp_size or not isinstance(entry, dict):
                    continue
                at, stats = entry.get("at"), entry.get("stats")
                rank = int(key)
                if isinstance(at, (int, float)) and isinstance(stats, dict) and at > self.ranks[rank].stats_at:
                    if rank not in fresher or at > fresher[rank][0]:
                        fresher[rank] = (float(at), stats)
        return {rank: stats for rank, (_, stats) in fresher.items()}

    def _share_facts(self) -> None:
        """What this process learned of the engines in their handshake (num_gpu_blocks, the ready
        response), for the other serving processes (a whole file renamed into place)."""
        if self.facts_path is None:
            return
        ranks = {
            str(r.index): {"num_gpu_blocks": r.num_gpu_blocks, "ready_response": r.ready_response}
            for r in self.ranks if r.num_gpu_blocks or r.ready_response
        }  # fmt: skip
        partial = self.facts_path.with_name(f".{self.facts_path.name}.{os.getpid()}")
        try:
            known = self._read_facts()
            for index, facts in known.items():
                mine = ranks.setdefault(index, {"num_gpu_blocks": 0, "ready_response": {}})
                mine["num_gpu_blocks"] = mine["num_gpu_blocks"] or facts.get("num_gpu_blocks") or 0
                mine["ready_response"] = mine["ready_response"] or facts.get("ready_response") or {}
            partial.write_bytes(orjson.dumps({"url": self.url, "ranks": ranks}))
            os.replace(partial, self.facts_path)
        except OSError as exc:
            logger.warning("ZMQ worker %s: sharing the engines' facts failed: %s", self.url, exc)

    def _read_facts(self) -> dict[str, dict[str, Any]]:
        if self.facts_path is None:
            return {}
        try:
            data = orjson.loads(self.facts_path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        ranks = data.get("ranks") if isinstance(data, dict) else None
        return ranks if isinstance(ranks, dict) else {}

    def _recall_facts(self) -> None:
        """Fill in the engines' facts this process did not hear itself, from the shared file."""
        for index, facts in self._read_facts().items():
            if not index.isdigit() or int(index) >= self.dp_size or not isinstance(facts, dict):
                continue
            rank = self.ranks[int(index)]
            rank.num_gpu_blocks = rank.num_gpu_blocks or int(facts.get("num_gpu_blocks") or 0)
            if not rank.ready_response and isinstance(facts.get("ready_response"), dict):
                rank.ready_response = facts["ready_response"]

    def _output_message(self, frames: list[bytes]) -> None:
        if len(frames) == 1 and frames[0] == codec.ENGINE_CORE_DEAD:
            self._engines_died("the engine core died (ENGINE_CORE_DEAD)")
            return
        try:
            outputs = codec.decode_step(frames[0])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            logger.warning("ZMQ worker %s: outputs that do not decode: %s", self.url, exc)
            return
        self._take(outputs, frames)

    def _output_lost(self) -> None:
        """An engine's connection to the output socket dropped: its process is gone."""
        self._engines_died("an engine's connection to the gateway dropped")

    # State.

    def _rank_of(self, identity: bytes) -> EngineRank | None:
        if len(identity) != 2:
            return None
        index = codec.engine_index(identity)
        return self.ranks[index] if index < self.dp_size else None

    def _maybe_ready(self, rank: EngineRank) -> None:
        # An engine that handshook with another serving process, or with this gateway before it
        # restarted (its state here is new, or dead since a death frame), is served once it is
        # known on the input socket: registered is enough. One in its handshake waits for READY.
        started = rank.state in (RankState.STARTED, RankState.NEW, RankState.DEAD)
        if rank.registered and started:
            rank.state = RankState.READY
            logger.info("ZMQ worker %s: engine %d ready", self.url, rank.index)
        if all(r.state is RankState.READY for r in self.ranks):
            self._ready.set()

    def _rank_gone(self, rank: EngineRank) -> None:
        rank.state = RankState.NEW
        rank.registered = False
        self._ready.clear()

    def _engines_died(self, why: str) -> None:
        """Every request in flight ends at once; the worker is unserved until its engines
        handshake again (which engine died is not said, and vLLM treats any as all)."""
        logger.warning("ZMQ worker %s: %s; ending %d requests in flight", self.url, why, len(self._flights))
        for rank in self.ranks:
            rank.state = RankState.DEAD
            rank.registered = False
        self._ready.clear()
        self.engines_running = False
        self._fail_all(f"ZMQ worker {self.url}: {why}")

    def _fail_all(self, detail: str) -> None:
        """End every generation and utility call waiting on this worker (each its own failure)."""
        for flight in {id(f): f for f in self._flights.values()}.values():
            flight.put(UpstreamFailure(FailureKind.BROKEN, detail))
        for future in self._utility.values():
            if not future.done():
                future.set_exception(UpstreamFailure(FailureKind.BROKEN, detail))

    def _take(self, outputs: codec.EngineCoreOutputsRawStats, frames: list[bytes] | None = None) -> None:
        index = outputs.engine_index
        if 0 <= index < self.dp_size and codec.has_stats(outputs.scheduler_stats):
            self.ranks[index].raw_stats = outputs.scheduler_stats
            if self.shared:  # vLLM gives a step's stats to one client: the others may need them (loads)
                self.ranks[index].stats_at = time.time()
            if self.client_index and self.dp_size > 1:  # no wave_complete here: the wave from the stats
                wave = codec.decode_stats(outputs.scheduler_stats).get("current_wave")
                if isinstance(wave, int):
                    self.current_wave = max(self.current_wave, wave + 1)
        for output in outputs.outputs:
            flight = self._flights.get(output.request_id)
            if flight is not None:
                if frames is not None and len(frames) > 1:  # tensors in aux frames: the generator decodes them
                    inline_aux_frames(output.new_logprobs, frames)
                    inline_aux_frames(output.new_prompt_logprobs_tensors, frames)
                flight.take(output)
        utility = outputs.utility_output
        if utility is not None:
            future = self._utility.pop(utility.call_id, None)
            if future is not None and not future.done():
                future.set_result(utility)
        if outputs.wave_complete is not None:  # the engines paused: the next ADD starts a wave
            self.current_wave = outputs.wave_complete + 1
            self.engines_running = False
        elif outputs.start_wave is not None:  # an ADD arrived for a finished wave: wake the others
            self.current_wave = max(self.current_wave, outputs.start_wave)
            self.engines_running = True
            self._send_soon(self._wake_others(index))

    def _send_soon(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    # Sending.

    async def _send(self, rank: int, kind: codec.RequestType, payload: bytes) -> None:
        inputs = self._input
        if inputs is None:
            raise UpstreamFailure(FailureKind.CONNECT, f"the ZMQ worker {self.url} is not started")
        if not inputs.send(codec.engine_identity(rank), (kind.value, payload)):  # written at once
            raise UpstreamFailure(FailureKind.CONNECT, f"engine {rank} of {self.url} is unreachable: not connected")

    async def _wake_others(self, chosen: int) -> None:
        payload = codec.encode((self.current_wave, chosen))
        for rank in self.ranks:
            if rank.index != chosen and rank.state is RankState.READY:
                await self._send(rank.index, codec.RequestType.START_DP_WAVE, payload)

    def _serving(self) -> None:
        if not self._ready.is_set():
            raise UpstreamFailure(FailureKind.CONNECT, f"the engines of {self.url} are not connected")

    def _pick_rank(self, request: EngineRequest) -> int:
        wanted = request.data_parallel_rank
        if wanted is not None:
            if not 0 <= wanted < self.dp_size:
                raise UpstreamFailure.refused(f"data_parallel_rank {wanted} is outside dp_size {self.dp_size}")
            return wanted
        start = self._rotation
        self._rotation = (self._rotation + 1) % self.dp_size
        return min(range(self.dp_size), key=lambda r: (self.ranks[r].in_flight, (r - start) % self.dp_size))

    @property
    def max_model_len(self) -> int | None:
        """The context window: the smallest of what the engines reported and the configured one."""
        reported = [int(r.ready_response["max_model_len"]) for r in self.ranks if r.ready_response.get("max_model_len")]
        known = reported + ([self.configured_max_model_len] if self.configured_max_model_len else [])
        return min(known) if known else None

    def encode(self, request: EngineRequest, request_id: str, index: int) -> codec.EngineCoreRequest:
        """The EngineCoreRequest of choice ``index`` of ``request``."""
        return engine_core_request(
            request, request_id, index, eos_token_ids=self.eos_token_ids, max_model_len=self.max_model_len,
            current_wave=self.current_wave if self.dp_size > 1 else 0, client_index=self.client_index,
        )  # fmt: skip

    # The seam.

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if not self._ready.is_set():
            try:
                await self.open(self.health_timeout_secs)
            except ZmqAddressError as exc:
                raise UpstreamFailure(FailureKind.BROKEN, f"ZMQ worker {self.url}: {exc}") from None
        self._serving()
        n = max(1, request.sampling.n)
        base = self._engine_request_id(request.request_id)
        ids = {base if n == 1 else f"{i}_{base}": i for i in range(n)}
        if any(engine_id in self._flights for engine_id in ids):
            raise UpstreamFailure.refused(f"request id {request.request_id} is already running on {self.url}")
        rank = self._pick_rank(request)
        messages = [codec.encode(self.encode(request, engine_id, i)) for engine_id, i in ids.items()]
        # Not streamed: the caller only folds the outputs into one answer, so each choice's are
        # folded here (the plain steps by the reader itself) and given once, at its end, as a gRPC
        # engine answers a non-streamed request (the engine core sends every step regardless).
        whole = not request.stream
        flight = _Flight(rank=rank, choices=dict(ids), whole=whole)
        for engine_id in ids:
            self._flights[engine_id] = flight
        self.ranks[rank].in_flight += 1
        open_ids = set(ids)
        yielded = False
        try:
            for message in messages:
                await self._send(rank, codec.RequestType.ADD, message)
            # A client other than 0 hears no wave_complete (vLLM sends it to client 0): it wakes the
            # others with each request.
            if self.dp_size > 1 and (self.client_index or not self.engines_running):
                self.engines_running = True
                await self._wake_others(rank)
            completion = dict.fromkeys(ids.values(), 0)
            logprobs = {i: ChoiceLogprobs(request.sampling.top_logprobs) for i in ids.values()}
            cached = dict.fromkeys(ids.values(), 0)
            # Outputs already queued when one is taken are merged into it, a run per choice (as the
            # gRPC client merges the messages that arrived together): a burst of tokens costs the
            # pipeline one step and the client one write.
            prompt_tokens = len(request.input_ids)
            held: dict[int, _Run] = {}
            pending: _Run | None = None
            failure: UpstreamFailure | None = None
            while open_ids:
                if pending is not None and not flight.items:
                    yielded = True
                    yield pending.output(prompt_tokens)
                    pending = None
                item = flight.next_queued(flight.items.popleft() if flight.items else await flight.get())
                if isinstance(item, UpstreamFailure):
                    open_ids.clear()  # the engine is gone: nothing to abort
                    failure = item
                    break
                if item.request_id not in open_ids:  # a choice already ended (a late output after an abort)
                    continue
                index = ids[item.request_id]
                if item.finish_reason == codec.WireFinishReason.ERROR:
                    open_ids.discard(item.request_id)
                    failure = UpstreamFailure(FailureKind.BROKEN, f"the engine failed request {item.request_id}")
                    break
                try:
                    token_logprobs = logprobs[index].take(item)
                except TensorError as exc:  # the engine still runs it: the finally aborts it
                    failure = UpstreamFailure(FailureKind.BROKEN, f"engine request {item.request_id}: {exc}")
                    break
                completion[index] += len(item.new_token_ids)
                cached[index] = max(cached[index], item.num_cached_tokens)
                finish = None
                if item.finish_reason is not None:
                    open_ids.discard(item.request_id)
                    finish = finish_of(item, self.eos_token_ids)
                elif not item.new_token_ids:
                    continue
                prompt_logprobs = logprobs[index].pop_prompt()
                if whole:  # one output per choice, at its end
                    run = held.get(index)
                    if run is None:
                        held[index] = _Run(index, list(item.new_token_ids), completion[index], cached[index], finish,
                                           token_logprobs, prompt_logprobs)  # fmt: skip
                    else:
                        run.fold(item.new_token_ids, completion[index], cached[index], finish, token_logprobs,
                                 prompt_logprobs)  # fmt: skip
                    if finish is not None:
                        yielded = True
                        yield held.pop(index).output(prompt_tokens)
                    continue
                if pending is not None and pending.takes(index, token_logprobs, prompt_logprobs):
                    pending.token_ids.extend(item.new_token_ids)
                    pending.completion, pending.cached, pending.finish = completion[index], cached[index], finish
                    continue
                if pending is not None:
                    yielded = True
                    yield pending.output(prompt_tokens)
                pending = _Run(index, list(item.new_token_ids), completion[index], cached[index], finish,
                               token_logprobs, prompt_logprobs)  # fmt: skip
            if pending is not None:
                yielded = True
                yield pending.output(prompt_tokens)
            if failure is not None:
                raise failure.broke_off() if yielded else failure
        finally:
            for engine_id in ids:
                self._flights.pop(engine_id, None)
            self.ranks[rank].in_flight -= 1
            if open_ids:  # closed or cancelled before the end: stop the engine's work
                with contextlib.suppress(UpstreamFailure):
                    await self._send(rank, codec.RequestType.ABORT, codec.encode(sorted(open_ids)))

    def _engine_request_id(self, request_id: str) -> str:
        """The id the engine knows a request by: the gateway's, and with several serving processes
        the client's index after it (``ID-cI``), so that two processes' requests never share one
        (a client may name its request, ``rid``), as vLLM's scale-out front ends make theirs unique."""
        return f"{request_id}-c{self.client_index}" if self.shared else request_id

    async def abort(self, request_id: str) -> None:
        """Send ABORT for the request's choices and end them here with finish ``abort``: the engine
        core sends nothing for a request its client aborted (vLLM's front end ends the stream itself)."""
        base = self._engine_request_id(request_id)
        flight = self._flights.get(base) or next(
            (f for f in self._flights.values() if any(i.split("_", 1)[-1] == base for i in f.choices)), None
        )  # the request id, or the parent id of n choices
        if flight is None:
            return
        with contextlib.suppress(UpstreamFailure):
            await self._send(flight.rank, codec.RequestType.ABORT, codec.encode(sorted(flight.choices)))
        for engine_id in flight.choices:
            flight.put(codec.EngineCoreOutput(engine_id, [], finish_reason=codec.WireFinishReason.ABORT))

    async def _call_utility(self, rank: int, method: str, *args: Any) -> codec.UtilityOutput:
        call_id = uuid.uuid4().int >> 64
        future: asyncio.Future[codec.UtilityOutput] = asyncio.get_running_loop().create_future()
        self._utility[call_id] = future
        try:
            call = (self.client_index, call_id, method, list(args))  # answered on this client's output socket
            await self._send(rank, codec.RequestType.UTILITY, codec.encode(call))
            return await future
        finally:
            self._utility.pop(call_id, None)

    async def health(self) -> EngineHealth:
        """Every engine answers a utility call within the health timeout. A timeout is an
        engine that stopped answering: the requests in flight end. The first check binds the
        worker's sockets and gives the engines the health timeout to dial in; the process that
        checks health answers the engines' handshake (one of several serving processes: the
        leader, D69)."""
        try:
            await self.open(self.health_timeout_secs, handshake=True)
        except ZmqAddressError as exc:
            return EngineHealth(False, str(exc))
        if not self._ready.is_set():
            waiting = [rank.index for rank in self.ranks if rank.state is not RankState.READY]
            return EngineHealth(False, f"engines {waiting} are not connected")
        try:
            async with asyncio.timeout(self.health_timeout_secs):
                answers = await asyncio.gather(*(self._call_utility(r.index, HEALTH_UTILITY) for r in self.ranks))
        except TimeoutError:
            self._engines_died(f"no answer to a health check within {self.health_timeout_secs:g}s")
            return EngineHealth(False, "health check timed out")
        except UpstreamFailure as failure:
            return EngineHealth(False, failure.detail)
        failed = [answer.failure_message for answer in answers if answer.failure_message]
        return EngineHealth(not failed, "; ".join(str(f) for f in failed))

    async def model_info(self) -> ModelInfo:
        first = next((r.ready_response for r in self.ranks if r.ready_response), {})
        return ModelInfo(
            model_path=self.model_id,
            served_model_name=self.model_id,
            tokenizer_path=self.tokenizer_path,
            max_context_length=self.max_model_len,
            eos_token_ids=self.eos_token_ids,
            max_req_input_len=(self.max_model_len - 1) if self.max_model_len else None,
            model_type=str(first.get("model_type", "")),
        )

    async def server_info(self) -> dict[str, Any]:
        return {
            "transport": "zmq",
            "runtime": self.runtime,
            "model_id": self.model_id,
            "dp_size": self.dp_size,
            "handshake_address": self.addresses.handshake,
            "client_index": self.client_index,
            "client_count": self.client_count,
            "max_model_len": self.max_model_len,
            "engines": [
                {"dp_rank": r.index, "state": r.state.value, "num_gpu_blocks": r.num_gpu_blocks, **r.ready_response}
                for r in self.ranks
            ],
        }

    async def loads(self) -> tuple[EngineLoad, ...]:
        fresher = self._fresher_stats() if self.shared else {}
        return tuple(rank.load(fresher.get(rank.index)) for rank in self.ranks)

    async def flush_cache(self) -> CommandResult:
        raise self.unsupported("FlushCache")  # the spec: flush skips ZMQ workers

    async def start_profile(self, options: ProfileOptions) -> CommandResult:
        raise self.unsupported("StartProfile")

    async def stop_profile(self) -> CommandResult:
        raise self.unsupported("StopProfile")

    async def tokenizer(self) -> TokenizerBundle:
        raise self.unsupported("GetTokenizer (the engine core has no tokenizer: configure a local tokenizer path)")

    @classmethod
    def offers(cls, rpc: str) -> bool:
        return rpc not in ("FlushCache", "StartProfile", "StopProfile", "GetTokenizer", "Embed")
