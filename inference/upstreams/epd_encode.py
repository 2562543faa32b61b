"""The encode stage of encode/prefill/decode disaggregation (gRPC EPD, TokenSpeed engines).

For a request with images on a TokenSpeed prefill/decode pair with encode workers, the routing side
assigned each image an encode worker (:mod:`inference.routing.epd`; the plan is kept for the rest of
the request by :func:`choose_encode`). Each generation then (:func:`with_encode`):

- mints one room per item (random in [0, 2^63 - 1), as the reference does: rooms are not
  deduplicated in flight, so a 31-bit space would collide under load);
- first turns each image into its model's encoder input (:mod:`inference.upstreams.epd_pixels`: the
  Qwen-VL processor of the model's ``preprocessor_config.json``; a large image off the event loop) and
  expands the prompt's image pad token of each image to the item's token count;
- sends each item to its encode worker, ``TokenSpeedEncoder.Encode``: a fresh ``request_id``
  (``encode-<uuid>``), ``mm_inputs`` with the one item (modality IMAGE, its SHA-256 as
  ``content_hash``, the patches as a ``bfloat16`` tensor [patches, 3 * T * p * p] in ``encoder_input``,
  ``image_grid_thw``, its placeholder range and token) and ``items`` with its room; the worker answers
  ``accepted`` and hands the embedding to the room;
- at the same time runs the prefill/decode generation on the expanded prompt, the prefill leg carrying
  ``encode_bootstrap_info`` (per item its index, the encode worker's bootstrap host (its URL's host)
  and bootstrap port (8998 when unset) and the room, where the prefill engine receives the embedding)
  and ``mm_inputs`` without pixels (each item's hash, grid and placeholder range); the decode leg gets
  neither.

An encode that fails (the RPC fails, or the worker does not accept) ends the generation at once: the
prefill/decode leg still running is cancelled (both engines get Abort), the failure counts on the
encode worker's breaker, not on the pair's, and is raised as a :class:`PdFailure` naming the encode
worker (the attempts loop excludes it from a retry). The reference sends the encode jobs in the
background and leaves the prefill to time out waiting for the embedding; here the failure is seen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc

from common.mm_metrics import record_mm_processing
from inference import errors
from inference.admission.media import MediaBudget
from inference.pipeline.prompt import check_prompt
from inference.routing.epd import EncodeAssignment
from inference.routing.pd import GRPC_DEFAULT_BOOTSTRAP_PORT
from inference.upstreams.engine import EncodeBootstrap, EngineClient, EngineOutput, EngineRequest, MultimodalSlot
from inference.upstreams.epd_pixels import OFF_LOOP_PIXELS, PixelItem, VisionProcessor
from inference.upstreams.epd_pixels import expand_placeholders, preprocess
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.grpc.channel import failure_from_rpc_error
from inference.upstreams.grpc.client import GrpcEngineClient
from inference.upstreams.grpc.tokenspeed import multimodal_item
from inference.upstreams.pd_http import PdFailure
from protos import tokenspeed_encoder_pb2, tokenspeed_encoder_pb2_grpc, tokenspeed_scheduler_pb2

__all__ = ["MAX_ENCODE_ROOM", "EncodePlan", "choose_encode", "encode_item", "encode_plan", "with_encode"]

MAX_ENCODE_ROOM = 2**63 - 2  # the room is an int64, drawn in [0, i64::MAX)
_random = random.SystemRandom()


@dataclass(frozen=True, slots=True)
class EncodePlan:
    """The request's encode assignments, each one's encode worker's engine client, the model's
    image processor, and the pair's context window (the smaller of the two; None: unknown)."""

    assignments: tuple[EncodeAssignment, ...]
    clients: tuple[EngineClient, ...]
    processor: VisionProcessor
    context_length: int | None = None
    # The in-flight media budget and what this request reserves from it for its images' encoder input
    # (``tensor_bytes``, on top of the ``inline_bytes`` it was admitted with), while the tensors are held.
    media: MediaBudget | None = None
    tensor_bytes: int = 0
    inline_bytes: int = 0
    model: str | None = None  # the request's model (gw_mm_processing_total)


