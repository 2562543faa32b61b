"""Messages beside chat completions on the gRPC pipeline: ``.venv/bin/python bench/messages_vs_chat.py``.

The gateway (uvicorn) and smg each front the project's gRPC engine stand-in (bench/lean_engine.py,
as bench/grpc_pipeline.py runs it), and each target is asked the same prompt through ``POST
/v1/chat/completions`` and through ``POST /v1/messages`` (a system text and one user message; the
Messages body carries the system prompt in ``system``). Per (target, surface):

1. whole answers, ``max_tokens`` 16: wrk at c=64 for ``--duration`` seconds, the target's CPU per
   request (every thread's CPU time from /proc, as bench/cpu_cost.py);
2. streamed answers, 256 tokens: ``--stream-rounds`` rounds of 32 concurrent streams, the target's
   CPU per output token (its CPU over the rounds / tokens streamed; each stream's prompt handling
   included).

The Messages API has no ``ignore_eos``, so the engine runs every request to its token limit
(``lean_engine.py --to-max-tokens``) and neither body asks for it: both surfaces stream exactly 256
tokens. Both targets run at once on ``--target-core`` (the one not measured is idle), the engine,
wrk and the stream client on ``--load-core``. ``--rounds`` rounds each measure every (target,
surface) once, the order rotated every round, so a busy moment of the shared machine falls on every
case alike; the report gives each case's median and its spread (min..max over the rounds), and the
Messages / chat ratio per target as the median of the per-round ratios (each round's two numbers
were taken next to each other). A surface a target does not serve (its smoke request fails) is
recorded with the answer and left out.

Results: a table on stdout and ``bench/results/messages-vs-chat.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_cost import cpu_seconds  # noqa: E402
from bench.gateway import start_grpc_engine  # noqa: E402
from bench.grpc_pipeline import (  # noqa: E402
    _TEMPLATE_TOKENS,
    MARKER,
    MODELS,
    SIZES,
    STREAMS,
    Model,
    _bases,
    _concrete,
    _start_target,
    add_checked,
    prompt_text,
    split,
)
from bench.loadgen import run_wrk, write_script  # noqa: E402
from bench.nginx import MODEL  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, StartError, free_port, http_post_json  # noqa: E402
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
from bench.streaming import run_streams  # noqa: E402

SURFACES = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
TARGETS = ("gateway", "smg")
SYSTEM = "You are a helpful assistant."
SHORT_TOKENS, STREAM_TOKENS = 16, 256


def body(surface: str, prompt: str, unique: bool, max_tokens: int, stream: bool) -> dict[str, Any]:
    """The same prompt as a chat or a Messages request (no ``ignore_eos``: the engine runs to the limit)."""
    user = {"role": "user", "content": f"[request {MARKER if unique else '0'}] {prompt}"}
    out: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0}
    if surface == "chat":
        out["messages"] = [{"role": "system", "content": SYSTEM}, user]
        if stream:
            out.update(stream=True, stream_options={"include_usage": True})
    else:
        out.update(system=SYSTEM, messages=[user])
        if stream:
            out["stream"] = True
    return out


def _output_tokens(surface: str, answer: bytes, stream: bool) -> int:
    """The output token count an answer reports; raises StartError when it is not a complete answer."""
    text = answer.decode(errors="replace")
    if not stream:
        parsed = json.loads(text)
        if surface == "chat" and parsed.get("choices"):
            return int(parsed["usage"]["completion_tokens"])
        if surface == "messages" and parsed.get("type") == "message":
            return int(parsed["usage"]["output_tokens"])
        raise StartError(f"not a {surface} answer: {text[:300]!r}")
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and "[DONE]" not in line]
    if surface == "chat":
        usage = next((e["usage"] for e in reversed(events) if e.get("usage")), None)
        if usage and text.rstrip().endswith("[DONE]"):
            return int(usage["completion_tokens"])
    else:
        delta = next((e for e in events if e.get("type") == "message_delta"), None)
        if delta and events[-1].get("type") == "message_stop":
            return int(delta["usage"]["output_tokens"])
    raise StartError(f"incomplete {surface} stream: {text[-300:]!r}")


def smoke(url: str, surface: str, payload: dict[str, Any], stream: bool, timeout: float = 90.0) -> int:
    """POST until 200 (the gateway answers 503 while it loads the tokenizer); the output tokens."""
    deadline = time.monotonic() + timeout
    while True:
        status, answer = http_post_json(url, _concrete(payload), timeout=60)
        if status == 200 or time.monotonic() > deadline or status not in (0, 503):
            break
        time.sleep(0.5)
    if status != 200:
        raise StartError(f"answered {status}: {answer[:300].decode(errors='replace')!r}")
    return _output_tokens(surface, answer, stream)


class Case:
    """One (target, surface): its URL, bodies and the numbers of every round."""

    def __init__(self, target: str, surface: str, base: str, pid: int, prompt: str, unique: bool, work: Path) -> None:
        self.target, self.surface, self.pid = target, surface, pid
        self.url = base + SURFACES[surface]
        self.unique = unique
        self.short = body(surface, prompt, unique, SHORT_TOKENS, False)
        self.stream = body(surface, prompt, unique, STREAM_TOKENS, True)
        self.stream_file = work / f"{target}-{surface}-stream.json"
        self.stream_file.write_text(json.dumps(self.stream))
        self.work = work
        self.rounds: list[dict[str, Any]] = []

    @property
    def key(self) -> str:
        return f"{self.target}/{self.surface}"

    def check(self) -> None:
        got = smoke(self.url, self.surface, self.short, False)
        if got != SHORT_TOKENS:
            raise StartError(f"a whole answer gave {got} output tokens instead of {SHORT_TOKENS}")
        got = smoke(self.url, self.surface, self.stream, True)
        if got != STREAM_TOKENS:
            raise StartError(f"a stream gave {got} output tokens instead of {STREAM_TOKENS}")

    def measure(self, args: argparse.Namespace) -> dict[str, Any]:
        marker = MARKER if self.unique else None
        script = write_script(self.work / f"{self.target}-{self.surface}.lua", self.short, unique_marker=marker,
                              unique_base=next(_bases) * 10**8)  # fmt: skip
        run_wrk(self.url, script, connections=64, threads=1, duration=args.warmup, core=args.load_core)
        before = cpu_seconds(self.pid)
        point = run_wrk(self.url, script, connections=64, threads=1, duration=args.duration, core=args.load_core)
        cpu = cpu_seconds(self.pid) - before
        before = cpu_seconds(self.pid)
        done = run_streams(
            self.url, streams=STREAMS, rounds=args.stream_rounds, warmup_rounds=0, core=args.load_core,
            timeout_s=120.0, body=self.stream_file, unique_marker=marker, unique_base=next(_bases) * 10**8,
        )  # fmt: skip
        stream_cpu = cpu_seconds(self.pid) - before
        tokens = done.samples * STREAM_TOKENS
        return {
            "rps": round(point.rps, 1),
            "requests": point.requests,
            "errors": point.errors + point.non_2xx + done.errors,
            "cpu_us_per_request": round(cpu / max(point.requests, 1) * 1e6, 1),
            "cpu_us_per_token": round(stream_cpu / max(tokens, 1) * 1e6, 2),
            # The gateway writes several tokens as one event when it falls behind the engine; per event
            # is the cost that does not depend on how many tokens each event carried.
            "cpu_us_per_event": round(stream_cpu / max(done.samples * done.events_per_stream, 1) * 1e6, 2),
            "tokens_per_s": round(tokens / done.elapsed_s, 1) if done.elapsed_s else 0.0,
            "events_per_stream": done.events_per_stream,
        }


def summarize(cases: list[Case]) -> dict[str, Any]:
    """Each case's median and spread, and per target the Messages / chat ratios by round."""
    return summarize_with_ratios(cases, lambda case: case.key, TARGETS, "/chat", "/messages", "messages-vs-chat")


