"""Each engine runtime's gRPC service in the stand-in, over the one runtime-neutral
:class:`ScriptedEngine`: only the translation of the runtime's messages, as its own servicer does.

- SGLang and TokenSpeed (:class:`SglangService`, :class:`TokenSpeedService`): cumulative counts, the
  request id on every response, Abort by id with a reason, GetLoads, FlushCache, profiling;
  SGLang also Embed.
- vLLM and MLX (:class:`VllmService`, :class:`MlxService`): each chunk's own count, no request id on
  responses, Abort by a list of ids; vLLM also GetLoads, FlushCache, profiling and Embed. MLX has no
  ``n`` (one choice) and names the ending stop token ``matched_stop_token_id``.
- TensorRT-LLM (:class:`TrtllmService`): ``sequence_index`` and cumulative counts, logprobs as
  ``TokenLogprob`` lists, every token of the choice again in ``complete.output_token_ids``, a
  HealthCheck status word ("OK"), Embed; no GetLoads, FlushCache or profiling. ``max_tokens`` is a
  plain uint32: 0 fails with INVALID_ARGUMENT (the engine would generate nothing).

A servicer answers an RPC by defining a method of its name; :meth:`EngineService.handler` registers
exactly the RPCs the runtime's proto declares and the servicer defines, so the rest (and every other
runtime's service) answer UNIMPLEMENTED.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from types import ModuleType
from typing import Any, ClassVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from protos import common_pb2
from protos import mlx_engine_pb2 as mx
from protos import sglang_scheduler_pb2 as sg
from protos import tokenspeed_scheduler_pb2 as ts
from protos import trtllm_service_pb2 as tr
from protos import vllm_engine_pb2 as vl
from standins.scripted_engine import MOCK_ENGINE_VERSION, EMBEDDING_DIM, Sampling, ScriptedEngine

__all__ = [
    "SERVICES",
    "EngineService",
    "MlxService",
    "SglangService",
    "TokenSpeedService",
    "TrtllmService",
    "VllmService",
]

_Context = grpc.aio.ServicerContext[Any, Any]


def _seen(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def _rank(request: Message) -> int | None:
    """The data_parallel_rank a GenerateRequest named (SGLang, vLLM, TokenSpeed), None when unset."""
    if "data_parallel_rank" in request.DESCRIPTOR.fields_by_name and request.HasField("data_parallel_rank"):
        return int(getattr(request, "data_parallel_rank"))
    return None


def _known(message_type: type[Message], values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that name fields of ``message_type``."""
    fields = message_type.DESCRIPTOR.fields_by_name
    return {key: value for key, value in values.items() if key in fields}


def _output_logprobs(module: Any, engine: ScriptedEngine, tokens: list[int], top: int) -> Any:
    """The ``OutputLogProbs`` shape (SGLang, vLLM, TokenSpeed, MLX) of the tokens' logprobs."""
    values, top_ids, top_values = engine.model.logprobs(tokens, top)
    return module.OutputLogProbs(
        token_logprobs=values,
        token_ids=tokens,
        top_logprobs=[module.TopLogProbs(values=v, token_ids=i) for v, i in zip(top_values, top_ids)],
    )


