"""The gRPC pipeline beside smg, one core each: ``.venv/bin/python bench/grpc_pipeline.py [--duration S]``.

The gateway (uvicorn) and smg each front the project's gRPC engine stand-in (``manage.py
runmockworker --grpc --runtime sglang``), so both render the chat template, tokenize, drive the
engine with token ids, detokenize and parse. The target runs alone on core 0; the engine, wrk and
the stream client share core 1 (bench/run.py's pinning). For each fixture tokenizer (Qwen3, Llama 3
with its 3.2 template) x prompt size (~1k, ~8k tokens) x prompt variant (``cached``: the same prompt
every time; ``unique``: a new number at the start of the user message per request, so no whole-prompt
or prefix cache holds the long part) and each target:

1. non-streaming chat, ``max_tokens`` 16: p50 at c=1 and requests/s at c=64 (wrk), and the target's
   CPU per request over the c=64 run (every thread's CPU time from /proc, as bench/cpu_cost.py);
2. streaming chat, 256 tokens (``ignore_eos``): rounds of 32 concurrent streams, streamed tokens/s
   and the target's CPU per output token (its CPU over the rounds / tokens streamed; it includes
   each stream's prompt handling).

``--profile`` then runs the gateway under cProfile for the short chat at c=64 and for the streams
(``--profile-case``) and prints the top functions by own and by cumulative time (bench/hotspots.py's
summary).

``--deployment`` measures the settings a Qwen3 deployment runs instead (issue 27): both targets started
twice, with ``--reasoning-parser qwen3 --tool-call-parser qwen`` (parsers on) and without (off), and
asked with ``chat_template_kwargs: {"enable_thinking": false}`` (thinking off) or true (on), for a short
prompt (~35 tokens) and an ~8k one (``--sizes``). Per case and round: whole answers (``max_tokens``
16, wrk at ``--whole-connections``, default 16) as CPU per request, and rounds of ``--streams``
(default 8) concurrent streams of 16 and of 256 tokens: the slope between the two is the CPU per
output token, what is left at 16 tokens the fixed cost per stream. ``--rounds`` rounds, each over
every case in a rotated order, so the gateway and smg alternate under the same load; medians with
min..max, and gateway / smg as the median of the per-round ratios. ``--before PATH`` adds another
checkout's gateway (a worktree of the tree before a change) as the target ``before`` in the same
rounds; ``--gateway-repo PATH`` runs the target ``gateway`` from another checkout too (a worktree of
the change alone, when the shared checkout holds other work in progress).
Results: a table on stdout and ``bench/results/grpc-pipeline.json``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenizers import Tokenizer  # noqa: E402

from bench.cpu_cost import cpu_seconds  # noqa: E402
from bench.gateway import PYTHON, REPO, start_gateway, start_grpc_engine  # noqa: E402
from bench.hotspots import _summary as profile_summary, stop_profiled  # noqa: E402
from bench.loadgen import run_wrk, write_script  # noqa: E402
from bench.nginx import MODEL  # noqa: E402
from bench.peers import start_smg  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, StartError, free_port, http_post_json  # noqa: E402
from bench.rounds import (  # noqa: E402
    RESULTS,
    rotations,
    spread,
    bench_meta,
    in_work_dir,
    no_heavy_load,
    watched,
    without_missing_smg,
    write_results,
)
from bench.run import _raise_on_sigterm  # noqa: E402
from bench.streaming import run_streams  # noqa: E402
from standins.fixtures import FIXTURE_MODELS as FIXTURES

MARKER = "@@REQ@@"
SHORT_TOKENS, STREAM_TOKENS, STREAMS = 16, 256, 32
TARGETS = ("gateway", "smg")
GATEWAYS = ("gateway", "before")  # "before": --deployment --before PATH, another checkout's gateway


@dataclass(frozen=True)
class Model:
    folder: Path
    chat_template: Path | None
    reasoning_parser: str | None
    tool_parser: str

    def flags(self) -> list[str]:
        """Template and parser flags, spelled the same for both targets."""
        out = ["--tool-call-parser", self.tool_parser] if self.tool_parser else []
        if self.reasoning_parser:
            out += ["--reasoning-parser", self.reasoning_parser]
        if self.chat_template:
            out += ["--chat-template", str(self.chat_template)]
        return out


MODELS = {
    "qwen3": Model(FIXTURES / "qwen3", None, "qwen3", "qwen"),
    "llama3": Model(FIXTURES / "llama3", FIXTURES / "llama3" / "chat_template.llama-3.2.jinja", None, "llama"),
}
SIZES = {"short": 35, "1k": 1024, "8k": 8192}
VARIANTS = ("cached", "unique")
_TEMPLATE_TOKENS = 50  # what the template and the system message add, about
_bases = itertools.count(1)


def prompt_text(tokenizer_file: Path, tokens: int, seed: int = 9) -> str:
    """Deterministic prose-like text of pseudo-words that encodes to ``tokens`` tokens."""
    tokens = max(tokens, 8)  # "short": a few words
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "an", "is", "qu", "est", "ber", "ni", "ox", "ul"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(tokens)]
    text = " ".join(w.capitalize() + "." if i % 13 == 12 else w for i, w in enumerate(words))
    encoding = Tokenizer.from_file(str(tokenizer_file)).encode(text, add_special_tokens=False)
    return text[: encoding.offsets[min(tokens, len(encoding.ids)) - 1][1]]


def chat_body(
    prompt: str, unique: bool, max_tokens: int, stream: bool, thinking: bool | None = None
) -> dict[str, Any]:
    """A chat request; ``thinking`` set: ``chat_template_kwargs.enable_thinking`` (None: not sent)."""
    number = MARKER if unique else "0"
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"[request {number}] {prompt}"},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    if stream:
        body.update(stream=True, ignore_eos=True, stream_options={"include_usage": True})
    return body


def _concrete(body: dict[str, Any]) -> bytes:
    return json.dumps(body).replace(MARKER, str(next(_bases) * 10**8)).encode()


def _smoke(url: str, body: dict[str, Any], stream: bool, timeout: float = 90.0) -> dict[str, Any]:
    """POST until 200 (the gateway answers 503 while it loads the tokenizer); the answer's usage."""
    deadline = time.monotonic() + timeout
    while True:
        status, answer = http_post_json(url, _concrete(body), timeout=60)
        if status == 200 or time.monotonic() > deadline or status not in (0, 503):
            break
        time.sleep(0.5)
    if status != 200:
        raise StartError(f"smoke request answered {status}: {answer[:300]!r}")
    if stream:
        events = [line[5:].strip() for line in answer.decode().splitlines() if line.startswith("data:")]
        usage = next((json.loads(e)["usage"] for e in reversed(events) if '"usage"' in e and e != "[DONE]"), None)
        if events[-1:] != ["[DONE]"] or not usage:
            raise StartError(f"stream without usage or [DONE]: {answer[-300:]!r}")
        return dict(usage)
    parsed = json.loads(answer)
    if not parsed.get("choices"):
        raise StartError(f"no choices: {answer[:300]!r}")
    return dict(parsed["usage"])


