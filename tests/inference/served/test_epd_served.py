"""gRPC EPD through the gateway: a TokenSpeed prefill/decode pair of stand-ins with a TokenSpeed encode
worker stand-in (standins.grpc_encoder), read with the openai SDK in strict mode, on a vision model
directory (the qwen3 tokenizer with Qwen2-VL's preprocessor_config.json). An image request is
preprocessed by the gateway (each image's patches, grid and pad tokens expanded in the prompt) and
encoded (one Encode per image, checked by the encoder) while the pair runs, the prefill receiving each
item's embedding at the room the gateway named; a text request skips the encoder; an encoder failure
ends the request at once, counted on the encoder, both sides of the pair aborted; with the encoder's
breaker open an image request gets 503 and a text request still runs."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from common.telemetry import REGISTRY as METRICS
from inference.dataplane import data_plane
from inference.pipeline import tokenizer_sources
from inference.pipeline.parsers import choose_parsers
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.breaker import BreakerState
from inference.routing.registry import REGISTRY
from inference.routing.workers import EngineSpec, PdTraits, WorkerLoad, WorkerRecord, WorkerStatus, WorkerType
from inference.upstreams.epd_pixels import load_vision_processor
from standins.fixtures import FIXTURE_MODELS
from standins.grpc_encoder import GrpcEncoderServer, GrpcTokenSpeedPdServer
from standins.grpc_engine import GrpcEngineConfig
from standins.model_hub import ModelHub
from standins.pd_worker import PdWorkerConfig
from tests.conftest import GatewayFactory, until
from tests.inference.served.conftest import QWEN, QWEN_MODEL

# A vision model's template (Qwen-VL style: an image part is its placeholder), over the Qwen3 tokenizer.
VISION_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}"
    "{% if part.type == 'text' %}{{ part.text }}{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_PAD = 151655  # <|image_pad|> in the qwen3 tokenizer (Qwen2-VL's image_token_id)


def picture(width: int, height: int, kind: str) -> bytes:
    """A small real image (a colour gradient) encoded as ``kind`` (PNG, JPEG)."""
    image = Image.new("RGB", (width, height))
    image.putdata([(x * 255 // width, y * 255 // height, 128) for y in range(height) for x in range(width)])
    out = io.BytesIO()
    image.save(out, kind)
    return out.getvalue()


# Qwen2-VL's smart resize (multiples of 28): 64x48 -> 56x56, grid (1, 4, 4), 4 tokens;
# 300x200 -> 308x196, grid (1, 14, 22), 77 tokens; patches of 3 * 2 * 14 * 14 = 1176 values.
PNG = picture(64, 48, "PNG")
JPEG = picture(300, 200, "JPEG")


def vision_model(directory: Path) -> str:
    """A vision model's directory: the qwen3 fixture's tokenizer and Qwen2-VL's preprocessor_config.json."""
    model = directory / "qwen2-vl"
    model.mkdir(exist_ok=True)
    for name, source in (("tokenizer.json", Path(QWEN)), ("tokenizer_config.json", Path(QWEN)),
                         ("preprocessor_config.json", FIXTURE_MODELS / "qwen2-vl")):  # fmt: skip
        if not (model / name).exists():
            (model / name).symlink_to(source / name)
    return str(model)


def data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


def record(
    url: str, kind: WorkerType, bootstrap_port: int | None, template: str, model: str | None = QWEN,
    context_length: int | None = None,
) -> WorkerRecord:
    family = choose_parsers(QWEN_MODEL)
    return WorkerRecord(
        id=str(uuid.uuid4()), url=url, model_id=QWEN_MODEL, runtime_type="tokenspeed", status=WorkerStatus.READY,
        worker_type=kind, engine=EngineSpec(
            tokenizer=model, chat_template=template, tool_parser=family.tool_parser,
            reasoning_parser=family.reasoning_parser, context_length=context_length,
        ),
        pd=PdTraits(bootstrap_port=bootstrap_port),
    )