def _timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class EngineService:
    """What every runtime's service answers alike (``smg.grpc.common`` messages), and the handler."""

    runtime: ClassVar[str]
    descriptor: ClassVar[ServiceDescriptor]

    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine = engine

    def handler(self) -> grpc.GenericRpcHandler:
        """The RPCs the runtime's proto declares and this servicer defines."""
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in self.descriptor.methods:
            implementation = getattr(self, method.name, None)
            if implementation is None:
                continue
            make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
            handlers[method.name] = make(
                implementation,
                request_deserializer=GetMessageClass(method.input_type).FromString,
                response_serializer=lambda message: message.SerializeToString(),
            )
        return grpc.method_handlers_generic_handler(self.descriptor.full_name, handlers)

    async def FlushCache(self, request: common_pb2.FlushCacheRequest, context: _Context) -> common_pb2.FlushCacheResponse:
        self.engine.flush()
        return common_pb2.FlushCacheResponse(success=True, message="Cache flushed (mock)")

    async def StartProfile(self, request: common_pb2.StartProfileRequest, context: _Context) -> common_pb2.ProfileResponse:
        self.engine.state.profiles.append("start")
        return common_pb2.ProfileResponse(success=True, message="profiling started (mock)")

    async def StopProfile(self, request: common_pb2.StopProfileRequest, context: _Context) -> common_pb2.ProfileResponse:
        self.engine.state.profiles.append("stop")
        return common_pb2.ProfileResponse(success=True, message="profiling stopped (mock)")

    async def GetTokenizer(self, request: common_pb2.GetTokenizerRequest, context: _Context) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        for chunk in self.engine.tokenizer_chunks():
            yield chunk

    def _model_info(self, module: ModuleType) -> Any:
        """The runtime's GetModelInfoResponse: the engine's facts, under the names it has."""
        return module.GetModelInfoResponse(**_known(module.GetModelInfoResponse, self.engine.model_facts()))

    def _loads(self, module: ModuleType) -> Any:
        """The runtime's GetLoadsResponse: one SchedulerLoad per dp rank, with the fields it has."""
        loads = [module.SchedulerLoad(**_known(module.SchedulerLoad, entry)) for entry in self.engine.loads()]
        return module.GetLoadsResponse(
            timestamp=_timestamp(), version=MOCK_ENGINE_VERSION, dp_rank_count=len(loads), loads=loads
        )


class _SchedulerService(EngineService):
    """SGLang's shape, shared by TokenSpeed (the same message and field names)."""

    pb: ClassVar[ModuleType]

    async def Generate(self, request: Any, context: _Context) -> AsyncIterator[Any]:
        pb = self.pb
        p = request.sampling_params
        sampling = Sampling(
            n=max(1, p.n),
            max_new_tokens=p.max_new_tokens if p.HasField("max_new_tokens") else None,
            stop_token_ids=frozenset(p.stop_token_ids),
            ignore_eos=p.ignore_eos,
            logprobs=request.return_logprob,
            top_logprobs=request.top_logprobs_num,
            stream=request.stream,
        )
        ids = tuple(request.tokenized.input_ids)
        cached = self.engine.cached_prefix(ids)
        steps = self.engine.run(
            request.request_id, ids, request.tokenized.original_text, sampling, _seen(request), context, _rank(request)
        )
        async with aclosing(steps):
            async for served, index, new, choice, finished in steps:
                total = len(served.outputs[index])
                logprobs = (
                    _output_logprobs(pb, self.engine, new, sampling.top_logprobs) if sampling.logprobs and new else None
                )
                if request.stream and new:
                    yield pb.GenerateResponse(
                        request_id=request.request_id,
                        chunk=pb.GenerateStreamChunk(
                            token_ids=new, prompt_tokens=len(ids), completion_tokens=total, cached_tokens=cached,
                            output_logprobs=logprobs, index=index,
                        ),
                    )
                if finished:
                    complete = pb.GenerateComplete(
                        output_ids=new, finish_reason=choice.finish, prompt_tokens=len(ids), completion_tokens=total,
                        cached_tokens=cached, output_logprobs=logprobs, index=index,
                    )
                    if choice.matched is not None:
                        complete.matched_token_id = choice.matched
                    yield pb.GenerateResponse(request_id=request.request_id, complete=complete)

    async def HealthCheck(self, request: Any, context: _Context) -> Any:
        healthy = self.engine.health_check()
        return self.pb.HealthCheckResponse(healthy=healthy, message="ok" if healthy else "unhealthy (mock fault)")

    async def Abort(self, request: Any, context: _Context) -> Any:
        found = self.engine.abort(request.request_id, request.reason)
        return self.pb.AbortResponse(
            success=found, message=f"Request {request.request_id} {'aborted' if found else 'not found'}"
        )

    async def GetModelInfo(self, request: Any, context: _Context) -> Any:
        return self._model_info(self.pb)

    async def GetLoads(self, request: Any, context: _Context) -> Any:
        return self._loads(self.pb)

    def _server_info(self, **versions: Any) -> Any:
        config = self.engine.config
        answer = self.pb.GetServerInfoResponse(
            active_requests=len(self.engine.state.running),
            uptime_seconds=time.time() - self.engine.started,
            max_total_num_tokens=config.max_context_length * 4,
            **versions,
        )
        answer.server_args.update(
            {"model_path": config.model, "tokenizer_path": str(config.tokenizer_file.parent),
             "context_length": config.max_context_length, "dp_size": config.dp_size}
        )
        return answer


