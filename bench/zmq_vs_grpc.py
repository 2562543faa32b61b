"""The ZMQ path beside the gRPC path: ``.venv/bin/python bench/zmq_vs_grpc.py``.

The gateway (uvicorn, ``--workers 1``) and smg each front the gRPC engine stand-in
(bench/lean_engine.py, ``grpc://``) and the ZMQ engine-core stand-in (bench/lean_engine.py
``--zmq-url``: vLLM's EngineCore dialing in to the target's ``ipc://`` worker), both driven by the
same fixture tokenizer and scripted engine, made lean the same way and run to the token limit
(``--to-max-tokens``). Each target renders, tokenizes, drives the engine with token ids and
detokenizes, so the two paths differ only in the engine wire. Per (target, path), on the same
chat prompt (Qwen3 fixture, ~1k tokens, ``--tokenizer``, ``--size``, ``--variant`` as in gRPC
pipeline mode):

1. whole answers, ``max_tokens`` 16: wrk at c=64 for ``--duration`` seconds, the target's CPU per
   request (every thread's CPU time from /proc, as bench/cpu_cost.py);
2. streamed answers, 256 tokens: ``--stream-rounds`` rounds of 32 concurrent streams, the target's
   CPU per output token and per SSE event.

Every target runs at once on ``--target-core`` (those not measured are idle; an ``ipc://`` worker
has one engine per target, as only one process can bind its sockets); the engines, wrk and the
stream client on ``--load-core``. ``--rounds`` rounds each measure every case once, the order
rotated every round; the report gives medians, min..max, and per target the ZMQ / gRPC ratio as
the median of the per-round ratios. Results: a table on stdout and ``bench/results/zmq-vs-grpc.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import pstats
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import PYTHON, REPO, start_gateway, start_grpc_engine  # noqa: E402
from bench.grpc_pipeline import _TEMPLATE_TOKENS, MODELS, SIZES, Model, TestWatch, _no_heavy_load, prompt_text, split  # noqa: E402
from bench.loadgen import WRK  # noqa: E402
from bench.machine import describe, loadavg  # noqa: E402
from bench.messages_vs_chat import Case, _spread  # noqa: E402
from bench.nginx import NGINX  # noqa: E402
from bench.peers import PEERS, peer_version, start_smg  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, StartError, child_env, free_port, http_get, pinned  # noqa: E402
from bench.run import _raise_on_sigterm  # noqa: E402

RESULTS = REPO / "bench" / "results"
PATHS = ("grpc", "zmq")
TARGETS = ("gateway", "smg")
METRICS = ("cpu_us_per_request", "cpu_us_per_token", "cpu_us_per_event", "rps", "tokens_per_s", "events_per_stream")


def start_zmq_engine(group: ProcessGroup, url: str, model: Model, core: str, delay_ms: float = 0.0) -> ManagedProcess:
    """The lean ZMQ engine-core stand-in for the worker ``url``; it dials in once the target binds
    (not waited for here: the target starts next)."""
    argv = [PYTHON, str(REPO / "bench" / "lean_engine.py"), "--tokenizer", str(model.folder), "--zmq-url", url,
            "--chunk-tokens", "1", "--to-max-tokens", "--delay-ms", f"{delay_ms:g}"]  # fmt: skip
    env = child_env({"DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
    return group.start(f"zmq-engine-{Path(url).name}", pinned(core, argv), env=env, cwd=REPO)


def start_target(target: str, path: str, group: ProcessGroup, work: Path, port: int, engine_url: str, model: Model,
                 args: argparse.Namespace, wrap: tuple[str, ...] = ()) -> ManagedProcess:  # fmt: skip
    if target == "gateway":
        metrics = ["--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port())]
        zmq = ["--workers", "1", "--model-path", str(model.folder)] if path == "zmq" else []
        return start_gateway(
            group, f"gateway-{path}-{port}", port=port, worker_url=engine_url, server="uvicorn",
            core=args.target_core, data_dir=work / f"data-{port}", extra=metrics + zmq + model.flags(), wrap=wrap,
        )  # fmt: skip
    where = work / f"smg-{port}"
    where.mkdir(parents=True, exist_ok=True)
    extra = ["--model-path", str(model.folder), "--tokenizer-cache-enable-l0", "--tokenizer-cache-enable-l1"]
    if path == "zmq":
        extra += ["--backend", "vllm"]
    return start_smg(group, where, port, engine_url, args.target_core, extra=extra + model.flags())


def served_model(base: str) -> str:
    """The one model id the target lists (gRPC: the engine's; ZMQ: the ``--model-path``)."""
    status, answer = http_get(base + "/v1/models")
    if status != 200:
        raise StartError(f"GET /v1/models answered {status}")
    return str(json.loads(answer)["data"][0]["id"])


def make_case(target: str, path: str, base: str, pid: int, prompt: str, unique: bool, work: Path) -> Case:
    case = Case(f"{target}-{path}", "chat", base, pid, prompt, unique, work)
    model = served_model(base)
    case.short["model"] = case.stream["model"] = model
    case.stream_file = work / f"{target}-{path}-stream.json"
    case.stream_file.write_text(json.dumps(case.stream))
    return case


def summarize(cases: list[Case]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case in cases:
        if case.rounds:
            out[case.target] = {m: _spread([r[m] for r in case.rounds]) for m in METRICS} | {
                "errors": sum(r["errors"] for r in case.rounds),
                "disturbed_rounds": sum(r["disturbed"] for r in case.rounds),
            }
    by_key = {case.target: case for case in cases}
    for target in TARGETS:
        grpc, zmq = by_key.get(f"{target}-grpc"), by_key.get(f"{target}-zmq")
        if not grpc or not zmq or not grpc.rounds or not zmq.rounds:
            continue
        ratios: dict[str, Any] = {}
        for metric in ("cpu_us_per_request", "cpu_us_per_token", "cpu_us_per_event"):
            per_round = [z[metric] / g[metric] for g, z in zip(grpc.rounds, zmq.rounds) if g[metric]]
            ratios[metric] = {"median": round(statistics.median(per_round), 3), "min": round(min(per_round), 3),
                              "max": round(max(per_round), 3)}  # fmt: skip
        out[f"{target}/zmq-vs-grpc"] = ratios
    return out


def render_markdown(summary: dict[str, Any], failures: dict[str, str]) -> str:
    rows = [
        "| target | path | CPU µs/req median | min..max | CPU µs/tok median | min..max | CPU µs/event "
        "| events/stream | req/s c=64 | tok/s | errors | rounds with a pytest |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, entry in summary.items():
        if key.endswith("zmq-vs-grpc"):
            continue
        req, tok = entry["cpu_us_per_request"], entry["cpu_us_per_token"]
        rows.append(
            f"| {key.replace('-', ' | ')} | {req['median']:,.0f} | {req['min']:,.0f}..{req['max']:,.0f} "
            f"| {tok['median']:.2f} | {tok['min']:.2f}..{tok['max']:.2f} | {entry['cpu_us_per_event']['median']:.2f} "
            f"| {entry['events_per_stream']['median']:.0f} | {entry['rps']['median']:,.0f} "
            f"| {entry['tokens_per_s']['median']:,.0f} | {entry['errors']} | {entry['disturbed_rounds']} |"
        )
    for key, ratios in summary.items():
        if key.endswith("zmq-vs-grpc"):
            req, tok, ev = ratios["cpu_us_per_request"], ratios["cpu_us_per_token"], ratios["cpu_us_per_event"]
            rows.append(
                f"\n{key.split('/')[0]}: ZMQ / gRPC CPU per request x{req['median']:.3f} "
                f"(rounds {req['min']:.3f}..{req['max']:.3f}), per output token x{tok['median']:.3f} "
                f"(rounds {tok['min']:.3f}..{tok['max']:.3f}), per event x{ev['median']:.3f} "
                f"(rounds {ev['min']:.3f}..{ev['max']:.3f})"
            )
    for key, reason in failures.items():
        rows.append(f"\n{key}: not measured: {reason}")
    return "\n".join(rows)


def run(args: argparse.Namespace, group: ProcessGroup, work: Path) -> tuple[list[Case], dict[str, str]]:
    model: Model = MODELS[args.tokenizer]
    prompt = prompt_text(model.folder / "tokenizer.json", SIZES[args.size] - _TEMPLATE_TOKENS)
    cases: list[Case] = []
    failures: dict[str, str] = {}
    grpc_url = ""
    if "grpc" in args.paths:
        engine_port = free_port()
        start_grpc_engine(group, port=engine_port, tokenizer=model.folder, core=args.load_core, lean=True,
                          to_max_tokens=True, delay_ms=args.delay_ms)  # fmt: skip
        grpc_url = f"grpc://{LOOPBACK}:{engine_port}"
    for target in args.targets:
        for path in args.paths:
            key = f"{target}/{path}"
            port = free_port()
            print(f"- {key}: starting", flush=True)
            try:
                engine_url = grpc_url
                if path == "zmq":
                    engine_url = f"ipc://{work}/zmq-{target}-{port}"
                    engine = start_zmq_engine(group, engine_url, model, args.load_core, args.delay_ms)
                proc = start_target(target, path, group, work, port, engine_url, model, args)
                if path == "zmq":
                    engine.wait_ready(lambda: "mock zmq engine serving" in engine.log_path.read_text(errors="replace"),
                                      timeout=60)  # fmt: skip
                case = make_case(target, path, f"http://{LOOPBACK}:{port}", proc.popen.pid, prompt,
                                 args.variant == "unique", work)  # fmt: skip
                case.check()
            except (StartError, RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
                failures[key] = str(exc)[-2000:]
                print(f"  {key}: not measured: {str(exc)[-600:]}", flush=True)
                continue
            cases.append(case)
    for number in range(args.rounds):
        shift = number % max(len(cases), 1)
        for case in cases[shift:] + cases[:shift]:
            for attempt in range(1, args.attempts + 1):
                _no_heavy_load(args.wait_for_tests)
                with TestWatch() as watch:
                    entry = case.measure(args)
                entry.update(round=number, loadavg=loadavg(), disturbed=watch.seen, attempt=attempt)
                if not watch.seen or args.wait_for_tests <= 0:
                    break
                print(f"  {case.target}: a pytest ran meanwhile; measuring again", flush=True)
            case.rounds.append(entry)
            print(
                f"  round {number + 1} {case.target}: {entry['cpu_us_per_request']:,.0f} µs CPU/req "
                f"({entry['rps']:,.0f} req/s), {entry['cpu_us_per_token']:.2f} µs CPU/token "
                f"({entry['tokens_per_s']:,.0f} tok/s), errors {entry['errors']}"
                + ("; a pytest ran meanwhile" if entry["disturbed"] else ""),
                flush=True,
            )
    return cases, failures


def profile(args: argparse.Namespace, group: ProcessGroup, work: Path) -> str:
    """The gateway under cProfile on each path: wrk c=64 whole answers for ``--duration`` seconds, then
    ``--stream-rounds`` rounds of 32 streams; the top functions by own time, and the functions whose
    own time per request differs most between the paths (bench/results/profile-zmq-PATH.prof)."""
    model: Model = MODELS[args.tokenizer]
    prompt = prompt_text(model.folder / "tokenizer.json", SIZES[args.size] - _TEMPLATE_TOKENS)
    own: dict[str, dict[str, float]] = {}
    requests: dict[str, int] = {}
    report: list[str] = []
    for path in args.paths:
        out = RESULTS / f"profile-zmq-{path}.prof"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        port = free_port()
        if path == "zmq":
            engine_url = f"ipc://{work}/zmq-profile-{port}"
            engine = start_zmq_engine(group, engine_url, model, args.load_core)
        else:
            engine_port = free_port()
            engine = start_grpc_engine(group, port=engine_port, tokenizer=model.folder, core=args.load_core, lean=True,
                                       to_max_tokens=True)  # fmt: skip
            engine_url = f"grpc://{LOOPBACK}:{engine_port}"
        proc = start_target("gateway", path, group, work, port, engine_url, model, args,
                            wrap=("-m", "cProfile", "-o", str(out)))  # fmt: skip
        try:
            case = make_case("gateway", path, f"http://{LOOPBACK}:{port}", proc.popen.pid, prompt,
                             args.variant == "unique", work)  # fmt: skip
            case.check()
            entry = case.measure(args)
            requests[path] = entry["requests"]
        finally:
            proc.stop(grace=30, sig=signal.SIGINT)  # uvicorn exits cleanly; cProfile writes the file
            group.processes.remove(proc)
            group.stop(engine)
        if not out.exists():
            report.append(f"{path}: no profile written (see {proc.log_path})")
            continue
        stats = pstats.Stats(str(out))
        own[path] = {f"{Path(file).name}:{line}({name})": entry[2] for (file, line, name), entry in stats.stats.items()}  # type: ignore[attr-defined]
        buf = io.StringIO()
        pstats.Stats(str(out), stream=buf).strip_dirs().sort_stats("tottime").print_stats(args.top)
        report.append(f"== gateway / {path}: {entry['requests']} whole answers, {entry['rps']:,.0f} req/s under the "
                      f"profiler, then streams\n" + "\n".join(ln for ln in buf.getvalue().splitlines() if ln.strip()))  # fmt: skip
    if "grpc" in own and "zmq" in own:
        grpc, zmq = own["grpc"], own["zmq"]
        rows = sorted(
            ((zmq.get(k, 0.0) / requests["zmq"] - grpc.get(k, 0.0) / requests["grpc"]) * 1e6, k) for k in set(grpc) | set(zmq)
        )  # fmt: skip
        report.append("== own time per whole answer, ZMQ minus gRPC (µs; streams included in both)")
        report += [f"{delta:+9.1f}  {name}" for delta, name in rows[::-1][: args.top]]
        report += [f"{delta:+9.1f}  {name}" for delta, name in rows[:10]]
    return "\n".join(report)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--paths", default=",".join(PATHS), help="subset of grpc,zmq (default both)")
    add("--targets", default=",".join(TARGETS), help="subset of gateway,smg (default both)")
    add("--tokenizer", default="qwen3", choices=sorted(MODELS))
    add("--size", default="1k", choices=sorted(SIZES))
    add("--variant", default="cached", choices=("cached", "unique"))
    add("--rounds", type=int, default=5, help="rounds over every (target, path) (default 5)")
    add("--duration", type=float, default=3.0, help="seconds of wrk c=64 per case and round (default 3)")
    add("--warmup", type=float, default=0.5, help="seconds of wrk warm-up before each measurement (default 0.5)")
    add("--stream-rounds", type=int, default=2, help="rounds of 32 streams per case and round (default 2)")
    add("--delay-ms", type=float, default=0.0,
        help="both engines' pause before each token (default 0: as fast as they can; a target then merges the "
             "tokens that arrived together into fewer events, the more so the faster its engine)")
    add("--target-core", default="0")
    add("--load-core", default="1")
    add("--wait-for-tests", type=float, default=0.0,
        help="before each measurement, wait up to this many seconds while a pytest runs (default 0: do not wait)")
    add("--attempts", type=int, default=2,
        help="with --wait-for-tests, measure again (up to this many times) when a pytest ran meanwhile")
    add("--profile", action="store_true",
        help="instead: the gateway under cProfile on each path, and where their own times differ")
    add("--top", type=int, default=30, help="functions to list with --profile (default 30)")
    add("--output", type=Path, default=RESULTS / "zmq-vs-grpc.json")
    args = parser.parse_args(argv)
    args.paths, args.targets = split(args.paths), split(args.targets)
    if set(args.paths) - set(PATHS) or set(args.targets) - set(TARGETS) or not args.paths:
        parser.error("unknown path or target")
    if "smg" in args.targets and not PEERS["smg"].installed:
        print("smg is not installed (bench/run.py --install-peers): measuring the gateway alone", file=sys.stderr)
        args.targets = [t for t in args.targets if t != "smg"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _raise_on_sigterm()
    meta = describe(REPO, NGINX, WRK)
    meta["smg_version"] = peer_version(PEERS["smg"]) if PEERS["smg"].installed else None
    # A short prefix: an ipc:// path must fit a Unix socket address (about 100 bytes) with its suffixes.
    work = Path(tempfile.mkdtemp(prefix="gwz-"))
    cases: list[Case] = []
    failures: dict[str, str] = {}
    try:
        with ProcessGroup(work / "logs") as group:
            if args.profile:
                print(profile(args, group, work))
                return 0
            cases, failures = run(args, group, work)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping everything", file=sys.stderr)
        return 130
    finally:
        logs = RESULTS / "logs-zmq"
        shutil.rmtree(logs, ignore_errors=True)
        shutil.copytree(work / "logs", logs, dirs_exist_ok=True) if (work / "logs").is_dir() else None
        shutil.rmtree(work, ignore_errors=True)
    meta["loadavg_end"] = loadavg()
    summary = summarize(cases)
    print()
    print(render_markdown(summary, failures))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "meta": meta, "config": vars(args) | {"output": str(args.output)}, "summary": summary, "failures": failures,
        "rounds": {case.target: case.rounds for case in cases},
    }, indent=2, default=str))  # fmt: skip
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