# The encode plan of each prefill worker the current request paired (None: no encode stage), set as
# the pair is picked, read where the pair's generation starts (PdEngineClient.generate).
_PLANS: ContextVar[dict[str, EncodePlan | None] | None] = ContextVar("epd_plans", default=None)


def choose_encode(prefill_id: str, plan: EncodePlan | None) -> None:
    """Remember, for the rest of the current request, the encode plan of its pair with prefill worker
    ``prefill_id`` (None: that pair runs without an encode stage)."""
    plans = _PLANS.get()
    if plans is None:
        if plan is None:
            return
        plans = {}
        _PLANS.set(plans)
    plans[prefill_id] = plan


def encode_plan(prefill_id: str) -> EncodePlan | None:
    """The current request's encode plan for its pair with prefill worker ``prefill_id``, if any."""
    plans = _PLANS.get()
    return None if plans is None else plans.get(prefill_id)


def encode_item(pixels: PixelItem, slot: MultimodalSlot, room: int) -> tokenspeed_encoder_pb2.EncodeRequest:
    """The Encode request of one item (its pixels and place in the prompt) for its room."""
    tensor = tokenspeed_scheduler_pb2.TensorData(shape=list(pixels.values.shape), dtype=pixels.dtype, inline=pixels.payload())
    return tokenspeed_encoder_pb2.EncodeRequest(
        request_id=f"encode-{uuid.uuid4().hex}",
        mm_inputs=tokenspeed_scheduler_pb2.MultimodalInputs(items=[multimodal_item(slot, tensor)]),
        items=[tokenspeed_encoder_pb2.EncodeItemAssignment(bootstrap_room=room)],
    )


async def _pixels(plan: EncodePlan) -> list[PixelItem]:
    """Each image's encoder input; the large ones (or those whose size is unknown) in worker threads,
    side by side. Raises 400 multimodal_not_supported for an image that does not decode."""

    async def one(assignment: EncodeAssignment) -> PixelItem:
        item = assignment.item
        try:
            if 0 < item.pixels <= OFF_LOOP_PIXELS:
                return preprocess(item.data, plan.processor)
            return await asyncio.to_thread(preprocess, item.data, plan.processor)
        except (OSError, ValueError, SyntaxError) as error:
            raise errors.multimodal_not_supported(f"EPD encode: image {assignment.item_index}: {error}") from None

    if len(plan.assignments) == 1:
        return [await one(plan.assignments[0])]
    return list(await asyncio.gather(*(one(assignment) for assignment in plan.assignments)))


async def _encode(assignment: EncodeAssignment, client: EngineClient, request: tokenspeed_encoder_pb2.EncodeRequest) -> None:
    """One item on its encode worker, counted in the worker's in-flight load and on its breaker."""
    worker = assignment.encoder.handle
    load = worker.load
    load.in_flight += 1
    try:
        if not isinstance(client, GrpcEngineClient):
            raise UpstreamFailure(FailureKind.BROKEN, "worker is not served over gRPC")
        stub = tokenspeed_encoder_pb2_grpc.TokenSpeedEncoderStub(client.channel.get())
        try:
            answer = await stub.Encode(request, metadata=client.metadata)
        except grpc.aio.AioRpcError as error:
            raise failure_from_rpc_error(error, "worker") from None
        if not answer.accepted:
            raise UpstreamFailure(FailureKind.BROKEN, "worker did not accept the request")
    except UpstreamFailure as failure:  # "encode worker ...: INTERNAL: ..." (PdFailure names the side)
        load.breaker.record(not failure.rejected)
        raise PdFailure("encode", worker.id, failure) from None
    finally:
        load.in_flight -= 1
    load.breaker.record(False)


