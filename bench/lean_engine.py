"""The gRPC engine stand-in for load, without its per-request bookkeeping that grows with the prompt.

``.venv/bin/python bench/lean_engine.py --tokenizer FOLDER --port P [--model M] [--chunk-tokens N]``
``.venv/bin/python bench/lean_engine.py --tokenizer FOLDER --zmq-url ipc://PATH [--chunk-tokens N]``

The same service as ``manage.py runmockworker --grpc`` (:mod:`standins.grpc_engine`, the same wire
and the same scripted replies), with three test aids turned off because in Python they cost the
engine milliseconds per long prompt and would make the engine, not the gateway, the bottleneck:

- the simulated prefix cache (a token-by-token compare against 64 earlier prompts; ``cached_tokens``
  is 0);
- decoding the prompt ids back to text for the request record (the record keeps an empty text, so
  the ``[[mock:KIND]]`` markers and the thinking state are not seen in a prompt longer than 64
  tokens: its reply is the default one, without reasoning);
- the id range check, done with ``max`` instead of a generator over every id;
- the copy of each request as a dict for the record (``MessageToDict`` over every prompt id).

``--stream-delay-only`` keeps ``--delay-ms`` for streamed chunks and sends whole answers at once
(bench/served_instructions.py: streams paced so the gateway reads one message at a time, whole
requests not stretched). ``--to-max-tokens`` also makes every request with a token limit run to that limit, as if it had set
``ignore_eos`` (bench/messages_vs_chat.py: the Messages API has no ``ignore_eos``, and chat and
Messages must stream the same number of tokens to compare their cost per token).

``--zmq-url ipc://PATH`` runs the ZMQ engine-core stand-in instead (:mod:`standins.zmq_engine`, vLLM's
EngineCore dialing in to the gateway's worker ``PATH``, as ``runmockworker --zmq``) with the same
scripted engine made lean, and its record of every ADD's raw array kept to the last 64 (the
stand-in keeps them all: a long prompt each, which grows without bound under load). Its messages are
the stand-in's, laid out as vLLM's (:mod:`standins.engine_core_wire`: the scheduler stats with every
field, which smg 1.13.0 requires: it drops every output whose stats lack
``prefix_cache_stats.preempted_*`` or ``kv_cache_eviction_events``). It prints
``mock zmq engine serving ...`` once registered (bench/zmq_vs_grpc.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from standins import grpc_services, scripted_engine  # noqa: E402
from standins.grpc_engine import GrpcEngineConfig, run_grpc_engine  # noqa: E402


def make_lean() -> None:
    """Patch the stand-in's engine classes in this process (bench/ only; the stand-in is unchanged)."""
    engine_cls, model_cls = scripted_engine.ScriptedEngine, scripted_engine.ScriptedModel
    check = engine_cls.check_prompt

    async def check_prompt(self: Any, ids: tuple[int, ...], context: Any) -> None:
        if not ids or max(ids) >= self.model.vocab_size or len(ids) >= self.config.max_context_length:
            await check(self, ids, context)  # the stand-in's own error

    def decode(self: Any, ids: list[int] | tuple[int, ...]) -> str:
        return "" if len(ids) > 64 else str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    grpc_services._seen = lambda message: {}
    engine_cls.cached_prefix = lambda self, ids: 0  # type: ignore[method-assign]
    engine_cls.check_prompt = check_prompt  # type: ignore[method-assign]
    model_cls.decode = decode  # type: ignore[method-assign]


def run_to_max_tokens() -> None:
    """Every choice with ``max_new_tokens`` runs to it (as with ``ignore_eos``), whatever the request says."""
    model_cls = scripted_engine.ScriptedModel
    choice = model_cls.choice

    def to_limit(self: Any, kind: Any, thinking: Any, sampling: Any) -> Any:
        if sampling.max_new_tokens is not None and not sampling.ignore_eos:
            sampling = dataclasses.replace(sampling, ignore_eos=True)
        return choice(self, kind, thinking, sampling)

    model_cls.choice = to_limit  # type: ignore[method-assign]


def pause_streams_only() -> None:
    """``--delay-ms`` before each streamed chunk only: a whole answer (its one pause of a step per
    token) leaves at once, so a bench can pace streams without stretching whole requests."""
    engine_cls = scripted_engine.ScriptedEngine
    pause = engine_cls._pause

    async def streamed_only(self: Any, steps: int) -> None:
        await pause(self, steps if steps == 1 else 0)  # a stream pauses one step at a time

    engine_cls._pause = streamed_only  # type: ignore[method-assign]


class _RecentAdds(list[Any]):
    """The ZMQ stand-in's ``state.adds`` keeping only the last 64 raw ADD arrays."""

    def append(self, item: Any) -> None:
        super().append(item)
        if len(self) > 128:
            del self[:-64]


def run_lean_zmq(tokenizer: str, model: str, zmq_url: str, chunk_tokens: int, delay_ms: float) -> None:
    """The ZMQ engine-core stand-in, lean, dialing in to the worker ``zmq_url``."""
    from standins import zmq_engine

    state_cls = zmq_engine.ZmqEngineState
    init = state_cls.__init__

    def lean_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.adds = _RecentAdds()

    state_cls.__init__ = lean_init  # type: ignore[method-assign]
    config = zmq_engine.ZmqEngineConfig(tokenizer=tokenizer, model=model, chunk_tokens=chunk_tokens,
                                        delay_ms=delay_ms)  # fmt: skip
    zmq_engine.run_zmq_engine(config, zmq_engine.handshake_address_for(zmq_url))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--port", type=int, default=None, help="the gRPC port (required but with --zmq-url)")
    parser.add_argument("--zmq-url", default=None, help="ipc://PATH: the ZMQ engine-core stand-in for that worker")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default="mock-model")
    parser.add_argument("--runtime", default="sglang")
    parser.add_argument("--chunk-tokens", type=int, default=1)
    parser.add_argument("--to-max-tokens", action="store_true", help="every request runs to its max tokens")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="the stand-in's pause before each streamed chunk")
    parser.add_argument("--stream-delay-only", action="store_true",
                        help="no pause before a whole (non-streamed) answer")  # fmt: skip
    args = parser.parse_args(argv)
    if args.port is None and args.zmq_url is None:
        parser.error("--port or --zmq-url is required")
    make_lean()
    if args.to_max_tokens:
        run_to_max_tokens()
    if args.stream_delay_only:
        pause_streams_only()
    if args.zmq_url:
        run_lean_zmq(args.tokenizer, args.model, args.zmq_url, args.chunk_tokens, args.delay_ms)
        return 0
    config = GrpcEngineConfig(
        runtime=args.runtime, tokenizer=args.tokenizer, model=args.model, chunk_tokens=args.chunk_tokens,
        delay_ms=args.delay_ms,
    )
    run_grpc_engine(config, args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
