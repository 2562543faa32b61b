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

``--client`` instead measures the engine clients alone, in this process (no HTTP, no pipeline: what
differs between the paths): the ZMQ client and the gRPC client (SGLang's) each drive their lean
engine with non-streamed requests (``max_tokens`` 16, ``--client-concurrency`` at once, the same
prompt ids), rounds alternated; per whole answer the process's CPU (every thread: libzmq's I/O
thread too), and with ``--client-strace`` its system calls (strace attached per batch), with
``--client-callgrind`` (the bench itself run under ``valgrind --tool=callgrind
--instr-atstart=no``) its instructions, which a loaded machine does not change.

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
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import PYTHON, REPO, start_gateway, start_grpc_engine  # noqa: E402
from bench.grpc_pipeline import _TEMPLATE_TOKENS, MODELS, SIZES, Model, prompt_text, split  # noqa: E402
from bench.messages_vs_chat import Case  # noqa: E402
from bench.peers import start_smg  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, StartError, child_env, free_port, http_get, pinned  # noqa: E402
from bench.rounds import (  # noqa: E402
    RESULTS,
    add_round_options,
    bench_meta,
    in_work_dir,
    measure_rounds,
    render_cpu_table,
    summarize_with_ratios,
    without_missing_smg,
    write_results,
)
from bench.run import _raise_on_sigterm  # noqa: E402

PATHS = ("grpc", "zmq")
TARGETS = ("gateway", "smg")


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
    """Each case's median and spread, and per target the ZMQ / gRPC ratios by round."""
    return summarize_with_ratios(cases, lambda case: case.target, TARGETS, "-grpc", "-zmq", "zmq-vs-grpc")


def render_markdown(summary: dict[str, Any], failures: dict[str, str]) -> str:
    return render_cpu_table(summary, failures, "path", "-", "zmq-vs-grpc", "ZMQ / gRPC")


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
    measure_rounds(cases, args, lambda case: case.target)
    return cases, failures


