"""The SGLang gRPC stand-in as one side of prefill/decode disaggregation: ``Generate`` must carry
``disaggregated_params`` (bootstrap_host, bootstrap_port, bootstrap_room), else INVALID_ARGUMENT;
the two sides meet by bootstrap_room exactly as the HTTP stand-ins do (:mod:`standins.pd_worker`):
a prefill announces each room's KV on its bootstrap server (an HTTP listener on its bootstrap port),
a decode asks ``bootstrap_host:bootstrap_port`` before it generates and fails (INTERNAL) when the KV
does not come within its timeout or the prefill failed.

Faults on command: a prompt marker ``[[pd:NAME]]`` in the request's original text, NAME one of
:data:`standins.pd_worker.PD_FAULTS` (``prefill_fail`` and ``decode_fail`` abort with INTERNAL, the
``_drop`` faults with UNAVAILABLE, the ``_hang`` faults never answer); or ``faults`` in the config. The bootstrap and transfer faults abort with SGLang's own messages (as
:mod:`standins.pd_worker` answers them), as does a decode whose KV does not come.

In-process::

    server = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=...), PdWorkerConfig("prefill"))
    await server.start()   # server.url, server.bootstrap_port, server.pd (a PdState)
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aiohttp import web

from protos import sglang_scheduler_pb2 as sg
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineState, ScriptedEngine, start_grpc_server
from standins.grpc_services import SglangService
from standins.pd_worker import PD_FAULTS, PdState, PdWorkerConfig, bootstrap_app, kv_problem_report, reported_fault, wait_for_kv

__all__ = ["GrpcPdServer", "SglangPdService"]

_MARKER = re.compile(r"\[\[pd:([a-z_]+)\]\]")
_Context = grpc.aio.ServicerContext[Any, Any]


class SglangPdService(SglangService):
    """``SglangScheduler`` in a PD role."""

    def __init__(self, engine: ScriptedEngine, pd: PdState) -> None:
        super().__init__(engine)
        self.pd = pd

    def _faults(self, text: str) -> frozenset[str]:
        role = self.pd.config.role
        named = [name for name in _MARKER.findall(text) if name in PD_FAULTS]
        return frozenset(f[len(role) + 1:] for f in (*self.pd.config.faults, *named) if f.startswith(role + "_"))

    async def Generate(self, request: sg.GenerateRequest, context: _Context) -> AsyncIterator[sg.GenerateResponse]:
        params = request.disaggregated_params
        if not request.HasField("disaggregated_params") or not params.bootstrap_host or params.bootstrap_port <= 0 or params.bootstrap_room < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "Disaggregated request requires disaggregated_params (bootstrap_host, bootstrap_port, bootstrap_room)",
            )
        pd = self.pd
        room = params.bootstrap_room
        pd.received.append(
            {"path": "Generate", "bootstrap_host": params.bootstrap_host, "bootstrap_port": params.bootstrap_port,
             "bootstrap_room": room}
        )
        faults = self._faults(request.tokenized.original_text)
        role = pd.config.role
        try:
            if "hang" in faults:
                await asyncio.Event().wait()
            reported = reported_fault(role, faults, room)
            if "fail" in faults or "drop" in faults or reported is not None:
                if pd.failure_gate is not None:
                    await pd.failure_gate.wait()
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


class GrpcPdServer:
    """The SGLang gRPC stand-in in a PD role, with a prefill's bootstrap server, in the running loop."""

    def __init__(self, config: GrpcEngineConfig, pd: PdWorkerConfig) -> None:
        if config.runtime != "sglang":
            raise ValueError("the gRPC PD stand-in speaks SGLang's service (disaggregated_params)")
        self.config = config
        self.state = GrpcEngineState()
        self.engine = ScriptedEngine(config, self.state)
        self.pd = PdState(pd)
        self._server: grpc.aio.Server | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.bootstrap_port: int | None = None

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        # The bootstrap server also holds the session a decode asks prefill workers with.
        runner = web.AppRunner(bootstrap_app(self.pd), access_log=None, handler_cancellation=True)
        await runner.setup()
        self._runner = runner
        bootstrap_port = self.pd.config.bootstrap_port or 0
        if self.pd.config.role == "prefill":
            await web.TCPSite(runner, host, bootstrap_port).start()
            self.bootstrap_port = int(runner.addresses[0][1])
        self._server, self.port = await start_grpc_server(SglangPdService(self.engine, self.pd).handler(), host, port)
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
