"""Encode/prefill/decode disaggregation (gRPC EPD) on the routing side: the images of a request that
encode workers turn into embeddings, and the encode worker each image goes to.

An EPD deployment is a PD deployment with encode workers (worker_type encode) beside its prefill and
decode workers. The gateway runs the encode stage for TokenSpeed engines over gRPC, as the reference
gateway does (its only EPD encode path): each image of the request is one item, sent to an encode
worker picked for it, which hands the item's embedding to the prefill engine at the room the gateway
names (:mod:`inference.upstreams.epd_encode`). A text-only request skips the encoders.

The encode worker of an item is chosen by the gateway's encode policy (its own instance of
``--policy``) among the usable encode workers of the pair's runtime, with the item's content hash as
the routing key (so ``consistent_hash`` sends the same image to the same encoder, whose cache may hold
it, as the reference's default encode policy does). None usable: 503 no_healthy_workers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from inference import errors
from inference.routing.breaker import BreakerState
from inference.routing.pd import PdMember
from inference.routing.policies.base import SelectionPolicy, SelectionRequest
from inference.upstreams.epd_pixels import image_size

__all__ = ["EPD_RUNTIMES", "EncodeAssignment", "MediaItem", "assign_encoders", "request_images"]

EPD_RUNTIMES = frozenset({"tokenspeed"})  # runtimes whose prefill the gateway pairs with encode workers

_MEDIA_PARTS = ("video_url", "audio_url", "input_audio")


@dataclass(frozen=True, slots=True)
class MediaItem:
    """One image of a request, as the client sent it: its bytes, their media type, and their SHA-256."""

    data: bytes
    media_type: str
    content_hash: bytes
    pixels: int = 0  # width x height from its header (request_images with a pixel limit)
    width: int = 0
    height: int = 0


@dataclass(frozen=True, slots=True)
class EncodeAssignment:
    """Item ``item_index`` of the request (its order among the request's images) and its encoder."""

    item_index: int
    item: MediaItem
    encoder: PdMember


def _unsupported(message: str) -> errors.GatewayError:
    return errors.multimodal_not_supported(f"EPD encode: {message}")


def _item(data: str, media_type: str, where: str, max_image_pixels: int | None) -> MediaItem:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _unsupported(f"{where} is not valid base64") from None
    if not raw:
        raise _unsupported(f"{where} is empty")
    width, height = (0, 0) if max_image_pixels is None else image_size(raw, max_image_pixels, where)
    return MediaItem(raw, media_type, hashlib.sha256(raw).digest(), width * height, width, height)


def _data_url(url: Any, where: str, max_image_pixels: int | None) -> MediaItem:
    if not isinstance(url, str) or not url.startswith("data:"):
        raise _unsupported(f"{where}: only inline images (base64 data URLs) are sent to encode workers")
    head, comma, data = url[5:].partition(",")
    if not comma or not head.endswith(";base64"):
        raise _unsupported(f"{where} is not a base64 data URL")
    return _item(data, head[: -len(";base64")] or "application/octet-stream", where, max_image_pixels)


def _chat_part(part: Any, where: str, max_image_pixels: int | None) -> MediaItem | None:
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        return _data_url(image.get("url") if isinstance(image, Mapping) else image, where, max_image_pixels)
    if kind == "image":  # a Messages image block
        source = part.get("source")
        if isinstance(source, Mapping) and source.get("type") == "base64":
            return _item(str(source.get("data") or ""), str(source.get("media_type") or ""), where, max_image_pixels)
        raise _unsupported(f"{where}: only inline images (base64 sources) are sent to encode workers")
    if kind in _MEDIA_PARTS:
        raise _unsupported(f"{where}: {kind} parts are not encoded (images only)")
    return None


def request_images(body: Mapping[str, Any] | None, max_image_pixels: int | None = None) -> tuple[MediaItem, ...]:
    """The images of a chat or Messages request, in prompt order (empty: text only). Raises 400
    multimodal_not_supported for media an encode worker is not sent: a remote image URL, a video or
    audio part, an image that is not valid base64. With ``max_image_pixels`` (0: no limit) each
    image's header is read too: 400 multimodal_not_supported for bytes that are not an image, 413
    multimodal_payload_too_large for one above the limit (:func:`check_image`)."""
    if not body:
        return ()
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ()
    items: list[MediaItem] = []
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            item = _chat_part(part, f"messages[{m}].content[{p}]", max_image_pixels)
            if item is not None:
                items.append(item)
    return tuple(items)


def _usable(encoders: Sequence[PdMember], runtime: str, exclude: frozenset[str]) -> list[PdMember]:
    now = time.monotonic()
    return [
        member
        for member in encoders
        if member.handle.record.runtime_type == runtime
        and member.handle.id not in exclude
        and (member.handle.load.breaker.state is BreakerState.CLOSED or member.handle.load.breaker.allows(now))
    ]


def assign_encoders(
    encoders: Sequence[PdMember],
    items: Sequence[MediaItem],
    runtime: str,
    model: str | None,
    policy: SelectionPolicy,
    exclude: frozenset[str] = frozenset(),
) -> tuple[EncodeAssignment, ...]:
    """An encode worker per item, chosen by ``policy`` among ``encoders`` of ``runtime`` not in
    ``exclude`` whose breaker lets traffic through. Raises 503 no_healthy_workers when none is."""
    usable = _usable(encoders, runtime, exclude)
    if not usable:
        raise errors.no_encode_servers(model)
    by_id = {member.handle.id: member for member in usable}
    handles = [member.handle for member in usable]
    assignments = []
    for index, item in enumerate(items):
        key = item.content_hash.hex()
        request = SelectionRequest(model or "", key, key if policy.needs_text else None)
        assignments.append(EncodeAssignment(index, item, by_id[policy.select(handles, request).id]))
    return tuple(assignments)