@dataclass
class Epd:
    http: httpx.AsyncClient
    encoder: GrpcEncoderServer
    prefill: GrpcTokenSpeedPdServer
    decode: GrpcTokenSpeedPdServer

    def sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="x", http_client=self.http,
                                  _strict_response_validation=True, max_retries=0)  # fmt: skip

    def load(self, kind: WorkerType) -> WorkerLoad:
        return next(h.load for h in REGISTRY.snapshot.workers if h.record.worker_type == kind)


@contextlib.asynccontextmanager
async def epd(
    make_gateway: GatewayFactory, tmp_path: Path, context_length: int | None = None, source: str = "local",
    **config: Any,
) -> AsyncIterator[Epd]:
    """The fleet on the vision model, its tokenizer (and so its image processor) from ``source``: the
    local directory, ``"worker"`` (none named: the decode worker's GetTokenizer, the registry's
    autoload) or a model-hub id (the workers name it)."""
    template = tmp_path / "vision.jinja"
    template.write_text(VISION_TEMPLATE)
    model = vision_model(tmp_path)
    named = model if source == "local" else None if source == "worker" else source
    engine = GrpcEngineConfig(runtime="tokenspeed", tokenizer=model, model=QWEN_MODEL)
    encoder = GrpcEncoderServer(engine)
    prefill = GrpcTokenSpeedPdServer(engine, PdWorkerConfig("prefill", kv_timeout_s=20))
    decode = GrpcTokenSpeedPdServer(engine, PdWorkerConfig("decode"))
    for server in (encoder, prefill, decode):
        await server.start()
    try:
        records = [
            record(encoder.url, WorkerType.ENCODE, encoder.bootstrap_port, str(template), named),
            record(prefill.url, WorkerType.PREFILL, prefill.bootstrap_port, str(template), named, context_length),
            record(decode.url, WorkerType.DECODE, None, str(template), named, context_length),
        ]
        await TOKENIZERS.cache.aget(named or decode.url, str(template))
        http = make_gateway(records, history_backend="memory", retry_max_retries=0, **config)
        yield Epd(http, encoder, prefill, decode)
    finally:
        for server in (encoder, prefill, decode):
            await server.stop()


