"""The vLLM gRPC stand-in as one side of sequential prefill/decode disaggregation, its KV handed over
by ``kv_transfer_params`` as vLLM's KV connectors do (the connector named by the worker's config):

* NIXL (``NixlConnector``): a prefill tagged ``{"do_remote_decode": true}`` in
  ``kv_transfer_params_json`` keeps the prompt's KV (a fresh block id) and returns, in its
  GenerateComplete's ``kv_transfer_params_json``, where to pull it (``do_remote_prefill``,
  ``remote_engine_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``); untagged, it returns
  nothing. A decode with those params pulls the block from ``remote_host:remote_port``.
* Mooncake (``MooncakeConnector``, push-based): a prefill returns nothing; its KV is keyed by the
  ``transfer_id`` of a tagged request, else by the request id. A decode with a ``transfer_id`` and
  ``remote_bootstrap_addr`` pulls by the transfer id; with the typed ``kv_transfer_params``
  (remote_host, remote_port) by its request id.

The KV is announced and fetched on the prefill's bootstrap server (an HTTP listener, as
:mod:`standins.grpc_pd`'s); a decode whose KV does not come within its timeout, or whose prefill
failed, ends the request as vLLM does when a KV load fails under ``kv_load_failure_policy: fail``:
one GenerateComplete with finish reason ``error`` and no tokens (``pd.kv_failures`` counts it). A
decode without params recomputes the prompt, as vLLM's does. Faults on command: ``[[pd:NAME]]`` in
the prompt text, as in :mod:`standins.grpc_pd` (``decode_transfer_fail``: the decode's KV load fails
as above; the SGLang-only bootstrap and prefill transfer faults do not apply to vLLM and are
ignored), and ``[[pd:prefill_lose_kv]]``: the prefill answers but its KV never becomes available.

In-process::

    server = VllmPdServer(GrpcEngineConfig(runtime="vllm", tokenizer=...), PdWorkerConfig("prefill"), "NixlConnector")
    await server.start()   # server.url, server.bootstrap_port, server.pd (a PdState)
"""

from __future__ import annotations

import asyncio
import random
import re
import zlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import grpc
import orjson
from aiohttp import web

from protos import vllm_engine_pb2 as vl
from standins.grpc_engine import SERVER_OPTIONS, GrpcEngineConfig, GrpcEngineState, ScriptedEngine
from standins.grpc_services import VllmService
from standins.pd_worker import PD_FAULTS, PdState, PdWorkerConfig, bootstrap_app, wait_for_kv

__all__ = ["CONNECTORS", "LOSE_KV", "MOONCAKE", "NIXL", "VllmPdServer", "VllmPdService"]

NIXL = "NixlConnector"
MOONCAKE = "MooncakeConnector"
CONNECTORS = {"nixl": NIXL, "mooncake": MOONCAKE}  # runmockworker --kv-connector
# Besides PD_FAULTS: a prefill that answers but never makes its KV available (the decode's pull times out).
LOSE_KV = "prefill_lose_kv"
_MARKER = re.compile(r"\[\[pd:([a-z_]+)\]\]")
_Context = grpc.aio.ServicerContext[Any, Any]


def _key(text: str) -> int:
    """A bootstrap room for a transfer id or request id."""
    return zlib.crc32(text.encode())


