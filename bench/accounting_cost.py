"""CPU of a request's accounting alone (issue 25 item 1, docs/DECISIONS.md D66), in-process and
steady where the whole request path is not on a busy machine: what the turn runner adds per request
(the account made, the answer recorded, the entry built into the ledger and the token counters) and
what reading a relayed answer's usage adds (a whole chat answer; a 16-token stream, with the
usage-only event the gateway asked for taken out, and the request body written again with
``stream_options``).

``taskset -c 0 .venv/bin/python bench/accounting_cost.py [--requests 200000]``

Prints microseconds per request, best of 5 rounds of process CPU time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings_test")

import django  # noqa: E402

django.setup()

import orjson  # noqa: E402

from common import telemetry  # noqa: E402
from common.config import GatewayConfig  # noqa: E402
from inference.accounting import Delivered  # noqa: E402
from inference.auth import Identity, IdentityKind  # noqa: E402
from inference.dataplane import DataPlane  # noqa: E402
from inference.kit.account import RequestAccount  # noqa: E402
from inference.upstreams.usage_scan import StreamUsage, usage_in_body  # noqa: E402
from inference.writers import ResponseClock, ResponseWriter  # noqa: E402
from inference.writers.framing import OPENAI_SSE  # noqa: E402
from standins import mock_responses as mr  # noqa: E402

BODY = {"model": "mock-model", "messages": [{"role": "user", "content": "hello " * 40}], "stream": True}
WHOLE = orjson.dumps(mr.chat_completion("chatcmpl-1", 1, "mock-model", 1, 16, "stop", 40))
_steps, _tail = mr.chat_stream("chatcmpl-1", 1, "mock-model", 1, 16, "stop", 40, True)
CHUNKS = [*_steps, _tail]


async def _send(message: Any) -> None:
    return None


def _best(rounds: int, count: int, work: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(count):
            work()
        best = min(best, (time.process_time() - started) / count)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    args = parser.parse_args()
    dp = DataPlane.build(GatewayConfig())
    dp.ledger.log_capacity = 0  # the flush would drain it; a growing log is not the request's cost
    tenant = Identity(IdentityKind.TENANT, "acme")
    writer = ResponseWriter(_send, b"req-1", ResponseClock(time.perf_counter()), OPENAI_SSE)
    timer = telemetry.RouteTimer("/v1/chat/completions", "mock-model", False, time.perf_counter())
    usage = usage_in_body(WHOLE)

    def account() -> None:
        entry = RequestAccount(dp, tenant, "/v1/chat/completions", writer, timer)
        entry.model = "mock-model"
        entry.worker = "http://127.0.0.1:8000"
        entry.answered(200, Delivered(True, usage))
        entry.finish()

    def whole() -> None:
        usage_in_body(WHOLE)

    def stream() -> None:
        orjson.dumps({**BODY, "stream_options": {"include_usage": True}})
        scan = StreamUsage(strip=True)
        for chunk in CHUNKS:
            scan.feed(chunk)
        scan.end()
        scan.usage()

    count = args.requests
    print(f"account (entry, ledger, counters): {_best(5, count, account):.2f} us per request")
    print(f"usage of a whole relayed answer ({len(WHOLE)} bytes): {_best(5, count, whole):.2f} us")
    print(f"usage of a relayed 16-token stream (+ body rewrite): {_best(5, count // 10, stream):.2f} us")


if __name__ == "__main__":
    main()