def image_chat(*images: bytes, text: str = "What is in these?") -> list[Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": data_url(raw)}} for raw in images]
    return [{"role": "user", "content": parts}]


async def test_an_image_request_is_encoded_then_served_by_the_pair_and_text_skips_the_encoder(
    make_gateway: GatewayFactory, tmp_path: Path,
) -> None:
    async with epd(make_gateway, tmp_path) as fleet:
        selections = {"worker_type": "encode", "connection_mode": "grpc", "model": QWEN_MODEL, "policy": "round_robin"}
        selected = METRICS.get_sample_value("gw_worker_selection_total", selections) or 0.0
        answer = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG, JPEG))
        assert answer.choices[0].message.content
        encoder, prefill = fleet.encoder, fleet.prefill
        # One Encode per image (sent at once, so in any order), each the image's patches as bfloat16
        # [t*h*w, 3*2*14*14] with its grid, its placeholder range and token, and the hash of the bytes sent.
        room_of = {r["hashes"][0]: r["rooms"][0] for r in encoder.received}
        by_hash = {r["hashes"][0]: r for r in encoder.received}
        png, jpeg = by_hash[hashlib.sha256(PNG).digest()], by_hash[hashlib.sha256(JPEG).digest()]
        assert (png["grids"], png["shapes"], png["dtypes"], png["sizes"]) == ([(1, 4, 4)], [[16, 1176]], ["bfloat16"], [16 * 1176 * 2])
        assert (jpeg["grids"], jpeg["shapes"], jpeg["dtypes"]) == ([(1, 14, 22)], [[308, 1176]], ["bfloat16"])
        assert encoder.invalid == 0
        # The prompt: each image's one <|image_pad|> expanded to t*h*w/2^2 pads (4 and 77), on both sides of
        # the pair; the prefill told each item's range and grid (no pixels: its embedding comes from the encoder).
        mm = prefill.service.mm_received[-1]
        assert [(m["grid"], m["placeholders"][0][1], m["placeholder_token_id"], m["pixels"]) for m in mm] == [
            ((1, 4, 4), 4, IMAGE_PAD, False), ((1, 14, 22), 77, IMAGE_PAD, False)
        ]
        assert [png["placeholders"][0], jpeg["placeholders"][0]] == [m["placeholders"] for m in mm]
        prefill_ids, decode_ids = (side.engine.state.requests[-1].input_ids for side in (prefill, fleet.decode))
        assert prefill_ids == decode_ids and prefill_ids.count(IMAGE_PAD) == 4 + 77
        assert all(r["request_id"].startswith("encode-") and len(r["hashes"]) == 1 for r in encoder.received)
        # The prefill got each item's rendezvous at the encoder, in prompt order (the decode got none: it would refuse it).
        assert prefill.service.encode_received[-1] == [
            {"item_index": i, "bootstrap_host": "127.0.0.1", "bootstrap_port": encoder.bootstrap_port,
             "bootstrap_room": room_of[hashlib.sha256(raw).digest()]}
            for i, raw in enumerate((PNG, JPEG))
        ]  # fmt: skip
        assert prefill.pd.received[-1] == fleet.decode.pd.received[-1]  # the PD rendezvous as before
        assert fleet.load(WorkerType.ENCODE).breaker.failures == 0 and fleet.load(WorkerType.ENCODE).in_flight == 0

        # Messages: an image block is encoded the same way.
        reply = await fleet.http.post("/v1/messages", json={
            "model": QWEN_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()}},
                {"type": "text", "text": "Describe it"},
            ]}],
        })  # fmt: skip
        assert reply.status_code == 200, reply.text
        assert len(encoder.received) == 3 and encoder.received[-1]["hashes"] == [hashlib.sha256(PNG).digest()]
        assert METRICS.get_sample_value("gw_worker_selection_total", selections) == selected + 3  # one per image

        # Streamed: the same encode stage before the pair's first output.
        streamed = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(JPEG), stream=True)
        assert [c async for c in streamed][-1].choices[0].finish_reason is not None
        assert len(encoder.received) == 4 and len(prefill.service.encode_received) == 3

        # Text only: no encode, no embedding rendezvous.
        stream = await fleet.sdk().chat.completions.create(
            model=QWEN_MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        assert [c async for c in stream][-1].choices[0].finish_reason is not None
        assert len(encoder.received) == 4 and len(prefill.service.encode_received) == 3

        # A remote image URL is not sent to an encoder: 400 before anything is dispatched.
        with pytest.raises(openai.BadRequestError) as refused:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])  # fmt: skip
        assert refused.value.code == "multimodal_not_supported" and len(prefill.pd.received) == 4


async def test_an_encoder_failure_ends_the_request_and_aborts_the_pair_then_its_open_breaker_gives_503(
    make_gateway: GatewayFactory, tmp_path: Path,
) -> None:
    async with epd(make_gateway, tmp_path, cb_failure_threshold=1) as fleet:
        fleet.encoder.faults.add("fail")
        with pytest.raises(openai.APIStatusError) as caught:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG))
        assert caught.value.status_code == 502

        async def pair_aborted() -> bool:
            return fleet.prefill.pd.cancelled == 1 and fleet.decode.pd.cancelled == 1

        await until(pair_aborted)  # the prefill was waiting for the embedding, the decode for the KV
        assert caught.value.message.endswith("encode worker: INTERNAL: encode failed on command")
        assert fleet.load(WorkerType.ENCODE).breaker.state is BreakerState.OPEN  # blamed on the encoder, not the pair
        assert fleet.load(WorkerType.PREFILL).breaker.failures == fleet.load(WorkerType.DECODE).breaker.failures == 0
        assert all(fleet.load(kind).in_flight == 0 for kind in (WorkerType.ENCODE, WorkerType.PREFILL, WorkerType.DECODE))

        # The encoder's breaker is open (threshold 1): no encoder for an image, a text request still runs.
        with pytest.raises(openai.APIStatusError) as unavailable:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG))
        assert unavailable.value.status_code == 503 and unavailable.value.code == "no_healthy_workers"
        assert len(fleet.encoder.received) == 1
        answer = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=[{"role": "user", "content": "Hi"}])
        assert answer.choices[0].message.content


