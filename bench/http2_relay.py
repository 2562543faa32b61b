"""Instructions per relayed chat, HTTP/2 (h2c, D111) beside HTTP/1.1, counted by callgrind in one run.

``.venv/bin/python bench/http2_relay.py [--requests 400] [--stream-tokens 16]``

A worker process outside callgrind serves the mock worker (standins/mock_worker.py) on one port and
the h2c front (standins/h2_worker.py) in front of it on another. The gateway's ASGI application is
called in-process (no server, no client socket, no background tasks) under
``valgrind --tool=callgrind --instr-atstart=no``, with two records of that worker: one over HTTP/1.1
to the mock worker's port, one over HTTP/2 to the front's. Warmed up, then windows alternated
(HTTP/1.1, HTTP/2, twice each) of ``--requests`` whole chats 8 at a time, and of ``--requests / 4``
streamed chats of ``--stream-tokens`` tokens; each window dumped on its own (``callgrind_control``).
Prints instructions per request of each transport and kind, per window (the heap frozen after the
warm-up: a full collection in one window would swing it by a tenth).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _serve() -> None:
    """The worker process: the mock worker and the h2c front; prints both ports."""
    from aiohttp import web

    from standins.h2_worker import H2Front
    from standins.mock_worker import MockWorkerConfig, build_app

    async def main() -> None:
        runner = web.AppRunner(build_app(MockWorkerConfig(model="bench-model")), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        inner = runner.addresses[0][1]
        front = H2Front(inner)
        port = await front.start()
        print(json.dumps({"http1": inner, "http2": port}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _control(*command: str) -> None:
    subprocess.run(["callgrind_control", *command, str(os.getpid())], check=True, capture_output=True)


async def _count(ports: dict[str, int], requests: int, stream_tokens: int) -> None:
    """The counted process (under callgrind)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings_test")
    import django

    django.setup()
    from administration.lifecycle import LIFECYCLE
    from common.config import GatewayConfig, install_config
    from gateway_project.asgi import application
    from inference.dataplane import reset_data_plane
    from inference.routing.registry import REGISTRY
    from inference.routing.workers import WorkerRecord, WorkerStatus

    config = GatewayConfig()
    install_config(config, export=False)
    reset_data_plane(config)
    records = [
        WorkerRecord(id=str(uuid.uuid4()), url=f"http://127.0.0.1:{ports[name]}", model_id=f"m-{name}",
                     runtime_type="sglang", status=WorkerStatus.READY, http2=name == "http2")
        for name in ("http1", "http2")
    ]  # fmt: skip
    REGISTRY.publish(records, {})
    LIFECYCLE.started = True

    async def one(name: str, stream: bool) -> None:
        body: dict[str, Any] = {"model": f"m-{name}", "messages": [{"role": "user", "content": "hello"}]}
        if stream:
            body.update(stream=True, mock={"tokens": stream_tokens})
        data = json.dumps(body).encode()
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

        await application(scope, receive, send)
        done.set()
        if statuses != [200]:
            raise RuntimeError(f"{name}: answered {statuses}")

    async def window(name: str, stream: bool, count: int) -> None:
        for _ in range(count // 8):
            await asyncio.gather(*(one(name, stream) for _ in range(8)))

    for name in ("http1", "http2"):
        await window(name, False, 80)
        await window(name, True, 16)
    import gc

    gc.collect()
    gc.freeze()  # a full collection over Django's heap lands in one window or another: none counted
    for round_ in (1, 2):
        for stream in (False, True):
            for name in ("http1", "http2"):
                _control("-i", "on")
                _control("-z")
                await window(name, stream, requests // 4 if stream else requests)
                _control("-d", f"{name}-{'stream' if stream else 'whole'}-{round_}")
                _control("-i", "off")


def _totals(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no totals")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--stream-tokens", type=int, default=16)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve()
        return 0
    if args.count:
        asyncio.run(_count(json.loads(args.count), args.requests, args.stream_tokens))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    worker = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        ports = worker.stdout.readline()
        with tempfile.TemporaryDirectory() as out:
            base = Path(out) / "callgrind.out"
            subprocess.run(
                ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={base}",
                 sys.executable, __file__, "--count", ports.strip(), "--requests", str(args.requests),
                 "--stream-tokens", str(args.stream_tokens)],
                check=True, cwd=REPO, capture_output=True,
            )  # fmt: skip
            dumps = sorted(Path(out).glob("callgrind.out*"))
            figures: dict[str, list[float]] = {}
            for dump in dumps:
                text = dump.read_text()
                label = next(
                    (line.split()[-1] for line in text.splitlines() if line.startswith("desc: Trigger:")), ""
                )
                parts = label.split("-")
                if len(parts) != 3:
                    continue
                name, kind, _ = parts
                count = args.requests // 4 if kind == "stream" else args.requests
                figures.setdefault(f"{name} {kind}", []).append(_totals(dump) / count)
    finally:
        worker.kill()
        worker.wait()
    result = {key: [round(value) for value in values] for key, values in sorted(figures.items())}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
