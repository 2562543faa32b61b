"""The vLLM gRPC PD stand-in as ``runmockworker --grpc --runtime vllm --role``: it announces its
role and bootstrap port, and reports its KV connector, role and engine id in GetServerInfo as a
vLLM PD engine does; roles are refused for runtimes without a PD stand-in."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import grpc
import pytest

from protos import vllm_engine_pb2 as vl
from protos import vllm_engine_pb2_grpc as vl_rpc
from standins.fixtures import FIXTURE_MODELS

REPO = Path(__file__).resolve().parents[2]
QWEN = str(FIXTURE_MODELS / "qwen3")


async def test_runmockworker_serves_a_vllm_prefill_with_its_connector() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "manage.py", "runmockworker", "--grpc", "--runtime", "vllm", "--role", "prefill",
        "--kv-connector", "mooncake", "--kv-engine-id", "p-1", "--tokenizer", QWEN, "--port", "0",
        "--model", "qwen3-mock", cwd=REPO, env=env, stdout=PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        found = re.fullmatch(
            r"mock grpc engine \(vllm prefill\) serving qwen3-mock on grpc://127\.0\.0\.1:(\d+) \(bootstrap port (\d+)\)", line
        )
        assert found is not None, line
        async with grpc.aio.insecure_channel(f"127.0.0.1:{found.group(1)}") as channel:
            info = await vl_rpc.VllmEngineStub(channel).GetServerInfo(vl.GetServerInfoRequest())
        assert (info.kv_connector, info.kv_role, info.kv_engine_id) == ("MooncakeConnector", "kv_producer", "p-1")
    finally:
        proc.terminate()
        await proc.wait()


def test_a_role_needs_a_runtime_with_a_pd_stand_in() -> None:
    from django.core.management.base import CommandError

    from standins.management.commands import runmockworker

    command = runmockworker.Command()
    parser = command.create_parser("manage.py", "runmockworker")
    argv = ["--grpc", "--runtime", "trtllm", "--role", "decode", "--tokenizer", QWEN, "--port", "0"]
    with pytest.raises(CommandError, match="--role"):
        command.handle(**vars(parser.parse_args(argv)))
