"""The gRPC engine stand-in, talked to with the project's raw stubs: what it sends on the wire is
what SGLang's and vLLM's own servicers send (chunks of new tokens, SGLang's cumulative and vLLM's
per-chunk counts, the last chunk's tokens again in ``complete``), its scripted replies are real
token ids of the fixture tokenizer, and it records what it received."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos import sglang_scheduler_pb2 as sg
from protos import sglang_scheduler_pb2_grpc as sg_rpc
from protos import vllm_engine_pb2 as vl
from protos import vllm_engine_pb2_grpc as vl_rpc
from inference.pipeline.reasoning import REASONING_PARSERS
from inference.pipeline.tools import TOOL_PARSERS
from standins.grpc_engine import TOOL_CALL, GrpcEngineConfig, GrpcEngineServer, Thinking
from standins.fixtures import FIXTURE_MODELS as FIXTURES
from standins.scripted_engine import DEFAULT_TEXT, REASONING, TOOL_REASONING, ScriptedModel

REPO = Path(__file__).resolve().parents[2]
QWEN, LLAMA = str(FIXTURES / "qwen3"), str(FIXTURES / "llama3")
MISTRAL, DEEPSEEK = str(FIXTURES / "mistral"), str(FIXTURES / "deepseek-r1")
QWEN_TURN = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"  # Qwen3's template, thinking on
DEEPSEEK_TURN = "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>"  # DeepSeek R1's template


async def _server(runtime: str, tokenizer: str = QWEN, **options: Any) -> GrpcEngineServer:
    server = GrpcEngineServer(GrpcEngineConfig(runtime=runtime, tokenizer=tokenizer, **options))
    await server.start()
    return server


@pytest.fixture
async def sglang() -> AsyncIterator[GrpcEngineServer]:
    server = await _server("sglang")
    yield server
    await server.stop()


@pytest.fixture
async def vllm() -> AsyncIterator[GrpcEngineServer]:
    server = await _server("vllm")
    yield server
    await server.stop()


def _target(server: GrpcEngineServer) -> str:
    return f"127.0.0.1:{server.port}"


async def test_sglang_stream_shape(sglang: GrpcEngineServer) -> None:
    model = sglang.engine.model
    prompt = model.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    request = sg.GenerateRequest(
        request_id="r1",
        tokenized=sg.TokenizedInput(input_ids=prompt),
        sampling_params=sg.SamplingParams(temperature=1.0, top_p=1.0, top_k=-1),
        stream=True,
    )
    async with grpc.aio.insecure_channel(_target(sglang)) as channel:
        responses = [r async for r in sg_rpc.SglangSchedulerStub(channel).Generate(request)]

    kinds = [r.WhichOneof("response") for r in responses]
    assert kinds[-1] == "complete" and set(kinds[:-1]) == {"chunk"}
    assert {r.request_id for r in responses} == {"r1"}
    chunks = [r.chunk for r in responses[:-1]]
    streamed = [t for c in chunks for t in c.token_ids]
    assert streamed == [*model.encode(model.reply_text("text", Thinking.MODEL)), 151645]
    assert [c.completion_tokens for c in chunks] == [sum(len(x.token_ids) for x in chunks[: i + 1]) for i in range(len(chunks))]
    complete = responses[-1].complete
    assert list(complete.output_ids) == list(chunks[-1].token_ids)  # the last batch again
    assert (complete.finish_reason, complete.matched_token_id) == ("stop", 151645)
    assert complete.completion_tokens == len(streamed) and complete.prompt_tokens == len(prompt)


async def test_vllm_stream_shape_counts_per_chunk(vllm: GrpcEngineServer) -> None:
    model = vllm.engine.model
    request = vl.GenerateRequest(
        request_id="r2", tokenized=vl.TokenizedInput(input_ids=model.encode("Hello")), stream=True
    )
    async with grpc.aio.insecure_channel(_target(vllm)) as channel:
        responses = [r async for r in vl_rpc.VllmEngineStub(channel).Generate(request)]
    chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk"]
    assert all(c.completion_tokens == len(c.token_ids) for c in chunks)
    complete = responses[-1].complete
    assert list(complete.output_ids) == list(chunks[-1].token_ids)
    assert complete.completion_tokens == len(chunks[-1].token_ids)


async def test_prompt_marker_picks_a_qwen_tool_call_and_the_prompt_is_recorded(sglang: GrpcEngineServer) -> None:
    model = sglang.engine.model
    # Thinking off (the template closed an empty block): the answer is the call alone.
    text = "<|im_start|>user\nWeather? [[mock:tool_call]]<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    request = sg.GenerateRequest(
        request_id="t1",
        tokenized=sg.TokenizedInput(input_ids=model.encode(text), original_text="something else"),
        stream=False,
    )
    async with grpc.aio.insecure_channel(_target(sglang)) as channel:
        responses = [r async for r in sg_rpc.SglangSchedulerStub(channel).Generate(request)]
    assert len(responses) == 1
    output = list(responses[0].complete.output_ids)
    assert output[0] == 151657  # <tool_call>, one special token
    decoded = model.decode(output[:-1])
    assert decoded.startswith("<tool_call>\n") and decoded.endswith("\n</tool_call>")
    assert json.loads(decoded[len("<tool_call>\n") : -len("\n</tool_call>")]) == TOOL_CALL
    served = sglang.state.request("t1")
    assert served.reply == "tool_call" and served.prompt_text == text and served.thinking is Thinking.CLOSED
    assert not served.prompt_matches  # the ids do not decode to the text the client claimed


async def test_with_thinking_on_a_qwen_tool_call_follows_closed_reasoning(sglang: GrpcEngineServer) -> None:
    model = sglang.engine.model
    text = "<|im_start|>user\nWeather? [[mock:tool_call]]<|im_end|>\n<|im_start|>assistant\n"
    request = sg.GenerateRequest(request_id="t2", tokenized=sg.TokenizedInput(input_ids=model.encode(text)))
    async with grpc.aio.insecure_channel(_target(sglang)) as channel:
        [response] = [r async for r in sg_rpc.SglangSchedulerStub(channel).Generate(request)]
    output = list(response.complete.output_ids)
    assert output[0] == 151667 and output[-1] == 151645  # <think> ... <|im_end|>
    assert model.decode(output[:-1]) == (
        f"<think>\n{TOOL_REASONING}\n</think>\n\n<tool_call>\n{json.dumps(TOOL_CALL)}\n</tool_call>"
    )
    assert sglang.state.request("t2").thinking is Thinking.MODEL


@pytest.mark.parametrize(
    ("tokenizer", "prompt", "thinking", "parsers"),
    [
        pytest.param(QWEN, QWEN_TURN, Thinking.MODEL, ("qwen3", "qwen"), id="qwen3-thinking-on"),
        pytest.param(QWEN, QWEN_TURN + "<think>\n\n</think>\n\n", Thinking.CLOSED, ("qwen3", "qwen"), id="qwen3-thinking-off"),
        # A raw completion prompt (no reasoning parsing there): the model just continues.
        pytest.param(QWEN, "Once upon a time", Thinking.NONE, (None, "qwen"), id="qwen3-raw-prompt"),
        pytest.param(
            LLAMA, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            Thinking.NONE, (None, "llama"), id="llama3",
        ),
        pytest.param(MISTRAL, "<s>[INST] Hi[/INST]", Thinking.NONE, (None, "mistral"), id="mistral"),
        pytest.param(DEEPSEEK, DEEPSEEK_TURN, Thinking.MODEL, ("deepseek_r1", "deepseek"), id="deepseek-r1"),
        pytest.param(DEEPSEEK, DEEPSEEK_TURN + "<think>\n", Thinking.OPENED, ("deepseek_r1", "deepseek"), id="r1-distill"),
        pytest.param(DEEPSEEK, DEEPSEEK_TURN + "</think>", Thinking.CLOSED, ("deepseek_v3", "deepseek"), id="v3.1-no-thinking"),
    ],
)  # fmt: skip
def test_each_family_answers_as_its_model_and_the_gateway_parsers_read_it(
    tokenizer: str, prompt: str, thinking: Thinking, parsers: tuple[str | None, str]
) -> None:
    """A reply decoded with special tokens kept, read by the family's own parsers after that
    prompt: a thinking model's reasoning, then its text or its call in the family's format."""
    model = ScriptedModel(GrpcEngineConfig(runtime="sglang", tokenizer=tokenizer))
    assert model.thinking_of(prompt) is thinking
    reasoning_name, tool_name = parsers
    thinks = thinking in (Thinking.MODEL, Thinking.OPENED)
    for kind, reasoning, answer in (("text", REASONING, DEFAULT_TEXT), ("tool_call", TOOL_REASONING, "")):
        output = model.decode(model.reply_ids(kind, thinking))
        if reasoning_name is not None:
            parsed = REASONING_PARSERS.get(reasoning_name).for_prompt(prompt)
            events = [*parsed.feed(output), *parsed.finish()]
            said = "".join(e.text for e in events if type(e).__name__ == "ReasoningDelta")
            output = "".join(e.text for e in events if type(e).__name__ == "TextDelta")
            assert said == (reasoning if thinks else "")
        else:
            assert "<think>" not in output
        tools = TOOL_PARSERS.get(tool_name).parse(output)
        assert tools.content.strip() == answer
        if kind == "tool_call":
            (call,) = tools.tool_calls
            assert (call.name, json.loads(call.arguments)) == (TOOL_CALL["name"], TOOL_CALL["arguments"])
        else:
            assert tools.tool_calls == ()


async def test_llama_tool_call_and_reasoning_replies() -> None:
    server = await _server("vllm", LLAMA, reply="tool_call")
    try:
        model = server.engine.model
        assert model.family == "llama" and model.eos_token_id == 128009 and model.bos_token_id == 128000
        request = vl.GenerateRequest(request_id="l1", tokenized=vl.TokenizedInput(input_ids=[128000, 9906]))
        async with grpc.aio.insecure_channel(_target(server)) as channel:
            stub = vl_rpc.VllmEngineStub(channel)
            [response] = [r async for r in stub.Generate(request)]
            call = json.loads(model.decode(list(response.complete.output_ids)[:-1]))
            assert call == {"name": "get_weather", "parameters": TOOL_CALL["arguments"]}
            marker = vl.GenerateRequest(
                request_id="l2", tokenized=vl.TokenizedInput(input_ids=model.encode("[[mock:reasoning]]"))
            )
            [response] = [r async for r in stub.Generate(marker)]
            assert model.decode(list(response.complete.output_ids)).startswith("<think>\n")
    finally:
        await server.stop()


async def test_bad_prompts_are_invalid_arguments(sglang: GrpcEngineServer) -> None:
    async with grpc.aio.insecure_channel(_target(sglang)) as channel:
        stub = sg_rpc.SglangSchedulerStub(channel)
        for ids in ([], [10**7]):
            request = sg.GenerateRequest(request_id="bad", tokenized=sg.TokenizedInput(input_ids=ids))
            with pytest.raises(grpc.aio.AioRpcError) as error:
                [r async for r in stub.Generate(request)]
            assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_only_its_own_runtime_service_answers(sglang: GrpcEngineServer) -> None:
    async with grpc.aio.insecure_channel(_target(sglang)) as channel:
        assert (await sg_rpc.SglangSchedulerStub(channel).HealthCheck(sg.HealthCheckRequest())).healthy
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await vl_rpc.VllmEngineStub(channel).HealthCheck(vl.HealthCheckRequest())
        assert error.value.code() is grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await sg_rpc.SglangSchedulerStub(channel).ListLoadedLoRAAdapters(sg.ListLoadedLoRAAdaptersRequest())
        assert error.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_abort_of_a_running_request_ends_its_stream_with_abort() -> None:
    server = await _server("sglang", delay_ms=20.0, chunk_tokens=1)
    try:
        request = sg.GenerateRequest(
            request_id="long", tokenized=sg.TokenizedInput(input_ids=[9707]), stream=True
        )
        async with grpc.aio.insecure_channel(_target(server)) as channel:
            stub = sg_rpc.SglangSchedulerStub(channel)
            responses = []
            async for response in stub.Generate(request):
                responses.append(response)
                if len(responses) == 1:
                    answer = await stub.Abort(sg.AbortRequest(request_id="long", reason="client went away"))
                    assert answer.success
        assert responses[-1].complete.finish_reason == "abort"
        assert [(a.request_id, a.reason) for a in server.state.aborts] == [("long", "client went away")]
        assert server.state.request("long").finish_reasons == {0: "abort"}
    finally:
        await server.stop()


def test_config_is_checked() -> None:
    for bad in ({"runtime": "tgi"}, {"reply": "poem"}, {"chunk_tokens": 0}):
        with pytest.raises(ValueError):
            GrpcEngineConfig(**{"runtime": "sglang", "tokenizer": QWEN, **bad})


def test_management_command_grpc_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.management.base import CommandError

    from standins.management.commands import runmockworker

    calls: list[tuple[GrpcEngineConfig, str, int]] = []
    monkeypatch.setattr(runmockworker, "run_grpc_engine", lambda config, host, port: calls.append((config, host, port)))
    command = runmockworker.Command()
    parser = command.create_parser("manage.py", "runmockworker")
    argv = ["--grpc", "--runtime", "vllm", "--tokenizer", LLAMA, "--port", "0", "--reply", "reasoning", "--delay-ms", "1"]
    command.handle(**vars(parser.parse_args(argv)))
    assert calls == [
        (GrpcEngineConfig(runtime="vllm", tokenizer=LLAMA, reply="reasoning", delay_ms=1.0), "127.0.0.1", 0)
    ]
    with pytest.raises(CommandError, match="--tokenizer"):
        command.handle(**vars(parser.parse_args(["--grpc", "--port", "0"])))
    with pytest.raises(CommandError, match="--model"):
        command.handle(**vars(parser.parse_args(["--port", "0"])))


async def test_runmockworker_grpc_serves_and_announces() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "manage.py", "runmockworker", "--grpc", "--runtime", "sglang", "--tokenizer", QWEN,
        "--port", "0", "--model", "qwen3-mock", cwd=REPO, env=env, stdout=PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        prefix = "mock grpc engine (sglang) serving qwen3-mock on grpc://127.0.0.1:"
        assert line.startswith(prefix), line
        async with grpc.aio.insecure_channel(f"127.0.0.1:{int(line[len(prefix):])}") as channel:
            info = await sg_rpc.SglangSchedulerStub(channel).GetModelInfo(sg.GetModelInfoRequest())
        assert info.served_model_name == "qwen3-mock" and list(info.eos_token_ids) == [151645]
    finally:
        proc.terminate()
        await proc.wait()
