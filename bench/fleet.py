"""Fleet mode: how the gateway's control plane and relay hold up as the fleet grows, beside smg.

``.venv/bin/python bench/fleet.py [--sizes 1,100,1000] [--targets gateway,smg] [--idle-secs 30]``

One nginx worker (core 1) listens on N loopback ports, so N distinct worker URLs reach the same C
worker. For each size and target (core 0, health checks every 5 s, everything else at defaults):

- registration: POST /workers for every URL, one after another (``--via cli``: every URL in
  ``--worker-urls`` at start; ``--via file``: every URL in a manifest of the file discovery provider,
  ``--discovery-provider file``; ``--via k8s``: every worker a Running and Ready pod of the stand-in
  Kubernetes API server (standins/kube_api.py, its own process on core 1, named by a kubeconfig), read
  with ``--service-discovery --selector app=bench-fleet --service-discovery-port P``, the pods' IPs
  distinct loopback addresses (127.1.x.y) where nginx listens on P; ``--via k8s-scale``: the same
  pods, none of them there until the target's first watch, then brought as a scale-up does, in waves
  of 100, three watch events a pod (Pending, Running with its IP, Ready); all timed from the
  process's start), then the time until every
  worker is healthy in GET /workers (the gateway needs two successful probes, smg its own rule), and
  the target's CPU seconds meanwhile;
- idle CPU over ``--idle-secs`` with the whole fleet registered (percent of one core);
- GET /workers latency (median of 10);
- RSS of the target's process tree;
- relay throughput: wrk c=64 on /v1/chat/completions for ``--duration`` seconds, with the target's
  CPU per relayed request and how busy its core was.

Prints a table and writes ``bench/results/fleet.json``. ``--profile DIR`` (py-spy on PATH or in the
venv) records the gateway during registration and while idle, as collapsed stacks in DIR.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_cost import _process_tree, cpu_seconds  # noqa: E402
from bench.gateway import MANAGE, PYTHON, REPO  # noqa: E402
from bench.loadgen import run_wrk, write_script  # noqa: E402
from bench.nginx import start_nginx_worker  # noqa: E402
from bench.peers import PEERS  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, child_env, free_port, http_get, http_post_json, pinned  # noqa: E402

RESULTS = REPO / "bench" / "results"
START_TIMEOUT_S = 60.0


POD_LABEL = "app=bench-fleet"


def _discovery_flags(urls: list[str], manifest: Path | None) -> list[str]:
    """--worker-urls, or the file discovery provider's flags with its manifest written."""
    if manifest is None:
        return ["--worker-urls", *urls] if urls else []
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"version": 1, "workers": [{"url": url} for url in urls]}))
    return ["--discovery-provider", "file", "--discovery-file", str(manifest)]