def client_cost(args: argparse.Namespace, group: ProcessGroup, work: Path) -> str:
    """``--client``: the two engine clients alone, in this process, on non-streamed requests."""
    import asyncio
    import os
    import resource
    import statistics

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
    django.setup()
    from tokenizers import Tokenizer

    from inference.upstreams.engine import EngineClient, EngineRequest, SamplingParams
    from inference.upstreams.grpc.sglang import SglangClient
    from inference.upstreams.zmq.client import ZmqEngineClient

    model: Model = MODELS[args.tokenizer]
    prompt = prompt_text(model.folder / "tokenizer.json", SIZES[args.size] - _TEMPLATE_TOKENS)
    ids = tuple(Tokenizer.from_file(str(model.folder / "tokenizer.json")).encode(prompt).ids)
    config = model.folder / "generation_config.json"
    named = json.loads(config.read_text()).get("eos_token_id") if config.exists() else None
    eos = tuple(named) if isinstance(named, list) else (named,) if isinstance(named, int) else ()

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    async def measure() -> str:
        clients: dict[str, EngineClient] = {}
        if "grpc" in args.paths:
            engine_port = free_port()
            start_grpc_engine(group, port=engine_port, tokenizer=model.folder, core=args.load_core, lean=True,
                              to_max_tokens=True, delay_ms=args.delay_ms)  # fmt: skip
            clients["grpc"] = SglangClient(f"grpc://{LOOPBACK}:{engine_port}")
        if "zmq" in args.paths:
            url = f"ipc://{work}/zmq-client"
            zmq_client = ZmqEngineClient(url, model_id="bench", tokenizer_path=str(model.folder), eos_token_ids=eos)
            await zmq_client.open(0.0, handshake=True)
            start_zmq_engine(group, url, model, args.load_core, args.delay_ms)
            await zmq_client.wait_ready(60)
            clients["zmq"] = zmq_client
        counter = 0

        async def batch(client: EngineClient, path: str, record: bool) -> dict[str, float]:
            nonlocal counter
            per_task = max(1, args.client_requests // args.client_concurrency)
            answers = per_task * args.client_concurrency

            async def task() -> None:
                nonlocal counter
                for _ in range(per_task):
                    counter += 1
                    request = EngineRequest(f"b{counter}", ids, SamplingParams(max_new_tokens=16), stream=False)
                    async for _output in client.generate(request):
                        pass

            tracer = None
            trace_file = work / f"strace-{path}-{counter}.txt"
            if record and args.client_strace:
                tracer = subprocess.Popen(["strace", "-f", "-c", "-o", str(trace_file), "-p", str(os.getpid())])
                await asyncio.sleep(1.0)  # attached to every thread
            if record and args.client_callgrind:
                subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True, check=False)
            start = cpu()
            await asyncio.gather(*(task() for _ in range(args.client_concurrency)))
            used = cpu() - start
            if record and args.client_callgrind:
                subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True, check=False)
                # one dump per batch, its trigger naming the path (the instructions per answer: its
                # "totals" over the answers printed here)
                subprocess.run(["callgrind_control", f"--dump={path}-{answers}-answers", str(os.getpid())],
                               capture_output=True, check=False)  # fmt: skip
            entry = {"cpu_us_per_answer": used / answers * 1e6}
            if tracer is not None:
                tracer.send_signal(signal.SIGINT)
                tracer.wait(30)
                total = [line.split() for line in trace_file.read_text().splitlines() if line.rstrip().endswith("total")]
                if total:
                    entry["syscalls_per_answer"] = int(total[-1][3]) / answers
            return entry

        for path, client in clients.items():
            await batch(client, path, record=False)  # warm-up
        results: dict[str, list[dict[str, float]]] = {path: [] for path in clients}
        for number in range(args.rounds):
            order = list(clients) if number % 2 == 0 else list(clients)[::-1]
            for path in order:
                results[path].append(await batch(clients[path], path, record=True))
            print(f"  round {number + 1}: " + ", ".join(f"{p} {r[-1]}" for p, r in results.items()), flush=True)
        for client in clients.values():
            await client.close()
        lines = [f"== engine clients alone: {args.client_concurrency} at once, non-streamed, max_tokens 16, "
                 f"delay {args.delay_ms:g} ms; medians over {args.rounds} rounds (min..max)"]  # fmt: skip
        for path, entries in results.items():
            for key in entries[0]:
                values = [entry[key] for entry in entries]
                lines.append(f"{path:5} {key:20} {statistics.median(values):9.1f} ({min(values):.1f}..{max(values):.1f})")
        if len(results) == 2:
            ratios = [z["cpu_us_per_answer"] / g["cpu_us_per_answer"] for z, g in zip(results["zmq"], results["grpc"])]
            lines.append(f"ZMQ / gRPC CPU per answer: x{statistics.median(ratios):.2f} "
                         f"(rounds {min(ratios):.2f}..{max(ratios):.2f})")  # fmt: skip
        return "\n".join(lines)

    return asyncio.run(measure())