def render_markdown(summary: dict[str, Any], failures: dict[str, str]) -> str:
    return render_cpu_table(summary, failures, "surface", "/", "messages-vs-chat", "Messages / chat")


def run(args: argparse.Namespace, group: ProcessGroup, work: Path) -> tuple[list[Case], dict[str, str]]:
    model: Model = MODELS[args.tokenizer]
    prompt = prompt_text(model.folder / "tokenizer.json", SIZES[args.size] - _TEMPLATE_TOKENS)
    engine_port = free_port()
    start_grpc_engine(group, port=engine_port, tokenizer=model.folder, core=args.load_core, lean=True,
                      to_max_tokens=True, delay_ms=args.delay_ms)  # fmt: skip
    engine_url = f"grpc://{LOOPBACK}:{engine_port}"
    cases: list[Case] = []
    failures: dict[str, str] = {}
    for target in args.targets:
        port = free_port()
        print(f"- {target}: starting", flush=True)
        try:
            proc: ManagedProcess = _start_target(target, group, work, port, engine_url, model, args)
        except (StartError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            failures[target] = str(exc)
            print(f"  {target} failed to start: {exc}", flush=True)
            continue
        for surface in args.surface:
            case = Case(target, surface, f"http://{LOOPBACK}:{port}", proc.popen.pid, prompt, args.variant == "unique",
                        work)  # fmt: skip
            add_checked(case, cases, failures)
    measure_rounds(cases, args, lambda case: case.key)
    return cases, failures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--surface", default=",".join(SURFACES), help="subset of chat,messages (default both)")
    add("--targets", default=",".join(TARGETS), help="subset of gateway,smg (default both)")
    add("--tokenizer", default="qwen3", choices=sorted(MODELS))
    add("--size", default="1k", choices=sorted(SIZES))
    add("--variant", default="cached", choices=("cached", "unique"))
    add_round_options(add, "(target, surface)",
                      "the engine's pause before each token (default 0: as fast as it can; the gateway then merges "
                      "tokens into fewer events when it falls behind, which lowers its CPU per token)")  # fmt: skip
    add("--output", type=Path, default=RESULTS / "messages-vs-chat.json")
    args = parser.parse_args(argv)
    args.surface, args.targets = split(args.surface), split(args.targets)
    if set(args.surface) - set(SURFACES) or set(args.targets) - set(TARGETS) or not args.surface:
        parser.error("unknown surface or target")
    args.targets = without_missing_smg(args.targets)
    args.chunk_tokens, args.stock_engine = 1, False  # what bench/grpc_pipeline.py's target start reads
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _raise_on_sigterm()
    meta = bench_meta()
    done = in_work_dir("gw-messages-bench-", "logs-messages", lambda group, work: run(args, group, work))
    if done is None:
        return 130
    cases, failures = done
    summary = summarize(cases)
    write_results(args, meta, render_markdown(summary, failures), summary=summary, failures=failures,
                  rounds={case.key: case.rounds for case in cases})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
