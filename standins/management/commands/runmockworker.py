"""``manage.py runmockworker``: serve the project's mock OpenAI-compatible worker (a test aid).

Prints ``mock worker serving MODEL on http://HOST:PORT`` once listening; stop it with Ctrl+C/SIGTERM.

With ``--grpc``: serve the gRPC engine stand-in instead (``--runtime sglang|vllm|trtllm|tokenspeed|mlx``,
``--tokenizer`` a fixture tokenizer folder or tokenizer.json; :mod:`standins.grpc_engine`), which
prints ``mock grpc engine (RUNTIME) serving MODEL on grpc://HOST:PORT``.

With ``--zmq``: run the ZMQ engine-core stand-in (:mod:`standins.zmq_engine`), which dials in to the
gateway's ZMQ worker ``--zmq-url ipc://PATH`` (``--zmq-handshake-address``, ``--dp-size N``) and
prints ``mock zmq engine serving MODEL via HANDSHAKE (dp_size N)`` once registered.

With ``--role prefill|decode``: the HTTP worker as one side of SGLang-style PD disaggregation
(:mod:`standins.pd_worker`; ``--bootstrap-port`` for a prefill worker's bootstrap server,
``--kv-timeout`` for how long a decode waits for its KV, ``--pd-fault`` to fail on command). With
``--grpc --role``: the SGLang gRPC stand-in in that role (:mod:`standins.grpc_pd`), or with
``--runtime vllm`` the vLLM one handing the KV over by kv_transfer_params (:mod:`standins.grpc_pd_vllm`,
``--kv-connector nixl|mooncake``, ``--kv-engine-id``), or with ``--runtime tokenspeed`` the TokenSpeed
one (kv_bootstrap_info), ``--role encode`` a TokenSpeed encode worker (:mod:`standins.grpc_encoder`,
``--encode-fault`` to fail on command); a prefill or encode one's bootstrap server listens on
``--bootstrap-port`` (a free port when unset, printed).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from standins.grpc_engine import REPLIES, RUNTIMES, GrpcEngineConfig, run_grpc_engine
from standins.grpc_encoder import ENCODER_FAULTS, GrpcEncoderServer, GrpcTokenSpeedPdServer
from standins.grpc_pd import GrpcPdServer
from standins.grpc_pd_vllm import CONNECTORS, VllmPdServer
from standins.mock_worker import MockWorkerConfig, run_mock_worker
from standins.pd_worker import PD_FAULTS, PD_ROLES, PdWorkerConfig, run_pd_worker
from standins.zmq_engine import ZmqEngineConfig, handshake_address_for, run_zmq_engine

__all__ = ["Command"]


class Command(BaseCommand):
    help = "Run a mock OpenAI-compatible inference worker (SGLang/vLLM stand-in) for tests and benchmarks."
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=None,
                            help="TCP port (0 picks a free one); required but with --zmq, which dials in")
        parser.add_argument("--model", default=None, help="model name served and reported (required over HTTP)")
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
        parser.add_argument(
            "--owned-by",
            default="sglang",
            help="owned_by in /v1/models: sglang, vllm, or anything else for a generic runtime",
        )
        parser.add_argument("--tokens", type=int, default=16, help="completion tokens per response")
        parser.add_argument("--delay-ms", type=float, default=0.0, help="delay before each generated token")
        parser.add_argument(
            "--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health"
        )
        parser.add_argument(
            "--max-model-len", type=int, default=None, help="context window, reported and enforced (default 4096; 32768 with --grpc)"
        )
        pd_options = parser.add_argument_group("prefill/decode disaggregation stand-in (--role)")
        pd_options.add_argument(
            "--role", choices=(*PD_ROLES, "encode"), default=None,
            help="serve as a prefill or decode worker (with --grpc --runtime tokenspeed also an encode worker)",
        )
        pd_options.add_argument(
            "--encode-fault", action="append", choices=ENCODER_FAULTS, default=[],
            help="with --role encode: fail every Encode so",
        )
        pd_options.add_argument("--bootstrap-port", type=int, default=None, help="a prefill worker's bootstrap port")
        pd_options.add_argument("--kv-timeout", type=float, default=30.0, help="seconds a decode waits for its KV")
        pd_options.add_argument(
            "--pd-fault", action="append", choices=PD_FAULTS, default=[], help="fail every request on this side so"
        )
        pd_options.add_argument(
            "--kv-connector", choices=sorted(CONNECTORS), default="nixl",
            help="with --grpc --runtime vllm: the KV connector the engine uses and reports (default nixl)",
        )
        pd_options.add_argument("--kv-engine-id", default="engine-0", help="with --grpc --runtime vllm: the KV engine id it reports")
        grpc_options = parser.add_argument_group("gRPC engine stand-in (--grpc)")
        grpc_options.add_argument("--grpc", action="store_true", help="serve an engine's gRPC service instead of HTTP")
        grpc_options.add_argument(
            "--runtime", choices=RUNTIMES, default="sglang",
            help=f"the engine's gRPC service: {', '.join(RUNTIMES)} (default sglang)",
        )
        grpc_options.add_argument("--tokenizer", default=None, help="tokenizer.json or its folder (required with --grpc)")
        grpc_options.add_argument(
            "--reply", choices=REPLIES, default="text",
            help="default scripted reply (a prompt marker [[mock:KIND]] picks one per request)",
        )
        grpc_options.add_argument("--text", default=None, help="the reply's text")
        grpc_options.add_argument("--chunk-tokens", type=int, default=3, help="tokens per streamed chunk")
        zmq_options = parser.add_argument_group("ZMQ engine-core stand-in (--zmq; also --tokenizer, --reply, ...)")
        zmq_options.add_argument("--zmq", action="store_true", help="dial in to a gateway's ZMQ worker as vLLM's EngineCore")
        zmq_options.add_argument("--zmq-url", default=None, help="the worker's ipc://PATH URL (required with --zmq)")
        zmq_options.add_argument("--zmq-handshake-address", default=None, help="tcp:// handshake address (default: derived from the path)")
        zmq_options.add_argument(
            "--dp-size", type=int, default=1,
            help="data-parallel engines to start (indexes 0..N-1); over HTTP and gRPC, the dp_size the server info reports",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["zmq"]:
            self._serve_zmq(options)
            return
        if options["port"] is None:
            raise CommandError("--port is required")
        if not 0 <= options["port"] <= 65535:
            raise CommandError("--port must be between 0 and 65535")
        if options["grpc"]:
            self._serve_grpc(options)
            return
        if not options["model"]:
            raise CommandError("--model is required")
        try:
            config = MockWorkerConfig(
                model=options["model"],
                owned_by=options["owned_by"],
                tokens=options["tokens"],
                delay_ms=options["delay_ms"],
                api_key=options["api_key"] or None,
                max_model_len=options["max_model_len"] or 4096,
                dp_size=options["dp_size"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["role"]:
            self._serve_pd(config, options)
            return
        try:
            run_mock_worker(config, options["host"], options["port"])
        except OSError as exc:  # e.g. the port is taken
            raise CommandError(f"cannot serve on {options['host']}:{options['port']}: {exc}") from None

    def _serve_pd(self, config: MockWorkerConfig, options: dict[str, Any]) -> None:
        if options["role"] == "encode":
            raise CommandError("--role encode serves --grpc --runtime tokenspeed (TokenSpeedEncoder)")
        try:
            pd = PdWorkerConfig(
                options["role"], options["bootstrap_port"], options["kv_timeout"], tuple(options["pd_fault"])
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            run_pd_worker(config, pd, options["host"], options["port"])
        except OSError as exc:
            raise CommandError(f"cannot serve on {options['host']}:{options['port']}: {exc}") from None

    def _serve_grpc(self, options: dict[str, Any]) -> None:
        if not options["tokenizer"]:
            raise CommandError("--tokenizer is required with --grpc")
        extra: dict[str, Any] = {}
        if options["text"]:
            extra["text"] = options["text"]
        if options["max_model_len"]:
            extra["max_context_length"] = options["max_model_len"]
        try:
            config = GrpcEngineConfig(
                runtime=options["runtime"],
                tokenizer=options["tokenizer"],
                model=options["model"] or "mock-model",
                reply=options["reply"],
                chunk_tokens=options["chunk_tokens"],
                delay_ms=options["delay_ms"],
                dp_size=options["dp_size"],
                **extra,
            )
            if not config.tokenizer_file.is_file():
                raise ValueError(f"no tokenizer at {config.tokenizer_file}")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["role"]:
            self._serve_grpc_pd(config, options)
            return
        try:
            run_grpc_engine(config, options["host"], options["port"])
        except (OSError, RuntimeError) as exc:
            raise CommandError(f"cannot serve on {options['host']}:{options['port']}: {exc}") from None

    def _serve_grpc_pd(self, config: GrpcEngineConfig, options: dict[str, Any]) -> None:
        if config.runtime not in ("sglang", "vllm", "tokenspeed"):
            raise CommandError(
                "--grpc --role serves --runtime sglang (disaggregated_params), vllm (kv_transfer_params) "
                "or tokenspeed (kv_bootstrap_info; also --role encode)"
            )
        if options["role"] == "encode":
            if config.runtime != "tokenspeed":
                raise CommandError("--role encode serves --grpc --runtime tokenspeed (TokenSpeedEncoder)")
            self._serve_encoder(config, options)
            return
        try:
            pd = PdWorkerConfig(
                options["role"], options["bootstrap_port"], options["kv_timeout"], tuple(options["pd_fault"])
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        host, port = options["host"], options["port"]

        async def serve() -> None:
            server: GrpcPdServer | VllmPdServer | GrpcTokenSpeedPdServer
            if config.runtime == "vllm":
                server = VllmPdServer(config, pd, CONNECTORS[options["kv_connector"]], options["kv_engine_id"])
            elif config.runtime == "tokenspeed":
                server = GrpcTokenSpeedPdServer(config, pd)
            else:
                server = GrpcPdServer(config, pd)
            bound = await server.start(host, port)
            url_host = f"[{host}]" if ":" in host else host
            boot = f" (bootstrap port {server.bootstrap_port})" if server.bootstrap_port is not None else ""
            sys.stdout.write(
                f"mock grpc engine ({config.runtime} {pd.role}) serving {config.model} on grpc://{url_host}:{bound}{boot}\n"
            )
            sys.stdout.flush()
            try:
                await server.wait()
            finally:
                await server.stop()

        try:
            asyncio.run(serve())
        except KeyboardInterrupt:
            pass
        except OSError as exc:
            raise CommandError(f"cannot serve on {host}:{port}: {exc}") from None

    def _serve_encoder(self, config: GrpcEngineConfig, options: dict[str, Any]) -> None:
        host, port = options["host"], options["port"]

        async def serve() -> None:
            server = GrpcEncoderServer(config, tuple(options["encode_fault"]), options["bootstrap_port"])
            bound = await server.start(host, port)
            url_host = f"[{host}]" if ":" in host else host
            sys.stdout.write(
                f"mock grpc engine ({config.runtime} encode) serving {config.model} on grpc://{url_host}:{bound}"
                f" (bootstrap port {server.bootstrap_port})\n"
            )
            sys.stdout.flush()
            try:
                await server.wait()
            finally:
                await server.stop()

        try:
            asyncio.run(serve())
        except KeyboardInterrupt:
            pass
        except OSError as exc:
            raise CommandError(f"cannot serve on {host}:{port}: {exc}") from None

    def _serve_zmq(self, options: dict[str, Any]) -> None:
        if not options["tokenizer"] or not options["zmq_url"]:
            raise CommandError("--tokenizer and --zmq-url are required with --zmq")
        if options["dp_size"] < 1:
            raise CommandError("--dp-size must be at least 1")
        try:
            handshake = options["zmq_handshake_address"] or handshake_address_for(options["zmq_url"])
            config = ZmqEngineConfig(
                tokenizer=options["tokenizer"], model=options["model"] or "mock-model", reply=options["reply"],
                text=options["text"] or None, chunk_tokens=options["chunk_tokens"], delay_ms=options["delay_ms"],
                max_model_len=options["max_model_len"] or 32768,
            )  # fmt: skip
            tokenizer_file = config.scripted().tokenizer_file  # scripted() checks reply, chunk and length
            if not tokenizer_file.is_file():
                raise ValueError(f"no tokenizer at {tokenizer_file}")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        run_zmq_engine(config, handshake, options["dp_size"])
