"""A ZMQ worker (the EngineCore stand-in as its own process, ``runmockworker --zmq``) behind
``rungateway --workers 2``: each serving process is one client of the engine (D69), so both serve
it, and a serving process killed and replaced by the supervisor serves it again (its sockets rebound
at the same addresses; the engine reconnects and says nothing: the replacement finds it by a probe).

Which process answered is known for certain: each openai SDK client keeps one keep-alive
connection, and the connection's owner is read from /proc (as test_serving_processes.py pins
them); the engine logs the ``client_index`` of every request and abort it receives."""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from standins.fixtures import FIXTURE_MODELS
from standins.scripted_engine import DEFAULT_TEXT
from tests.e2e.conftest import Process, wait_for
from tests.e2e.test_serving_processes import _dead, connection_owner, serving_pids, start_supervised

pytestmark = pytest.mark.e2e

__all__ = ["start_supervised"]  # the fixture, used here

QWEN = str(FIXTURE_MODELS / "qwen3")
MODEL = QWEN  # the worker is named by --model-path
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
MESSAGES = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zmq", dir="/tmp") as folder:  # ipc paths must stay short
        yield Path(folder)


class Pinned:
    """An openai SDK client whose one keep-alive connection is held by serving process ``pid``."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=30)
        self.sdk = openai.OpenAI(base_url=base_url + "/v1", api_key="x", http_client=self.http, max_retries=0,
                                 _strict_response_validation=True)  # fmt: skip
        self.pid: int | None = None

    def chat(self, port: int, pids: list[int]) -> tuple[str, int | None]:
        """A whole chat answer, and the process that served it (the connection's owner). A process
        just started loads the tokenizer at its first request and answers 503 meanwhile (retried)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                raw = self.sdk.chat.completions.with_raw_response.create(
                    model=MODEL, messages=MESSAGES, extra_body=NO_THINKING
                )
                break
            except openai.APIStatusError as error:
                if error.status_code != 503 or "is loading" not in error.message or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        client_port = raw.http_response.extensions["network_stream"].get_extra_info("client_addr")[1]
        self.pid = connection_owner(port, client_port, pids)
        return raw.parse().choices[0].message.content or "", self.pid

    def close(self) -> None:
        self.http.close()


def pin_each(gateway: Process, port: int, pids: list[int]) -> dict[int, Pinned]:
    """One SDK client per serving process, each having been answered by it once."""
    pinned: dict[int, Pinned] = {}
    deadline = time.monotonic() + 60
    while set(pinned) != set(pids) and time.monotonic() < deadline:
        client = Pinned(gateway.url)
        text, owner = client.chat(port, pids)
        assert text == DEFAULT_TEXT
        if owner is not None and owner not in pinned:
            pinned[owner] = client
        else:
            client.close()
    assert set(pinned) == set(pids), f"answers reached {sorted(pinned)} of {pids}:\n{gateway.log()}"
    return pinned


def clients_seen(engine: Process) -> set[int]:
    return {int(index) for index in re.findall(r"request \S+ from client (\d+)", engine.log())}


def test_both_serving_processes_serve_a_zmq_worker_and_a_replaced_one_again(
    spawn: Callable[..., Process], start_supervised: Callable[..., tuple[Process, int]], ipc_dir: Path
) -> None:
    url = f"ipc://{ipc_dir}/engine"
    engine = spawn("zmq-engine", ["runmockworker", "--zmq", "--zmq-url", url, "--model", "Qwen/Qwen3-8B", "--tokenizer", QWEN,
                                  "--chunk-tokens", "1", "--delay-ms", "5"], None, wait=False,
                   env={"GW_LOG_LEVEL": "debug"})  # fmt: skip
    gateway, port = start_supervised("--worker-urls", url, "--model-path", QWEN)
    wait_for(lambda: "mock zmq engine serving" in engine.log(), 30, "the engine's handshake", engine)
    lock = Path(gateway.env["GW_DATA_DIR"]) / "run" / f"gateway-{port}" / "leader.lock"
    leader = int(lock.read_text())
    pids = serving_pids(gateway)
    pinned = pin_each(gateway, port, pids)
    assert clients_seen(engine) == {0, 1}  # each process sent its requests as its own client

    # Streaming from each process.
    for pid, client in pinned.items():
        stream = client.sdk.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, extra_body=NO_THINKING)
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == DEFAULT_TEXT, pid
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"

    # A client that goes away mid-stream, on the process that does not answer the handshake: the
    # engine hears ABORT for that request.
    follower = next(pid for pid in pids if pid != leader)
    long = {**NO_THINKING, "max_tokens": 2000, "ignore_eos": True}
    with pinned[follower].sdk.chat.completions.with_streaming_response.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_body=long
    ) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        request_id = re.search(r'"id":"([^"]+)"', first)
        assert request_id is not None
    pinned[follower].close()
    aborted = f"abort {request_id.group(1)}-c"  # the engine's id: the gateway's and the client's index
    wait_for(lambda: aborted in engine.log(), 15, "the engine's ABORT", engine)

    # The follower killed: the supervisor replaces it, and the replacement serves the worker again.
    os.kill(follower, signal.SIGKILL)
    wait_for(lambda: _dead(follower), 10, "the killed process gone", None)
    wait_for(lambda: len(serving_pids(gateway)) == 2 and follower not in serving_pids(gateway), 30,
             "a replacement process", gateway)  # fmt: skip
    replacement = next(pid for pid in serving_pids(gateway) if pid != leader)
    again = pin_each(gateway, port, [leader, replacement])
    stream = again[replacement].sdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_body=NO_THINKING
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == DEFAULT_TEXT
    for client in [*pinned.values(), *again.values()]:
        client.close()