class SglangService(_SchedulerService):
    """``sglang.grpc.scheduler.SglangScheduler``."""

    runtime = "sglang"
    pb: ClassVar[ModuleType] = sg
    descriptor = sg.DESCRIPTOR.services_by_name["SglangScheduler"]

    async def GetServerInfo(self, request: sg.GetServerInfoRequest, context: _Context) -> sg.GetServerInfoResponse:
        answer: sg.GetServerInfoResponse = self._server_info(sglang_version=MOCK_ENGINE_VERSION, server_type="grpc")
        return answer

    async def Embed(self, request: sg.EmbedRequest, context: _Context) -> sg.EmbedResponse:
        ids = tuple(request.tokenized.input_ids)
        embedding = await self.engine.embed(request.request_id, ids, request.tokenized.original_text, context)
        return sg.EmbedResponse(embedding=embedding, prompt_tokens=len(ids), embedding_dim=EMBEDDING_DIM)


class TokenSpeedService(_SchedulerService):
    """``tokenspeed.grpc.scheduler.TokenSpeedScheduler``: SGLang's without Embed."""

    runtime = "tokenspeed"
    pb: ClassVar[ModuleType] = ts
    descriptor = ts.DESCRIPTOR.services_by_name["TokenSpeedScheduler"]

    async def GetServerInfo(self, request: ts.GetServerInfoRequest, context: _Context) -> ts.GetServerInfoResponse:
        answer: ts.GetServerInfoResponse = self._server_info(tokenspeed_version=MOCK_ENGINE_VERSION)
        return answer


class _PerChunkService(EngineService):
    """vLLM's shape, shared by MLX: each chunk's own count, no request id, Abort by a list of ids."""

    pb: ClassVar[ModuleType]
    matched_field: ClassVar[str] = "matched_token_id"
    health_messages: ClassVar[tuple[str, str]] = ("Health", "Engine is not alive")

    def _choices(self, params: Any) -> int:
        return max(1, int(params.n))

    async def Generate(self, request: Any, context: _Context) -> AsyncIterator[Any]:
        pb = self.pb
        if request.WhichOneof("input") != "tokenized":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stand-in takes tokenized input only")
        p = request.sampling_params
        sampling = Sampling(
            n=self._choices(p),
            max_new_tokens=p.max_tokens if p.HasField("max_tokens") else None,
            stop_token_ids=frozenset(p.stop_token_ids),
            ignore_eos=p.ignore_eos,
            logprobs=p.HasField("logprobs"),
            top_logprobs=p.logprobs if p.HasField("logprobs") else 0,
            stream=request.stream,
        )
        ids = tuple(request.tokenized.input_ids)
        cached = self.engine.cached_prefix(ids)
        steps = self.engine.run(
            request.request_id, ids, request.tokenized.original_text, sampling, _seen(request), context, _rank(request)
        )
        async with aclosing(steps):
            async for _served, index, new, choice, finished in steps:
                logprobs = (
                    _output_logprobs(pb, self.engine, new, sampling.top_logprobs) if sampling.logprobs and new else None
                )
                if request.stream and new:
                    yield pb.GenerateResponse(
                        chunk=pb.GenerateStreamChunk(
                            token_ids=new, prompt_tokens=len(ids), completion_tokens=len(new), cached_tokens=cached,
                            output_logprobs=logprobs, index=index,
                        )
                    )
                if finished:
                    complete = pb.GenerateComplete(
                        output_ids=new, finish_reason=choice.finish, prompt_tokens=len(ids), completion_tokens=len(new),
                        cached_tokens=cached, output_logprobs=logprobs, index=index,
                    )
                    if choice.matched is not None:
                        setattr(complete, self.matched_field, choice.matched)
                    yield pb.GenerateResponse(complete=complete)

    async def HealthCheck(self, request: Any, context: _Context) -> Any:
        healthy = self.engine.health_check()
        return self.pb.HealthCheckResponse(healthy=healthy, message=self.health_messages[0 if healthy else 1])

    async def Abort(self, request: Any, context: _Context) -> Any:
        for request_id in request.request_ids:
            self.engine.abort(request_id, "")
        return self.pb.AbortResponse()

    async def GetModelInfo(self, request: Any, context: _Context) -> Any:
        return self._model_info(self.pb)


