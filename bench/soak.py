"""Soak: an hour (or ``--duration``) of mixed traffic against one gateway, with clients that behave
and clients that do not, sampling the gateway's memory, descriptors and CPU as it goes.

    .venv/bin/python bench/soak.py [--duration 3600] [--server uvicorn|daphne]

The mock worker and this client share core 1, the gateway has core 0. Traffic, each kind a set of
loops on raw sockets (so misbehaviour is exact): non-streamed chat, streamed chat read to the end,
streams dropped after the first event, a stream read slowly, heads trickled past their deadline,
bodies that stop, connections that never send, heads past the size limit, malformed JSON, and
GET /workers (a "chat" count is one connection of 20 requests kept alive). Every answer is checked against what that kind must get (200, 408, 431, 400, a close);
anything else counts as unexpected. Memory is judged by its drift: RSS after warm-up against RSS at
the end. Results go to bench/results/soak-<time>.json; the summary is printed (record it in
docs/PERFORMANCE.md: this is not part of CI).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.cpu_cost import cpu_seconds  # noqa: E402
from bench.gateway import MANAGE, PYTHON, start_mock_worker  # noqa: E402
from bench.nginx import MODEL  # noqa: E402
from bench.procs import LOOPBACK, ProcessGroup, child_env, free_port, http_get, pinned  # noqa: E402

RESULTS = REPO / "bench" / "results"
HEAD_TIMEOUT = 5  # the gateway's --request-head-timeout-secs and --request-body-timeout-secs here
MAX_HEAD = 16 * 1024
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}).encode()
STREAM = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": True}).encode()


@dataclass
class Tally:
    expected: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)

    def note(self, kind: str, ok: bool, what: str) -> None:
        if ok:
            self.expected[kind] += 1
        else:
            self.unexpected[f"{kind}: {what}"] += 1


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n").encode() + body


async def _answer(reader: asyncio.StreamReader, slow: bool = False) -> tuple[int, bytes]:
    """Read one answer: its status and body (Content-Length, chunked, or to the close)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        body = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                return status, bytes(body)
            if slow:
                for _ in range(0, size, 64):
                    await asyncio.sleep(0.05)
            body += await reader.readexactly(size)
            await reader.readline()
    for line in lowered.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return status, await reader.readexactly(int(line.split(b":")[1]))
    return status, await reader.read()


class Soak:
    def __init__(self, port: int, deadline: float) -> None:
        self.port = port
        self.deadline = deadline
        self.tally = Tally()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(LOOPBACK, self.port)

    async def loop(self, kind: str, once: Callable[[], Awaitable[tuple[bool, str]]], pause: float = 0.0) -> None:
        while time.monotonic() < self.deadline:
            try:
                ok, what = await asyncio.wait_for(once(), 60)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError) as exc:
                ok, what = False, type(exc).__name__
            self.tally.note(kind, ok, what)
            if pause:
                await asyncio.sleep(pause * random.uniform(0.5, 1.5))

    async def chat(self) -> tuple[bool, str]:
        reader, writer = await self._connect()
        try:
            for _ in range(20):  # kept alive for a few requests
                writer.write(_post("/v1/chat/completions", CHAT))
                status, _body = await _answer(reader)
                if status != 200:
                    return False, str(status)
            return True, ""
        finally:
            writer.close()

    async def stream(self, slow: bool = False) -> tuple[bool, str]:
        reader, writer = await self._connect()
        try:
            writer.write(_post("/v1/chat/completions", STREAM, "Connection: close\r\n"))
            status, body = await _answer(reader, slow=slow)
            return status == 200 and b"[DONE]" in body, f"{status}"
        finally:
            writer.close()

    async def dropped_stream(self) -> tuple[bool, str]:
        reader, writer = await self._connect()
        writer.write(_post("/v1/chat/completions", STREAM))
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"data:")
        writer.transport.abort()  # gone mid-stream, without a FIN
        return head.startswith(b"HTTP/1.1 200"), head[:20].decode(errors="replace")

    async def _refused(self, parts: list[bytes], want: int, gap: float = 0.0) -> tuple[bool, str]:
        reader, writer = await self._connect()
        try:
            for part in parts:
                writer.write(part)
                await writer.drain()
                if gap:
                    await asyncio.sleep(gap)
            answer = await reader.read()
            status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
            return status == want, str(status)
        finally:
            writer.close()

    async def trickled_head(self) -> tuple[bool, str]:
        head = b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Slow: "
        return await self._refused([head] + [b"s"] * 3, 408, gap=1.0)

    async def stalled_body(self) -> tuple[bool, str]:
        return await self._refused([_post("/v1/chat/completions", CHAT)[:-10]], 408)

    async def silent(self) -> tuple[bool, str]:
        return await self._refused([], 0)

    async def oversized_head(self) -> tuple[bool, str]:
        return await self._refused([b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"b" * (MAX_HEAD + 10)
                                    + b"\r\n\r\n"], 431)

    async def bad_json(self) -> tuple[bool, str]:
        return await self._refused([_post("/v1/chat/completions", b'{"model": "x", "messages": [', "Connection: close\r\n")], 400)

    async def workers(self) -> tuple[bool, str]:
        return await self._refused([b"GET /workers HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"], 200)

    async def run(self) -> None:
        kinds: list[tuple[str, Callable[[], Awaitable[tuple[bool, str]]], int, float]] = [
            ("chat", self.chat, 8, 0.0),
            ("stream", self.stream, 4, 0.0),
            ("stream read slowly", lambda: self.stream(slow=True), 1, 0.0),
            ("stream dropped", self.dropped_stream, 2, 0.1),
            ("head trickled (408)", self.trickled_head, 4, 0.0),
            ("body stalled (408)", self.stalled_body, 4, 0.0),
            ("silent connection (closed)", self.silent, 4, 0.0),
            ("head too large (431)", self.oversized_head, 1, 0.2),
            ("malformed JSON (400)", self.bad_json, 1, 0.1),
            ("GET /workers", self.workers, 1, 1.0),
        ]
        await asyncio.gather(*(self.loop(kind, once, pause) for kind, once, count, pause in kinds for _ in range(count)))


