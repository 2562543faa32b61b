"""Prefill/decode disaggregation for engines the gateway serves (gRPC).

SGLang-style parallel dispatch (:func:`parallel_pd`). The same request goes to the prefill and the decode engine at once, each with the same
:class:`~inference.upstreams.engine.DisaggregationParams` (the prefill worker's bootstrap host, its
bootstrap port or 8998, a fresh room); the answer is the decode engine's outputs, streamed as they
come; the prefill engine's outputs are read and dropped.

Neither side outlives a failure of the other: a prefill that fails before the decode ended cancels
the decode iteration (the gRPC client cancels its RPC and sends Abort) and raises the prefill's
failure; a decode that fails or is cancelled (the client went away) cancels the prefill the same
way; a prefill still running when the decode ended is cancelled.

vLLM-style sequential dispatch (:func:`sequential_pd`): the prefill leg first (one token, n=1, not
streamed, tagged per the prefill worker's KV connector: :mod:`inference.upstreams.pd_kv`), read to
its end for the kv_transfer_params its engine returns; then the decode leg with the handoff params
(relayed, minted or the typed host and port), whose outputs are the answer.

A side whose engine reports a failed bootstrap or KV transfer (SGLang's abort messages:
:func:`common.pd_metrics.reported_failure`) counts in gw_pd_bootstrap_failures_total or
gw_pd_kv_transfer_failures_total; so does, as a KV transfer failure, a vLLM decode with a handoff
that its engine ended with finish reason ``error`` before any output (its KV load failed), and a
NIXL prefill that returned no params (the decode recomputes the prompt). Other failures count in
neither. A prefill worker whose bootstrap host cannot be derived sends nothing (500, counted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from functools import partial
from time import perf_counter
from typing import Any

from common import pd_metrics
from inference.errors import GatewayError
from inference.routing.dp_ranks import give_back, take_rank
from inference.routing.pd import GRPC_DEFAULT_BOOTSTRAP_PORT, PdMember, grpc_room, require_bootstrap_host
from inference.routing.workers import WorkerHandle
from inference.routing.load_report import EngineLoad
from inference.upstreams.engine import (
    CommandResult, DisaggregationParams, EngineClient, EngineHealth, EngineOutput, EngineRequest, KvTransfer,
    ModelInfo, ProfileOptions, TokenizerBundle,
)
from inference.upstreams.epd_encode import encode_plan, with_encode
from inference.upstreams.failures import EngineEndedWithError, FailureKind, UpstreamFailure
from inference.upstreams.pd_http import PdFailure
from inference.upstreams.pd_kv import SEQUENTIAL_PD_RUNTIMES, KvMode, effective_kv_engine_id, kv_plan

__all__ = [
    "PARALLEL_PD_RUNTIMES", "PdEngineClient", "disaggregation_for", "parallel_pd", "pd_engine_refusal", "sequential_pd",
]

log = logging.getLogger(__name__)

PARALLEL_PD_RUNTIMES = frozenset({"sglang", "tokenspeed"})  # runtimes that carry the bootstrap rendezvous


def pd_engine_refusal(runtime: str) -> GatewayError | None:
    """None when the gateway serves PD for ``runtime``'s engines, else the reference's refusal
    (400 runtime_pd_not_supported)."""
    if runtime in PARALLEL_PD_RUNTIMES or runtime in SEQUENTIAL_PD_RUNTIMES:
        return None
    return GatewayError(400, "runtime_pd_not_supported", "This runtime does not support PD disaggregated mode")


def disaggregation_for(prefill: PdMember) -> DisaggregationParams:
    """The rendezvous both engines get: the prefill worker's host, its bootstrap port (8998 when
    unset) and a fresh room (SGLang's field is an int32)."""
    host = require_bootstrap_host(prefill)
    port = prefill.traits.bootstrap_port or GRPC_DEFAULT_BOOTSTRAP_PORT
    return DisaggregationParams(bootstrap_host=host, bootstrap_port=port, bootstrap_room=grpc_room())


async def _drain(
    outputs: AsyncIterator[EngineOutput], model: str | None, runtime: str, worker: WorkerHandle | None
) -> str | None:
    """The prefill side, read to its end; its worker's in-flight count and breaker kept meanwhile.
    Returns the kv_transfer_params its engine returned (sequential PD), if any."""
    started = perf_counter()
    returned: str | None = None
    load = worker.load if worker is not None else None
    if load is not None:
        load.in_flight += 1
    try:
        async with aclosing(outputs) as iterator:  # type: ignore[type-var]  # an async generator
            async for output in iterator:
                if output.kv_transfer_params is not None:
                    returned = output.kv_transfer_params
    except UpstreamFailure as failure:
        pd_metrics.record_reported_failure(failure.detail)  # "Prefill bootstrap failed ...", "... transfer failed ..."
        if load is not None:
            load.breaker.record(not failure.rejected)
        if worker is not None:
            raise PdFailure("prefill", worker.id, failure) from None
        raise
    finally:
        if load is not None:
            load.in_flight -= 1
    if load is not None:
        load.breaker.record(False)
    pd_metrics.record_pd_prefill(model, runtime, perf_counter() - started)
    return returned


def _rank_ended(handle: WorkerHandle, _task: asyncio.Task[Any]) -> None:
    give_back(handle)


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - the stopped side's own ending is of no interest
        pass


def _failed(task: asyncio.Task[Any]) -> BaseException | None:
    if not task.done() or task.cancelled():
        return None
    return task.exception()


async def parallel_pd(
    prefill: EngineClient,
    decode: EngineClient,
    request: EngineRequest,
    disaggregation: DisaggregationParams,
    model: str | None = None,
    prefill_worker: WorkerHandle | None = None,
) -> AsyncIterator[EngineOutput]:
    """The decode engine's outputs for ``request`` sent to both engines with ``disaggregation``.
    Raises UpstreamFailure as :meth:`EngineClient.generate` does (nothing yielded yet: retryable);
    with ``prefill_worker``, a prefill failure is a PdFailure naming it (its load and breaker kept)."""
    paired = dataclasses.replace(request, disaggregation=disaggregation)
    started = perf_counter()
    first = True
    # Under --dp-aware the prefill engine gets a data-parallel rank of its own (the decode's is the request's).
    ranked = take_rank(prefill_worker) if prefill_worker is not None else None
    prefill_rank = ranked.dp_rank if ranked is not None else None
    prefill_request = paired if prefill_rank == paired.data_parallel_rank else dataclasses.replace(
        paired, data_parallel_rank=prefill_rank
    )
    prefill_task = asyncio.create_task(_drain(prefill.generate(prefill_request), model, prefill.runtime, prefill_worker))
    if ranked is not None and ranked is not prefill_worker:
        prefill_task.add_done_callback(partial(_rank_ended, ranked))
    # EPD: only the prefill receives the items' embeddings (encode_bootstrap_info).
    outputs = decode.generate(
        dataclasses.replace(paired, encode_bootstrap=(), multimodal=()) if paired.encode_bootstrap else paired
    )
    step: asyncio.Future[EngineOutput] | None = None
    try:
        # Until the prefill ended, each decode step is awaited beside it: a prefill failure must
        # not wait for a decode output that may never come.
        while not prefill_task.done():
            if step is None:
                step = asyncio.ensure_future(anext(outputs))
            racing: set[asyncio.Future[Any]] = {step, prefill_task}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            failure = _failed(prefill_task)
            if failure is not None:
                raise _as_failure(failure)
            if step.done():
                done, step = step, None
                try:
                    output = done.result()
                except StopAsyncIteration:
                    return
                if first:
                    first = False
                    pd_metrics.record_pd_ttft(model, prefill.runtime, perf_counter() - started)
                yield output
        if step is not None:
            pending, step = step, None
            try:
                output = await pending
            except StopAsyncIteration:
                return
            if first:
                first = False
                pd_metrics.record_pd_ttft(model, prefill.runtime, perf_counter() - started)
            yield output
        async for output in outputs:
            if first:
                first = False
                pd_metrics.record_pd_ttft(model, prefill.runtime, perf_counter() - started)
            yield output
    except UpstreamFailure as failure:
        if failure is not _failed(prefill_task):  # the decode's own ("Decode handshake/transfer failed ...")
            pd_metrics.record_reported_failure(failure.detail)
        raise
    finally:
        if step is not None and not step.done():
            await _stop(step)
        if not prefill_task.done():
            await _stop(prefill_task)
        elif not prefill_task.cancelled() and prefill_task.exception() is not None:
            log.warning("PD prefill on %s failed: %s", prefill.url, prefill_task.exception())
        await outputs.aclose()  # type: ignore[attr-defined]  # an async generator


def _as_failure(failure: BaseException) -> BaseException:
    if isinstance(failure, (UpstreamFailure, GatewayError)):
        return failure
    return UpstreamFailure(FailureKind.BROKEN, f"prefill failed: {type(failure).__name__}: {failure}")


async def sequential_pd(
    prefill: EngineClient,
    decode: EngineClient,
    request: EngineRequest,
    partner: PdMember,
    model: str | None = None,
) -> AsyncIterator[EngineOutput]:
    """The decode engine's outputs for ``request`` after its prefill on ``partner``'s engine, the KV
    handed over by kv_transfer_params (vLLM). A prefill failure is a PdFailure naming its worker
    (nothing was sent to the decode); a decode failure is the decode's. Raises as
    :meth:`EngineClient.generate` does."""
    started = perf_counter()
    worker = partner.handle
    traits = partner.traits
    ranked = take_rank(worker)
    rank = ranked.dp_rank if ranked is not None else None
    engine_id = effective_kv_engine_id(traits.kv_engine_id, traits.dp_size, rank)
    plan = kv_plan(traits.kv_connector, partner.host, traits.bootstrap_port, engine_id, request.sampling.n)
    if plan.mode is KvMode.MOONCAKE:
        require_bootstrap_host(partner)  # the decode pulls from the prefill's bootstrap server (NIXL's params say where)
    prefill_request = dataclasses.replace(
        request,
        sampling=dataclasses.replace(request.sampling, max_new_tokens=1, n=1),
        stream=False,
        data_parallel_rank=rank,
        kv_transfer=KvTransfer(json=plan.prefill_json) if plan.prefill_json is not None else None,
    )
    try:
        returned = await _drain(prefill.generate(prefill_request), model, prefill.runtime, worker)
    finally:
        if ranked is not None and ranked is not worker:
            give_back(ranked)
    prefill_ended = perf_counter()
    handoff, missing = plan.decode(returned)
    if missing:  # NIXL expected params back and got none: the decode recomputes the prompt
        pd_metrics.PD_KV_TRANSFER_FAILURES.inc()
    expected = handoff != KvTransfer()
    outputs = decode.generate(dataclasses.replace(request, kv_transfer=handoff if expected else None))
    first = True
    try:
        async for output in outputs:
            if first:
                first = False
                now = perf_counter()
                pd_metrics.record_kv_connector_mode(plan.mode.value)
                pd_metrics.record_pd_kv_transfer(model, prefill.runtime, now - prefill_ended)
                pd_metrics.record_pd_ttft(model, prefill.runtime, now - started)
            yield output
    except UpstreamFailure as failure:
        if first and expected and isinstance(failure, EngineEndedWithError):
            pd_metrics.PD_KV_TRANSFER_FAILURES.inc()  # vLLM's report of a KV load that failed (finish reason error)
        else:
            pd_metrics.record_reported_failure(failure.detail)
        raise
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]  # an async generator