def main_thread_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s main thread (the event loop; the rest is gRPC's and the pools' threads)."""
    try:
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError):
        return 0.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def measure_case(
    args: argparse.Namespace, url: str, pid: int, engine_pid: int, model: Model, size: str, variant: str, work: Path
) -> dict[str, Any]:
    """One target, one (tokenizer, prompt size, variant): wrk c=1 and c=64, then streams."""
    prompt = prompt_text(model.folder / "tokenizer.json", SIZES[size] - _TEMPLATE_TOKENS)
    unique = variant == "unique"
    short, stream = chat_body(prompt, unique, SHORT_TOKENS, False), chat_body(prompt, unique, STREAM_TOKENS, True)
    out: dict[str, Any] = {"usage": _smoke(url, short, False), "stream_usage": _smoke(url, stream, True)}
    if out["stream_usage"].get("completion_tokens") != STREAM_TOKENS:
        raise StartError(f"a stream gave {out['stream_usage']} instead of {STREAM_TOKENS} tokens")
    marker = MARKER if unique else None

    def script(name: str) -> Path:
        return write_script(work / f"{name}.lua", short, unique_marker=marker, unique_base=next(_bases) * 10**8)

    run_wrk(url, script("warm"), connections=64, threads=1, duration=args.warmup, core=args.load_core)
    c1 = run_wrk(url, script("c1"), connections=1, threads=1, duration=args.duration, core=args.load_core)
    before, engine_before, started = cpu_seconds(pid), cpu_seconds(engine_pid), time.monotonic()
    main_before = main_thread_cpu(pid)
    c64 = run_wrk(url, script("c64"), connections=64, threads=1, duration=args.duration, core=args.load_core)
    cpu, engine_cpu, wall = cpu_seconds(pid) - before, cpu_seconds(engine_pid) - engine_before, time.monotonic() - started
    out["main_thread_share"] = round((main_thread_cpu(pid) - main_before) / cpu, 3) if cpu else 0.0
    out["c1"], out["c64"] = c1.to_dict(), c64.to_dict()
    out["cpu_us_per_request"] = round(cpu / max(c64.requests, 1) * 1e6, 1)
    out["engine_cpu_us_per_request"] = round(engine_cpu / max(c64.requests, 1) * 1e6, 1)
    out["target_core_busy"] = round(cpu / wall, 3)

    body_file = work / "stream.json"
    body_file.write_text(json.dumps(stream))
    streams = functools.partial(
        run_streams, url, streams=STREAMS, warmup_rounds=0, core=args.load_core, timeout_s=120.0, body=body_file,
        unique_marker=marker,
    )  # fmt: skip
    streams(rounds=1, unique_base=next(_bases) * 10**8)  # warm-up
    before, main_before = cpu_seconds(pid), main_thread_cpu(pid)
    done = streams(rounds=args.stream_rounds, unique_base=next(_bases) * 10**8)
    cpu, main_cpu = cpu_seconds(pid) - before, main_thread_cpu(pid) - main_before
    tokens = done.samples * STREAM_TOKENS
    out["stream"] = {
        **done.to_dict(),
        "tokens": tokens,
        "tokens_per_s": round(tokens / done.elapsed_s, 1) if done.elapsed_s else 0.0,
        "cpu_us_per_token": round(cpu / max(tokens, 1) * 1e6, 2),
        "cpu_us_per_stream": round(cpu / max(done.samples, 1) * 1e6, 1),
        "target_core_busy": round(cpu / done.elapsed_s, 3) if done.elapsed_s else 0.0,
        "main_thread_share": round(main_cpu / cpu, 3) if cpu else 0.0,
    }
    out["rss_mb"] = rss_mb(pid)
    return out


def _start_target(
    target: str, group: ProcessGroup, work: Path, port: int, engine_url: str, model: Model, args: argparse.Namespace,
    wrap: tuple[str, ...] = (),
) -> ManagedProcess:  # fmt: skip
    if target in GATEWAYS:
        metrics = ["--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port())]
        # bench/messages_vs_chat.py's arguments have neither: this checkout's gateway
        repo = (args.before if target == "before" else getattr(args, "gateway_repo", REPO)).resolve()
        return start_gateway(
            group, f"{target}-{port}", port=port, worker_url=engine_url, server="uvicorn", core=args.target_core,
            data_dir=work / f"data-{port}", extra=metrics + model.flags(), wrap=wrap, repo=repo,
        )  # fmt: skip
    where = work / f"smg-{port}"
    where.mkdir(parents=True, exist_ok=True)
    # Both targets keep whole-prompt and prefix encode caches (the gateway's are on by default).
    extra = ["--model-path", str(model.folder), "--tokenizer-cache-enable-l0", "--tokenizer-cache-enable-l1"]
    return start_smg(group, where, port, engine_url, args.target_core, extra=extra + model.flags())


def run_all(args: argparse.Namespace, group: ProcessGroup, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in args.tokenizers:
        model = MODELS[name]
        engine_port = free_port()
        engine = start_grpc_engine(
            group, port=engine_port, tokenizer=model.folder, core=args.load_core, lean=not args.stock_engine,
            chunk_tokens=args.chunk_tokens,
        )  # fmt: skip
        engine_url = f"grpc://{LOOPBACK}:{engine_port}"
        try:
            for target in args.targets:
                port = free_port()
                print(f"- {name} / {target}: starting", flush=True)
                proc: ManagedProcess | None = None
                try:
                    proc = _start_target(target, group, work, port, engine_url, model, args)
                    url, pid = f"http://{LOOPBACK}:{port}/v1/chat/completions", proc.popen.pid
                    for size, variant in itertools.product(args.sizes, VARIANTS):
                        key = f"{name}/{size}/{variant}"
                        entry = watched(
                            functools.partial(measure_case, args, url, pid, engine.popen.pid, model, size, variant, work),
                            args, key,
                        )  # fmt: skip
                        results.setdefault(key, {})[target] = entry
                        print(f"  {key}: {_line(entry)}", flush=True)
                except (StartError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                    print(f"  {target} failed: {exc}", flush=True)
                    results.setdefault("failures", {})[f"{name}/{target}"] = str(exc)
                finally:
                    if proc is not None:
                        group.stop(proc)
        finally:
            group.stop(engine)
    return results


def _line(entry: dict[str, Any]) -> str:
    c1, c64, st = entry["c1"], entry["c64"], entry["stream"]
    errors = c64["errors"] + c64["non_2xx"] + c1["errors"] + c1["non_2xx"] + st["errors"]
    return (
        f"prompt {entry['usage']['prompt_tokens']} tok; c=64 {c64['rps']:,.0f} req/s, {entry['cpu_us_per_request']:,.0f} "
        f"us CPU/req (core {entry['target_core_busy']:.0%} busy); c=1 p50 {c1['p50_ms']:.2f} ms; stream "
        f"{st['tokens_per_s']:,.0f} tok/s, {st['cpu_us_per_token']:.1f} us CPU/token, "
        f"{st.get('events_per_stream', 0):.0f} events/stream; errors {errors}"
        + ("; a pytest ran meanwhile" if entry.get("disturbed") else "")
    )


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else ""


def render_markdown(results: dict[str, Any]) -> str:
    head = (
        "| tokenizer | prompt | variant | prompt tok | req/s c=64 gw | req/s c=64 smg | p50 c=1 ms gw | p50 c=1 ms smg "
        "| CPU us/req gw | CPU us/req smg | ratio | stream tok/s gw | stream tok/s smg | CPU us/tok gw "
        "| CPU us/tok smg | ratio |\n|---|---|---|" + "---:|" * 13
    )
    rows = [head]
    for key, entry in results.items():
        if key == "failures":
            continue
        gw, smg = entry.get("gateway", {}), entry.get("smg", {})

        def get(e: dict[str, Any], path: str, fmt: str) -> str:
            value: Any = e
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            return format(value, fmt) if isinstance(value, (int, float)) else "-"

        def num(e: dict[str, Any], path: str) -> float | None:
            value: Any = e
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            return float(value) if isinstance(value, (int, float)) else None

        disturbed = " (pytest ran)" if gw.get("disturbed") or smg.get("disturbed") else ""
        cells = [
            *key.split("/")[:2], key.split("/")[2] + disturbed,
            get(gw or smg, "usage.prompt_tokens", "d"),
            get(gw, "c64.rps", ",.0f"), get(smg, "c64.rps", ",.0f"),
            get(gw, "c1.p50_ms", ".3f"), get(smg, "c1.p50_ms", ".3f"),
            get(gw, "cpu_us_per_request", ",.0f"), get(smg, "cpu_us_per_request", ",.0f"),
            _ratio(num(gw, "cpu_us_per_request"), num(smg, "cpu_us_per_request")),
            get(gw, "stream.tokens_per_s", ",.0f"), get(smg, "stream.tokens_per_s", ",.0f"),
            get(gw, "stream.cpu_us_per_token", ".1f"), get(smg, "stream.cpu_us_per_token", ".1f"),
            _ratio(num(gw, "stream.cpu_us_per_token"), num(smg, "stream.cpu_us_per_token")),
        ]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


PY_SPY = Path(PYTHON).parent / "py-spy"  # pip install py-spy into the venv


_LINE = re.compile(r":\d+\)$")
_TRUNK = ("(manage.py", "django/core/management/", "rungateway.py", "(administration/servers.py", "uvicorn/server.py",
          "uvicorn/_compat.py", "asyncio/runners.py", "(threading.py")  # fmt: skip


def pyspy_summary(raw: Path, top: int) -> str:
    """Top functions of a py-spy ``--format raw`` file (collapsed stacks, lines merged per function):
    by own samples (on top of the stack) and by inclusive samples (anywhere in the stack)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames, samples = [_LINE.sub(")", frame) for frame in stack.split(";")], int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    if not total:
        return "no samples"
    lines = [f"{total} samples; --- by own samples"]
    lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines.append("--- by inclusive samples (without the server's start-up frames that hold every request)")
    kept = [(frame, n) for frame, n in inclusive.most_common() if not any(part in frame for part in _TRUNK)]
    lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in kept[:top]]
    return "\n".join(lines)


