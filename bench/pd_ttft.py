"""What PD dispatch adds to the first token: ``.venv/bin/python bench/pd_ttft.py``.

Three HTTP stand-ins on ``--load-core``: a regular mock worker (``runmockworker``), a prefill and a
decode worker (``runmockworker --role prefill --bootstrap-port N`` / ``--role decode``; the decode
side asks the prefill's bootstrap server for the request's KV before it answers, as SGLang's decode
waits for the transfer). On ``--target-core``, each measured alone in its turn (the others idle):

- ``gateway``: ``rungateway --worker-urls REGULAR`` (the non-PD route);
- ``gateway-pd``: ``rungateway --pd-disaggregation --prefill PREFILL BOOTSTRAP --decode DECODE``;
- ``smg`` and ``smg-pd``: smg launched the same two ways, when installed.

A streaming chat request (the ttfb client's default body, ``--tokens`` tokens, no delay) at
``--streams`` concurrent streams (default 1: one request at a time), the rounds alternating over
``direct`` (the regular worker itself), then every target, so all of them see the same machine noise.
TTFT is the time from sending the request to the first SSE bytes. ``--blocks`` blocks of
``--rounds`` rounds each give one p50 per URL; the report gives the median of the blocks' p50s with
their min..max, and per gateway what PD adds (its PD p50 minus its non-PD p50, per block) beside one
upstream round trip (the direct p50: one request to an upstream until its first byte). Results:
a table on stdout and ``bench/results/pd-ttft.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import MANAGE, PYTHON, REPO, START_TIMEOUT_S, mock_worker_argv  # noqa: E402
from bench.machine import loadavg  # noqa: E402
from bench.nginx import MODEL  # noqa: E402
from bench.peers import _NO_EGRESS, PEERS  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, StartError, child_env, free_port, http_get, http_post_json, pinned  # noqa: E402
from bench.rounds import RESULTS, bench_meta, failure_lines, in_work_dir, rotations, spread, write_results  # noqa: E402
from bench.run import _raise_on_sigterm  # noqa: E402
from bench.streaming import percentile, run_streams_multi  # noqa: E402

TARGETS = ("gateway", "gateway-pd", "smg", "smg-pd")


def start_worker(group: ProcessGroup, name: str, port: int, args: argparse.Namespace, role: list[str]) -> ManagedProcess:
    env = child_env({"DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
    argv = mock_worker_argv(port, args.tokens, 0.0) + role
    proc = group.start(name, pinned(args.load_core, argv), env=env, cwd=REPO)
    url = f"http://{LOOPBACK}:{port}/v1/models"
    proc.wait_ready(lambda: http_get(url)[0] == 200, timeout=START_TIMEOUT_S)
    return proc


def upstream_flags(pd: bool, regular: str, prefill: str, bootstrap: int, decode: str) -> list[str]:
    if pd:
        return ["--pd-disaggregation", "--prefill", prefill, str(bootstrap), "--decode", decode]
    return ["--worker-urls", regular]


def start_target(group: ProcessGroup, target: str, port: int, flags: list[str], work: Path,
                 args: argparse.Namespace) -> ManagedProcess:  # fmt: skip
    metrics = ["--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port())]
    if target.startswith("gateway"):
        argv = [PYTHON, MANAGE, "rungateway", "--host", LOOPBACK, "--port", str(port), "--server", "uvicorn",
                "--log-level", "warning", "--worker-startup-check-interval", "1", *metrics, *flags]  # fmt: skip
        env = child_env({"GW_DATA_DIR": str(work / f"data-{port}"), "DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
        (work / f"data-{port}").mkdir(parents=True, exist_ok=True)
        proc = group.start(f"{target}-{port}", pinned(args.target_core, argv), env=env, cwd=REPO)
    else:
        argv = [str(PEERS["smg"].binary), "launch", "--host", LOOPBACK, "--port", str(port), "--policy", "round_robin",
                "--log-level", "warn", *metrics, *flags]  # fmt: skip
        where = work / f"smg-{port}"
        where.mkdir(parents=True, exist_ok=True)
        proc = group.start(f"{target}-{port}", pinned(args.target_core, argv), env=child_env(_NO_EGRESS), cwd=where)
    url = f"http://{LOOPBACK}:{port}/readiness"
    if target == "gateway-pd":
        # The gateway's /readiness counts regular workers only (503 with prefill/decode workers alone):
        # ready once a chat request is answered.
        chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
        chat_url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
        proc.wait_ready(lambda: http_post_json(chat_url, chat, timeout=10)[0] == 200, timeout=START_TIMEOUT_S)
    else:
        proc.wait_ready(lambda: http_get(url)[0] == 200, timeout=START_TIMEOUT_S)
    return proc


async def _direct_pd(prefill: str, decode: str, bootstrap: int, rounds: int, warmup: int) -> list[float]:
    """The client as its own PD dispatcher: the same body (with bootstrap fields) to the prefill and the
    decode worker at once, as the gateways do; TTFT (ms) of the decode worker's stream."""
    import random

    import aiohttp

    from bench.ttfb_client import _body

    base = json.loads(_body(MODEL))
    samples: list[float] = []
    async with aiohttp.ClientSession() as session:

        async def drain(url: str, body: bytes) -> float:
            start = time.perf_counter()
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                first = await response.content.readany()
                first_at = time.perf_counter()
                while await response.content.readany():
                    pass
            if response.status != 200 or not first.startswith(b"data:"):
                raise RuntimeError(f"{url} answered {response.status}: {first[:200]!r}")
            return (first_at - start) * 1000

        for number in range(warmup + rounds):
            body = json.dumps(base | {"bootstrap_host": LOOPBACK, "bootstrap_port": bootstrap,
                                      "bootstrap_room": random.getrandbits(63)}).encode()  # fmt: skip
            _, ttft = await asyncio.gather(drain(f"{prefill}/v1/chat/completions", body),
                                           drain(f"{decode}/v1/chat/completions", body))  # fmt: skip
            if number >= warmup:
                samples.append(ttft)
    return samples