class VllmService(_PerChunkService):
    """``vllm.grpc.engine.VllmEngine``."""

    runtime = "vllm"
    pb: ClassVar[ModuleType] = vl
    descriptor = vl.DESCRIPTOR.services_by_name["VllmEngine"]

    async def GetServerInfo(self, request: vl.GetServerInfoRequest, context: _Context) -> vl.GetServerInfoResponse:
        return vl.GetServerInfoResponse(
            active_requests=len(self.engine.state.running),
            uptime_seconds=time.time() - self.engine.started,
            server_type="vllm-grpc",
            max_num_seqs=256,
            data_parallel_size=self.engine.config.dp_size,
        )

    async def GetLoads(self, request: vl.GetLoadsRequest, context: _Context) -> vl.GetLoadsResponse:
        answer: vl.GetLoadsResponse = self._loads(vl)
        return answer

    async def Embed(self, request: vl.EmbedRequest, context: _Context) -> vl.EmbedResponse:
        ids = tuple(request.tokenized.input_ids)
        embedding = await self.engine.embed(request.request_id, ids, request.tokenized.original_text, context)
        return vl.EmbedResponse(embedding=embedding, prompt_tokens=len(ids), embedding_dim=EMBEDDING_DIM)


class MlxService(_PerChunkService):
    """``mlx.grpc.engine.MlxEngine``: generation, health, abort, model and server info, tokenizer."""

    runtime = "mlx"
    pb: ClassVar[ModuleType] = mx
    descriptor = mx.DESCRIPTOR.services_by_name["MlxEngine"]
    matched_field = "matched_stop_token_id"
    health_messages = ("ok", "model not loaded (mock fault)")

    def _choices(self, params: Any) -> int:
        return 1  # no n on this engine

    async def GetServerInfo(self, request: mx.GetServerInfoRequest, context: _Context) -> mx.GetServerInfoResponse:
        return mx.GetServerInfoResponse(
            server_type="mlx-grpc",
            active_requests=len(self.engine.state.running),
            uptime_seconds=time.time() - self.engine.started,
        )


