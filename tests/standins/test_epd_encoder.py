"""The TokenSpeed encode worker stand-in as ``runmockworker --grpc --runtime tokenspeed --role encode``:
it announces its bootstrap port, accepts a well-formed Encode and refuses a malformed one (the fields
it checks), fails on command (``--encode-fault``), and answers the scheduler's HealthCheck as the
engine the gateway registers; ``--role encode`` needs that runtime."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import grpc
import pytest

from protos import common_pb2, tokenspeed_encoder_pb2 as te, tokenspeed_encoder_pb2_grpc as te_rpc
from protos import tokenspeed_scheduler_pb2 as ts, tokenspeed_scheduler_pb2_grpc as ts_rpc
from standins.fixtures import FIXTURE_MODELS

REPO = Path(__file__).resolve().parents[2]
QWEN = str(FIXTURE_MODELS / "qwen3")
IMAGE = b"\x89PNG\r\n\x1a\n-an-image"
GRID = (1, 4, 4)  # 16 patches of 3 * 2 * 14 * 14 values (Qwen2-VL's sizes, the encoder's default), 4 tokens


def encode(
    room: int, data: bytes = IMAGE, content_hash: bytes | None = None, shape: tuple[int, int] = (16, 1176)
) -> te.EncodeRequest:
    grid = ts.TensorData(shape=[1, 3], dtype="int64", inline=b"".join(v.to_bytes(8, "little") for v in GRID))
    item = ts.MultimodalItem(
        modality=common_pb2.IMAGE, content_hash=hashlib.sha256(data).digest() if content_hash is None else content_hash,
        encoder_input=ts.TensorData(shape=list(shape), dtype="bfloat16", inline=bytes(2 * shape[0] * shape[1])),
        model_specific_tensors={"image_grid_thw": grid}, placeholders=[ts.PlaceholderRange(offset=3, length=4)],
        placeholder_token_id=151655,
    )
    return te.EncodeRequest(request_id="encode-1", mm_inputs=ts.MultimodalInputs(items=[item]),
                            items=[te.EncodeItemAssignment(bootstrap_room=room)])  # fmt: skip


async def serve(*extra: str) -> tuple[asyncio.subprocess.Process, str, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "manage.py", "runmockworker", "--grpc", "--runtime", "tokenspeed", "--role", "encode",
        "--tokenizer", QWEN, "--port", "0", "--model", "qwen3-mock", *extra, cwd=REPO, env=env, stdout=PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
    found = re.fullmatch(
        r"mock grpc engine \(tokenspeed encode\) serving qwen3-mock on grpc://(127\.0\.0\.1:\d+) \(bootstrap port (\d+)\)", line
    )
    assert found is not None, line
    return proc, found.group(1), int(found.group(2))


async def test_runmockworker_serves_an_encoder_that_checks_what_it_receives() -> None:
    proc, target, bootstrap_port = await serve()
    try:
        assert bootstrap_port > 0
        async with grpc.aio.insecure_channel(target) as channel:
            health = await ts_rpc.TokenSpeedSchedulerStub(channel).HealthCheck(ts.HealthCheckRequest())
            assert health.healthy
            stub = te_rpc.TokenSpeedEncoderStub(channel)
            assert (await stub.Encode(encode(7))).accepted
            for bad in (encode(7, content_hash=b"not the hash"), encode(-1), encode(7, shape=(16, 588))):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Encode(bad)
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        proc.terminate()
        await proc.wait()


async def test_an_encoder_fails_on_command() -> None:
    proc, target, _ = await serve("--encode-fault", "refuse")
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            assert not (await te_rpc.TokenSpeedEncoderStub(channel).Encode(encode(7))).accepted
    finally:
        proc.terminate()
        await proc.wait()


def test_role_encode_needs_the_tokenspeed_runtime() -> None:
    from django.core.management.base import CommandError

    from standins.management.commands import runmockworker

    command = runmockworker.Command()
    parser = command.create_parser("manage.py", "runmockworker")
    for argv in (["--grpc", "--runtime", "sglang", "--role", "encode", "--tokenizer", QWEN, "--port", "0"],
                 ["--role", "encode", "--model", "m", "--port", "0"]):  # fmt: skip
        with pytest.raises(CommandError, match="--role encode"):
            command.handle(**vars(parser.parse_args(argv)))
