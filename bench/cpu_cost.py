"""CPU the gateway spends per request: a steadier measure than latency on a shared machine.

``.venv/bin/python bench/cpu_cost.py [--target uvicorn|daphne|smg] [--requests 640] [--repeat 3]``

Starts the gateway (or a reference peer) pinned to core 0 and, on core 1, the nginx worker (non-streaming) and the mock
worker (streaming, 1 and 64 tokens). Reads the gateway's user+system CPU time from /proc before and
after a fixed number of requests and prints microseconds of gateway CPU per request:

- ``chat``: non-streaming chat at concurrency 32 (wrk) to nginx;
- ``stream-1``: streams of one token, bursts of 32 (the per-request cost of a stream);
- ``stream-64``: streams of 64 tokens, bursts of 32; ``(stream-64 - stream-1) / 63`` is the cost of
  relaying one SSE chunk.

Latency on a busy machine swings by tens of percent; CPU time per request moves by a few. Use this
to compare changes to the request path, and ``bench/run.py`` for the targets.

``--relay``: the HTTP relay beside smg in one run (issue 27), ``.venv/bin/python bench/cpu_cost.py
--relay [--targets uvicorn,smg] [--auth off,on] [--rounds 5] [--duration 5] [--connections 64]``.
One nginx worker (one worker process) on ``--load-core``; every (target, auth) case runs at once on
``--target-core`` (the ones not measured are idle), health checks every ``--health-interval``
seconds; ``on`` starts the target with ``--api-key`` and wrk sends the key. Each of ``--rounds``
rounds loads every case once with wrk (``--connections``, ``--duration`` seconds after a warm-up),
the order rotated every round, and takes the CPU time of the case's process tree from /proc per
request answered. The default 5 s is the gateway's usage flush interval: every window holds one
flush (the request log's rows of about 5 s of load), where a 4 s window held one or none. Reported per case: the median and min..max over the rounds; per auth setting the
ratio of each target to smg, and per target on / off, as the median (min..max) of the per-round
ratios. A target ``uvicorn@PATH`` is the gateway of another checkout (a worktree of another
commit, run with this checkout's venv): an A/B of two builds in the same alternated rounds.
Writes ``bench/results/relay-cpu.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import REPO, start_gateway, start_mock_worker  # noqa: E402
from bench.loadgen import CHAT_REQUEST, run_wrk, write_script  # noqa: E402
from bench.machine import loadavg  # noqa: E402
from bench.nginx import start_nginx_worker  # noqa: E402
from bench.peers import PEERS, start_smg  # noqa: E402
from bench.procs import LOOPBACK, ProcessGroup, StartError, free_port  # noqa: E402
from bench.rounds import bench_meta, in_work_dir, measure_rounds, spread, write_results  # noqa: E402
from bench.streaming import run_streams  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a peer may run its server in a child process)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                queue.extend(int(child) for child in task.read_text().split())
            except OSError:
                pass
    return found


def cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of a process and its descendants, to the nanosecond (schedstat),
    else in clock ticks."""
    total = 0.0
    for member in _process_tree(pid):
        try:
            for task in Path(f"/proc/{member}/task").iterdir():
                total += int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            try:
                fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / _TICK
            except OSError:
                pass
    return total


def _start_target(
    target: str, group: ProcessGroup, work: Path, name: str, port: int, worker_url: str, workers: int = 1
) -> int:
    """Start the gateway (``uvicorn``/``daphne``, ``workers`` serving processes) or an installed peer
    (``smg``) on core 0; its pid (the CPU of its whole process tree is counted)."""
    if target in ("uvicorn", "daphne"):
        proc = start_gateway(
            group, f"gw-{name}", port=port, worker_url=worker_url, server=target, core=0,
            data_dir=work / f"data-{name}", workers=workers,
        )
    else:
        peer = PEERS[target]
        if not peer.installed:
            raise SystemExit(f"{target} is not installed: bench/run.py --install-peers")
        where = work / f"{target}-{name}"
        where.mkdir(parents=True, exist_ok=True)
        proc = peer.start(group, where, port, worker_url, 0)
    return proc.popen.pid  # taskset execs the program, so the launcher's pid is the server's