async def _encode_all(plan: EncodePlan, requests: list[tokenspeed_encoder_pb2.EncodeRequest]) -> None:
    """Every item at once; the first failure cancels the others and is raised."""
    tasks = [
        asyncio.ensure_future(_encode(assignment, client, request))
        for assignment, client, request in zip(plan.assignments, plan.clients, requests)
    ]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - the stopped side's own ending is of no interest
        pass


async def with_encode(
    plan: EncodePlan, request: EngineRequest, generate: Callable[[EngineRequest], AsyncIterator[EngineOutput]]
) -> AsyncIterator[EngineOutput]:
    """The outputs of ``generate`` (the prefill/decode leg, given ``request`` with its image pads
    expanded, each item's place in the prompt and embedding rendezvous), run while the items are
    encoded; an encode failure cancels the leg and is raised. Raises 400 multimodal_not_supported
    before any engine is asked for an image that does not decode or a prompt without one image pad
    token per image, 400 context_length_exceeded when the expanded prompt fills the pair's window;
    429 multimodal_inflight_budget when the media budget cannot take the encoder input within its wait."""
    budget, reserved = plan.media, plan.tensor_bytes
    if budget is not None and reserved:
        await budget.reserve(reserved, held=plan.inline_bytes)  # before any pixel is made
    try:
        pixels = await _pixels(plan)
        record_mm_processing(plan.model, "router", "epd", len(pixels))
        pad = plan.processor.image_token_id
        if pad is None:
            raise errors.multimodal_not_supported("EPD encode: the model has no image pad token (config.json image_token_id)")
        input_ids, ranges = expand_placeholders(request.input_ids, pad, [item.tokens for item in pixels])
        check_prompt(len(input_ids), plan.context_length, "messages")  # the window counts the expanded pads
        slots = tuple(
            MultimodalSlot(assignment.item.content_hash, item.grid_thw, offset, length, pad)
            for assignment, item, (offset, length) in zip(plan.assignments, pixels, ranges)
        )
        rooms = [_random.randint(0, MAX_ENCODE_ROOM) for _ in plan.assignments]
        encodes = [encode_item(item, slot, room) for item, slot, room in zip(pixels, slots, rooms)]
        del pixels
        bootstrap = tuple(
            EncodeBootstrap(
                item_index=assignment.item_index,
                bootstrap_host=assignment.encoder.host,
                bootstrap_port=assignment.encoder.traits.bootstrap_port or GRPC_DEFAULT_BOOTSTRAP_PORT,
                bootstrap_room=room,
            )
            for assignment, room in zip(plan.assignments, rooms)
        )
        encoding = asyncio.ensure_future(_encode_all(plan, encodes))
    except BaseException:
        if budget is not None and reserved:
            budget.release(reserved)
        raise
    # The tensors are held by the encoding alone (not by this generator for the rest of the answer);
    # their bytes go back to the budget when it ends, whichever way.
    del encodes
    if budget is not None and reserved:
        encoding.add_done_callback(lambda _: budget.release(reserved))
    outputs = generate(dataclasses.replace(request, input_ids=input_ids, encode_bootstrap=bootstrap, multimodal=slots))
    step: asyncio.Future[EngineOutput] | None = None
    try:
        # Until every item is encoded, each output is awaited beside the encoding: an encode failure
        # must not wait for an output that, its embedding missing, may never come.
        while not encoding.done():
            if step is None:
                step = asyncio.ensure_future(anext(outputs))
            racing: set[asyncio.Future[Any]] = {step, encoding}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if encoding.done() and not encoding.cancelled():
                failure = encoding.exception()
                if failure is not None:
                    raise failure
            if step.done():
                done, step = step, None
                try:
                    output = done.result()
                except StopAsyncIteration:
                    return
                yield output
        if step is not None:
            pending, step = step, None
            try:
                output = await pending
            except StopAsyncIteration:
                return
            yield output
        async for output in outputs:
            yield output
    finally:
        if step is not None and not step.done():
            await _stop(step)
        if not encoding.done():
            await _stop(encoding)
        await outputs.aclose()  # type: ignore[attr-defined]  # an async generator