async def test_an_encoder_that_does_not_accept_fails_the_request(make_gateway: GatewayFactory, tmp_path: Path) -> None:
    async with epd(make_gateway, tmp_path) as fleet:
        fleet.encoder.faults.add("refuse")
        answer = await fleet.http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": image_chat(PNG)})
        assert answer.status_code == 502 and "did not accept" in answer.json()["error"]["message"]
        assert fleet.load(WorkerType.ENCODE).breaker.failures == 1


async def test_an_image_over_the_pixel_limit_or_not_an_image_is_refused_before_any_worker_is_asked(
    make_gateway: GatewayFactory, tmp_path: Path,
) -> None:
    async with epd(make_gateway, tmp_path, multimodal_max_image_pixels=64 * 64) as fleet:
        # 300x200 is over --multimodal-max-image-pixels 4096 (read from the header, not decoded): 413.
        with pytest.raises(openai.APIStatusError) as large:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG, JPEG))
        assert large.value.status_code == 413 and large.value.code == "multimodal_payload_too_large"
        assert "300x200" in large.value.message and "--multimodal-max-image-pixels" in large.value.message
        # Bytes that are not an image: 400 multimodal_not_supported.
        with pytest.raises(openai.BadRequestError) as garbage:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(b"\x89PNG\r\n\x1a\nnot really"))
        assert garbage.value.code == "multimodal_not_supported"
        # A header that reads but pixels that do not decode: 400 too (found by the decode, before any engine is asked).
        with pytest.raises(openai.BadRequestError) as truncated:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG[: len(PNG) // 2]))
        assert truncated.value.code == "multimodal_not_supported"
        assert fleet.encoder.received == [] and not fleet.prefill.pd.received and not fleet.decode.pd.received
        assert all(fleet.load(kind).breaker.failures == 0 and fleet.load(kind).in_flight == 0
                   for kind in (WorkerType.ENCODE, WorkerType.PREFILL, WorkerType.DECODE))  # fmt: skip
        # The image under the limit is served.
        answer = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG))
        assert answer.choices[0].message.content and len(fleet.encoder.received) == 1


async def test_a_model_without_an_image_processor_refuses_images(make_gateway: GatewayFactory, tmp_path: Path) -> None:
    async with epd(make_gateway, tmp_path) as fleet:
        (tmp_path / "qwen2-vl" / "preprocessor_config.json").unlink()
        load_vision_processor.cache_clear()
        with pytest.raises(openai.BadRequestError) as refused:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG))
        assert refused.value.code == "multimodal_not_supported" and "preprocessor_config.json" in refused.value.message
        assert fleet.encoder.received == [] and not fleet.prefill.pd.received


async def test_a_qwen_vl_model_without_preprocessor_config_uses_its_familys_defaults(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    """config.json names a Qwen-VL family and there is no preprocessor_config.json: the family's default
    processor (as smg falls back to its processor's defaults); another family still gets 400."""
    async with epd(make_gateway, tmp_path) as fleet:
        model = tmp_path / "qwen2-vl"
        (model / "preprocessor_config.json").unlink()
        (model / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
        load_vision_processor.cache_clear()
        answer = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG))
        assert answer.choices[0].message.content
        [sent] = fleet.encoder.received
        assert (sent["grids"], sent["shapes"], sent["dtypes"]) == ([(1, 4, 4)], [[16, 1176]], ["bfloat16"])
        assert fleet.encoder.invalid == 0
        (model / "config.json").write_text(json.dumps({"model_type": "llava"}))
        load_vision_processor.cache_clear()
        with pytest.raises(openai.BadRequestError) as refused:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG))
        assert refused.value.code == "multimodal_not_supported" and len(fleet.encoder.received) == 1


