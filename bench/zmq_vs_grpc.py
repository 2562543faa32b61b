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
        return (*run(args, group, work), "")

    # A short prefix: an ipc:// path must fit a Unix socket address (about 100 bytes) with its suffixes.
    done = in_work_dir("gwz-", "logs-zmq", body)
    if done is None:
        return 130
    cases, failures, profiled = done
    if args.profile:
        print(profiled)
        return 0
    summary = summarize(cases)
    write_results(args, meta, render_markdown(summary, failures), summary=summary, failures=failures,
                  rounds={case.target: case.rounds for case in cases})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
