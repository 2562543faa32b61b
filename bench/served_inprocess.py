"""The served gRPC pipeline in-process, for counting under callgrind (bench/served_instructions.py
``--in-process`` runs this file under valgrind with the working directory of the build to count).

``cd BUILD && valgrind --tool=callgrind --instr-atstart=no ... python bench/served_inprocess.py URL``
``--streams 4 --tokens 16,64 --whole 96 [--runtime sglang] [--loop asyncio|uvloop]``

The build's ASGI application is called directly (no HTTP server, no client socket, none of a started
gateway's background tasks) for an engine worker at ``URL`` (bench/lean_engine.py, Qwen3's fixture,
the gateway's Qwen3 parsers, thinking off, a new number in every prompt). After a warm-up it opens
three callgrind windows on its own process and dumps each (``callgrind_control``): ``--whole`` whole
short chats, 8 at a time, then ``--streams`` concurrent streams of each ``--tokens`` length. Prints
the SSE events per stream of each length (with the role, finish, usage and [DONE] events: a stream
of N tokens that did not fold has N + 4).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import uuid
from typing import Any

sys.path.insert(0, os.getcwd())  # the build to count: its own tree, not this file's
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings_test")

import django  # noqa: E402

django.setup()

from administration.lifecycle import LIFECYCLE  # noqa: E402
from common.config import GatewayConfig, install_config  # noqa: E402
from gateway_project.asgi import application  # noqa: E402
from inference.dataplane import reset_data_plane  # noqa: E402
from inference.pipeline.tokenizer_registry import TOKENIZERS  # noqa: E402
from inference.routing.registry import REGISTRY  # noqa: E402
from inference.routing.workers import EngineSpec, WorkerRecord, WorkerStatus  # noqa: E402
from standins.fixtures import FIXTURE_MODELS  # noqa: E402

MODEL = "bench-model"
_numbers = itertools.count(10**8)


def _control(*command: str) -> None:
    subprocess.run(["callgrind_control", *command, str(os.getpid())], check=True, capture_output=True)


def _body(tokens: int, stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": f"[request {next(_numbers)}] Kalo mi rento sa veldor an is qu est"}],
        "max_tokens": tokens, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False},
    }  # fmt: skip
    if stream:
        body.update(stream=True, ignore_eos=True, stream_options={"include_usage": True})
    return json.dumps(body).encode()


async def _one(tokens: int, stream: bool, events: list[int]) -> None:
    data = _body(tokens, stream)
    scope = {
        "type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(data)).encode())],
        "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 1),
        "client": ("127.0.0.1", 2), "root_path": "",
    }  # fmt: skip
    statuses: list[int] = []
    done = asyncio.Event()
    pending = [{"type": "http.request", "body": data, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
        elif message.get("body"):
            events[0] += message["body"].count(b"data:")

    await application(scope, receive, send)
    done.set()
    if statuses != [200]:
        raise RuntimeError(f"answered {statuses}")


async def run(args: argparse.Namespace) -> dict[str, float]:
    config = GatewayConfig(reasoning_parser="qwen3", tool_call_parser="qwen")
    install_config(config, export=False)
    reset_data_plane(config)
    tokenizer = str(FIXTURE_MODELS / "qwen3")
    record = WorkerRecord(id=str(uuid.uuid4()), url=args.url, model_id=MODEL, runtime_type=args.runtime,
                          status=WorkerStatus.READY,
                          engine=EngineSpec(tokenizer=tokenizer, reasoning_parser="qwen3", tool_parser="qwen"))  # fmt: skip
    TOKENIZERS.cache.get(tokenizer, None)
    REGISTRY.publish([record], {})
    LIFECYCLE.started = True
    events = [0]
    for attempt in range(30):  # the tokenizer loads first (503 until then)
        try:
            await _one(16, False, events)
            break
        except RuntimeError:
            if attempt == 29:
                raise
            await asyncio.sleep(1)
    for _ in range(10):
        await _one(16, False, events)
    low, high = args.tokens
    await asyncio.gather(*(_one(low, True, events) for _ in range(args.streams)))
    _control("-i", "on")
    _control("-z")
    for _ in range(args.whole // 8):
        await asyncio.gather(*(_one(16, False, events) for _ in range(8)))
    _control("-d", "whole")
    _control("-i", "off")
    out: dict[str, float] = {}
    for tokens in (low, high):
        events[0] = 0
        _control("-i", "on")
        _control("-z")
        await asyncio.gather(*(_one(tokens, True, events) for _ in range(args.streams)))
        _control("-d", f"stream-{tokens}")
        _control("-i", "off")
        out[f"events_per_stream_{tokens}"] = events[0] / args.streams
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=lambda s: tuple(int(x) for x in s.split(",")), default=(16, 64))
    parser.add_argument("--whole", type=int, default=96)
    parser.add_argument("--runtime", default="sglang", help="the worker's runtime (the lean engine's --runtime)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="the event loop: asyncio's own (Python: its wake-ups are counted as bytecodes) or "
                             "uvloop, as a served gateway runs")  # fmt: skip
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