class TrtllmService(EngineService):
    """``trtllm.TrtllmService``."""

    runtime = "trtllm"
    descriptor = tr.DESCRIPTOR.services_by_name["TrtllmService"]

    def _logprobs(self, tokens: list[int], top: int) -> list[tr.TokenLogprob]:
        values, top_ids, top_values = self.engine.model.logprobs(tokens, top)
        return [
            tr.TokenLogprob(
                token_id=token,
                logprob=values[position],
                top_logprobs=[
                    tr.TopLogprob(token_id=t, logprob=v)
                    for t, v in zip(top_ids[position] if top else [], top_values[position] if top else [])
                ],
            )
            for position, token in enumerate(tokens)
        ]

    async def Generate(self, request: tr.GenerateRequest, context: _Context) -> AsyncIterator[tr.GenerateResponse]:
        if request.max_tokens == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be at least 1")
        c, out = request.sampling_config, request.output_config
        sampling = Sampling(
            n=max(1, c.num_return_sequences),
            max_new_tokens=request.max_tokens,
            stop_token_ids=frozenset(request.stop_token_ids),
            ignore_eos=request.ignore_eos,
            logprobs=out.HasField("logprobs"),
            top_logprobs=out.logprobs if out.HasField("logprobs") else 0,
            stream=request.streaming,
        )
        ids = tuple(request.tokenized.input_token_ids)
        cached = self.engine.cached_prefix(ids)
        steps = self.engine.run(request.request_id, ids, request.tokenized.original_text, sampling, _seen(request), context)
        async with aclosing(steps):
            async for served, index, new, choice, finished in steps:
                total = len(served.outputs[index])
                if request.streaming and new:
                    chunk = tr.GenerateStreamChunk(
                        token_ids=new, sequence_index=index, prompt_tokens=len(ids), completion_tokens=total,
                        cached_tokens=cached,
                    )
                    if sampling.logprobs:
                        chunk.logprobs.extend(self._logprobs(new, sampling.top_logprobs))
                    yield tr.GenerateResponse(request_id=request.request_id, chunk=chunk)
                if finished:
                    every = served.outputs[index]  # the whole choice again, as TensorRT-LLM's servicer sends it
                    complete = tr.GenerateComplete(
                        output_token_ids=every, sequence_index=index, finish_reason=choice.finish,
                        prompt_tokens=len(ids), completion_tokens=total, cached_tokens=cached,
                    )
                    if sampling.logprobs:
                        complete.logprobs.extend(self._logprobs(every, sampling.top_logprobs))
                    if choice.matched is not None:
                        complete.matched_token_id = choice.matched
                    yield tr.GenerateResponse(request_id=request.request_id, complete=complete)

    async def Embed(self, request: tr.EmbedRequest, context: _Context) -> tr.EmbedResponse:
        ids = tuple(request.tokenized.input_token_ids)
        embedding = await self.engine.embed(request.request_id, ids, request.tokenized.original_text, context)
        return tr.EmbedResponse(request_id=request.request_id, embedding=embedding, prompt_tokens=len(ids))

    async def HealthCheck(self, request: tr.HealthCheckRequest, context: _Context) -> tr.HealthCheckResponse:
        return tr.HealthCheckResponse(status="OK" if self.engine.health_check() else "Executor is shutdown")

    async def Abort(self, request: tr.AbortRequest, context: _Context) -> tr.AbortResponse:
        found = self.engine.abort(request.request_id, "")
        return tr.AbortResponse(success=found, message=f"Request {request.request_id} {'aborted' if found else 'not found'}")

    async def GetModelInfo(self, request: tr.GetModelInfoRequest, context: _Context) -> tr.GetModelInfoResponse:
        config = self.engine.config
        return tr.GetModelInfoResponse(
            model_id=config.model,
            max_input_len=config.max_context_length - 1,
            max_seq_len=config.max_context_length,
            max_batch_size=256,
            vocab_size=self.engine.model.vocab_size,
        )

    async def GetServerInfo(self, request: tr.GetServerInfoRequest, context: _Context) -> tr.GetServerInfoResponse:
        return tr.GetServerInfoResponse(
            version=MOCK_ENGINE_VERSION, backend="tensorrt-llm", tensor_parallel_size=1, pipeline_parallel_size=1,
            context_parallel_size=1, world_size=1,
        )


SERVICES: dict[str, type[EngineService]] = {
    service.runtime: service
    for service in (SglangService, VllmService, TrtllmService, TokenSpeedService, MlxService)
}
"""Each runtime's service, by runtime name (:data:`standins.scripted_engine.RUNTIMES`)."""
