"""TokenSpeed's encode/prefill/decode disaggregation (EPD) as stand-ins, on the project's protos.

:class:`GrpcEncoderServer` is an encode worker: ``tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode``
beside TokenSpeed's scheduler service (health, model info, loads: what the gateway registers and
watches a worker by), and a bootstrap server (an HTTP listener on its bootstrap port) where it
announces each room's embedding as ready, as :mod:`standins.pd_worker`'s prefill side announces KV.
Encode checks what it receives and answers INVALID_ARGUMENT otherwise, as a real encoder refuses
input its vision tower cannot take: a ``request_id``; exactly one assignment per item, each with a
room in [0, 2^63 - 1); each item an IMAGE with a 32-byte ``content_hash``, an int64 [1, 3]
``image_grid_thw`` (t, h, w; h and w multiples of merge_size) in ``model_specific_tensors``, one
placeholder range of ``t * h * w / merge_size^2`` tokens and its ``placeholder_token_id``, and an
inline ``encoder_input`` of dtype bfloat16, float16 or float32 and shape [t * h * w, 3 *
temporal_patch_size * patch_size^2] whose bytes are exactly that many values (the sizes from the
``preprocessor_config.json`` beside its tokenizer, Qwen2-VL's 14/2/2 when there is none). Faults on
command (``server.faults``): ``fail`` (INTERNAL), ``drop`` (UNAVAILABLE),
``refuse`` (``accepted`` false), ``hang`` (never answers); a failed encode announces nothing, so the
prefill waiting for its embedding waits until its own timeout (as an engine's would).

:class:`GrpcTokenSpeedPdServer` is a TokenSpeed prefill or decode worker: Generate must carry
``kv_bootstrap_info`` (else INVALID_ARGUMENT) and the two sides meet by room exactly as
:mod:`standins.grpc_pd`'s SGLang ones do (its ``[[pd:NAME]]`` faults too). A prefill whose request
carries ``encode_bootstrap_info`` asks each item's ``bootstrap_host:bootstrap_port`` for its room's
embedding before it answers, and fails (INTERNAL) when one does not come within its timeout; it also
needs one ``mm_inputs`` item per rendezvous whose placeholder range holds that item's placeholder token
in its prompt ids (recorded in ``service.mm_received``); a decode must not get ``encode_bootstrap_info``
(INVALID_ARGUMENT).

``python manage.py runmockworker --grpc --runtime tokenspeed --role encode|prefill|decode --tokenizer DIR
[--bootstrap-port N] [--encode-fault fail|drop|refuse|hang]``, or in-process::

    encoder = GrpcEncoderServer(GrpcEngineConfig(runtime="tokenspeed", tokenizer=...))
    await encoder.start()      # encoder.url, encoder.bootstrap_port, encoder.received, encoder.faults
    prefill = GrpcTokenSpeedPdServer(GrpcEngineConfig(runtime="tokenspeed", ...), PdWorkerConfig("prefill"))
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from protos import common_pb2, tokenspeed_encoder_pb2 as te
from protos import tokenspeed_scheduler_pb2 as ts
from standins.grpc_engine import SERVER_OPTIONS, GrpcEngineConfig, GrpcEngineState, ScriptedEngine
from standins.grpc_services import EngineService, TokenSpeedService
from standins.pd_worker import (
    PD_FAULTS, PdState, PdWorkerConfig, bootstrap_app, kv_problem_report, reported_fault, wait_for_kv,
)  # fmt: skip

__all__ = ["ENCODER_FAULTS", "GrpcEncoderServer", "GrpcTokenSpeedPdServer", "TokenSpeedPdService"]

ENCODER_FAULTS = ("fail", "drop", "refuse", "hang")
MAX_ROOM = 2**63 - 1
_MARKER = re.compile(r"\[\[pd:([a-z_]+)\]\]")
_Context = grpc.aio.ServicerContext[Any, Any]


async def _serve(handlers: tuple[grpc.GenericRpcHandler, ...], host: str, port: int) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers(handlers)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    return server, bound


_ITEM_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}


def vision_sizes(tokenizer: str | None) -> tuple[int, int, int]:
    """(patch_size, temporal_patch_size, merge_size) of the model beside ``tokenizer`` (its
    ``preprocessor_config.json``), Qwen2-VL's (14, 2, 2) when it has none."""
    path = Path(tokenizer or "")
    try:
        config = json.loads(((path if path.is_dir() else path.parent) / "preprocessor_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    return int(config.get("patch_size", 14)), int(config.get("temporal_patch_size", 2)), int(config.get("merge_size", 2))


def grid_of(item: ts.MultimodalItem) -> tuple[int, ...] | None:
    """The item's ``image_grid_thw`` (t, h, w), None when it is not an int64 [1, 3] tensor."""
    grid = item.model_specific_tensors.get("image_grid_thw")
    if grid is None or grid.dtype != "int64" or list(grid.shape) != [1, 3] or len(grid.inline) != 24:
        return None
    return tuple(int.from_bytes(grid.inline[i : i + 8], "little", signed=True) for i in (0, 8, 16))


def _item_problem(item: ts.MultimodalItem, sizes: tuple[int, int, int]) -> str | None:
    patch, temporal, merge = sizes
    if item.modality != common_pb2.IMAGE:
        return "modality must be IMAGE"
    if len(item.content_hash) != 32:
        return "content_hash must be a SHA-256"
    grid = grid_of(item)
    if grid is None or min(grid) <= 0 or grid[1] % merge or grid[2] % merge:
        return f"model_specific_tensors.image_grid_thw must be int64 [1, 3] (t, h, w), h and w multiples of {merge}"
    tokens = math.prod(grid) // (merge * merge)
    if [(p.length) for p in item.placeholders] != [tokens] or not item.HasField("placeholder_token_id"):
        return f"one placeholder range of {tokens} tokens and its placeholder_token_id are required"
    tensor = item.encoder_input
    if tensor.WhichOneof("payload") != "inline" or not tensor.inline:
        return "encoder_input must be an inline tensor"
    expected = [math.prod(grid), 3 * temporal * patch * patch]
    if tensor.dtype not in _ITEM_SIZES or list(tensor.shape) != expected:
        return f"encoder_input must be a bfloat16, float16 or float32 tensor of shape {expected}"
    if len(tensor.inline) != math.prod(expected) * _ITEM_SIZES[tensor.dtype]:
        return "encoder_input's bytes do not hold its shape's values"
    return None


class TokenSpeedEncoderService(EngineService):
    """``tokenspeed.grpc.encoder.TokenSpeedEncoder``: Encode, checked, faults on command."""

    runtime = "tokenspeed"
    descriptor = te.DESCRIPTOR.services_by_name["TokenSpeedEncoder"]

    def __init__(self, engine: ScriptedEngine, owner: GrpcEncoderServer) -> None:
        super().__init__(engine)
        self.owner = owner
        self.sizes = vision_sizes(owner.config.tokenizer)

    async def Encode(self, request: te.EncodeRequest, context: _Context) -> te.EncodeResponse:
        owner = self.owner
        items = list(request.mm_inputs.items)
        rooms = [assignment.bootstrap_room for assignment in request.items]
        problem = None
        if not request.request_id:
            problem = "request_id is required"
        elif not items or len(items) != len(rooms):
            problem = "one assignment (items) per multimodal item is required"
        elif any(not 0 <= room < MAX_ROOM for room in rooms):
            problem = "bootstrap_room must be in [0, 2^63 - 1)"
        else:
            problem = next((p for p in (_item_problem(item, self.sizes) for item in items) if p is not None), None)
        if problem is not None:
            owner.invalid += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        owner.received.append(
            {"request_id": request.request_id, "rooms": rooms, "hashes": [item.content_hash for item in items],
             "sizes": [len(item.encoder_input.inline) for item in items],
             "shapes": [list(item.encoder_input.shape) for item in items],
             "dtypes": [item.encoder_input.dtype for item in items], "grids": [grid_of(item) for item in items],
             "placeholders": [[(p.offset, p.length) for p in item.placeholders] for item in items]}
        )  # fmt: skip
        faults = owner.faults
        # A failed encode hands nothing over: the prefill waiting for the room's embedding waits on.
        if "hang" in faults:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                owner.cancelled += 1
                raise
        if faults & {"fail", "drop", "refuse"}:
            if "refuse" in faults:
                return te.EncodeResponse(accepted=False)
            code = grpc.StatusCode.UNAVAILABLE if "drop" in faults else grpc.StatusCode.INTERNAL
            await context.abort(code, "encode failed on command")
        owner.pd.settle(rooms, True)  # the embedding handed to the room
        return te.EncodeResponse(accepted=True)


class GrpcEncoderServer:
    """A TokenSpeed encode worker stand-in (Encode and the scheduler's control RPCs) with its
    bootstrap server, in the running loop."""

    def __init__(self, config: GrpcEngineConfig, faults: tuple[str, ...] = (), bootstrap_port: int | None = None) -> None:
        unknown = [fault for fault in faults if fault not in ENCODER_FAULTS]
        if unknown:
            raise ValueError(f"unknown encoder fault {unknown[0]!r} (one of {', '.join(ENCODER_FAULTS)})")
        self.config = config
        self.engine = ScriptedEngine(config, GrpcEngineState())
        self.faults: set[str] = set(faults)
        # The rooms it announced; a PdState in the prefill role is the announcing side of the rendezvous.
        self.pd = PdState(PdWorkerConfig("prefill", bootstrap_port=bootstrap_port))
        self.received: list[dict[str, Any]] = []
        self.invalid = 0
        self.cancelled = 0
        self._server: grpc.aio.Server | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.bootstrap_port = 0

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        runner = web.AppRunner(bootstrap_app(self.pd), access_log=None, handler_cancellation=True)
        await runner.setup()
        self._runner = runner
        await web.TCPSite(runner, host, self.pd.config.bootstrap_port or 0).start()
        self.bootstrap_port = int(runner.addresses[0][1])
        handlers = (TokenSpeedEncoderService(self.engine, self).handler(), TokenSpeedService(self.engine).handler())
        self._server, self.port = await _serve(handlers, host, port)
        return self.port

    async def stop(self, grace: float | None = 0.5) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


class TokenSpeedPdService(TokenSpeedService):
    """``TokenSpeedScheduler`` in a PD role; a prefill receives the items' embeddings first."""

    def __init__(self, engine: ScriptedEngine, pd: PdState) -> None:
        super().__init__(engine)
        self.pd = pd
        self.encode_received: list[list[dict[str, int | str]]] = []
        self.mm_received: list[list[dict[str, Any]]] = []  # per request: each item's grid, range, pixels sent
        self.embedding_failures = 0

    def _faults(self, text: str) -> frozenset[str]:
        role = self.pd.config.role
        named = [name for name in _MARKER.findall(text) if name in PD_FAULTS]
        return frozenset(f[len(role) + 1:] for f in (*self.pd.config.faults, *named) if f.startswith(role + "_"))

    async def _embeddings(self, request: ts.GenerateRequest, context: _Context) -> None:
        """A prefill's wait for each item's embedding at its encode worker's room."""
        items = list(request.encode_bootstrap_info.items)
        self.encode_received.append([
            {"item_index": i.item_index, "bootstrap_host": i.bootstrap_host, "bootstrap_port": i.bootstrap_port,
             "bootstrap_room": i.bootstrap_room}
            for i in items
        ])  # fmt: skip
        if any(not i.bootstrap_host or i.bootstrap_port <= 0 or not 0 <= i.bootstrap_room < MAX_ROOM for i in items):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "encode_bootstrap_info needs host, port and room per item")
        if [i.item_index for i in items] != list(range(len(items))):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "encode_bootstrap_info item_index must count from 0")
        # Each item's place in the prompt: its range must hold its placeholder token and nothing else.
        ids = request.tokenized.input_ids
        mm = list(request.mm_inputs.items)
        self.mm_received.append([
            {"grid": grid_of(m), "placeholders": [(p.offset, p.length) for p in m.placeholders],
             "placeholder_token_id": m.placeholder_token_id, "pixels": m.HasField("encoder_input")}
            for m in mm
        ])  # fmt: skip
        if len(mm) != len(items):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "mm_inputs needs one item per encode_bootstrap_info item")
        for m in mm:
            for p in m.placeholders:
                span = ids[p.offset : p.offset + p.length]
                if p.length == 0 or len(span) != p.length or any(t != m.placeholder_token_id for t in span):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a placeholder range must hold its placeholder tokens")
        problems = await asyncio.gather(
            *(wait_for_kv(self.pd, i.bootstrap_host, i.bootstrap_port, i.bootstrap_room) for i in items)
        )
        problem = next((p for p in problems if p is not None), None)
        if problem is not None:
            self.embedding_failures += 1
            await context.abort(grpc.StatusCode.INTERNAL, f"Prefill embedding receive failed: {problem}")

    async def Generate(self, request: ts.GenerateRequest, context: _Context) -> AsyncIterator[ts.GenerateResponse]:
        params = request.kv_bootstrap_info
        if not request.HasField("kv_bootstrap_info") or not params.bootstrap_host or params.bootstrap_port <= 0 or params.bootstrap_room < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "Disaggregated request requires kv_bootstrap_info (bootstrap_host, bootstrap_port, bootstrap_room)",
            )
        pd = self.pd
        role = pd.config.role
        room = params.bootstrap_room
        pd.received.append(
            {"path": "Generate", "bootstrap_host": params.bootstrap_host, "bootstrap_port": params.bootstrap_port,
             "bootstrap_room": room}
        )  # fmt: skip
        faults = self._faults(request.tokenized.original_text)
        try:
            if request.HasField("encode_bootstrap_info"):
                if role != "prefill":
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a decode takes no encode_bootstrap_info")
                await self._embeddings(request, context)
            if "hang" in faults:
                await asyncio.Event().wait()
            reported = reported_fault(role, faults, room)
            if "fail" in faults or "drop" in faults or reported is not None:
                if role == "prefill":
                    pd.failed += 1
                    pd.settle([room], False)
                code = grpc.StatusCode.UNAVAILABLE if "drop" in faults else grpc.StatusCode.INTERNAL
                await context.abort(code, reported or f"{role} failed on command ([[pd:...]])")
            if role == "prefill":
                pd.ready += 1
                pd.settle([room], True)
            else:
                pd.kv_waits += 1
                problem = await wait_for_kv(pd, params.bootstrap_host, params.bootstrap_port, room)
                if problem is not None:
                    pd.kv_failures += 1
                    await context.abort(grpc.StatusCode.INTERNAL, kv_problem_report(room, problem))
            async for answer in super().Generate(request, context):
                yield answer
        except asyncio.CancelledError:
            pd.cancelled += 1
            if role == "prefill":
                pd.settle([room], False)
            raise
        except Exception:
            if role == "prefill":
                pd.settle([room], False)
            raise


class GrpcTokenSpeedPdServer:
    """The TokenSpeed gRPC stand-in in a PD role, with a prefill's bootstrap server, in the running loop."""

    def __init__(self, config: GrpcEngineConfig, pd: PdWorkerConfig) -> None:
        if config.runtime != "tokenspeed":
            raise ValueError("this PD stand-in speaks TokenSpeed's service (kv_bootstrap_info)")
        self.config = config
        self.engine = ScriptedEngine(config, GrpcEngineState())
        self.pd = PdState(pd)
        self.service = TokenSpeedPdService(self.engine, self.pd)
        self._server: grpc.aio.Server | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.bootstrap_port: int | None = None

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        # The bootstrap server also holds the session this side asks other bootstrap servers with.
        runner = web.AppRunner(bootstrap_app(self.pd), access_log=None, handler_cancellation=True)
        await runner.setup()
        self._runner = runner
        if self.pd.config.role == "prefill":
            await web.TCPSite(runner, host, self.pd.config.bootstrap_port or 0).start()
            self.bootstrap_port = int(runner.addresses[0][1])
        self._server, self.port = await _serve((self.service.handler(),), host, port)
        return self.port

    async def stop(self, grace: float | None = 0.5) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()