class VllmPdService(VllmService):
    """``VllmEngine`` in a PD role with a KV connector."""

    def __init__(self, engine: ScriptedEngine, pd: PdState, connector: str, engine_id: str, host: str) -> None:
        super().__init__(engine)
        self.pd = pd
        self.connector = connector
        self.engine_id = engine_id
        self.host = host
        self.bootstrap_port: int | None = None

    async def GetServerInfo(self, request: vl.GetServerInfoRequest, context: _Context) -> vl.GetServerInfoResponse:
        """vLLM's answer, with the KV connector, role and engine id a PD engine reports."""
        answer = await super().GetServerInfo(request, context)
        answer.kv_connector = self.connector
        answer.kv_role = "kv_producer" if self.pd.config.role == "prefill" else "kv_consumer"
        answer.kv_engine_id = self.engine_id
        return answer

    def _faults(self, text: str) -> frozenset[str]:
        role = self.pd.config.role
        named = [name for name in _MARKER.findall(text) if name in PD_FAULTS or name == LOSE_KV]
        return frozenset(f[len(role) + 1:] for f in (*self.pd.config.faults, *named) if f.startswith(role + "_"))

    async def Generate(self, request: vl.GenerateRequest, context: _Context) -> AsyncIterator[vl.GenerateResponse]:
        pd = self.pd
        role = pd.config.role
        params: dict[str, Any] | None = None
        if request.HasField("kv_transfer_params_json"):
            try:
                loaded = orjson.loads(request.kv_transfer_params_json)
            except orjson.JSONDecodeError:
                loaded = None
            if not isinstance(loaded, dict):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "kv_transfer_params_json must be a JSON object")
            params = loaded
        typed = (
            (request.kv_transfer_params.remote_host, request.kv_transfer_params.remote_port)
            if request.HasField("kv_transfer_params") else None
        )  # fmt: skip
        sampling = request.sampling_params
        pd.received.append({
            "path": "Generate", "request_id": request.request_id, "kv_transfer_params_json": params,
            "kv_transfer_params": typed, "stream": request.stream,
            "max_tokens": sampling.max_tokens if sampling.HasField("max_tokens") else None, "n": sampling.n,
        })  # fmt: skip
        faults = self._faults(request.tokenized.original_text)
        try:
            if role == "prefill":
                async for answer in self._prefill(request, params, faults, context):
                    yield answer
            elif not await self._fetch_kv(request, params, typed, faults, context):
                # vLLM's answer to a KV load that failed (kv_load_failure_policy "fail").
                yield vl.GenerateResponse(complete=vl.GenerateComplete(
                    finish_reason="error", prompt_tokens=len(request.tokenized.input_ids),
                ))  # fmt: skip
            else:
                async for answer in super().Generate(request, context):
                    yield answer
        except asyncio.CancelledError:
            pd.cancelled += 1
            raise

    async def _prefill(
        self, request: vl.GenerateRequest, params: dict[str, Any] | None, faults: frozenset[str], context: _Context
    ) -> AsyncIterator[vl.GenerateResponse]:
        pd = self.pd
        returned: str | None = None
        room: int | None = None
        if self.connector == NIXL and params is not None and params.get("do_remote_decode"):
            room = random.randint(0, 2**31 - 1)
            returned = orjson.dumps({
                "do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": self.engine_id,
                "remote_block_ids": [room], "remote_host": self.host, "remote_port": self.bootstrap_port, "tp_size": 1,
            }).decode()  # fmt: skip
        elif self.connector == MOONCAKE:
            transfer_id = params.get("transfer_id") if params is not None else None
            room = _key(str(transfer_id) if transfer_id else request.request_id)
        if "hang" in faults:
            await asyncio.Event().wait()
        if "fail" in faults or "drop" in faults:
            pd.failed += 1
            if room is not None:
                pd.settle([room], False)
            code = grpc.StatusCode.INTERNAL if "fail" in faults else grpc.StatusCode.UNAVAILABLE
            await context.abort(code, "prefill failed on command ([[pd:...]])")
        try:
            async for answer in super().Generate(request, context):
                if answer.WhichOneof("response") == "complete":
                    if returned is not None:
                        answer.complete.kv_transfer_params_json = returned
                    if room is not None and "lose_kv" not in faults:
                        pd.ready += 1
                        pd.settle([room], True)
                yield answer
        except asyncio.CancelledError:
            if room is not None:
                pd.settle([room], False)
            raise

    async def _fetch_kv(
        self, request: vl.GenerateRequest, params: dict[str, Any] | None, typed: tuple[str, int] | None,
        faults: frozenset[str], context: _Context,
    ) -> bool:
        """Pull the KV the params name; False when the load failed (the request ends with error)."""
        pd = self.pd
        if "hang" in faults:
            await asyncio.Event().wait()
        if "fail" in faults or "drop" in faults:
            code = grpc.StatusCode.INTERNAL if "fail" in faults else grpc.StatusCode.UNAVAILABLE
            await context.abort(code, "decode failed on command ([[pd:...]])")
        where: tuple[str, int, int] | None = None
        if params is not None and params.get("do_remote_prefill"):
            if params.get("transfer_id") and params.get("remote_bootstrap_addr"):  # Mooncake, minted id
                address = urlsplit(str(params["remote_bootstrap_addr"]))
                where = (address.hostname or "", address.port or 0, _key(str(params["transfer_id"])))
            elif params.get("remote_block_ids") and params.get("remote_host"):  # NIXL, relayed
                where = (str(params["remote_host"]), int(params.get("remote_port") or 0), int(params["remote_block_ids"][0]))
            else:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "kv_transfer_params name no KV to pull")
        elif typed is not None:  # Mooncake, typed host and port: the KV keyed by the request id
            where = (typed[0], typed[1], _key(request.request_id))
        if where is None:
            return True  # no handoff: the prompt is recomputed here
        pd.kv_waits += 1
        problem = "failed on command (pd_fault)" if "transfer_fail" in faults else None
        if problem is None:
            problem = await wait_for_kv(pd, where[0], where[1], where[2])
        if problem is not None:
            pd.kv_failures += 1
            return False
        return True


class VllmPdServer:
    """The vLLM gRPC stand-in in a PD role with a KV connector, in the running loop."""

    def __init__(
        self, config: GrpcEngineConfig, pd: PdWorkerConfig, connector: str = NIXL, engine_id: str = "engine-0"
    ) -> None:
        if config.runtime != "vllm":
            raise ValueError("the vLLM PD stand-in speaks vLLM's service (kv_transfer_params)")
        self.config = config
        self.connector = connector
        self.engine_id = engine_id
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
        runner = web.AppRunner(bootstrap_app(self.pd), access_log=None, handler_cancellation=True)
        await runner.setup()
        self._runner = runner
        if self.pd.config.role == "prefill":
            await web.TCPSite(runner, host, self.pd.config.bootstrap_port or 0).start()
            self.bootstrap_port = int(runner.addresses[0][1])
        service = VllmPdService(self.engine, self.pd, self.connector, self.engine_id, host)
        service.bootstrap_port = self.bootstrap_port
        server = grpc.aio.server(options=SERVER_OPTIONS)
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
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()
