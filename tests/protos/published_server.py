"""An engine-side gRPC server built from the published smg-grpc-proto package, the way SGLang's and
vLLM's own gRPC servers are built. tests/protos/test_interop.py runs it in a subprocess (it must never
be imported next to protos/: both declare the same full names) and talks to it with our stubs.

Each answer reports what the server decoded, in protobuf text format, so the client can check that
every field it set arrived under the same name and value."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from google.protobuf import text_format
from google.protobuf.message import Message
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sglang
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sglang_rpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vllm_rpc

TOKENIZER_ZIP = b"PK\x03\x04 not really a zip, just bytes in two chunks"


def _seen(message: Message) -> str:
    return text_format.MessageToString(message, as_one_line=True)


class SglangScheduler(sglang_rpc.SglangSchedulerServicer):
    async def Generate(self, request: sglang.GenerateRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[sglang.GenerateResponse]:
        ids = list(request.tokenized.input_ids)
        yield sglang.GenerateResponse(
            request_id=request.request_id,
            chunk=sglang.GenerateStreamChunk(token_ids=ids[:1], prompt_tokens=len(ids), completion_tokens=1, index=1),
        )
        yield sglang.GenerateResponse(
            request_id=request.request_id,
            complete=sglang.GenerateComplete(
                output_ids=ids,
                finish_reason=_seen(request),
                prompt_tokens=len(ids),
                completion_tokens=len(ids),
                cached_tokens=2,
                reasoning_tokens=5,
                matched_stop_str="</s>",
                index=1,
                spec_accepted_tokens=3,
                spec_draft_tokens=4,
            ),
        )

    async def HealthCheck(self, request: sglang.HealthCheckRequest, context: grpc.aio.ServicerContext) -> sglang.HealthCheckResponse:
        return sglang.HealthCheckResponse(healthy=True, message="sglang")

    async def Abort(self, request: sglang.AbortRequest, context: grpc.aio.ServicerContext) -> sglang.AbortResponse:
        return sglang.AbortResponse(success=True, message=_seen(request))

    async def GetModelInfo(self, request: sglang.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> sglang.GetModelInfoResponse:
        return sglang.GetModelInfoResponse(
            model_path="/models/qwen3",
            tokenizer_path="/models/qwen3/tokenizer",
            served_model_name="qwen3",
            max_context_length=40960,
            eos_token_ids=[151645, 151643],
            bos_token_id=151643,
            architectures=["Qwen3ForCausalLM"],
            default_sampling_params_json='{"temperature": 0.6}',
        )

    async def GetLoads(self, request: sglang.GetLoadsRequest, context: grpc.aio.ServicerContext) -> sglang.GetLoadsResponse:
        return sglang.GetLoadsResponse(
            version=_seen(request),
            dp_rank_count=1,
            loads=[sglang.SchedulerLoad(dp_rank=0, num_running_reqs=3, num_waiting_uncached_tokens=17)],
        )

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        return common_pb2.FlushCacheResponse(success=True, message=_seen(request))

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        half = len(TOKENIZER_ZIP) // 2
        yield common_pb2.GetTokenizerChunk(data=TOKENIZER_ZIP[:half])
        yield common_pb2.GetTokenizerChunk(data=TOKENIZER_ZIP[half:], sha256="digest")


class VllmEngine(vllm_rpc.VllmEngineServicer):
    async def Generate(self, request: vllm.GenerateRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[vllm.GenerateResponse]:
        ids = list(request.tokenized.input_ids)
        yield vllm.GenerateResponse(chunk=vllm.GenerateStreamChunk(token_ids=ids[:1], prompt_tokens=len(ids), index=0))
        yield vllm.GenerateResponse(
            complete=vllm.GenerateComplete(output_ids=ids, finish_reason=_seen(request), matched_token_id=2, index=0)
        )

    async def HealthCheck(self, request: vllm.HealthCheckRequest, context: grpc.aio.ServicerContext) -> vllm.HealthCheckResponse:
        return vllm.HealthCheckResponse(healthy=True, message="vllm")

    async def Abort(self, request: vllm.AbortRequest, context: grpc.aio.ServicerContext) -> vllm.AbortResponse:
        await context.send_initial_metadata((("seen", _seen(request)),))
        return vllm.AbortResponse()

    async def GetModelInfo(self, request: vllm.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> vllm.GetModelInfoResponse:
        return vllm.GetModelInfoResponse(
            model_path="/models/llama3",
            served_model_name="llama3",
            max_context_length=8192,
            tokenizer_path="/models/llama3",
            eos_token_ids=[128009],
            bos_token_id=128000,
            architectures=["LlamaForCausalLM"],
        )


async def serve() -> None:
    server = grpc.aio.server()
    sglang_rpc.add_SglangSchedulerServicer_to_server(SglangScheduler(), server)
    vllm_rpc.add_VllmEngineServicer_to_server(VllmEngine(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"PORT {port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve())