def served_syscalls(args: argparse.Namespace, group: ProcessGroup, work: Path) -> str:
    """``--served-strace``: the started gateway's system calls per whole answer on each path (every
    thread, ``strace -c -f`` attached for ``--client-requests`` non-streamed chat requests sent
    ``--client-concurrency`` at a time after a warm-up); strace slows the target: read the counts."""
    import asyncio

    import httpx

    model: Model = MODELS[args.tokenizer]
    prompt = prompt_text(model.folder / "tokenizer.json", SIZES[args.size] - _TEMPLATE_TOKENS)
    lines = [f"== the gateway's system calls per whole answer (max_tokens 16, {args.client_concurrency} at once, "
             f"delay {args.delay_ms:g} ms, {args.client_requests} answers)"]  # fmt: skip
    for path in args.paths:
        port = free_port()
        if path == "zmq":
            engine_url = f"ipc://{work}/zmq-strace-{port}"
            engine = start_zmq_engine(group, engine_url, model, args.load_core, args.delay_ms)
        else:
            engine_port = free_port()
            engine = start_grpc_engine(group, port=engine_port, tokenizer=model.folder, core=args.load_core, lean=True,
                                       to_max_tokens=True, delay_ms=args.delay_ms)  # fmt: skip
            engine_url = f"grpc://{LOOPBACK}:{engine_port}"
        proc = start_target("gateway", path, group, work, port, engine_url, model, args)
        base = f"http://{LOOPBACK}:{port}"
        case = make_case("gateway", path, base, proc.popen.pid, prompt, args.variant == "unique", work)
        case.check()

        async def send(count: int) -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                queue = list(range(count))

                async def worker() -> None:
                    while queue:
                        queue.pop()
                        answer = await client.post(case.url, json=case.short)
                        answer.raise_for_status()

                await asyncio.gather(*(worker() for _ in range(args.client_concurrency)))

        asyncio.run(send(args.client_concurrency * 8))  # warm-up
        trace_file = work / f"served-strace-{path}.txt"
        tracer = subprocess.Popen(["strace", "-f", "-c", "-o", str(trace_file), "-p", str(proc.popen.pid)])
        asyncio.run(asyncio.sleep(1.0))  # attached to every thread
        asyncio.run(send(args.client_requests))
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
        rows = [line.split() for line in trace_file.read_text().splitlines()]
        total = [row for row in rows if row and row[-1] == "total"]
        calls = int(total[-1][3]) / args.client_requests if total else float("nan")
        top = sorted((row for row in rows if len(row) >= 5 and row[3].isdigit() and row[-1] != "total"),
                     key=lambda row: -int(row[3]))[:6]  # fmt: skip
        lines.append(f"{path:5} {calls:7.1f} per answer; most: "
                     + ", ".join(f"{row[-1]} {int(row[3]) / args.client_requests:.1f}" for row in top))  # fmt: skip
        group.processes.remove(proc)
        proc.stop(grace=10, sig=signal.SIGINT)
        group.stop(engine)
    return "\n".join(lines)


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
    add_round_options(add, "(target, path)",
                      "both engines' pause before each token (default 0: as fast as they can; a target then merges "
                      "the tokens that arrived together into fewer events, the more so the faster its engine)")  # fmt: skip
    add("--profile", action="store_true",
        help="instead: the gateway under cProfile on each path, and where their own times differ")
    add("--top", type=int, default=30, help="functions to list with --profile (default 30)")
    add("--client", action="store_true",
        help="instead: the engine clients alone in this process (CPU, system calls, instructions per answer)")
    add("--client-requests", type=int, default=320, help="--client: whole answers per path and round (default 320)")
    add("--client-concurrency", type=int, default=16, help="--client: requests at once (default 16)")
    add("--client-strace", action="store_true", help="--client: count system calls per answer (strace)")
    add("--client-callgrind", action="store_true",
        help="--client under valgrind --tool=callgrind --instr-atstart=no: count only the measured batches")
    add("--served-strace", action="store_true",
        help="instead: the started gateway's system calls per whole answer on each path (strace -c -f; "
             "--client-requests answers, --client-concurrency at once)")  # fmt: skip
    add("--output", type=Path, default=RESULTS / "zmq-vs-grpc.json")
    args = parser.parse_args(argv)
    args.paths, args.targets = split(args.paths), split(args.targets)
    if set(args.paths) - set(PATHS) or set(args.targets) - set(TARGETS) or not args.paths:
        parser.error("unknown path or target")
    args.targets = without_missing_smg(args.targets)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _raise_on_sigterm()
    meta = bench_meta()

    def body(group: ProcessGroup, work: Path) -> tuple[list[Case], dict[str, str], str]:
        if args.profile:
            return [], {}, profile(args, group, work)
        if args.client:
            return [], {}, client_cost(args, group, work)
        if args.served_strace:
            return [], {}, served_syscalls(args, group, work)
        return (*run(args, group, work), "")

    # A short prefix: an ipc:// path must fit a Unix socket address (about 100 bytes) with its suffixes.
    done = in_work_dir("gwz-", "logs-zmq", body)
    if done is None:
        return 130
    cases, failures, profiled = done
    if args.profile or args.client or args.served_strace:
        print(profiled)
        return 0
    summary = summarize(cases)
    write_results(args, meta, render_markdown(summary, failures), summary=summary, failures=failures,
                  rounds={case.target: case.rounds for case in cases})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
