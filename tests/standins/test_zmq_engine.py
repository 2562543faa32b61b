"""The ZMQ engine-core stand-in on its own: it dials in as a headless vLLM engine (``runmockworker
--zmq`` as a real process), derives the handshake address as the gateway does, and refuses bad
options."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from asyncio.subprocess import PIPE
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from inference.upstreams.engine import EngineRequest, FinishReason
from inference.upstreams.zmq.addresses import zmq_addresses
from inference.upstreams.zmq.client import ZmqEngineClient
from standins.fixtures import FIXTURE_MODELS
from standins.zmq_engine import ZmqEngineConfig, handshake_address_for, scripted_model

REPO = Path(__file__).resolve().parents[2]
QWEN = str(FIXTURE_MODELS / "qwen3")


@pytest.mark.parametrize("path", ["/tmp/vllm-engine", "/run/x", "/tmp/ü/engine"])
def test_the_stand_in_derives_the_handshake_address_as_the_gateway_does(path: str) -> None:
    assert handshake_address_for(f"ipc://{path}") == zmq_addresses(f"ipc://{path}").handshake


def test_runmockworker_zmq_refuses_missing_options() -> None:
    from standins.management.commands import runmockworker

    command = runmockworker.Command()
    parser = command.create_parser("manage.py", "runmockworker")
    with pytest.raises(CommandError, match="--zmq-url"):
        command.handle(**vars(parser.parse_args(["--zmq", "--port", "0", "--tokenizer", QWEN])))
    with pytest.raises(CommandError, match="ipc://"):
        command.handle(**vars(parser.parse_args(["--zmq", "--port", "0", "--tokenizer", QWEN, "--zmq-url", "tcp://x"])))
    with pytest.raises(CommandError, match="--dp-size"):
        command.handle(**vars(parser.parse_args(
            ["--zmq", "--port", "0", "--tokenizer", QWEN, "--zmq-url", "ipc:///tmp/x", "--dp-size", "0"]
        )))  # fmt: skip


async def test_runmockworker_zmq_dials_in_and_serves() -> None:
    with tempfile.TemporaryDirectory(prefix="zmq", dir="/tmp") as folder:
        url = f"ipc://{folder}/engine"
        eos = scripted_model(ZmqEngineConfig(tokenizer=QWEN)).eos_token_id
        assert eos is not None
        client = ZmqEngineClient(url, handshake_address="tcp://127.0.0.1:*", dp_size=2, eos_token_ids=(eos,))
        await client.start()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "manage.py", "runmockworker", "--zmq", "--port", "0", "--tokenizer", QWEN,
            "--model", "qwen3-mock", "--zmq-url", url, "--zmq-handshake-address", client.handshake_endpoint,
            "--dp-size", "2", cwd=REPO, env=env, stdout=PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
            assert line == f"mock zmq engine serving qwen3-mock via {client.handshake_endpoint} (dp_size 2)"
            await client.wait_ready(10)
            outputs = [o async for o in client.generate(EngineRequest("r", (9707, 11, 1879, 0)))]
            assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.STOP
            assert outputs[-1].finish.matched_token_id == eos
        finally:
            proc.terminate()
            await proc.wait()
            await client.close()