def measure(target: str, requests: int, repeat: int, workers: int = 1) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"chat": [], "stream-1": [], "stream-64": []}
    with tempfile.TemporaryDirectory(prefix="gw-cpu-") as tmp, ProcessGroup(Path(tmp) / "logs") as group:
        work = Path(tmp)
        nginx_port, mock1_port, mock64_port = free_port(), free_port(), free_port()
        start_nginx_worker(group, work / "nginx", nginx_port, core=1)
        start_mock_worker(group, port=mock1_port, tokens=1, delay_ms=5, core=1)
        start_mock_worker(group, port=mock64_port, tokens=64, delay_ms=5, core=1)
        gateways = {}
        for name, worker_port in (("chat", nginx_port), ("stream-1", mock1_port), ("stream-64", mock64_port)):
            port = free_port()
            pid = _start_target(target, group, work, name, port, f"http://{LOOPBACK}:{worker_port}", workers)
            gateways[name] = (port, pid)
        script = write_script(work / "chat.lua")
        for _ in range(repeat):
            port, pid = gateways["chat"]
            url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
            run_wrk(url, script, connections=32, threads=1, duration=1.0, core=1)  # warm
            before = cpu_seconds(pid)
            point = run_wrk(url, script, connections=32, threads=1, duration=3.0, core=1)
            results["chat"].append((cpu_seconds(pid) - before) / max(point.requests, 1) * 1e6)
            for name in ("stream-1", "stream-64"):
                # One-token streams take ~10 ms a round: five times as many keep the gateway's
                # background work (health checks, registry refresh) a small share of the window.
                rounds = max(1, requests // 32) * (5 if name == "stream-1" else 1)
                port, pid = gateways[name]
                url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
                run_streams(url, streams=32, rounds=2, warmup_rounds=0, core=1)  # warm
                before = cpu_seconds(pid)
                done = run_streams(url, streams=32, rounds=rounds, warmup_rounds=0, core=1)
                results[name].append((cpu_seconds(pid) - before) / max(done.samples, 1) * 1e6)
    return results


_RELAY_KEY = "bench-relay-key"
_AUTH = {"off": None, "on": _RELAY_KEY}


@dataclass
class RelayCase:
    """One relay target with client authentication on or off, measured once per round."""

    target: str  # uvicorn, daphne, smg, or uvicorn@PATH (another checkout's gateway)
    auth: str  # "on" (--api-key) or "off"
    port: int
    pid: int
    script: Path
    rounds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.target} auth-{self.auth}"

    def measure(self, args: argparse.Namespace) -> dict[str, Any]:
        url = f"http://{LOOPBACK}:{self.port}/v1/chat/completions"
        core = args.load_core
        if args.warmup > 0:
            run_wrk(url, self.script, connections=args.connections, threads=1, duration=args.warmup, core=core)
        before = cpu_seconds(self.pid)
        point = run_wrk(url, self.script, connections=args.connections, threads=1, duration=args.duration, core=core)
        cpu = cpu_seconds(self.pid) - before
        return {
            "cpu_us_per_request": cpu / max(point.requests, 1) * 1e6, "rps": point.rps, "requests": point.requests,
            "errors": point.errors + point.non_2xx,
        }  # fmt: skip


def _start_relay_target(
    target: str, auth: str, group: ProcessGroup, work: Path, worker_url: str, args: argparse.Namespace
) -> tuple[int, int]:
    """The target on ``--target-core`` in front of ``worker_url``, health checks every
    ``--health-interval`` s, ``--api-key`` when ``auth`` is on: (port, pid)."""
    port, key = free_port(), _AUTH[auth]
    interval = ["--health-check-interval-secs", f"{args.health_interval:g}"]
    name = f"{target.replace('/', '_')}-{auth}"
    if target == "smg":
        extra = [*interval, *(["--api-key", key] if key else [])]
        where = work / name
        where.mkdir(parents=True, exist_ok=True)
        proc = start_smg(group, where, port, worker_url, args.target_core, extra)
    else:
        server, _, checkout = target.partition("@")
        repo = Path(checkout).resolve() if checkout else REPO
        proc = start_gateway(
            group, f"gw-{name}", port=port, worker_url=worker_url, server=server, core=args.target_core,
            data_dir=work / f"data-{name}", extra=interval, api_key=key, repo=repo,
        )  # fmt: skip
    return port, proc.popen.pid


def _relay_smoke(case: RelayCase) -> None:
    """The case answers a chat request with the key (200, choices) and, with auth on, refuses one
    without it (401): raises StartError otherwise."""

    def post(key: str | None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        request = urllib.request.Request(
            f"http://{LOOPBACK}:{case.port}/v1/chat/completions", data=json.dumps(CHAT_REQUEST).encode(),
            headers=headers, method="POST",
        )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=10) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    status, body = post(_AUTH[case.auth])
    if status != 200 or b'"choices"' not in body:
        raise StartError(f"{case.key}: chat answered {status}: {body[:200]!r}")
    if case.auth == "on" and (refused := post(None)[0]) != 401:
        raise StartError(f"{case.key}: a request without the key answered {refused}, not 401")