def profile(args: argparse.Namespace, group: ProcessGroup, work: Path, mode: str) -> str:
    """Where the gateway's time goes for ``--profile-case``: the short chat at c=64 (``mode`` chat)
    or rounds of 32 streams (``mode`` stream). With py-spy (``.venv/bin/py-spy``): sampled at 250 Hz
    from outside while loaded, the gateway unchanged; with cProfile: the gateway runs under it and is
    stopped with SIGINT so the profile is written (bench/hotspots.py's summary)."""
    name, size, variant = args.profile_case.split(":")
    model = MODELS[name] if args.profile_parsers == "on" else Model(MODELS[name].folder, MODELS[name].chat_template, None, "")
    spy = args.profiler == "py-spy"
    out = RESULTS / f"profile-grpc-{mode}-{name}-{size}-{variant}.{'txt' if spy else 'prof'}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    engine_port, port = free_port(), free_port()
    engine = start_grpc_engine(group, port=engine_port, tokenizer=model.folder, core=args.load_core,
                               lean=not args.stock_engine, chunk_tokens=args.chunk_tokens)  # fmt: skip
    wrap = () if spy else ("-m", "cProfile", "-o", str(out))
    gateway = _start_target("gateway", group, work, port, f"grpc://{LOOPBACK}:{engine_port}", model, args, wrap)
    url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
    sampler: subprocess.Popen[bytes] | None = None
    try:
        no_heavy_load(args.wait_for_tests)
        prompt = prompt_text(model.folder / "tokenizer.json", SIZES[size] - _TEMPLATE_TOKENS)
        marker = MARKER if variant == "unique" else None
        thinking = None if args.profile_thinking == "unset" else args.profile_thinking == "on"
        body = chat_body(prompt, marker is not None, SHORT_TOKENS if mode == "chat" else STREAM_TOKENS, mode == "stream",
                         thinking)  # fmt: skip
        _smoke(url, body, mode == "stream")
        (work / "profile.json").write_text(json.dumps(body))
        script = write_script(work / "profile.lua", body, unique_marker=marker, unique_base=next(_bases) * 10**8)

        def load(seconds: float) -> str:
            if mode == "chat":
                point = run_wrk(url, script, connections=64, threads=1, duration=seconds, core=args.load_core)
                return f"wrk c=64 {seconds:g} s: {point.rps:,.0f} req/s"
            rounds = max(2, round(seconds * 1.5))
            done = run_streams(url, streams=STREAMS, rounds=rounds, warmup_rounds=0, core=args.load_core, timeout_s=120,
                               body=work / "profile.json", unique_marker=marker, unique_base=next(_bases) * 10**8)  # fmt: skip
            return f"{rounds} rounds x {STREAMS} streams of {STREAM_TOKENS} tokens in {done.elapsed_s:.1f} s"

        if spy:
            load(1.0)  # warm
            argv = [str(PY_SPY), "record", "-p", str(gateway.popen.pid), "-d", f"{args.profile_seconds:g}", "-r", "250",
                    "-f", "raw", "-o", str(out), "--nonblocking"]  # fmt: skip
            sampler = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        summary = load(args.profile_seconds + (1 if spy else 0))
        if sampler is not None:
            sampler.wait(timeout=60)
    finally:
        stop_profiled(group, gateway, sampler, spy)
        group.stop(engine)
    if not out.exists():
        return f"no profile written (see {gateway.log_path})"
    text = pyspy_summary(out, args.top) if spy else profile_summary(out, args.top)
    return f"== {args.profiler} {mode} {args.profile_case}: {summary} ({out})\n{text}"


