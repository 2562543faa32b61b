"""The gateway's image processor for EPD (inference.upstreams.epd_pixels): Qwen2-VL's smart resize,
patches in HF's Qwen2VLImageProcessor order, bfloat16 on the wire, the prompt's pads expanded, and the
header check's limits."""

from __future__ import annotations

import io
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from inference.errors import GatewayError
from inference.upstreams.epd_pixels import (
    MAX_CONFIG_BYTES, VisionProcessor, bfloat16_bytes, check_image, encoder_input_bytes, expand_placeholders,
    load_vision_processor, preprocess, smart_resize,
)  # fmt: skip
from standins.fixtures import FIXTURE_MODELS

QWEN2_VL = load_vision_processor(str(FIXTURE_MODELS / "qwen2-vl"))


def png(width: int, height: int) -> bytes:
    rng = np.random.default_rng(width * height)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def test_the_fixture_config_is_read() -> None:
    assert QWEN2_VL is not None
    assert (QWEN2_VL.patch_size, QWEN2_VL.merge_size, QWEN2_VL.temporal_patch_size) == (14, 2, 2)
    assert (QWEN2_VL.min_pixels, QWEN2_VL.max_pixels) == (3136, 12845056)


@pytest.mark.parametrize(
    ("height", "width", "resized"),
    [(200, 300, (196, 308)), (2000, 3000, (1988, 2996)), (10, 10, (56, 56)), (20, 100, (28, 112)),
     (8000, 8000, (3584, 3584))],
)  # fmt: skip
def test_smart_resize(height: int, width: int, resized: tuple[int, int]) -> None:
    assert QWEN2_VL is not None
    h, w = smart_resize(height, width, QWEN2_VL)
    assert (h, w) == resized and h % 28 == 0 and w % 28 == 0 and h * w <= QWEN2_VL.max_pixels


def test_smart_resize_refuses_an_aspect_ratio_above_200() -> None:
    with pytest.raises(ValueError):
        smart_resize(10, 2010, VisionProcessor())


def test_patches_are_in_hf_order_with_the_grid_and_token_count() -> None:
    assert QWEN2_VL is not None
    data = png(300, 200)
    item = preprocess(data, QWEN2_VL, "float32")
    assert item.values.shape == (14 * 22, 1176) and item.values.dtype == np.float32
    assert item.grid_thw == (1, 14, 22) and item.tokens == 14 * 22 // 4
    # HF's Qwen2VLImageProcessor: resize, rescale, normalize, the frame repeated over the temporal patch,
    # reshape (t, T, C, h/m, m, p, w/m, m, p) and transpose (0, 3, 6, 4, 7, 2, 1, 5, 8).
    image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((308, 196), Image.Resampling.BICUBIC), np.float32)
    image = (image / 255 - np.array(QWEN2_VL.image_mean, np.float32)) / np.array(QWEN2_VL.image_std, np.float32)
    frames = np.stack([image.transpose(2, 0, 1)] * 2)
    hf = frames.reshape(1, 2, 3, 7, 2, 14, 11, 2, 14).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(308, 1176)
    assert np.allclose(item.values, hf, atol=1e-5)
    # On the wire (the default): the same values as bfloat16.
    wire = preprocess(data, QWEN2_VL)
    assert wire.dtype == "bfloat16" and wire.values.shape == (308, 1176) and wire.payload() == bfloat16_bytes(hf)


def test_bfloat16_rounds_to_nearest_even() -> None:
    values = np.array([1.0, -2.5, 3.14159, 65504.0, 1.00390625], dtype=np.float32)
    assert np.frombuffer(bfloat16_bytes(values), "<u2").tolist() == [0x3F80, 0xC020, 0x4049, 0x4780, 0x3F80]


def test_each_pad_is_expanded_to_its_image_tokens() -> None:
    ids, ranges = expand_placeholders((1, 9, 2, 9, 3), 9, [3, 2])
    assert ids == (1, 9, 9, 9, 2, 9, 9, 3) and ranges == [(1, 3), (5, 2)]
    with pytest.raises(GatewayError) as refused:
        expand_placeholders((1, 9, 2), 9, [3, 2])
    assert refused.value.status == 400 and refused.value.code == "multimodal_not_supported"


def test_the_header_check_reads_the_size_and_refuses_what_is_too_large_or_not_an_image() -> None:
    assert check_image(png(64, 48), 64 * 48, "image") == 64 * 48
    with pytest.raises(GatewayError) as large:
        check_image(png(64, 48), 64 * 47, "image")
    assert large.value.status == 413 and large.value.code == "multimodal_payload_too_large"
    with pytest.raises(GatewayError) as garbage:
        check_image(b"GIF89a-not-really", 0, "image")
    assert garbage.value.status == 400 and garbage.value.code == "multimodal_not_supported"


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature, IHDR and a tiny IDAT: its size reads, its pixels are not there."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16))