def _pod_address(index: int) -> str:
    """The loopback address pod ``index`` has as its IP (127.1.0.1, ...; 250 to a /24)."""
    return f"127.1.{index // 250}.{1 + index % 250}"


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: stand-in, cluster: {{server: \"{server}\"}}}}]\n"
        "users: [{name: bench, user: {token: stand-in-token}}]\n"
        "contexts: [{name: stand-in, context: {cluster: stand-in, user: bench}}]\n"
        "current-context: stand-in\n"
    )
    return path


def _start_kube_api(group: ProcessGroup, work: Path, addresses: list[str], scale_up: bool) -> Path:
    """The stand-in API server (core 1) holding one Running and Ready pod per address (``scale_up``:
    bringing them after the first watch): its kubeconfig."""
    work.mkdir(parents=True, exist_ok=True)
    key, _, value = POD_LABEL.partition("=")
    pods = work / "pods.json"
    pods.write_text(json.dumps([{"name": f"engine-{n}", "ip": ip, "labels": {key: value}}
                                for n, ip in enumerate(addresses)]))
    port = free_port()
    argv = [PYTHON, "-m", "standins.kube_api", "--host", LOOPBACK, "--port", str(port), "--pods", str(pods)]
    argv += ["--scale-up"] if scale_up else []
    proc = group.start("kube-api", pinned(1, argv), env=child_env(), cwd=REPO)
    proc.wait_ready(lambda: http_get(f"http://{LOOPBACK}:{port}/api/v1/pods?limit=1")[0] == 200,
                    timeout=START_TIMEOUT_S)
    return _kubeconfig(work / "kubeconfig", f"http://{LOOPBACK}:{port}")


def _kube_env(kubeconfig: Path | None) -> dict[str, str]:
    """KUBECONFIG naming the stand-in, for a target under ``--via k8s`` (nothing otherwise)."""
    return {} if kubeconfig is None else {"KUBECONFIG": str(kubeconfig)}


def _start_gateway(
    group: ProcessGroup, work: Path, port: int, interval: float, flags: list[str], kubeconfig: Path | None
) -> ManagedProcess:
    argv = [PYTHON, MANAGE, "rungateway", "--host", LOOPBACK, "--port", str(port), "--log-level", "warning",
            "--health-check-interval-secs", f"{interval:g}", "--prometheus-port", str(free_port())]
    argv += flags
    env = child_env({"GW_DATA_DIR": str(work / "data"), "DJANGO_SETTINGS_MODULE": "gateway_project.settings",
                     **_kube_env(kubeconfig)})
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = group.start(f"gateway-{port}", pinned(0, argv), env=env, cwd=REPO)
    proc.wait_ready(lambda: http_get(f"http://{LOOPBACK}:{port}/liveness")[0] == 200, timeout=START_TIMEOUT_S)
    return proc


def _start_smg(
    group: ProcessGroup, work: Path, port: int, interval: float, flags: list[str], kubeconfig: Path | None
) -> ManagedProcess:
    argv = [str(PEERS["smg"].binary), "launch", "--host", LOOPBACK, "--port", str(port), "--policy", "round_robin",
            "--health-check-interval-secs", f"{interval:g}", "--prometheus-host", LOOPBACK,
            "--prometheus-port", str(free_port()), "--log-level", "warn"]
    argv += flags
    work.mkdir(parents=True, exist_ok=True)
    env = child_env(_kube_env(kubeconfig))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = group.start(f"smg-{port}", pinned(0, argv), env=env, cwd=work)
    proc.wait_ready(lambda: http_get(f"http://{LOOPBACK}:{port}/liveness")[0] == 200, timeout=START_TIMEOUT_S)
    return proc


STARTERS: dict[str, Callable[[ProcessGroup, Path, int, float, list[str], Path | None], ManagedProcess]] = {
    "gateway": _start_gateway,
    "smg": _start_smg,
}


def _healthy(base: str) -> int:
    status, body = http_get(f"{base}/workers", timeout=30)
    if status != 200:
        return 0
    workers = json.loads(body).get("workers") or []
    return sum(1 for worker in workers if worker.get("is_healthy"))


def _distinct_ports(count: int) -> list[int]:
    """Free ports, no two alike (a port freed by one probe can come back from the next)."""
    found: dict[int, None] = {}
    while len(found) < count:
        found[free_port()] = None
    return list(found)


def _rss_mib(pid: int) -> float:
    total = 0
    for member in _process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _profiler(args: argparse.Namespace, pid: int, name: str, secs: float) -> subprocess.Popen[bytes] | None:
    """py-spy recording ``pid`` for ``secs`` into ``--profile``/``name``.svg (None without --profile)."""
    if not args.profile:
        return None
    spy = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
    out = Path(args.profile) / f"{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [spy, "record", "-p", str(pid), "-d", str(max(1, int(secs))), "-o", str(out), "-f", "raw", "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(target: str, size: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    with ProcessGroup(work / f"logs-{target}-{size}") as group:
        kubeconfig: Path | None = None
        if args.via in ("k8s", "k8s-scale"):  # one port on many loopback addresses, the pods' IPs
            port, nginx_port, pod_port = _distinct_ports(3)
            addresses = [_pod_address(n) for n in range(size)]
            start_nginx_worker(group, work / f"nginx-{target}-{size}", nginx_port, core=1,
                               extra_listens=[f"{address}:{pod_port}" for address in addresses])
            urls = [f"http://{address}:{pod_port}" for address in addresses]
            kubeconfig = _start_kube_api(group, work / f"kube-{target}-{size}", addresses, args.via == "k8s-scale")
            flags = ["--service-discovery", "--selector", POD_LABEL, "--service-discovery-port", str(pod_port)]
        else:
            ports = _distinct_ports(size + 1)  # the workers' and the target's
            port = ports.pop()
            start_nginx_worker(group, work / f"nginx-{target}-{size}", ports[0], core=1, extra_ports=ports[1:])
            urls = [f"http://{LOOPBACK}:{worker_port}" for worker_port in ports]
            manifest = work / f"{target}-{size}-workers.json" if args.via == "file" else None
            flags = _discovery_flags(urls if args.via in ("cli", "file") else [], manifest)
        started = time.monotonic()  # through --worker-urls or discovery: from the process's start
        proc = STARTERS[target](group, work / f"{target}-{size}", port, args.health_interval, flags, kubeconfig)
        cpu_started = cpu_seconds(proc.popen.pid) if args.via == "post" else 0.0  # else from the start
        base = f"http://{LOOPBACK}:{port}"
        profiling = _profiler(args, proc.popen.pid, f"{target}-{size}-register", 20) if target == "gateway" else None
        if args.via == "post":
            started = time.monotonic()
            for url in urls:
                status, body = http_post_json(f"{base}/workers", json.dumps({"url": url}).encode())
                if status not in (200, 201, 202):
                    raise RuntimeError(f"{target}: POST /workers answered {status}: {body[:200]!r}")
        posted = time.monotonic() - started
        deadline = started + args.ready_timeout
        ready = 0
        while time.monotonic() < deadline:
            ready = _healthy(base)
            if ready >= size:
                break
            time.sleep(0.25)
        registered = time.monotonic() - started if ready >= size else None
        registration_cpu = cpu_seconds(proc.popen.pid) - cpu_started
        if profiling is not None:
            profiling.wait()
        before = cpu_seconds(proc.popen.pid)
        time.sleep(args.idle_secs)
        idle = (cpu_seconds(proc.popen.pid) - before) / args.idle_secs * 100
        if target == "gateway" and (profiling := _profiler(args, proc.popen.pid, f"{target}-{size}-idle", 15)):
            profiling.wait()
        latencies = []
        for _ in range(10):
            began = time.perf_counter()
            http_get(f"{base}/workers", timeout=60)
            latencies.append((time.perf_counter() - began) * 1000)
        script = write_script(work / f"chat-{target}-{size}.lua")
        url = f"{base}/v1/chat/completions"
        run_wrk(url, script, connections=64, threads=1, duration=1.0, core=1)
        busy_before = cpu_seconds(proc.popen.pid)
        load = run_wrk(url, script, connections=64, threads=1, duration=args.duration, core=1)
        busy = cpu_seconds(proc.popen.pid) - busy_before
        return {
            "target": target, "via": args.via, "workers": size, "ready": ready, "posted_s": round(posted, 2),
            "all_ready_s": None if registered is None else round(registered, 2),
            "registration_cpu_s": round(registration_cpu, 2), "idle_cpu_pct": round(idle, 1),
            "get_workers_ms": round(statistics.median(latencies), 1), "rss_mib": round(_rss_mib(proc.popen.pid), 1),
            "relay_req_s": round(load.rps), "relay_errors": load.errors + load.non_2xx,
            # CPU of the target per relayed request (the figure that counts: req/s also depends on
            # whether nginx and wrk, sharing core 1, keep up) and how busy its core was.
            "relay_cpu_us": round(busy / max(1, load.requests) * 1e6, 1),
            "relay_core_pct": round(busy / args.duration * 100, 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000", help="fleet sizes, comma separated")
    parser.add_argument("--targets", default="gateway,smg", help="subset of gateway,smg")
    parser.add_argument("--health-interval", type=float, default=5.0)
    parser.add_argument("--idle-secs", type=float, default=30.0)
    parser.add_argument("--duration", type=float, default=6.0, help="wrk seconds for the relay throughput")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--via", choices=("post", "cli", "file", "k8s", "k8s-scale"), default="post",
                        help="register by POST /workers one after another, or all at start with --worker-urls, "
                             "or all at start in the file discovery provider's manifest, or as pods of the "
                             "stand-in Kubernetes API server read by --service-discovery (k8s-scale: brought "
                             "after the first watch, as a scale-up)")
    parser.add_argument("--profile", default="", help="write py-spy collapsed stacks of the gateway here")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    targets = [name for name in args.targets.split(",") if name.strip()]
    if "smg" in targets and not PEERS["smg"].installed:
        print("smg is not installed (bench/run.py --install-peers): measuring the gateway alone")
        targets.remove("smg")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gw-fleet-") as tmp:
        for size in sizes:
            for target in targets:
                row = measure(target, size, args, Path(tmp))
                rows.append(row)
                print(json.dumps(row), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fleet.json").write_text(json.dumps(rows, indent=2))
    print("\n| target (registration) | workers | POSTs s | all ready s | registration CPU s | idle CPU % | GET /workers ms "
          "| RSS MiB | relay req/s | relay CPU us/req | relay core % |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['target']} ({row['via']}) | {row['workers']:,} | {row['posted_s']} | {row['all_ready_s']} | "
              f"{row['registration_cpu_s']} | "
              f"{row['idle_cpu_pct']} | {row['get_workers_ms']} | {row['rss_mib']} | {row['relay_req_s']:,} | "
              f"{row['relay_cpu_us']} | {row['relay_core_pct']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
