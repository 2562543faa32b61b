"""vLLM EngineCore's output messages as a real engine core lays them out, for the stand-ins that speak
the ZMQ wire (:mod:`standins.zmq_engine`, and ``bench/lean_engine.py --zmq-url`` through it).

The one builder of the engine's side of EngineCoreOutputs, so every stand-in sends what the vLLM
version cited by :mod:`inference.upstreams.zmq.codec` sends, field for field:

- ``vllm/v1/engine/__init__.py`` @ 364631ab: EngineCoreOutputs, EngineCoreOutput and UtilityOutput
  are msgspec ``array_like`` Structs: positional arrays of *every* field in field order (their
  ``omit_defaults`` has no effect on array-like Structs: msgspec sends defaults in arrays,
  jcrist/msgspec#720), so always 8, 13 and 3 elements.
- ``vllm/v1/metrics/stats.py`` (its SchedulerStats of the same period, with ``kv_cache_eviction_events``,
  the LoRA adapter counts, ``cudagraph_stats`` and ``perf_stats``): SchedulerStats and its
  PrefixCacheStats are dataclasses, which msgspec encodes as maps of *every* field, in field order,
  ``None`` ones included (:func:`scheduler_stats`, :data:`SCHEDULER_STATS_FIELDS`).
- ``finished_requests`` is set only by an engine of a data-parallel group (vLLM's scheduler keeps the
  finished set only when ``data_parallel_size`` > 1); the scheduler stats ride on step outputs only,
  not on a utility answer nor a ``wave_complete`` notice.

Readers of these messages that expect the full layout (smg 1.13.0 drops every output whose stats
lack ``prefix_cache_stats.preempted_*`` or ``kv_cache_eviction_events``) decode them as they decode
a real engine's. The gateway's own client reads the stats as maps and needs none of this.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = [
    "PREFIX_CACHE_STATS_FIELDS",
    "SCHEDULER_STATS_FIELDS",
    "engine_core_output",
    "engine_core_outputs",
    "prefix_cache_stats",
    "scheduler_stats",
]

PREFIX_CACHE_STATS_FIELDS = (
    "reset", "requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits",
)  # fmt: skip
"""PrefixCacheStats (BaseCacheStats' fields, then its own), in order."""

SCHEDULER_STATS_FIELDS = (
    "num_running_reqs", "num_waiting_reqs", "step_counter", "current_wave", "kv_cache_usage",
    "encoder_cache_usage", "prefix_cache_stats", "connector_prefix_cache_stats", "kv_cache_eviction_events",
    "spec_decoding_stats", "kv_connector_stats", "waiting_lora_adapters", "running_lora_adapters",
    "cudagraph_stats", "perf_stats",
)  # fmt: skip
"""SchedulerStats, in order."""

def prefix_cache_stats(requests: int = 0, queries: int = 0, hits: int = 0, *, reset: bool = False) -> dict[str, Any]:
    """PrefixCacheStats as a map of every field (no preempted requests: the stand-ins preempt none)."""
    return {"reset": reset, "requests": requests, "queries": queries, "hits": hits,
            "preempted_requests": 0, "preempted_queries": 0, "preempted_hits": 0}  # fmt: skip


def scheduler_stats(
    *,
    num_running_reqs: int,
    num_waiting_reqs: int = 0,
    step_counter: int = 0,
    current_wave: int = 0,
    kv_cache_usage: float = 0.0,
    prefix: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """SchedulerStats as a map of every field in vLLM's order; ``overrides`` replace fields' values
    (a test's load) without changing the order, and add any field vLLM does not have at the end."""
    stats: dict[str, Any] = {
        "num_running_reqs": num_running_reqs,
        "num_waiting_reqs": num_waiting_reqs,
        "step_counter": step_counter,
        "current_wave": current_wave,
        "kv_cache_usage": float(kv_cache_usage),
        "encoder_cache_usage": 0.0,
        "prefix_cache_stats": prefix if prefix is not None else prefix_cache_stats(),
        "connector_prefix_cache_stats": None,
        "kv_cache_eviction_events": [],
        "spec_decoding_stats": None,
        "kv_connector_stats": None,
        "waiting_lora_adapters": {},
        "running_lora_adapters": {},
        "cudagraph_stats": None,
        "perf_stats": None,
    }
    stats.update(overrides or {})
    return stats


def engine_core_output(
    request_id: str,
    new_token_ids: list[int],
    *,
    new_logprobs: Any = None,
    new_prompt_logprobs_tensors: Any = None,
    finish_reason: int | None = None,
    stop_reason: int | str | None = None,
    num_cached_tokens: int = 0,
) -> list[Any]:
    """One EngineCoreOutput as the engine sends it: request_id, new_token_ids, new_logprobs,
    new_prompt_logprobs_tensors, pooling_output, finish_reason, stop_reason, events,
    kv_transfer_params, trace_headers, num_cached_tokens, routed_experts, num_nans_in_logits."""
    return [request_id, new_token_ids, new_logprobs, new_prompt_logprobs_tensors, None, finish_reason,
            stop_reason, None, None, None, num_cached_tokens, None, 0]


def engine_core_outputs(
    engine_index: int,
    outputs: list[list[Any]] | None = None,
    *,
    scheduler_stats: dict[str, Any] | None = None,
    utility_output: list[Any] | None = None,
    finished_requests: list[str] | None = None,
    wave_complete: int | None = None,
    start_wave: int | None = None,
    timestamp: float | None = None,
) -> list[Any]:
    """One EngineCoreOutputs as the engine sends it: engine_index, outputs, scheduler_stats,
    timestamp (the engine's monotonic clock, as vLLM's ``__post_init__`` sets it), utility_output,
    finished_requests, wave_complete, start_wave."""
    return [engine_index, outputs or [], scheduler_stats, time.monotonic() if timestamp is None else timestamp,
            utility_output, finished_requests, wave_complete, start_wave]
