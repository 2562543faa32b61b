"""Our generated stubs against a server built from the published package (the way the engines' own
gRPC servers are), over real loopback gRPC: the same paths (/sglang.grpc.scheduler.SglangScheduler/
Generate ...), and every field we set arrives under the same name with the same value."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import text_format
from google.protobuf.message import Message

from protos import common_pb2
from protos import sglang_scheduler_pb2 as sglang
from protos import sglang_scheduler_pb2_grpc as sglang_rpc
from protos import vllm_engine_pb2 as vllm
from protos import vllm_engine_pb2_grpc as vllm_rpc
from tests.protos.sources import ROOT

SERVER = Path(__file__).with_name("published_server.py")


def _seen(message: Message) -> str:
    return text_format.MessageToString(message, as_one_line=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(SERVER)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            process.kill()
            _, errors = process.communicate(timeout=10)
            pytest.fail(f"the published-package server did not start: {line!r} {errors}")
        yield f"127.0.0.1:{int(line.split()[1])}"
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_sglang_generate_streams_and_every_request_field_arrives(engine: str) -> None:
    request = sglang.GenerateRequest(
        request_id="chatcmpl-1",
        tokenized=sglang.TokenizedInput(original_text="Hi", input_ids=[9707, 0, 4294967295]),
        sampling_params=sglang.SamplingParams(
            temperature=0.7,
            top_p=1.0,
            top_k=-1,
            repetition_penalty=1.0,
            max_new_tokens=0,
            stop_token_ids=[151645],
            skip_special_tokens=True,
            json_schema='{"type": "object"}',
            n=2,
            min_new_tokens=1,
            logit_bias={"9707": -2.5},
        ),
        return_logprob=True,
        top_logprobs_num=3,
        data_parallel_rank=0,
        stream=True,
        require_reasoning=True,
    )
    async with grpc.aio.insecure_channel(engine) as channel:
        responses = [response async for response in sglang_rpc.SglangSchedulerStub(channel).Generate(request)]

    assert [response.WhichOneof("response") for response in responses] == ["chunk", "complete"]
    assert {response.request_id for response in responses} == {"chatcmpl-1"}
    assert list(responses[0].chunk.token_ids) == [9707]
    complete = responses[1].complete
    # Presence survived the trip: max_new_tokens=0 and data_parallel_rank=0 were sent explicitly.
    assert complete.finish_reason == _seen(request)
    assert "max_new_tokens: 0" in complete.finish_reason and "data_parallel_rank: 0" in complete.finish_reason
    assert list(complete.output_ids) == [9707, 0, 4294967295]
    assert complete.WhichOneof("matched_stop") == "matched_stop_str" and complete.matched_stop_str == "</s>"
    assert (complete.cached_tokens, complete.reasoning_tokens, complete.index) == (2, 5, 1)
    assert (complete.spec_accepted_tokens, complete.spec_draft_tokens) == (3, 4)


async def test_sglang_control_rpcs_and_tokenizer_stream(engine: str) -> None:
    async with grpc.aio.insecure_channel(engine) as channel:
        stub = sglang_rpc.SglangSchedulerStub(channel)
        health = await stub.HealthCheck(sglang.HealthCheckRequest())
        abort = await stub.Abort(sglang.AbortRequest(request_id="chatcmpl-1", reason="client disconnected"))
        info = await stub.GetModelInfo(sglang.GetModelInfoRequest())
        loads = await stub.GetLoads(sglang.GetLoadsRequest(dp_rank=0, include=["memory"]))
        flush = await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=1.5))
        chunks = [chunk async for chunk in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]

    assert (health.healthy, health.message) == (True, "sglang")
    assert abort.success and abort.message == 'request_id: "chatcmpl-1" reason: "client disconnected"'
    assert (info.tokenizer_path, info.max_context_length, info.bos_token_id) == ("/models/qwen3/tokenizer", 40960, 151643)
    assert list(info.eos_token_ids) == [151645, 151643] and list(info.architectures) == ["Qwen3ForCausalLM"]
    assert info.default_sampling_params_json == '{"temperature": 0.6}'
    assert loads.version == 'dp_rank: 0 include: "memory"'
    assert (loads.loads[0].num_running_reqs, loads.loads[0].num_waiting_uncached_tokens) == (3, 17)
    assert flush.success and flush.message == "timeout_s: 1.5"
    assert b"".join(chunk.data for chunk in chunks).startswith(b"PK\x03\x04") and chunks[-1].sha256 == "digest"


async def test_vllm_generate_and_abort(engine: str) -> None:
    request = vllm.GenerateRequest(
        request_id="cmpl-2",
        tokenized=vllm.TokenizedInput(input_ids=[128000, 9906]),
        sampling_params=vllm.SamplingParams(
            temperature=0.0,
            top_k=0,
            max_tokens=16,
            min_tokens=2,
            stop_token_ids=[128009],
            logprobs=0,
            seed=7,
            choice=vllm.ChoiceConstraint(choices=["yes", "no"]),
            logit_bias={128009: -100.0},
        ),
        stream=True,
        data_parallel_rank=1,
    )
    async with grpc.aio.insecure_channel(engine) as channel:
        stub = vllm_rpc.VllmEngineStub(channel)
        responses = [response async for response in stub.Generate(request)]
        call = stub.Abort(vllm.AbortRequest(request_ids=["cmpl-2", "cmpl-3"]))
        await call
        metadata = await call.initial_metadata()
        health = await stub.HealthCheck(vllm.HealthCheckRequest())
        info = await stub.GetModelInfo(vllm.GetModelInfoRequest())

    complete = responses[-1].complete
    assert complete.finish_reason == _seen(request)
    # temperature is proto3 optional on vLLM: an explicit 0.0 (greedy) must reach the engine.
    assert "temperature: 0" in complete.finish_reason and "logprobs: 0" in complete.finish_reason
    assert complete.WhichOneof("matched_stop") == "matched_token_id" and complete.matched_token_id == 2
    assert dict(metadata)["seen"] == 'request_ids: "cmpl-2" request_ids: "cmpl-3"'
    assert (health.healthy, health.message) == (True, "vllm")
    assert (info.served_model_name, info.max_context_length, list(info.eos_token_ids)) == ("llama3", 8192, [128009])