class PdEngineClient(EngineClient):
    """A decode engine paired with its prefill engine for one request: ``generate`` runs
    :func:`sequential_pd` for vLLM, else :func:`parallel_pd` (a fresh rendezvous per call; with the
    request's encode plan, beside its encode stage: EPD), ``abort`` reaches both; everything else is
    the decode engine's."""

    def __init__(self, prefill: EngineClient, decode: EngineClient, partner: PdMember, model: str | None = None) -> None:
        super().__init__(decode.url, api_key=decode.api_key)
        self.runtime = decode.runtime  # type: ignore[misc]  # the decode engine's, per instance
        self.prefill = prefill
        self.decode = decode
        self.partner = partner
        self.model = model

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if self.decode.runtime in SEQUENTIAL_PD_RUNTIMES:
            return sequential_pd(self.prefill, self.decode, request, self.partner, self.model)
        disaggregation = disaggregation_for(self.partner)
        plan = encode_plan(self.partner.handle.id)
        if plan is not None:  # EPD: the request's images encoded while the pair runs (inference.upstreams.epd_encode)
            return with_encode(plan, request, lambda encoded: parallel_pd(
                self.prefill, self.decode, encoded, disaggregation, self.model, self.partner.handle,
            ))  # fmt: skip
        return parallel_pd(self.prefill, self.decode, request, disaggregation, self.model, self.partner.handle)

    async def abort(self, request_id: str) -> None:
        await asyncio.gather(self.prefill.abort(request_id), self.decode.abort(request_id), return_exceptions=True)

    async def health(self) -> EngineHealth:
        return await self.decode.health()

    async def model_info(self) -> ModelInfo:
        return await self.decode.model_info()

    async def server_info(self) -> dict[str, Any]:
        return await self.decode.server_info()

    async def loads(self) -> tuple[EngineLoad, ...]:
        return await self.decode.loads()

    async def flush_cache(self) -> CommandResult:
        return await self.decode.flush_cache()

    async def start_profile(self, options: ProfileOptions) -> CommandResult:
        return await self.decode.start_profile(options)

    async def stop_profile(self) -> CommandResult:
        return await self.decode.stop_profile()

    async def tokenizer(self) -> TokenizerBundle:
        return await self.decode.tokenizer()
