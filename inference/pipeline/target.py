"""An engine worker as one served request uses it: the worker, its engine client, the model's
tokenizer, the worker's engine spec and the model family detected for it (built per attempt by
:func:`inference.served.base.engine_target`, from the data plane's registry and clients)."""

from __future__ import annotations

from dataclasses import dataclass

from inference.pipeline.tokenizers import ModelTokenizer
from inference.routing.workers import EngineSpec, WorkerHandle
from inference.schemas.families import ModelFamily
from inference.upstreams.engine import EngineClient

__all__ = ["EngineTarget"]


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """An engine worker as a served request uses it."""

    worker: WorkerHandle
    client: EngineClient
    tokenizer: ModelTokenizer
    spec: EngineSpec
    family: ModelFamily | None
    model: str
