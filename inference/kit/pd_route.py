"""Whether a request goes through prefill/decode disaggregation, its pair (with its encode stage on
a gRPC EPD deployment: :func:`pd_pair_for`), and PD admission.

A model is served by PD when no regular worker serves it and the registry's PD pool has prefill or
decode workers for it (registered with --pd-disaggregation, or through the admin API with
worker_type prefill/decode). The pair is chosen with --prefill-policy and --decode-policy (default
--policy) among prefill and decode workers with equal pairing keys; none: 503 no_prefill_servers.

PD admission (:func:`admit_pair`): when a pair could take the request but for overload protection
(the load monitor's last report put its prefill or decode side over the worker's overload
thresholds), the request waits up to --pd-admission-wait-secs for a report that frees one, looking
again every :data:`ADMISSION_POLL_SECS`; it holds no worker slot meanwhile (nothing is counted in
flight on any worker until the pair is chosen), only the gateway's concurrency permit it already
had. Admitted after waiting: gw_pd_admission_waits_total. Not freed in time (or a wait of 0): 503
worker_overload_protection_shed with Retry-After the load-monitor interval, not retried,
gw_pd_admission_sheds_total (and gw_worker_overload_shed_total{stage="pd_admission"}, counted by the
route's telemetry).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Mapping

from common import pd_metrics, telemetry
from inference.admission.media import inline_media_bytes
from inference.dataplane import DataPlane
from inference import errors
from inference.errors import ErrorCode, GatewayError
from inference.routing.epd import EPD_RUNTIMES, assign_encoders, request_images
from inference.routing.pd import PdPair, select_pair
from inference.routing.policies import SelectionRequest
from inference.routing.request_text import request_text
from inference.pipeline.tokenizer_registry import tokenizer_for
from inference.routing.workers import EngineSpec, Transport, WorkerKind, WorkerType
from inference.upstreams.epd_encode import EncodePlan, choose_encode
from inference.upstreams.epd_pixels import encoder_input_bytes, load_vision_processor, media_too_large

__all__ = ["ADMISSION_POLL_SECS", "admit_pair", "pd_pair_for", "serves_by_epd", "serves_by_pd"]

# How often a waiting PD request looks at the overload flags again. A flag moves only when a load
# report lands (every --load-monitor-interval, or the leader's report shared with the other serving
# processes), and nothing signals that here: looking is one pair selection, so a few waiting
# requests cost little, and the delay it adds after a report is at most this.
ADMISSION_POLL_SECS = 0.05


def serves_by_pd(dp: DataPlane, model: str | None) -> bool:
    """Whether requests for ``model`` (as the client named it; None: any) go through PD."""
    snapshot = dp.registry.snapshot
    pool = snapshot.pd
    if not pool:
        return False
    canonical = snapshot.aliases.get(model, model) if model else None
    if canonical is None:
        if snapshot.routable:
            return False
    elif snapshot.routable_by_model.get(canonical) or snapshot.routable_any_model:
        return False
    prefills, decodes = pool.members(canonical)
    return bool(prefills or decodes)


def serves_by_epd(dp: DataPlane, model: str | None) -> bool:
    """Whether requests for ``model`` (None: any) land on a gRPC EPD deployment: no regular worker
    serves it and a ready engine encode worker does (surfaces the spec refuses there answer 501)."""
    snapshot = dp.registry.snapshot
    canonical = snapshot.aliases.get(model, model) if model else None
    if canonical is None:
        if snapshot.routable:
            return False
    elif snapshot.routable_by_model.get(canonical) or snapshot.routable_any_model:
        return False
    return snapshot.pd.encodes(canonical)


def pd_pair_for(
    dp: DataPlane,
    model: str | None,
    routing_key: str | None,
    body: Mapping[str, Any] | None,
    exclude: frozenset[str] = frozenset(),
) -> PdPair:
    """The pair for a PD request (:func:`serves_by_pd`), its encode stage (EPD) chosen with it and
    kept for the request (:func:`choose_encode`). Raises 503 no_prefill_servers or no_healthy_workers
    (no encode worker for its images), 400 multimodal_not_supported."""
    snapshot = dp.registry.snapshot
    canonical = snapshot.aliases.get(model, model) if model else None
    prefills, decodes = snapshot.pd.members(canonical)
    prefill_policy, decode_policy = dp.prefill_policy, dp.decode_policy
    assert prefill_policy is not None and decode_policy is not None
    needs_text = prefill_policy.needs_text or decode_policy.needs_text
    request = SelectionRequest(canonical or "", routing_key, request_text(body) if needs_text and body else None)
    pair = select_pair(prefills, decodes, canonical, prefill_policy, decode_policy, request, exclude)
    choose_encode(pair.prefill.handle.id, _encode_plan(dp, canonical, pair, body, exclude))
    return pair


def _encode_plan(
    dp: DataPlane, model: str | None, pair: PdPair, body: Mapping[str, Any] | None, exclude: frozenset[str]
) -> EncodePlan | None:
    """The encode stage of a request on ``pair`` (gRPC EPD): an encode worker per image of the
    request, when the pair's runtime is one the gateway runs EPD for and encode workers of that
    runtime serve the model; None for a text-only request or a pair without encoders. Raises 503
    no_healthy_workers when none of those encoders can take it, 400 multimodal_not_supported for
    media an encoder is not sent."""
    record = pair.prefill.handle.record
    runtime = record.runtime_type
    if record.kind is not WorkerKind.ENGINE or record.transport is not Transport.GRPC or runtime not in EPD_RUNTIMES:
        return None
    encoders = [
        member for member in dp.registry.snapshot.pd.encoders(model)
        if member.handle.record.runtime_type == runtime and member.handle.record.transport is Transport.GRPC
    ]  # fmt: skip
    if not encoders:
        return None
    items = request_images(body, dp.config.multimodal_max_image_pixels)
    if not items:
        return None
    # The image processor sits beside the model's tokenizer, where that was loaded from (a local
    # directory, or the files fetched from the model hub or a worker): the tokenizer the request is
    # served with (the pair's decode worker's, chosen as inference.served.base.engine_target chooses
    # it), so 503 tokenizer_not_ready while it loads, as the request would get next.
    served = pair.decode.handle.record
    spec = served.engine or EngineSpec()
    tokenizer = tokenizer_for(
        model or served.model_id or "", location=spec.tokenizer, chat_template=spec.chat_template, fallback=served.url
    )
    processor = load_vision_processor(tokenizer.path)
    if processor is None:
        raise errors.multimodal_not_supported(
            "EPD encode: the model has no image processor the gateway runs (preprocessor_config.json, Qwen-VL)"
        )
    # The media budget counts what the gateway holds for the request: its inline bytes (admission) and
    # the encoder input it makes of them (known from each image's header), 413 when they exceed what
    # one request may hold; the tensors' bytes are reserved where they are made (epd_encode.with_encode).
    media, inline, tensors = dp.media, 0, 0
    if media is not None:
        inline = inline_media_bytes(body) if body is not None else 0
        tensors = sum(encoder_input_bytes(item.width, item.height, processor) for item in items)
        if inline + tensors > media.request_limit:
            raise media_too_large(
                f"EPD encode: the images ({inline} bytes inline) make {tensors} bytes of encoder input, "
                f"more than the in-flight media budget of {media.request_limit} bytes"
            )
    policy = dp.encode_policy
    assert policy is not None
    assignments = assign_encoders(encoders, items, runtime, model, policy, exclude)
    # gw_worker_selection_total, one per item (as the reference counts encode assignments).
    telemetry.WORKER_SELECTION.labels(WorkerType.ENCODE.value, Transport.GRPC.value, model or "", policy.name).inc(
        len(assignments)
    )
    clients = tuple(dp.engines.client(a.encoder.handle.record) for a in assignments)
    return EncodePlan(
        assignments, clients, processor, pair.context_length, media if tensors else None, tensors, inline, model=model
    )


async def admit_pair(dp: DataPlane, pick: Callable[[], PdPair], refused: GatewayError) -> PdPair:
    """PD admission after :func:`pd_pair_for` (``pick``) refused a request with ``refused``: a
    refusal other than the overload shed is raised as it is; an overload shed waits up to
    --pd-admission-wait-secs for a pair that ``pick`` gives, else is raised (counted as a shed)."""
    if refused.code != ErrorCode.WORKER_OVERLOAD_SHED.value:
        raise refused
    wait = dp.config.pd_admission_wait_secs
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(ADMISSION_POLL_SECS, left))
        try:
            pair = pick()
        except GatewayError as error:
            if error.code != ErrorCode.WORKER_OVERLOAD_SHED.value:
                raise  # the fleet changed under the wait: answered as a first selection would be
            refused = error
            continue
        pd_metrics.PD_ADMISSION_WAITS.inc()
        return pair
    pd_metrics.PD_ADMISSION_SHEDS.inc()
    raise refused
