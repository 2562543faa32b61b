"""The gateway benchmark: ``make bench`` or ``.venv/bin/python bench/run.py [--duration S] [--install-peers]``.

One run, on the same pinned cores (target under test on core 0; nginx worker, wrk and the streaming
client on core 1):

1. non-streaming chat with wrk at concurrency 1 and 64 against the nginx worker directly, the
   gateway under uvicorn and under daphne, and the reference peers (smg, LiteLLM) when installed;
2. streaming time-to-first-byte for 32 concurrent streams, directly against the mock worker and
   through each target;
3. a table, ratios and the issue's targets; ``bench/results/latest.json``; the results section of
   ``docs/PERFORMANCE.md``.

Everything started is stopped at the end, on errors and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report  # noqa: E402
from bench.gateway import REPO, start_gateway, start_mock_worker  # noqa: E402
from bench.loadgen import CHAT_REQUEST, WRK, run_wrk, write_script  # noqa: E402
from bench.machine import describe, loadavg, missing_tools  # noqa: E402
from bench.nginx import NGINX, start_nginx_worker  # noqa: E402
from bench.peers import PEERS, find_peers, install_peers, peer_version  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, StartError, free_port, http_post_json  # noqa: E402
from bench.streaming import run_streams_multi  # noqa: E402

RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "PERFORMANCE.md"
TARGETS = ("worker", "gateway-uvicorn", "gateway-daphne", "smg", "litellm")
LABELS = {
    "worker": "nginx worker (direct)",
    "direct": "mock worker (direct)",
    "gateway-uvicorn": "gateway (uvicorn)",
    "gateway-daphne": "gateway (daphne)",
    "smg": "smg (Rust)",
    "litellm": "LiteLLM proxy",
}
DOC_TEMPLATE = "# Performance\n\nSee bench/README.md.\n"

Starter = Callable[[ProcessGroup, Path, int, str], ManagedProcess]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark the gateway against its worker and reference peers.")
    add = parser.add_argument
    add("--duration", type=float, default=6.0, help="seconds per wrk measurement point (default 6)")
    add("--warmup", type=float, default=2.0, help="seconds of wrk warm-up per target (default 2)")
    add("--repeat", type=int, default=1, help="wrk runs per point; the best is kept (default 1)")
    add("--connections", default="1,64", help="wrk concurrencies, comma separated (default 1,64)")
    add("--wrk-threads", type=int, default=1, help="wrk threads (default 1; capped at the connections)")
    add("--targets", default=",".join(TARGETS), help=f"subset of {','.join(TARGETS)}")
    add("--streams", type=int, default=32, help="concurrent streams per round (default 32)")
    add("--stream-rounds", type=int, default=20, help="measured rounds (default 20, after 2 warm-up rounds)")
    add("--stream-tokens", type=int, default=64, help="mock worker --tokens (default 64)")
    add("--stream-delay-ms", type=float, default=5.0, help="mock worker --delay-ms (default 5)")
    add("--no-streaming", action="store_true", help="skip the streaming TTFB part")
    add("--install-peers", action="store_true", help="pip-install smg and LiteLLM into bench/.venvs first")
    add("--no-peers", action="store_true", help="do not run smg / LiteLLM even when installed")
    add("--no-doc", action="store_true", help="do not update docs/PERFORMANCE.md")
    add("--output", type=Path, default=RESULTS / "latest.json", help="JSON results file")
    add("--strict", action="store_true", help="exit 1 when the uvicorn gateway misses a target")
    add("--target-core", default="0", help="core for the target under test (default 0)")
    add("--load-core", default="1", help="core for nginx, wrk and the stream client (default 1)")
    add("--gateway-workers", type=int, default=1,
        help="multi-core mode: the gateway's --workers N, on the --target-core list (e.g. 0-7) that smg "
             "also gets (default 1)")
    args = parser.parse_args(argv)
    args.connections = sorted({int(c) for c in args.connections.split(",") if c.strip()})
    args.targets = [t for t in args.targets.split(",") if t.strip()]
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    if args.no_peers:
        args.targets = [t for t in args.targets if t not in PEERS]
    if args.duration < 1 or args.warmup < 0 or not args.connections or min(args.connections) < 1:
        parser.error("--duration must be >= 1, --warmup >= 0, connections >= 1")
    if not 1 <= args.repeat <= 10:
        parser.error("--repeat must be 1..10")
    return args


def _raise_on_sigterm() -> None:
    def handler(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, handler)


def _starters(args: argparse.Namespace) -> dict[str, Starter]:
    """Per target (other than the worker itself): start it on core 0, relaying to a worker URL."""

    def gateway(server: str) -> Starter:
        def start(group: ProcessGroup, where: Path, port: int, worker_url: str) -> ManagedProcess:
            return start_gateway(
                group,
                f"gateway-{server}-{port}",
                port=port,
                worker_url=worker_url,
                server=server,
                core=args.target_core,
                data_dir=where / "data",
                workers=args.gateway_workers,
            )

        return start

    def peer(name: str) -> Starter:
        def start(group: ProcessGroup, where: Path, port: int, worker_url: str) -> ManagedProcess:
            return PEERS[name].start(group, where, port, worker_url, args.target_core)

        return start

    return {
        "gateway-uvicorn": gateway("uvicorn"),
        "gateway-daphne": gateway("daphne"),
        "smg": peer("smg"),
        "litellm": peer("litellm"),
    }


def _skip_reason(name: str) -> str | None:
    if name in PEERS and not PEERS[name].installed:
        return f"not installed ({PEERS[name].venv} missing; run bench/run.py --install-peers)"
    return None


def _smoke(url: str) -> None:
    """One chat request through the target must answer 200 with choices, or it is not measured."""
    status, body = http_post_json(url, json.dumps(CHAT_REQUEST).encode(), timeout=30)
    if status != 200 or b'"choices"' not in body:
        raise StartError(f"smoke request answered {status}: {body[:300]!r}")


def run_nonstreaming(args: argparse.Namespace, group: ProcessGroup, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    worker_port = free_port()
    nginx = start_nginx_worker(group, work / "nginx", worker_port, core=args.load_core)
    worker_url = f"http://{LOOPBACK}:{worker_port}"
    script = write_script(work / "chat.lua")
    starters = _starters(args)
    try:
        for name in args.targets:
            entry: dict[str, Any] = {"label": LABELS[name], "status": "ok", "points": {}}
            out[name] = entry
            reason = _skip_reason(name)
            if reason:
                entry.update(status="skipped", reason=reason)
                print(f"- {LABELS[name]}: skipped, {reason}", flush=True)
                continue
            print(f"- {LABELS[name]}: ", end="", flush=True)
            proc: ManagedProcess | None = None
            try:
                if name == "worker":
                    port = worker_port
                else:
                    port = free_port()
                    where = work / f"ns-{name}"
                    where.mkdir()
                    proc = starters[name](group, where, port, worker_url)
                url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
                _smoke(url)
                if args.warmup > 0:
                    run_wrk(url, script, connections=max(args.connections), threads=1, duration=args.warmup,
                            core=args.load_core)
                for conc in args.connections:
                    runs = [
                        run_wrk(url, script, connections=conc, threads=min(args.wrk_threads, conc),
                                duration=args.duration, core=args.load_core)
                        for _ in range(args.repeat)
                    ]
                    # Other load on the machine only ever slows a run down: keep the best one.
                    point = max(runs, key=lambda r: r.rps)
                    entry["points"][str(conc)] = {**point.to_dict(), "all_rps": [r.rps for r in runs]}
                    print(f"c={conc} {point.rps:,.0f} req/s p50 {point.p50_ms:.3f} ms p99 {point.p99_ms:.3f} ms; ",
                          end="", flush=True)
                print(flush=True)
            except (StartError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                _record_failure(entry, name, exc)
            finally:
                if proc is not None:
                    group.stop(proc)
    finally:
        group.stop(nginx)
    return out


def run_streaming(args: argparse.Namespace, group: ProcessGroup, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    port = free_port()
    try:
        mock = start_mock_worker(
            group, port=port, tokens=args.stream_tokens, delay_ms=args.stream_delay_ms, core=args.load_core
        )
    except (StartError, OSError) as exc:
        out["direct"] = {"label": LABELS["direct"], "status": "failed", "reason": _first_line(exc)}
        print(f"- mock worker failed to start: {_first_line(exc)}", flush=True)
        return out
    worker_url = f"http://{LOOPBACK}:{port}"
    starters = _starters(args)
    names = ["direct", *(t for t in args.targets if t != "worker")]
    try:
        for name in names:
            entry: dict[str, Any] = {"label": LABELS[name], "status": "ok"}
            out[name] = entry
            reason = _skip_reason(name)
            if reason:
                entry.update(status="skipped", reason=reason)
                continue
            print(f"- {LABELS[name]}: ", end="", flush=True)
            proc: ManagedProcess | None = None
            try:
                target_port = port
                if name != "direct":
                    target_port = free_port()
                    where = work / f"st-{name}"
                    where.mkdir()
                    proc = starters[name](group, where, target_port, worker_url)
                direct_url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
                target_url = f"http://{LOOPBACK}:{target_port}/v1/chat/completions"
                # A target's rounds alternate with rounds straight to the worker: a paired baseline.
                urls = [direct_url] if name == "direct" else [direct_url, target_url]
                measured = run_streams_multi(
                    urls, streams=args.streams, rounds=args.stream_rounds, warmup_rounds=2, core=args.load_core
                )
                result = measured[-1]
                entry["result"] = result.to_dict()
                if name != "direct":
                    entry["paired_direct"] = measured[0].to_dict()
                    entry["delta_p50_ms"] = round(result.ttfb_p50_ms - measured[0].ttfb_p50_ms, 3)
                    entry["delta_p99_ms"] = round(result.ttfb_p99_ms - measured[0].ttfb_p99_ms, 3)
                extra = "" if name == "direct" else f", {entry['delta_p50_ms']:+.2f} ms vs paired direct"
                print(f"TTFB p50 {result.ttfb_p50_ms:.2f} ms p99 {result.ttfb_p99_ms:.2f} ms "
                      f"({result.samples} streams, {result.errors} errors{extra})", flush=True)
            except (StartError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                _record_failure(entry, name, exc)
            finally:
                if proc is not None:
                    group.stop(proc)
    finally:
        group.stop(mock)
    return out


def _record_failure(entry: dict[str, Any], name: str, exc: BaseException) -> None:
    """A target that did not run: a peer is skipped, our own gateway failed."""
    status = "skipped" if name in PEERS else "failed"
    entry.update(status=status, reason=_first_line(exc))
    print(f"{status}: {_first_line(exc)}", flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = text.splitlines()
    return lines[0] + (f" ... {lines[-1]}" if len(lines) > 1 else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_tools({"nginx": NGINX, "wrk": WRK, "taskset": shutil.which("taskset") or "/usr/bin/taskset"})
    if missing:
        print(f"missing tools: {', '.join(missing)} (apt-get install nginx-light wrk util-linux)", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("warning: fewer than 2 cores; target and load generator share a core", file=sys.stderr)
        args.target_core = args.load_core = "0"
    if args.install_peers:
        install_peers()
    _raise_on_sigterm()

    meta = describe(REPO, NGINX, WRK)
    meta["peer_versions"] = {
        name: peer_version(peer) or "?" for name, peer in find_peers().items() if name in args.targets
    }
    config = {
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "connections": args.connections,
        "wrk_threads": args.wrk_threads,
        "repeat": args.repeat,
        "target_core": args.target_core,
        "load_core": args.load_core,
        "gateway_workers": args.gateway_workers,
        "streams": args.streams,
        "stream_rounds": args.stream_rounds,
        "stream_tokens": args.stream_tokens,
        "stream_delay_ms": args.stream_delay_ms,
        "request": CHAT_REQUEST,
    }
    work = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    group = ProcessGroup(work / "logs")
    results: dict[str, Any] = {"meta": meta, "config": config, "nonstreaming": {}, "streaming": {}}
    try:
        print(f"non-streaming chat ({args.duration:g} s per point, work dir {work})", flush=True)
        results["nonstreaming"] = run_nonstreaming(args, group, work)
        if not args.no_streaming:
            print(f"streaming TTFB ({args.streams} concurrent streams x {args.stream_rounds} rounds)", flush=True)
            results["streaming"] = run_streaming(args, group, work)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping everything", file=sys.stderr)
        return 130
    finally:
        group.close()
        _keep_logs(work)
        shutil.rmtree(work, ignore_errors=True)

    meta["loadavg_end"] = loadavg()
    if float(meta["loadavg_start"].split()[0] if meta["loadavg_start"] != "?" else 0) > 0.5:
        print(f"note: load average was {meta['loadavg_start']} at start; other work on the machine adds noise")
    summary = report.summarize(results)
    print()
    print(report.render_text(results, summary))
    report.write_json(args.output, results, summary)
    print(f"\nwrote {args.output}")
    if not args.no_doc:
        report.update_doc(DOC, report.render_markdown(results, summary), DOC_TEMPLATE)
        print(f"updated {DOC}")
    failed = [t for t in summary["targets"] if t["gateway"] == "gateway-uvicorn" and t["pass"] is False]
    return 1 if failed and args.strict else 0


def _keep_logs(work: Path) -> None:
    """Copy the children's logs to bench/results/logs (git-ignored) for a look after the run."""
    logs = work / "logs"
    if not logs.is_dir():
        return
    dest = RESULTS / "logs"
    shutil.rmtree(dest, ignore_errors=True)
    try:
        shutil.copytree(logs, dest)
    except OSError:
        pass


if __name__ == "__main__":
    raise SystemExit(main())
