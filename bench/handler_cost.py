"""CPU per request of the data-plane handler alone, in-process: a steadier probe than the others on a
shared machine, for comparing two builds of the request path.

``taskset -c 0 .venv/bin/python bench/handler_cost.py [--requests 2000] [--stream] [--grpc]``

``--grpc``: the gRPC pipeline instead of the relay: the gRPC engine stand-in (sglang, the Qwen3
fixture tokenizer, 3 tokens a message) in the same process, answering the gateway's chat turn
(template, tokenize, generate, detokenize, parse).

The gateway's ASGI application is called directly (no HTTP server, no client) with the project's
mock worker running in the same process and event loop, so the figure includes the worker's share,
which is the same for both builds. Prints the best of 5 rounds, in microseconds of process CPU time
per request. Run the builds interleaved (A, B, A, B) and compare the minimums.

``--api-key``: the gateway authenticates (the requests carry the key). ``--callgrind``: instructions
per request instead, a count a loaded machine does not change: the probe runs again in a process of
its own under ``valgrind --tool=callgrind --instr-atstart=no``, the collector set as a started gateway
sets it, and one window of ``--requests`` requests after the warm-up is counted (instrumentation on
and counts zeroed at its start, dumped at its end, as bench/trace_cost.py does); the mock worker's
share is included, the same for every build. ``--keep DIR`` keeps the dump for callgrind_annotate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings_test")

import django  # noqa: E402

django.setup()

from aiohttp import web  # noqa: E402

from administration.lifecycle import GC_THRESHOLDS, LIFECYCLE  # noqa: E402
from common.config import GatewayConfig, install_config  # noqa: E402
from gateway_project.asgi import application  # noqa: E402
from inference.dataplane import reset_data_plane  # noqa: E402
from inference.routing.registry import REGISTRY  # noqa: E402
from inference.pipeline.tokenizer_registry import TOKENIZERS  # noqa: E402
from inference.routing.workers import EngineSpec, WorkerRecord, WorkerStatus  # noqa: E402
from standins.fixtures import FIXTURE_MODELS  # noqa: E402
from standins.grpc_engine import GrpcEngineServer  # noqa: E402
from standins.mock_worker import MockWorkerConfig, build_app  # noqa: E402
from standins.scripted_engine import GrpcEngineConfig  # noqa: E402

_MESSAGES = b'"messages":[{"role":"user","content":"hello"}]'
_API_KEY = "bench-handler-key"


async def measure(
    requests: int, stream: bool, grpc: bool = False, rounds: int = 5, clock: Callable[[], float] = time.process_time,
    api_key: bool = False,
) -> float:
    """The best of ``rounds`` rounds of ``requests``, in ``clock`` units per request (microseconds of
    process CPU time; bench/trace_cost.py's ``--callgrind`` passes a clock that marks the window).
    ``api_key``: the gateway with --api-key, the requests carrying it."""
    runner = web.AppRunner(build_app(MockWorkerConfig(model="mock-model", tokens=1)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = GatewayConfig(api_key=_API_KEY) if api_key else GatewayConfig()
    install_config(config, export=False)
    reset_data_plane(config)
    url = f"http://127.0.0.1:{port}"
    record = WorkerRecord(id=str(uuid.uuid4()), url=url, model_id="mock-model", runtime_type="sglang",
                          status=WorkerStatus.READY)
    engine: GrpcEngineServer | None = None
    if grpc:
        tokenizer = str(FIXTURE_MODELS / "qwen3")
        engine = GrpcEngineServer(GrpcEngineConfig(runtime="sglang", tokenizer=tokenizer, model="mock-model"))
        await engine.start()
        record = WorkerRecord(id=str(uuid.uuid4()), url=engine.url, model_id="mock-model", runtime_type="sglang",
                              status=WorkerStatus.READY, engine=EngineSpec(tokenizer=tokenizer))
        TOKENIZERS.cache.get(tokenizer, None)
    REGISTRY.publish([record], {})
    LIFECYCLE.started = True
    body = b'{"model":"mock-model",' + (b'"stream":true,' if stream else b"") + _MESSAGES + b"}"
    scope = {
        "type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(body)).encode()),
                                         *([(b"authorization", b"Bearer " + _API_KEY.encode())] if api_key else [])],
        "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 1),
        "client": ("127.0.0.1", 2), "root_path": "",
    }

    async def one() -> None:
        started: list[int] = []
        done = asyncio.Event()
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started.append(message["status"])

        await application(dict(scope), receive, send)
        done.set()
        assert started == [200], started

    for _ in range(300):
        await one()
    best = float("inf")
    for _ in range(rounds):
        before = clock()
        for _ in range(requests):
            await one()
        best = min(best, (clock() - before) / requests * 1e6)
    await reset_data_plane(config).aclose()
    await runner.cleanup()
    if engine is not None:
        await engine.stop()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--stream", action="store_true", help="one-token streams instead of chat")
    parser.add_argument("--grpc", action="store_true", help="the gRPC pipeline (engine stand-in) instead of the relay")
    parser.add_argument("--api-key", action="store_true", help="the gateway with --api-key (the requests carry it)")
    parser.add_argument("--callgrind", action="store_true", help="instructions per request under callgrind")
    parser.add_argument("--keep", type=Path, help="with --callgrind: copy the window's dump into this directory")
    parser.add_argument("--callgrind-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    kind = ("grpc " if args.grpc else "") + ("stream" if args.stream else "chat")
    if args.callgrind_child:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        asyncio.run(measure(args.requests, args.stream, args.grpc, rounds=1, clock=_window(), api_key=args.api_key))
        return 0
    if args.callgrind:
        count = _instructions(args)
        print(f"{kind}: {count / 1e3:,.1f}k instructions per request (callgrind, {args.requests} requests)")
        return 0
    best = asyncio.run(measure(args.requests, args.stream, args.grpc, api_key=args.api_key))
    print(f"{kind}: {best:.1f} us CPU per request (best of 5 x {args.requests})")
    return 0


def _window() -> Callable[[], float]:
    """A clock for :func:`measure` that opens the callgrind window at its first reading and dumps it
    at its second."""
    readings: list[int] = []

    def control(*command: str) -> None:
        subprocess.run(["callgrind_control", *command, str(os.getpid())], check=True, capture_output=True)

    def clock() -> float:
        if not readings:
            control("-i", "on")
            control("-z")
        else:
            control("-d", "window")
        readings.append(1)
        return 0.0

    return clock


def _instructions(args: argparse.Namespace) -> float:
    """Instructions per request: this probe in a process of its own under callgrind (one window)."""
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "callgrind.out"
        argv = [sys.executable, __file__, "--callgrind-child", "--requests", str(args.requests)]
        argv += [flag for flag, on in (("--stream", args.stream), ("--grpc", args.grpc), ("--api-key", args.api_key))
                 if on]  # fmt: skip
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *argv],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        [dump] = [path for path in Path(work).glob("callgrind.out.*")]  # the window's (the rest: the program's end)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(dump, args.keep / dump.name)
        summary = next(line for line in dump.read_text().splitlines() if line.startswith("summary:"))
    return int(summary.split()[1]) / args.requests


if __name__ == "__main__":
    raise SystemExit(main())