# --- --deployment: the settings a Qwen3 deployment runs (issue 27) -----------------------------------

DEPLOY_STREAM_TOKENS = (16, 256)  # the slope between the two is the CPU per output token
QWEN3_PARSERS = ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen"]


def add_checked(case: Any, cases: list[Any], failures: dict[str, str]) -> None:
    """``case`` (a case with ``key`` and ``check()``: its smoke requests) added to ``cases`` when its
    check passes, else its failure put in ``failures`` and said."""
    try:
        case.check()
    except (StartError, ValueError, KeyError, OSError) as exc:
        failures[case.key] = str(exc)
        print(f"  {case.key}: not measured: {exc}", flush=True)
        return
    cases.append(case)


class DeployCase:
    """One (target, parsers, thinking, prompt size): its bodies and the numbers of every round."""

    def __init__(
        self, target: str, parsers: bool, thinking: bool, size: str, url: str, pid: int, work: Path, unique: bool
    ) -> None:
        self.target, self.parsers, self.thinking, self.size, self.url, self.pid = target, parsers, thinking, size, url, pid
        self.marker = MARKER if unique else None
        prompt = prompt_text(MODELS["qwen3"].folder / "tokenizer.json", SIZES[size] - _TEMPLATE_TOKENS)
        self.whole = chat_body(prompt, unique, SHORT_TOKENS, False, thinking)
        self.stream_files: dict[int, Path] = {}
        for tokens in DEPLOY_STREAM_TOKENS:
            self.stream_files[tokens] = work / f"{self.key.replace('/', '-')}-{tokens}.json"
            self.stream_files[tokens].write_text(json.dumps(chat_body(prompt, unique, tokens, True, thinking)))
        self.work = work
        self.prompt_tokens = 0
        self.rounds: list[dict[str, Any]] = []

    @property
    def key(self) -> str:
        return (f"{self.target}/parsers {'on' if self.parsers else 'off'}/thinking {'on' if self.thinking else 'off'}"
                f"/{self.size}")  # fmt: skip

    def check(self) -> None:
        self.prompt_tokens = int(_smoke(self.url, self.whole, False)["prompt_tokens"])
        for tokens, path in self.stream_files.items():
            got = _smoke(self.url, json.loads(path.read_text()), True).get("completion_tokens")
            if got != tokens:
                raise StartError(f"a stream gave {got} tokens instead of {tokens}")

    def measure(self, args: argparse.Namespace) -> dict[str, Any]:
        script = write_script(self.work / f"{self.key.replace('/', '-')}.lua", self.whole, unique_marker=self.marker,
                              unique_base=next(_bases) * 10**8)  # fmt: skip
        run_wrk(self.url, script, connections=args.whole_connections, threads=1, duration=args.warmup,
                core=args.load_core)  # fmt: skip
        before = cpu_seconds(self.pid)
        point = run_wrk(self.url, script, connections=args.whole_connections, threads=1, duration=args.duration,
                        core=args.load_core)  # fmt: skip
        per_request = (cpu_seconds(self.pid) - before) / max(point.requests, 1) * 1e6
        per_stream: dict[int, float] = {}
        events: dict[int, float] = {}
        errors = point.errors + point.non_2xx
        for tokens, path in self.stream_files.items():
            rounds = max(2, round(args.stream_rounds * 256 / tokens / 4)) if tokens < 256 else args.stream_rounds
            before = cpu_seconds(self.pid)
            done = run_streams(self.url, streams=args.streams, rounds=rounds, warmup_rounds=1, core=args.load_core,
                               timeout_s=120.0, body=path, unique_marker=self.marker,
                               unique_base=next(_bases) * 10**8)  # fmt: skip
            per_stream[tokens] = (cpu_seconds(self.pid) - before) / max(done.samples, 1) * 1e6
            events[tokens] = done.events_per_stream
            errors += done.errors
        low, high = DEPLOY_STREAM_TOKENS
        slope = (per_stream[high] - per_stream[low]) / (high - low)
        return {
            "cpu_us_per_request": round(per_request, 1),
            "rps": round(point.rps, 1),
            "cpu_us_per_token": round(slope, 2),
            "cpu_us_per_stream_fixed": round(per_stream[low] - low * slope, 1),
            **{f"cpu_us_per_stream_{tokens}": round(cpu, 1) for tokens, cpu in per_stream.items()},
            **{f"events_per_stream_{tokens}": n for tokens, n in events.items()},
            "errors": errors,
        }


