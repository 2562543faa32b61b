"""CPU of a request's accounting alone (issue 25 item 1, docs/DECISIONS.md D66, D85, D96), in-process
and steady where the whole request path is not on a busy machine: what the turn runner adds per
request (the account made, the answer recorded, the entry built into the ledger and the token counters
noted) and what reading a relayed answer's usage adds (a whole chat answer; a 16-token stream, with the
usage-only event the gateway asked for taken out, and the request body written again with
``stream_options``).

``taskset -c 0 .venv/bin/python bench/accounting_cost.py [--requests 200000]``

Prints microseconds per request, best of 5 rounds of process CPU time.

``--callgrind``: instructions instead, each case counted in a window of its own under
``valgrind --tool=callgrind --instr-atstart=no`` (figures the machine's load does not move), and three
more cases: the account made and answered but not closed (what a build with accounting off still
does: the close is the account's cost), the minute sums folded from a flush's entries (``fold_minutes``,
per entry: what the flush adds for every request, log or not: D116), and a request log row written by
the flush's ``write_usage`` (the fold included) into a store of its own (a fresh SQLite file store in a
temporary directory, as the gateway's default; Postgres with ``DATABASE_URL``), 5 flushes of 400 rows
after 10 flushes that fill the table first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "--callgrind-child" in sys.argv and not os.environ.get("DATABASE_URL"):
    os.environ["GW_DATA_DIR"] = tempfile.mkdtemp(prefix="gw-accounting-")  # a file store of its own
    os.environ["DJANGO_SETTINGS_MODULE"] = "gateway_project.settings"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings_test")

import django  # noqa: E402

django.setup()

import orjson  # noqa: E402
from django.core.management import call_command  # noqa: E402

from administration.usage_flush import write_usage  # noqa: E402
from common import telemetry  # noqa: E402
from common.config import GatewayConfig  # noqa: E402
from inference.accounting import Delivered, TokenUsage, UsageLedger, fold_minutes  # noqa: E402
from inference.asgi_io import new_request_id  # noqa: E402
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
LOG_FLUSH_ROWS = 400
LOG_FLUSHES = 5


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


def _control(*command: str) -> None:
    subprocess.run(["callgrind_control", *command, str(os.getpid())], check=True, capture_output=True)


def _counted(name: str, count: int, work: Callable[[], None]) -> None:
    """``work`` run ``count`` times in a callgrind window dumped as ``name`` (the parent reads it)."""
    work()
    _control("-i", "on")
    _control("-z")
    for _ in range(count):
        work()
    _control("-d", name)
    _control("-i", "off")


def _cases(dp: DataPlane) -> dict[str, Callable[[], None]]:
    tenant = Identity(IdentityKind.TENANT, "acme")
    writer = ResponseWriter(_send, b"req-1", ResponseClock(time.perf_counter()), OPENAI_SSE)
    timer = telemetry.RouteTimer("/v1/chat/completions", "mock-model", False, time.perf_counter())
    usage = usage_in_body(WHOLE)

    def opened() -> RequestAccount:
        account = RequestAccount(dp, tenant, "/v1/chat/completions", writer, timer)
        account.model = "mock-model"
        account.worker = "http://127.0.0.1:8000"
        account.answered(200, Delivered(True, usage))
        return account

    def account() -> None:
        opened().finish()

    def whole() -> None:
        usage_in_body(WHOLE)

    def stream() -> None:
        orjson.dumps({**BODY, "stream_options": {"include_usage": True}})
        scan = StreamUsage(strip=True)
        for chunk in CHUNKS:
            scan.feed(chunk)
        scan.end()
        scan.usage()

    def unclosed() -> None:
        opened()

    return {"account": account, "opened": unclosed, "whole": whole, "stream": stream}


def _log_batches(dp: DataPlane, flushes: int) -> list[Any]:
    """``flushes`` drained batches of :data:`LOG_FLUSH_ROWS` accounted requests, as the relay makes them."""
    dp.ledger = UsageLedger(100_000)
    tenant = Identity(IdentityKind.TENANT, "acme")
    timer = telemetry.RouteTimer("/v1/chat/completions", "mock-model", False, time.perf_counter())
    batches = []
    for _ in range(flushes):
        for _ in range(LOG_FLUSH_ROWS):
            writer = ResponseWriter(_send, new_request_id(), ResponseClock(time.perf_counter()), OPENAI_SSE)
            account = RequestAccount(dp, tenant, "/v1/chat/completions", writer, timer)
            account.model = "mock-model"
            account.worker = "http://127.0.0.1:8000"
            account.answered(200, Delivered(True, TokenUsage(40, 16)))
            account.finish()
        batches.append(dp.ledger.drain())
    return batches


def _child(requests: int) -> None:
    call_command("migrate", verbosity=0)
    dp = DataPlane.build(GatewayConfig())
    dp.ledger.log_capacity = 0  # no log kept; the entries collect (folded every FOLD_EVERY) as between flushes
    for name, work in _cases(dp).items():
        _counted(name, requests // 10 if name == "stream" else requests, work)
    for batch in _log_batches(dp, 10):  # the table holds rows first, as a running gateway's does
        write_usage(batch)
    entries = iter([batch.log for batch in _log_batches(dp, LOG_FLUSHES + 1)])
    _counted("fold", LOG_FLUSHES, lambda: fold_minutes({}, next(entries)))  # the sums alone (D116)
    batches = iter(_log_batches(dp, LOG_FLUSHES + 1))  # one for _counted's warm-up
    _counted("log_row", LOG_FLUSHES, lambda: write_usage(next(batches)))


def _callgrind(requests: int) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind (callgrind) is needed: apt-get install valgrind")
    work = Path(tempfile.mkdtemp(prefix="gw-accounting-cg-"))
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={work}/cg", sys.executable,
         __file__, "--callgrind-child", "--requests", str(requests)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    counts: dict[str, int] = {}
    for dump in work.glob("cg.*"):
        text = dump.read_text(errors="replace")
        name = next((line.split()[-1] for line in text.splitlines() if line.startswith("desc: Trigger")), "")
        total = next(int(line.split()[1]) for line in text.splitlines() if line.startswith("totals:"))
        counts[name] = total
    shutil.rmtree(work, ignore_errors=True)
    per = {
        "account": counts["account"] / requests, "opened": counts["opened"] / requests,
        "whole": counts["whole"] / requests, "stream": counts["stream"] / (requests // 10),
        "log_row": counts["log_row"] / (LOG_FLUSHES * LOG_FLUSH_ROWS),
        "fold": counts["fold"] / (LOG_FLUSHES * LOG_FLUSH_ROWS),
    }
    print(f"account (made, answered, closed): {per['account']:,.0f} instructions per request")
    print(f"  of which the close (entry, ledger, tokens noted): {per['account'] - per['opened']:,.0f}")
    print(f"minute sums folded at the flush ({LOG_FLUSH_ROWS} entries a flush): {per['fold']:,.0f} per request")
    print(f"usage of a whole relayed answer ({len(WHOLE)} bytes): {per['whole']:,.0f}")
    print(f"usage of a relayed 16-token stream (+ body rewrite): {per['stream']:,.0f}")
    print(f"request log row written by the flush ({LOG_FLUSHES} flushes of {LOG_FLUSH_ROWS}, the fold included): "
          f"{per['log_row']:,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=None, help="per case (default 200,000; 2,000 counted)")
    parser.add_argument("--callgrind", action="store_true", help="instructions per case under callgrind")
    parser.add_argument("--callgrind-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.callgrind_child:
        _child(args.requests)
        return
    if args.callgrind:
        _callgrind(args.requests or 2_000)
        return
    dp = DataPlane.build(GatewayConfig())
    dp.ledger.log_capacity = 0  # no log kept; the entries collect (folded every FOLD_EVERY) as between flushes
    cases = _cases(dp)
    count = args.requests or 200_000
    print(f"account (entry, ledger, counters): {_best(5, count, cases['account']):.2f} us per request")
    print(f"usage of a whole relayed answer ({len(WHOLE)} bytes): {_best(5, count, cases['whole']):.2f} us")
    print(f"usage of a relayed 16-token stream (+ body rewrite): {_best(5, count // 10, cases['stream']):.2f} us")


if __name__ == "__main__":
    main()
