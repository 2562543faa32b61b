"""The multimodal metrics of the catalog (spec 3), in the gateway's metrics registry
(:mod:`common.telemetry`), with the helpers the gRPC EPD path calls.

- ``gw_mm_tensors_total{runtime, path}`` and ``gw_mm_tensor_bytes_total{runtime, path}``: each tensor
  the gateway sends an engine and its payload's bytes, as the reference counts them: an EPD encode
  item's encoder input (the image's patches) and its ``image_grid_thw``, and the ``image_grid_thw`` of
  each item on the prefill leg. ``path`` is how the bytes travel: ``inline`` (in the request
  message) is the gateway's one transport; ``shm`` and ``remote`` are the reference's shared-memory
  and RDMA handles, which the gateway does not send.
- ``gw_mm_shm_write_failures_total{runtime}``: shared-memory writes that fell back to inline; the
  gateway writes none, so the family is declared and has no series.
- ``gw_mm_processing_total{model, mode, reason}``: each media item the gateway's pipeline handled,
  by where it was turned into the engine's input: ``mode`` ``router`` (the gateway ran the model's
  processor) or ``worker`` (the worker was given the media as it came); ``reason`` why there. Today
  one pair occurs: ``router`` / ``epd`` (an EPD encode worker takes the encoder input, not the image,
  so the gateway preprocesses every image of an EPD request: D90).
"""

from __future__ import annotations

from prometheus_client import Counter

# The gateway's one memo of labelled children (telemetry's: .labels() validates and locks on every call).
from common.telemetry import REGISTRY, _child, bounded_model

__all__ = [
    "MM_TENSORS",
    "MM_TENSOR_BYTES",
    "MM_SHM_WRITE_FAILURES",
    "MM_PROCESSING",
    "INLINE",
    "record_mm_tensor",
    "record_mm_processing",
]

INLINE = "inline"

MM_TENSORS = Counter("gw_mm_tensors_total", "Multimodal tensors sent to engines, by runtime and transport path",
                     ("runtime", "path"), registry=REGISTRY)  # fmt: skip
MM_TENSOR_BYTES = Counter("gw_mm_tensor_bytes_total", "Multimodal tensor bytes sent to engines, by runtime and transport path",
                          ("runtime", "path"), registry=REGISTRY)  # fmt: skip
MM_SHM_WRITE_FAILURES = Counter("gw_mm_shm_write_failures_total", "Shared-memory tensor writes that fell back to inline",
                                ("runtime",), registry=REGISTRY)  # fmt: skip
MM_PROCESSING = Counter("gw_mm_processing_total", "Media items by where they were made into the engine's input",
                        ("model", "mode", "reason"), registry=REGISTRY)  # fmt: skip


def record_mm_tensor(runtime: str, nbytes: int, path: str = INLINE) -> None:
    """One tensor of ``nbytes`` payload bytes sent to a ``runtime`` engine over ``path``."""
    _child(MM_TENSORS, runtime, path).inc()
    _child(MM_TENSOR_BYTES, runtime, path).inc(nbytes)


def record_mm_processing(model: str | None, mode: str, reason: str, items: int = 1) -> None:
    """``items`` media items of ``model`` made into the engine's input where ``mode`` says, why ``reason`` says."""
    _child(MM_PROCESSING, bounded_model(model), mode, reason).inc(items)
