"""Prefill and decode stand-ins (standins.pd_worker) on loopback inside a test's event loop."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from aiohttp import web

from inference.routing.pd import PdMember
from inference.routing.workers import PdTraits, WorkerHandle, WorkerLoad, WorkerRecord, WorkerStatus, WorkerType
from standins.mock_worker import MockWorkerConfig, MockWorkerState, mock_state
from standins.pd_worker import PdState, PdWorkerConfig, build_pd_app, pd_state

__all__ = ["PdWorker", "serving_pd_worker"]


@dataclass
class PdWorker:
    url: str
    model: str
    role: str
    bootstrap_port: int | None
    app: web.Application

    @property
    def pd(self) -> PdState:
        return pd_state(self.app)

    @property
    def mock(self) -> MockWorkerState:
        return mock_state(self.app)

    def record(self, runtime: str = "sglang", pairing_protocol: str | None = None) -> WorkerRecord:
        worker_type = WorkerType.PREFILL if self.role == "prefill" else WorkerType.DECODE
        return WorkerRecord(
            id=str(uuid.uuid4()), url=self.url, model_id=self.model, runtime_type=runtime,
            status=WorkerStatus.READY, worker_type=worker_type,
            pd=PdTraits(bootstrap_port=self.bootstrap_port, pairing_protocol=pairing_protocol),
        )

    def member(self, pairing_protocol: str | None = None, context_length: int | None = None) -> PdMember:
        traits = PdTraits(bootstrap_port=self.bootstrap_port, pairing_protocol=pairing_protocol)
        return PdMember.of(WorkerHandle(self.record(), WorkerLoad()), traits, context_length)


@contextlib.asynccontextmanager
async def serving_pd_worker(
    role: str, model: str = "mock-model", *, bootstrap: bool = True, kv_timeout_s: float = 30.0,
    faults: tuple[str, ...] = (), **options: Any,
) -> AsyncIterator[PdWorker]:
    """A PD stand-in; a prefill one also listens on a bootstrap port of its own when ``bootstrap``."""
    app = build_pd_app(
        MockWorkerConfig(model=model, **options), PdWorkerConfig(role, kv_timeout_s=kv_timeout_s, faults=faults)  # type: ignore[arg-type]
    )
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    bootstrap_port = None
    if role == "prefill" and bootstrap:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        bootstrap_port = runner.addresses[1][1]
    try:
        yield PdWorker(f"http://127.0.0.1:{port}", model, role, bootstrap_port, app)
    finally:
        await runner.cleanup()
