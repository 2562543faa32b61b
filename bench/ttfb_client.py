"""Streaming client: N concurrent streaming chat requests at once, repeated for several rounds.

Run as its own process (the benchmark pins it with taskset) and prints one JSON object, a list
with one entry per ``--url``:
``[{"url": ..., "ttfb_ms": [...], "headers_ms": [...], "total_ms": [...], "errors": n, "error_samples": [...]}]``.
TTFB is the time from sending the request to the first body bytes (the first SSE event);
``headers_ms`` is the time to the response headers; ``elapsed_s`` the wall time of the measured rounds. With several ``--url`` the rounds alternate
between them (A, B, A, B, ...), so a baseline and a target see the same machine noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

LOOPBACK_PREFIX = "http://127.0.0.1:"


def _body(model: str) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Count slowly from one to one hundred."},
            ],
            "stream": True,
            "max_tokens": 64,
        }
    ).encode()


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    start = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        got_headers = time.perf_counter()
        if response.status != 200:
            text = (await response.read())[:200].decode(errors="replace")
            raise RuntimeError(f"HTTP {response.status}: {text}")
        first = await response.content.readany()
        first_at = time.perf_counter()
        tail = first
        events = first.count(b"data:")
        while chunk := await response.content.readany():
            events += (tail[-5:] + chunk).count(b"data:")
            tail = (tail + chunk)[-64:]
    done = time.perf_counter()
    # A chat stream ends with [DONE]; a Messages stream (event: lines) with its message_stop event.
    if not first.startswith((b"data:", b"event:")) or (b"[DONE]" not in tail and b'"message_stop"' not in tail):
        raise RuntimeError(f"not a complete SSE stream (first {first[:40]!r}, tail {tail[-20:]!r})")
    return {
        "ttfb_ms": (first_at - start) * 1000,
        "headers_ms": (got_headers - start) * 1000,
        "total_ms": (done - start) * 1000,
        "events": events,  # SSE events (data: lines) received, [DONE] included
    }


class _Bodies:
    """The request body, or with a marker, the body with the marker replaced by the next number."""

    def __init__(self, body: bytes, marker: str | None, base: int) -> None:
        self.head, found, self.tail = body.partition(marker.encode()) if marker else (body, b"", b"")
        if marker and not found:
            raise SystemExit(f"{marker!r} is not in the body")
        self.unique, self.n = bool(marker), base

    def next(self) -> bytes:
        if not self.unique:
            return self.head
        self.n += 1
        return b"%s%d%s" % (self.head, self.n, self.tail)


async def run(
    urls: list[str],
    model: str,
    streams: int,
    rounds: int,
    warmup: int,
    timeout: float,
    key: str | None,
    body: bytes | None = None,
    unique_marker: str | None = None,
    unique_base: int = 0,
) -> list[dict[str, Any]]:
    for url in urls:
        if not url.startswith(LOOPBACK_PREFIX):
            raise SystemExit(f"refusing non-loopback URL {url!r}")
    bodies = _Bodies(body or _body(model), unique_marker, unique_base)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    outs: list[dict[str, Any]] = [
        {"url": url, "ttfb_ms": [], "headers_ms": [], "total_ms": [], "errors": 0, "error_samples": [], "elapsed_s": 0.0}
        for url in urls
    ]
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    sessions = [
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=streams, limit_per_host=streams),
            timeout=client_timeout,
            trust_env=False,
        )
        for _ in urls
    ]
    try:
        for index in range(warmup + rounds):
            for url, session, out in zip(urls, sessions, outs):
                started = time.perf_counter()
                results = await asyncio.gather(
                    *(_one(session, url, bodies.next(), headers) for _ in range(streams)), return_exceptions=True
                )
                if index >= warmup:
                    out["elapsed_s"] += time.perf_counter() - started
                    _collect(out, results)
    finally:
        for session in sessions:
            await session.close()
    return outs


def _collect(out: dict[str, Any], results: list[Any]) -> None:
    for result in results:
        if isinstance(result, BaseException):
            out["errors"] += 1
            if len(out["error_samples"]) < 3:
                out["error_samples"].append(f"{type(result).__name__}: {result}")
        else:
            for name in ("ttfb_ms", "headers_ms", "total_ms"):
                out[name].append(round(result[name], 4))
            out.setdefault("events", []).append(result["events"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--url", action="append", required=True, help="URL of /v1/chat/completions on 127.0.0.1 (repeatable)"
    )
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup-rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--body", default=None, help="a file with the JSON request body to send instead of the default")
    parser.add_argument("--unique-marker", default=None, help="a string in the body replaced by a new number per request")
    parser.add_argument("--unique-base", type=int, default=0, help="the numbers start after this one")
    args = parser.parse_args(argv)
    body = Path(args.body).read_bytes() if args.body else None
    coro = run(
        args.url, args.model, args.streams, args.rounds, args.warmup_rounds, args.timeout, args.api_key,
        body, args.unique_marker, args.unique_base,
    )  # fmt: skip
    try:
        import uvloop  # noqa: PLC0415 - optional, lowers the client's own overhead

        result = uvloop.run(coro)
    except ImportError:
        result = asyncio.run(coro)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
