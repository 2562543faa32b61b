"""The surfaces the gateway serves itself on engine workers (gRPC and ZMQ): each maps its
request to engine requests through the pipeline's stages (:mod:`inference.pipeline`) and the
pipeline's API-neutral events to its own wire format, through the surface's response writer.

A served surface plugs into the same attempts loop as the relays: :meth:`open` starts the engine
request on a worker and returns an :class:`~inference.pipeline.engine_answer.EngineAnswer` once the
engine's first output arrived (a failure before it is retried on another worker), and the answer's
``forward`` writes the response.
"""

from __future__ import annotations

from inference.served.base import ServedAnswer, ServedRequest, ServedSurface

__all__ = ["ServedAnswer", "ServedRequest", "ServedSurface"]