DEPLOY_METRICS = ("cpu_us_per_request", "cpu_us_per_token", "cpu_us_per_stream_fixed", "events_per_stream_256")


def run_deployment(args: argparse.Namespace, group: ProcessGroup, work: Path) -> dict[str, Any]:
    """Every (target, parsers) started once on ``--target-core``, then ``--rounds`` rotated rounds over
    every (target, parsers, thinking, size) case."""
    model = MODELS["qwen3"]
    engine_port = free_port()
    start_grpc_engine(group, port=engine_port, tokenizer=model.folder, core=args.load_core, lean=True,
                      delay_ms=args.delay_ms)  # fmt: skip
    engine_url = f"grpc://{LOOPBACK}:{engine_port}"
    cases: list[DeployCase] = []
    failures: dict[str, str] = {}
    for target, parsers in itertools.product(args.targets, args.parsers):
        port = free_port()
        flavour = Model(model.folder, None, None, "") if not parsers else model
        print(f"- {target} parsers {'on' if parsers else 'off'}: starting", flush=True)
        try:
            proc = _start_target(target, group, work, port, engine_url, flavour, args)
        except (StartError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            failures[f"{target}/parsers {parsers}"] = str(exc)
            print(f"  failed to start: {exc}", flush=True)
            continue
        for thinking, size in itertools.product(args.thinking, args.sizes):
            case = DeployCase(target, parsers, thinking, size, f"http://{LOOPBACK}:{port}/v1/chat/completions",
                              proc.popen.pid, work, args.variant == "unique")  # fmt: skip
            add_checked(case, cases, failures)
    for number, order in rotations(cases, args.rounds):
        for case in order:
            entry = watched(lambda: case.measure(args), args, case.key, round=number)  # noqa: B023
            case.rounds.append(entry)
            print(f"  round {number + 1} {case.key}: {entry['cpu_us_per_request']:,.0f} µs/req, "
                  f"{entry['cpu_us_per_token']:.1f} µs/tok, {entry['cpu_us_per_stream_fixed']:,.0f} µs/stream fixed, "
                  f"{entry['events_per_stream_256']:.0f} events/256-token stream, errors {entry['errors']}"
                  + ("; a pytest ran meanwhile" if entry.get("disturbed") else ""), flush=True)  # fmt: skip
    summary: dict[str, Any] = {}
    by_key = {case.key: case for case in cases}
    for case in cases:
        entry = {metric: spread([r[metric] for r in case.rounds]) for metric in DEPLOY_METRICS}
        entry["prompt_tokens"] = case.prompt_tokens
        entry["errors"] = sum(r["errors"] for r in case.rounds)
        entry["disturbed_rounds"] = sum(bool(r.get("disturbed")) for r in case.rounds)
        peer = by_key.get(case.key.replace(case.target, "smg", 1)) if case.target in GATEWAYS else None
        if peer is not None:
            ratios = {
                metric: [o[metric] / b[metric] for o, b in zip(case.rounds, peer.rounds) if b[metric] > 0]
                for metric in DEPLOY_METRICS[:3]
            }  # a slope can come out negative on a busy machine: no ratio then
            entry["vs_smg"] = {metric: spread(values, 2) for metric, values in ratios.items() if values}
        summary[case.key] = entry
    return {"summary": summary, "failures": failures, "rounds": {case.key: case.rounds for case in cases}}


def render_deployment(done: dict[str, Any]) -> str:
    rows = [
        "| target | parsers | thinking | prompt | prompt tok | CPU µs/req | min..max | vs smg | CPU µs/out tok "
        "| min..max | vs smg | fixed µs/stream | min..max | vs smg | events/256-tok stream |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, entry in done["summary"].items():
        cells = key.replace("parsers ", "").replace("thinking ", "").split("/") + [str(entry["prompt_tokens"])]
        for metric, fmt in (("cpu_us_per_request", ",.0f"), ("cpu_us_per_token", ".1f"),
                            ("cpu_us_per_stream_fixed", ",.0f")):  # fmt: skip
            s = entry[metric]
            ratio = entry.get("vs_smg", {}).get(metric)
            cells += [format(s["median"], fmt), f"{s['min']:{fmt}}..{s['max']:{fmt}}",
                      f"{ratio['median']:.2f}x ({ratio['min']:.2f}..{ratio['max']:.2f})" if ratio else ""]  # fmt: skip
        cells.append(f"{entry['events_per_stream_256']['median']:.0f}")
        rows.append("| " + " | ".join(cells) + " |")
    rows += [f"\n{key}: not measured: {reason}" for key, reason in done["failures"].items()]
    return "\n".join(rows)


def split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--duration", type=float, default=5.0, help="seconds per wrk point (default 5)")
    add("--warmup", type=float, default=1.0, help="seconds of wrk warm-up per case (default 1)")
    add("--stream-rounds", type=int, default=6, help=f"measured rounds of {STREAMS} streams (default 6)")
    add("--tokenizers", default=",".join(MODELS), help="subset of qwen3,llama3")
    add("--sizes", default=",".join(SIZES), help="subset of 1k,8k")
    add("--targets", default=",".join(TARGETS), help="subset of gateway,smg")
    add("--target-core", default="0")
    add("--load-core", default="1")
    add("--stock-engine", action="store_true",
        help="run manage.py runmockworker --grpc as it is (default: bench/lean_engine.py, the same service "
             "without the stand-in's prompt-length bookkeeping, which makes it the bottleneck for long prompts)")
    add("--profile", action="store_true", help="also profile the gateway (cProfile): short chat at c=64, then streams")
    add("--profile-only", action="store_true", help="only the profiles")
    add("--profile-modes", default="chat,stream", help="which profiles: chat, stream or both (default chat,stream)")
    add("--profile-case", default="qwen3:1k:cached", help="TOKENIZER:SIZE:VARIANT to profile (default qwen3:1k:cached)")
    add("--profile-seconds", type=float, default=8.0)
    add("--profiler", choices=("py-spy", "cprofile"), default="py-spy" if PY_SPY.exists() else "cprofile",
        help="py-spy (sampling from outside; the default when py-spy is installed beside the venv's python) or cProfile")
    add("--chunk-tokens", type=int, default=1, help="the engine's tokens per streamed message (default 1)")
    add("--top", type=int, default=25)
    add("--wait-for-tests", type=float, default=1800.0,
        help="before each case, wait up to this many seconds while a pytest runs (0: do not wait)")
    add("--attempts", type=int, default=3,
        help="measure a case again (up to this many times in all) when a pytest ran while it was measured")
    add("--output", type=Path, default=RESULTS / "grpc-pipeline.json")
    add("--deployment", action="store_true",
        help="the Qwen3 deployment matrix instead (issue 27): parsers on/off x thinking on/off x --sizes "
             "(default short,8k), whole and streamed, --rounds alternated rounds beside smg")
    add("--parsers", default="on,off", help="--deployment: subset of on,off (the Qwen3 reasoning and tool parsers)")
    add("--thinking", default="off,on", help="--deployment: subset of off,on (chat_template_kwargs.enable_thinking)")
    add("--rounds", type=int, default=3, help="--deployment: rounds over every case (default 3)")
    add("--streams", type=int, default=8, help="--deployment: concurrent streams (default 8)")
    add("--whole-connections", type=int, default=16, help="--deployment: wrk connections for whole answers")
    add("--delay-ms", type=float, default=0.0, help="--deployment: the engine's pause before each token")
    add("--gateway-repo", type=Path, default=REPO,
        help="the checkout whose gateway is the target 'gateway' (default this one; run with this venv)")
    add("--before", type=Path, default=None,
        help="--deployment: also the gateway of this checkout (a worktree of the tree before a change, run with "
             "this venv) as the target 'before', in the same rounds")
    add("--variant", choices=VARIANTS, default="unique",
        help="--deployment: unique (default: a new number in every prompt, as distinct users send) or cached")
    add("--profile-thinking", choices=("unset", "off", "on"), default="unset",
        help="the profiled requests' chat_template_kwargs.enable_thinking (default: not sent)")
    add("--profile-parsers", choices=("on", "off"), default="on", help="the profiled gateway's parser flags")
    args = parser.parse_args(argv)
    if args.deployment:
        if "--sizes" not in " ".join(argv if argv is not None else sys.argv):
            args.sizes = "short,8k"
        args.parsers = [p == "on" for p in split(args.parsers)]
        args.thinking = [t == "on" for t in split(args.thinking)]
    args.tokenizers, args.sizes, args.targets = split(args.tokenizers), split(args.sizes), split(args.targets)
    if set(args.tokenizers) - set(MODELS) or set(args.sizes) - set(SIZES) or set(args.targets) - set(TARGETS):
        parser.error("unknown tokenizer, size or target")
    args.targets = without_missing_smg(args.targets)
    if args.deployment and args.before is not None:
        args.targets.insert(0, "before")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _raise_on_sigterm()
    meta = bench_meta()

    if args.deployment:
        deployed = in_work_dir("gw-grpc-deploy-", "logs-grpc", lambda group, work: run_deployment(args, group, work))
        if deployed is None:
            return 130
        write_results(args, meta, render_deployment(deployed), deployment=deployed)
        return 0

    def body(group: ProcessGroup, work: Path) -> tuple[dict[str, Any], str]:
        results = {} if args.profile_only else run_all(args, group, work)
        text = ""
        if args.profile or args.profile_only:
            text = "\n".join(profile(args, group, work, mode) for mode in split(args.profile_modes))
        return results, text

    done = in_work_dir("gw-grpc-bench-", "logs-grpc", body)
    if done is None:
        return 130
    results, text = done
    if results:
        write_results(args, meta, render_markdown(results), results=results)
    if text:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
