"""Worker handles for policy tests, without a registry."""

from __future__ import annotations

from inference.routing.policies import SelectionRequest
from inference.routing.workers import WorkerHandle, WorkerLoad, WorkerRecord


def fleet(count: int, model: str = "m") -> tuple[WorkerHandle, ...]:
    return tuple(
        WorkerHandle(WorkerRecord(id=f"w{i}", url=f"http://w{i}:8000", model_id=model, runtime_type="sglang", status="ready"), WorkerLoad())
        for i in range(count)
    )


def ask(text: str | None = None, key: str | None = None, model: str = "m") -> SelectionRequest:
    return SelectionRequest(model=model, routing_key=key, text=text)