def measure_relay(args: argparse.Namespace) -> dict[str, Any]:
    """The relay beside smg (``--relay``, the module's docstring): the summary written to ``--output``."""
    targets = [t for t in args.targets.split(",") if t]
    if "smg" in targets and not PEERS["smg"].installed:
        raise SystemExit("smg is not installed: bench/run.py --install-peers")
    auths = [a for a in args.auth.split(",") if a]
    meta = bench_meta()

    def run(group: ProcessGroup, work: Path) -> list[RelayCase]:
        nginx_port = free_port()
        start_nginx_worker(group, work / "nginx", nginx_port, core=args.load_core)
        worker_url = f"http://{LOOPBACK}:{nginx_port}"
        scripts = {auth: write_script(work / f"chat-{auth}.lua", api_key=_AUTH[auth]) for auth in auths}
        cases = []
        for target in targets:
            for auth in auths:
                port, pid = _start_relay_target(target, auth, group, work, worker_url, args)
                case = RelayCase(target, auth, port, pid, scripts[auth])
                _relay_smoke(case)
                cases.append(case)
        measure_rounds(cases, args, lambda case: case.key)
        return cases

    cases = in_work_dir("gw-relay-cpu-", "logs-relay-cpu", run)
    if cases is None:
        raise SystemExit(130)
    summary: dict[str, Any] = {
        case.key: {
            "cpu_us_per_request": spread([r["cpu_us_per_request"] for r in case.rounds], 1),
            "rps": spread([r["rps"] for r in case.rounds], 0),
            "errors": sum(r["errors"] for r in case.rounds),
            "disturbed_rounds": sum(r["disturbed"] for r in case.rounds),
        }
        for case in cases
    }
    by_key = {case.key: case for case in cases}

    def ratio(over: RelayCase | None, under: RelayCase | None) -> dict[str, float] | None:
        if over is None or under is None:
            return None
        return spread([o["cpu_us_per_request"] / u["cpu_us_per_request"]
                       for o, u in zip(over.rounds, under.rounds)], 3, round_ends=True)  # fmt: skip

    ratios: dict[str, Any] = {}
    for target in targets:
        for auth in auths:
            found = ratio(by_key.get(f"{target} auth-{auth}"), by_key.get(f"smg auth-{auth}"))
            if target != "smg" and found:
                ratios[f"{target} / smg, auth {auth}"] = found
        if found := ratio(by_key.get(f"{target} auth-on"), by_key.get(f"{target} auth-off")):
            ratios[f"{target}: auth on / off"] = found
    rows = [
        f"Relay CPU per request: one nginx worker, wrk -t1 -c{args.connections}, {args.rounds} rounds x "
        f"{args.duration:g} s, health checks every {args.health_interval:g} s; load average {loadavg()} at the end",
        "",
        "| target | auth | CPU µs/req median | min..max | req/s median | errors | rounds with a pytest |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        entry = summary[case.key]
        cpu = entry["cpu_us_per_request"]
        rows.append(f"| {case.target} | {case.auth} | {cpu['median']:,.1f} | {cpu['min']:,.1f}..{cpu['max']:,.1f} "
                    f"| {entry['rps']['median']:,.0f} | {entry['errors']} | {entry['disturbed_rounds']} |")  # fmt: skip
    rows += [f"\n{name}: x{r['median']:.3f} (rounds {r['min']:.3f}..{r['max']:.3f})" for name, r in ratios.items()]
    rounds = {case.key: case.rounds for case in cases}
    write_results(args, meta, "\n".join(rows), summary=summary, ratios=ratios, rounds=rounds)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="uvicorn", choices=("uvicorn", "daphne", *PEERS),
                        help="the gateway under uvicorn or daphne, or an installed reference peer")
    parser.add_argument("--requests", type=int, default=640, help="streams per streaming measurement")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gateway-workers", type=int, default=1,
                        help="the gateway's --workers N, all on core 0 (the cost of running as several processes)")
    relay = parser.add_argument_group("--relay: the HTTP relay beside smg, rounds alternated (see the docstring)")
    relay.add_argument("--relay", action="store_true", help="measure the relay beside smg instead")
    relay.add_argument("--targets", default="uvicorn,smg",
                       help="uvicorn, daphne, smg, uvicorn@PATH (another checkout), comma-separated")
    relay.add_argument("--auth", default="off,on", help="client authentication: off, on (--api-key) or both")
    relay.add_argument("--rounds", type=int, default=5)
    relay.add_argument("--duration", type=float, default=5.0,
                       help="seconds of wrk per case and round (a multiple of the gateway's 5 s usage flush)")
    relay.add_argument("--warmup", type=float, default=1.0, help="seconds of wrk before each measurement")
    relay.add_argument("--connections", type=int, default=64)
    relay.add_argument("--health-interval", type=float, default=5.0, help="seconds between health checks")
    relay.add_argument("--target-core", default="0")
    relay.add_argument("--load-core", default="1")
    relay.add_argument("--wait-for-tests", type=float, default=0.0,
                       help="before each measurement, wait up to this many seconds while a pytest runs")
    relay.add_argument("--attempts", type=int, default=2, help="measurements per case while a pytest ran meanwhile")
    relay.add_argument("--output", type=Path, default=Path(__file__).resolve().parent / "results" / "relay-cpu.json")
    args = parser.parse_args(argv)
    if args.relay:
        measure_relay(args)
        return 0
    results = measure(args.target, args.requests, args.repeat, args.gateway_workers)
    for name, values in results.items():
        print(f"{name:10s} CPU per request: median {statistics.median(values):7.1f} us  ({', '.join(f'{v:.1f}' for v in values)})")
    chunk = (statistics.median(results["stream-64"]) - statistics.median(results["stream-1"])) / 63
    print(f"per relayed SSE chunk: {chunk:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