def test_the_pixel_limit_is_the_flag_not_pillows_warning_and_pillows_hard_bound_is_413() -> None:
    assert check_image(png_header(9500, 9500), 0, "image") == 9500 * 9500  # over Pillow's warning: no limit set
    with pytest.raises(GatewayError) as limited:
        check_image(png_header(9500, 9500), 8192 * 8192, "image")
    assert limited.value.status == 413 and "9500x9500" in limited.value.message
    with pytest.raises(GatewayError) as bomb:
        check_image(png_header(20000, 20000), 0, "image")  # over Pillow's own hard bound
    assert bomb.value.status == 413 and bomb.value.code == "multimodal_payload_too_large"


def test_the_image_pad_token_is_config_jsons_else_the_tokenizers(tmp_path: Path) -> None:
    qwen3 = FIXTURE_MODELS / "qwen3"
    for name, source in (("tokenizer.json", qwen3), ("preprocessor_config.json", FIXTURE_MODELS / "qwen2-vl")):
        (tmp_path / name).symlink_to(source / name)
    processor = load_vision_processor(str(tmp_path))
    assert processor is not None and processor.image_token_id == 151655  # <|image_pad|>, an added token
    (tmp_path / "config.json").write_text(json.dumps({"image_token_id": 151656}))
    load_vision_processor.cache_clear()
    processor = load_vision_processor(str(tmp_path / "tokenizer.json"))  # a tokenizer file: its folder is the model's
    assert processor is not None and processor.image_token_id == 151656
    assert load_vision_processor(str(qwen3)) is None  # no preprocessor_config.json: no image processor


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        ("qwen2_vl", (14, 2, 2, 56 * 56, 28 * 28 * 1280, (0.48145466, 0.4578275, 0.40821073))),
        ("qwen2_5_vl", (14, 2, 2, 56 * 56, 28 * 28 * 1280, (0.48145466, 0.4578275, 0.40821073))),
        ("qwen3_vl", (16, 2, 2, 65536, 16777216, (0.5, 0.5, 0.5))),
        ("qwen3_vl_moe", (16, 2, 2, 65536, 16777216, (0.5, 0.5, 0.5))),
        ("llava", None),
        (None, None),
    ],
)
def test_without_preprocessor_config_a_qwen_vl_family_gets_its_default_processor(
    tmp_path: Path, model_type: str | None, expected: tuple[Any, ...] | None
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "image_token_id": 151655}))
    processor = load_vision_processor(str(tmp_path))
    if expected is None:
        assert processor is None  # a family the gateway does not preprocess: EPD answers 400
        return
    assert processor is not None
    assert (processor.patch_size, processor.merge_size, processor.temporal_patch_size, processor.min_pixels,
            processor.max_pixels, processor.image_mean) == expected  # fmt: skip
    assert processor.image_token_id == 151655


def test_a_config_file_over_the_read_bound_is_not_read(tmp_path: Path) -> None:
    """The model's config files are read on the event loop, once per directory: at most MAX_CONFIG_BYTES
    each (a fetched model's files are whatever its hub repository or worker sent)."""
    config = json.loads((FIXTURE_MODELS / "qwen2-vl" / "preprocessor_config.json").read_text())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config) + " " * MAX_CONFIG_BYTES)
    assert load_vision_processor(str(tmp_path)) is None
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    (tmp_path / "config.json").write_text(json.dumps({"image_token_id": 7, "pad": "x" * MAX_CONFIG_BYTES}))
    load_vision_processor.cache_clear()
    processor = load_vision_processor(str(tmp_path))
    assert processor is not None and processor.image_token_id is None  # config.json too large, no tokenizer.json


@pytest.mark.parametrize(("width", "height"), [(64, 48), (300, 200), (20, 100), (3000, 2000)])
def test_the_encoder_inputs_size_is_known_from_the_header(width: int, height: int) -> None:
    """What the media budget reserves for an image (D91) is what preprocess makes of it."""
    assert QWEN2_VL is not None
    made = preprocess(png(width, height), QWEN2_VL)
    assert encoder_input_bytes(width, height, QWEN2_VL) == len(made.payload())
    assert encoder_input_bytes(10, 3000, QWEN2_VL) == 0  # over 200:1, refused by preprocess: its request fails there