def run_direct_pd(prefill: str, decode: str, bootstrap: int, rounds: int, args: argparse.Namespace) -> dict[str, Any]:
    """:func:`_direct_pd` in its own process on ``--load-core`` (as the ttfb client runs)."""
    argv = [PYTHON, str(Path(__file__).resolve()), "--direct-pd-client", prefill, decode, str(bootstrap),
            "--rounds", str(rounds), "--warmup-rounds", str(args.warmup_rounds)]  # fmt: skip
    done = subprocess.run(pinned(args.load_core, argv), capture_output=True, text=True, timeout=rounds * 30 + 60,
                          env=child_env(), cwd=REPO, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"direct PD client failed: {done.stderr[-1500:]}")
    ttft = json.loads(done.stdout)
    return {"ttfb_p50_ms": round(percentile(ttft, 50), 3), "ttfb_p99_ms": round(percentile(ttft, 99), 3),
            "samples": len(ttft), "errors": 0}  # fmt: skip


def summarize(names: list[str], blocks: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        p50 = [b[name]["ttfb_p50_ms"] for b in blocks]
        p99 = [b[name]["ttfb_p99_ms"] for b in blocks]
        out[name] = {
            "ttft_p50_ms": spread(p50, 3),
            "ttft_p99_ms": spread(p99, 3),
            "samples": sum(b[name]["samples"] for b in blocks),
            "errors": sum(b[name]["errors"] for b in blocks),
        }
    for base in ("gateway", "smg"):
        if base in names and f"{base}-pd" in names:
            added = [b[f"{base}-pd"]["ttfb_p50_ms"] - b[base]["ttfb_p50_ms"] for b in blocks]
            trip = [b["direct"]["ttfb_p50_ms"] for b in blocks]
            direct_pd = [b["direct-pd"]["ttfb_p50_ms"] - b["direct"]["ttfb_p50_ms"] for b in blocks]
            dispatch = [a - d for a, d in zip(added, direct_pd)]
            out[f"{base}/pd-added"] = {
                "engines_pd_added_p50_ms": round(statistics.median(direct_pd), 3),
                "dispatch_added_p50_ms": spread(dispatch, 3, round_ends=True),
                "added_p50_ms": spread(added, 3, round_ends=True),
                "round_trip_ms": round(statistics.median(trip), 3),
                "added_over_round_trip": round(statistics.median(a / t for a, t in zip(added, trip)), 3),
            }
    return out


def render_markdown(summary: dict[str, Any], failures: dict[str, str]) -> str:
    rows = ["| URL | TTFT p50 ms (median of blocks) | min..max | TTFT p99 ms | samples | errors |",
            "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, entry in summary.items():
        if "/" in name:
            continue
        p50, p99 = entry["ttft_p50_ms"], entry["ttft_p99_ms"]
        rows.append(f"| {name} | {p50['median']:.2f} | {p50['min']:.2f}..{p50['max']:.2f} | {p99['median']:.2f} "
                    f"| {entry['samples']} | {entry['errors']} |")  # fmt: skip
    for name, entry in summary.items():
        if "/" in name:
            added = entry["added_p50_ms"]
            rows.append(f"\n{name.split('/')[0]}: PD adds {added['median']:+.2f} ms to the TTFT p50 (blocks "
                        f"{added['min']:+.2f}..{added['max']:+.2f}); one upstream round trip (direct p50) "
                        f"{entry['round_trip_ms']:.2f} ms; added / round trip x{entry['added_over_round_trip']:.2f}; "
                        f"of it the stand-ins' own PD (direct-pd minus direct) {entry['engines_pd_added_p50_ms']:+.2f} ms, "
                        f"the {name.split('/')[0]}'s dispatch {entry['dispatch_added_p50_ms']['median']:+.2f} ms (blocks "
                        f"{entry['dispatch_added_p50_ms']['min']:+.2f}..{entry['dispatch_added_p50_ms']['max']:+.2f})")  # fmt: skip
    rows += failure_lines(failures)
    return "\n".join(rows)


def run(args: argparse.Namespace, group: ProcessGroup, work: Path) -> tuple[list[str], list[dict[str, Any]], dict[str, str]]:
    regular_port, prefill_port, decode_port, bootstrap = free_port(), free_port(), free_port(), free_port()
    start_worker(group, "regular", regular_port, args, [])
    start_worker(group, "prefill", prefill_port, args, ["--role", "prefill", "--bootstrap-port", str(bootstrap)])
    start_worker(group, "decode", decode_port, args, ["--role", "decode"])
    regular, prefill, decode = (f"http://{LOOPBACK}:{p}" for p in (regular_port, prefill_port, decode_port))
    urls = {"direct": f"{regular}/v1/chat/completions"}
    failures: dict[str, str] = {}
    for target in args.targets:
        port = free_port()
        try:
            start_target(group, target, port, upstream_flags(target.endswith("-pd"), regular, prefill, bootstrap, decode),
                         work, args)  # fmt: skip
            url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
            run_streams_multi([url], streams=1, rounds=3, warmup_rounds=0, core=args.load_core)  # answers streams
        except (StartError, RuntimeError, OSError) as exc:
            failures[target] = str(exc)[-1500:]
            print(f"  {target}: not measured: {str(exc)[-400:]}", flush=True)
            continue
        urls[target] = url
        print(f"- {target}: serving", flush=True)
    names = list(urls)
    all_names = names + ["direct-pd"]
    blocks: list[dict[str, Any]] = []
    for number, order in rotations(names, args.blocks):
        results = run_streams_multi([urls[n] for n in order], streams=args.streams, rounds=args.rounds,
                                    warmup_rounds=args.warmup_rounds, core=args.load_core)  # fmt: skip
        block: dict[str, Any] = {name: result.to_dict() for name, result in zip(order, results)}
        block["loadavg"] = loadavg()
        block["direct-pd"] = run_direct_pd(prefill, decode, bootstrap, args.rounds, args)
        blocks.append(block)
        print(f"  block {number + 1}: " + ", ".join(f"{n} {block[n]['ttfb_p50_ms']:.2f} ms" for n in all_names),
              flush=True)  # fmt: skip
    return all_names, blocks, failures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--targets", default=",".join(TARGETS), help=f"subset of {','.join(TARGETS)} (default all)")
    add("--blocks", type=int, default=5, help="blocks, each one p50 per URL (default 5)")
    add("--rounds", type=int, default=60, help="rounds per block, alternating over the URLs (default 60)")
    add("--warmup-rounds", type=int, default=3)
    add("--streams", type=int, default=1, help="concurrent streams per round (default 1)")
    add("--tokens", type=int, default=16, help="tokens each stand-in streams (default 16)")
    add("--target-core", default="0")
    add("--load-core", default="1")
    add("--output", type=Path, default=RESULTS / "pd-ttft.json")
    add("--direct-pd-client", nargs=3, metavar=("PREFILL", "DECODE", "BOOTSTRAP_PORT"), default=None,
        help="internal: run the direct PD client and print its TTFTs")
    args = parser.parse_args(argv)
    args.targets = [t for t in args.targets.split(",") if t]
    if set(args.targets) - set(TARGETS):
        parser.error("unknown target")
    if not PEERS["smg"].installed:
        args.targets = [t for t in args.targets if not t.startswith("smg")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.direct_pd_client:
        prefill, decode, bootstrap = args.direct_pd_client
        print(json.dumps(asyncio.run(_direct_pd(prefill, decode, int(bootstrap), args.rounds, args.warmup_rounds))))
        return 0
    _raise_on_sigterm()
    meta = bench_meta()
    done = in_work_dir("gw-pd-bench-", "logs-pd", lambda group, work: run(args, group, work))
    if done is None:
        return 130
    names, blocks, failures = done
    summary = summarize(names, blocks) if blocks else {}
    write_results(args, meta, render_markdown(summary, failures), summary=summary, failures=failures, blocks=blocks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