async def test_the_context_window_counts_the_expanded_image_pads(make_gateway: GatewayFactory, tmp_path: Path) -> None:
    async with epd(make_gateway, tmp_path, context_length=64) as fleet:
        # The 64x48 image's 4 pads fit the pair's 64-token window; the 300x200 one's 77 do not, though
        # its unexpanded prompt (one pad) does: 400 before any engine is asked.
        answer = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG))
        assert answer.choices[0].message.content
        with pytest.raises(openai.BadRequestError) as refused:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(JPEG))
        assert refused.value.code == "context_length_exceeded" and len(fleet.encoder.received) == 1
        assert len(fleet.prefill.pd.received) == 1 and fleet.load(WorkerType.PREFILL).breaker.failures == 0


@pytest.mark.parametrize("source", ["worker", "acme/qwen2-vl"])
async def test_a_model_whose_tokenizer_is_fetched_brings_its_image_processor(
    make_gateway: GatewayFactory, tmp_path: Path, source: str, settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model whose tokenizer comes from a gRPC worker (its GetTokenizer bundle) or the model hub (the
    stand-in hub, standins.model_hub) has no local directory: its preprocessor_config.json is fetched
    with the tokenizer, and EPD finds it where the tokenizer was loaded from (D91)."""
    settings.DATA_DIR = tmp_path / "data"
    hub = ModelHub(tmp_path / "repos", tmp_path / "hub")
    hub.install(monkeypatch, tokenizer_sources)
    model = Path(vision_model(tmp_path))
    files: dict[str, Path | bytes] = {"model.safetensors": b"weights"}
    files |= {name: (model / name).resolve() for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json")}
    hub.repository("acme/qwen2-vl", files)
    async with epd(make_gateway, tmp_path, source=source) as fleet:
        answer = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG, JPEG))
        assert answer.choices[0].message.content
        grids = sorted(r["grids"][0] for r in fleet.encoder.received)
        assert grids == [(1, 4, 4), (1, 14, 22)] and fleet.encoder.invalid == 0
        mm = fleet.prefill.service.mm_received[-1]
        assert [(m["placeholders"][0][1], m["placeholder_token_id"]) for m in mm] == [(4, IMAGE_PAD), (77, IMAGE_PAD)]
        loaded = TOKENIZERS.cache.peek(fleet.decode.url if source == "worker" else source, str(tmp_path / "vision.jinja"))
        assert loaded is not None and (Path(loaded.path) / "preprocessor_config.json").is_file()
        fetched_under = settings.DATA_DIR / "tokenizers" / "workers" if source == "worker" else tmp_path / "hub"
        assert Path(loaded.path).is_relative_to(fetched_under)
        if source != "worker":
            assert hub.downloads == [["preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"]]


async def test_the_media_budget_counts_the_encoder_input_the_gateway_makes(
    make_gateway: GatewayFactory, tmp_path: Path,
) -> None:
    """--multimodal-max-inflight-bytes counts what the gateway holds for an EPD request: the inline
    bytes and the encoder input it makes of them (D91). The 64x48 PNG's input is 16 x 1176 bfloat16
    values (37,632 bytes), the 300x200 JPEG's 308 x 1176 (724,416 bytes) though its file is a few KiB."""
    async with epd(make_gateway, tmp_path, multimodal_max_inflight_bytes=200_000) as fleet:
        media = data_plane().media
        assert media is not None
        answer = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG))
        assert answer.choices[0].message.content and len(fleet.encoder.received) == 1

        async def released() -> bool:
            return media.in_use == 0 and media.queued == 0

        await until(released)  # the tensors' bytes when their encode ended, the inline bytes with the request
        assert len(JPEG) < 200_000
        with pytest.raises(openai.APIStatusError) as large:
            await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(JPEG))
        assert large.value.status_code == 413 and large.value.code == "multimodal_payload_too_large"
        assert "724416 bytes of encoder input" in large.value.message
        assert len(fleet.encoder.received) == 1 and len(fleet.prefill.pd.received) == 1  # no worker asked
        await until(released)