def _rss_and_fds(pid: int) -> tuple[float, int]:
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(list(Path(f"/proc/{pid}/fd").iterdir()))


async def _sample(pid: int, deadline: float, every: float, samples: list[dict[str, float]]) -> None:
    began = time.monotonic()
    while time.monotonic() < deadline:
        rss, fds = _rss_and_fds(pid)
        samples.append({"t": round(time.monotonic() - began, 1), "rss_mib": round(rss, 1), "fds": fds,
                        "cpu_s": round(cpu_seconds(pid), 2)})
        await asyncio.sleep(every)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds of traffic")
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds before the baseline RSS sample")
    parser.add_argument("--server", choices=("uvicorn", "daphne"), default="uvicorn")
    parser.add_argument("--sample-every", type=float, default=10.0)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {1})
    work = Path(f"/tmp/gw-soak-{os.getpid()}")
    with ProcessGroup(work / "logs") as group:
        worker_port, port = free_port(), free_port()
        start_mock_worker(group, port=worker_port, tokens=32, delay_ms=2, core=1)
        gateway_argv = [PYTHON, MANAGE, "rungateway", "--host", LOOPBACK, "--port", str(port), "--server", args.server,
                        "--worker-urls", f"http://{LOOPBACK}:{worker_port}", "--log-level", "warning",
                        "--request-head-timeout-secs", str(HEAD_TIMEOUT), "--request-body-timeout-secs",
                        str(HEAD_TIMEOUT), "--max-request-head-bytes", str(MAX_HEAD)]
        env = child_env({"GW_DATA_DIR": str(work / "data"), "DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
        gateway = group.start("gateway", pinned(0, gateway_argv), env=env, cwd=REPO)
        gateway.wait_ready(lambda: http_get(f"http://{LOOPBACK}:{port}/readiness")[0] == 200, timeout=60)
        pid = gateway.popen.pid
        deadline = time.monotonic() + args.duration
        soak = Soak(port, deadline)
        samples: list[dict[str, float]] = []

        async def everything() -> None:
            await asyncio.gather(soak.run(), _sample(pid, deadline, args.sample_every, samples))

        asyncio.run(everything())
        alive = gateway.alive
        log = gateway.log_path.read_text(errors="replace")
    after_warmup = [s for s in samples if s["t"] >= args.warmup] or samples
    cpu = samples[-1]["cpu_s"] - samples[0]["cpu_s"] if len(samples) > 1 else 0.0
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server": args.server,
        "duration_s": args.duration,
        "alive_at_end": alive,
        "expected": dict(soak.tally.expected),
        "unexpected": dict(soak.tally.unexpected),
        "rss_mib": {"start": samples[0]["rss_mib"], "after_warmup": after_warmup[0]["rss_mib"],
                    "max": max(s["rss_mib"] for s in samples), "end": samples[-1]["rss_mib"],
                    "median_after_warmup": statistics.median(s["rss_mib"] for s in after_warmup)},
        "fds": {"max": max(s["fds"] for s in samples), "end": samples[-1]["fds"]},
        "gateway_cpu_pct": round(cpu / max(1.0, samples[-1]["t"]) * 100, 1),
        "log_tracebacks": log.count("Traceback"),
        "log_errors": sum(1 for line in log.splitlines() if " ERROR " in line),
        "samples": samples,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    summary = {key: value for key, value in result.items() if key != "samples"}
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0 if alive and not soak.tally.unexpected else 1


if __name__ == "__main__":
    raise SystemExit(main())
