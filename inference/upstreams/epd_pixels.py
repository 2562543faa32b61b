"""The gateway's image processor for gRPC EPD (TokenSpeed encode workers), as the reference gateway's.

The reference gateway (smg) turns each image into its model's encoder input in the gateway, and so do
we, for the Qwen-VL family's processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: smg's ``QwenVLProcessorBase``,
HF's ``Qwen2VLImageProcessor``), read from the model directory's ``preprocessor_config.json`` (the
directory the model's tokenizer was loaded from: local, or fetched from the model hub or a worker with
its tokenizer):

- **decode** the image (Pillow) to RGB; its header is read first (:func:`check_image`, cheap, on the
  event loop at routing time) so an image over ``--multimodal-max-image-pixels`` is refused (413
  multimodal_payload_too_large) and one that is not an image (400 multimodal_not_supported) before any
  worker is asked; the full decode and the pixel work run off the event loop for a large image;
- **smart resize** to multiples of ``patch_size * merge_size`` within ``min_pixels``/``max_pixels``
  (bicubic, the config's ``resample``), aspect ratio kept, at most 200:1;
- **rescale** (``rescale_factor``, 1/255) and **normalize** with the config's ``image_mean``/``image_std``;
- **patchify** into ``grid_t * grid_h * grid_w`` flattened patches of ``3 * temporal_patch_size *
  patch_size^2`` values (the still image repeated over the temporal patch), merge blocks contiguous
  (HF's order), with ``image_grid_thw`` = (1, H / patch_size, W / patch_size);
- the item takes ``t * h * w / merge_size^2`` tokens: the prompt's one image pad token (``config.json``'s
  ``image_token_id``, else the tokenizer's ``<|image_pad|>``) per image is expanded to that many
  (:func:`expand_placeholders`), each item's placeholder range (offset, length) in the expanded ids.

The encoder input goes as ``bfloat16`` (the reference's default wire dtype), little-endian.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from inference import errors

if TYPE_CHECKING:
    import numpy as np
# numpy is imported by the functions that compute pixels (an image request to an EPD worker), not
# at this module's import, which every gateway start makes (issue 26 item 5).

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "DEFAULT_PROCESSOR_CONFIGS",
    "MAX_CONFIG_BYTES",
    "OFF_LOOP_PIXELS",
    "PixelItem",
    "VisionProcessor",
    "bfloat16_bits",
    "bfloat16_bytes",
    "check_image",
    "encoder_input_bytes",
    "image_size",
    "media_too_large",
    "expand_placeholders",
    "WIRE_DTYPE",
    "load_vision_processor",
    "preprocess",
    "smart_resize",
]

DEFAULT_MAX_IMAGE_PIXELS = 8192 * 8192  # --multimodal-max-image-pixels: a decoded image's width x height
OFF_LOOP_PIXELS = 256 * 256  # an image larger than this is decoded and processed in a worker thread
MAX_CONFIG_BYTES = 1024 * 1024  # config.json / preprocessor_config.json read at most (each is a few KiB)
MAX_ASPECT_RATIO = 200
WIRE_DTYPE = "bfloat16"
IMAGE_PAD = "<|image_pad|>"
_ADDED_PAD = re.compile(rb'\{\s*"id"\s*:\s*(\d+)\s*,\s*"content"\s*:\s*"<\|image_pad\|>"')

# Qwen2-VL's defaults (HF Qwen2VLImageProcessor; smg qwen2_vl.rs) for keys a config leaves out.
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class VisionProcessor:
    """A Qwen-VL image processor's parameters (``preprocessor_config.json``) and the image pad token."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = _CLIP_MEAN
    image_std: tuple[float, float, float] = _CLIP_STD
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    resample: int = 3  # PIL bicubic
    image_token_id: int | None = None

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def patch_values(self) -> int:
        """Values per flattened patch: 3 channels x temporal_patch_size x patch_size^2."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


@dataclass(frozen=True, slots=True)
class PixelItem:
    """One image as its encoder takes it: ``values`` ([patches, patch_values]; float32, or bfloat16 held
    as its little-endian uint16 bits), their ``dtype`` name on the wire, its grid (t, h, w in patches)
    and how many prompt tokens it takes."""

    values: np.ndarray[Any, Any]
    dtype: str
    grid_thw: tuple[int, int, int]
    tokens: int

    def payload(self) -> bytes:
        """The values' bytes as the encoder's tensor carries them (little-endian)."""
        return self.values.tobytes()


# A model directory with a config.json of a Qwen-VL family and no preprocessor_config.json gets its
# family's default processor (smg falls back to its processor's defaults the same way): Qwen2-VL and
# Qwen2.5-VL HF Qwen2VLImageProcessor's (VisionProcessor's own defaults), Qwen3-VL smg
# qwen3_vl.rs's (patch 16, mean and std 0.5, 65,536..16,777,216 pixels: Qwen3-VL's shipped config).
_QWEN2_VL: dict[str, Any] = {"merge_size": 2}
_QWEN3_VL: dict[str, Any] = {
    "merge_size": 2, "patch_size": 16, "min_pixels": 65536, "max_pixels": 16777216, "image_mean": 0.5, "image_std": 0.5,
}  # fmt: skip
DEFAULT_PROCESSOR_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2_vl": _QWEN2_VL, "qwen2_5_vl": _QWEN2_VL, "qwen3_vl": _QWEN3_VL, "qwen3_vl_moe": _QWEN3_VL,
}  # fmt: skip


def _triple(value: Any, default: tuple[float, float, float]) -> tuple[float, float, float]:
    if isinstance(value, (int, float)):
        return (float(value),) * 3
    if isinstance(value, list) and len(value) >= 3:
        return (float(value[0]), float(value[1]), float(value[2]))
    return default


def _small_json(path: Path) -> Any:
    """A model config file's JSON (read on the event loop, once per model directory): at most
    :data:`MAX_CONFIG_BYTES`; raises OSError or ValueError (absent, unreadable, too large, not JSON)."""
    with path.open("rb") as handle:
        raw = handle.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    return json.loads(raw)


def _model_config(model_dir: Path) -> dict[str, Any]:
    """The model's ``config.json``, or {} when it is absent, unreadable, too large or not an object."""
    try:
        config = _small_json(model_dir / "config.json")
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _image_token_id(model_dir: Path) -> int | None:
    token = _model_config(model_dir).get("image_token_id")
    if isinstance(token, int):
        return token
    # The tokenizer's added token, found without parsing the whole tokenizer.json (megabytes: this runs
    # once per model directory, at routing, on the event loop).
    try:
        found = _ADDED_PAD.search((model_dir / "tokenizer.json").read_bytes())
    except OSError:
        return None
    return int(found.group(1)) if found is not None else None


@functools.lru_cache(maxsize=64)
def load_vision_processor(model_dir: str) -> VisionProcessor | None:
    """The Qwen-VL image processor of the model in ``model_dir`` (its ``preprocessor_config.json``;
    without one, its family's defaults when ``config.json``'s ``model_type`` is a Qwen-VL family:
    :data:`DEFAULT_PROCESSOR_CONFIGS`), None when there is neither or it is not a Qwen-VL processor
    (patch and merge sizes).
    ``model_dir`` is where the model's tokenizer was loaded from (a local directory, or where a hub
    id's or a worker's tokenizer files were fetched to: :mod:`inference.pipeline.tokenizer_sources`
    fetches this file and config.json with them)."""
    path = Path(model_dir).expanduser()
    if path.is_file():  # a tokenizer.json given as the tokenizer's location: the model is its folder
        path = path.parent
    try:
        config = _small_json(path / "preprocessor_config.json")
    except FileNotFoundError:  # the family's defaults, when config.json names a Qwen-VL family
        config = DEFAULT_PROCESSOR_CONFIGS.get(str(_model_config(path).get("model_type")))
        if config is None:
            return None
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or ("merge_size" not in config and "Qwen" not in str(config.get("image_processor_type"))):
        return None
    base = VisionProcessor()
    sizes = config.get("size")
    size: dict[str, Any] = sizes if isinstance(sizes, dict) else {}
    return VisionProcessor(
        patch_size=int(config.get("patch_size") or base.patch_size),
        merge_size=int(config.get("merge_size") or base.merge_size),
        temporal_patch_size=int(config.get("temporal_patch_size") or base.temporal_patch_size),
        min_pixels=int(config.get("min_pixels") or size.get("shortest_edge") or base.min_pixels),
        max_pixels=int(config.get("max_pixels") or size.get("longest_edge") or base.max_pixels),
        image_mean=_triple(config.get("image_mean"), base.image_mean),
        image_std=_triple(config.get("image_std"), base.image_std),
        rescale_factor=float(config.get("rescale_factor") or base.rescale_factor),
        do_resize=bool(config.get("do_resize", True)),
        do_rescale=bool(config.get("do_rescale", True)),
        do_normalize=bool(config.get("do_normalize", True)),
        resample=int(config.get("resample", base.resample)),
        image_token_id=_image_token_id(path),
    )


def smart_resize(height: int, width: int, processor: VisionProcessor) -> tuple[int, int]:
    """The (height, width) an image is resized to: multiples of patch_size * merge_size, as close to
    the original as the min/max pixel bounds allow (HF's and smg's smart_resize)."""
    factor = processor.factor
    if height <= 0 or width <= 0 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"an aspect ratio above {MAX_ASPECT_RATIO}:1 ({width}x{height})")
    h_bar = max(factor, round(height / factor) * factor)  # round half to even, as Python and HF do
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > processor.max_pixels:
        beta = math.sqrt(height * width / processor.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < processor.min_pixels:
        beta = math.sqrt(processor.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _open(data: bytes) -> Image.Image:
    # The pixel limit is --multimodal-max-image-pixels (check_image), not Pillow's warning; Pillow's own
    # hard bound (DecompressionBombError, twice Image.MAX_IMAGE_PIXELS) still stands above it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data))


def media_too_large(message: str) -> errors.GatewayError:
    """413 multimodal_payload_too_large (spec 1's code for media too large) with its reason."""
    return errors.GatewayError(413, errors.ErrorCode.MULTIMODAL_PAYLOAD_TOO_LARGE, message)



def check_image(data: bytes, max_image_pixels: int, where: str) -> int:
    """The image's pixel count from its header (not decoded). Raises 400 multimodal_not_supported for
    bytes that are not an image Pillow reads, 413 multimodal_payload_too_large above the limit."""
    width, height = image_size(data, max_image_pixels, where)
    return width * height


def encoder_input_bytes(width: int, height: int, processor: VisionProcessor, dtype: str = WIRE_DTYPE) -> int:
    """The bytes of the encoder input :func:`preprocess` makes of a ``width`` x ``height`` image (its
    patches on the wire), known from the header alone; 0 for a size it refuses (its request fails there)."""
    try:
        resized_h, resized_w = smart_resize(height, width, processor) if processor.do_resize else (height, width)
    except ValueError:
        return 0
    patches = (resized_h // processor.patch_size) * (resized_w // processor.patch_size)
    return patches * processor.patch_values * (2 if dtype == "bfloat16" else 4)


def image_size(data: bytes, max_image_pixels: int, where: str) -> tuple[int, int]:
    """(width, height) from the image's header, checked as :func:`check_image` checks it."""
    try:
        image = _open(data)
        width, height = image.size
    except Image.DecompressionBombError as error:
        raise media_too_large(f"{where}: {error}") from None
    except (OSError, ValueError, SyntaxError):
        raise errors.multimodal_not_supported(f"EPD encode: {where} is not an image the gateway can decode") from None
    if max_image_pixels and width * height > max_image_pixels:
        raise media_too_large(
            f"{where}: an image of {width}x{height} pixels exceeds the limit of {max_image_pixels} pixels "
            "(--multimodal-max-image-pixels)"
        )
    return width, height


def preprocess(data: bytes, processor: VisionProcessor, dtype: str = WIRE_DTYPE) -> PixelItem:
    """The image's encoder input (decode, smart resize, rescale, normalize, patchify) as ``dtype``
    (bfloat16 or float32). Blocks: call it off the event loop for a large image. Raises ValueError
    (or OSError) for an undecodable one."""
    import numpy as np

    image = _open(data)
    image.load()
    if image.mode != "RGB":
        image = image.convert("RGB")
    height, width = image.height, image.width
    if processor.do_resize:
        height, width = smart_resize(height, width, processor)
        if (width, height) != image.size:
            image = image.resize((width, height), resample=Image.Resampling(processor.resample))
    p, m, t = processor.patch_size, processor.merge_size, processor.temporal_patch_size
    if height % (p * m) or width % (p * m):
        raise ValueError(f"an image of {width}x{height} is not a multiple of {p * m} (do_resize off)")
    pixels = np.asarray(image, dtype=np.float32)  # (H, W, 3)
    scale = np.full(3, processor.rescale_factor if processor.do_rescale else 1.0, dtype=np.float32)
    shift = np.zeros(3, dtype=np.float32)
    if processor.do_normalize:
        std = np.asarray(processor.image_std, dtype=np.float32)
        scale = scale / std
        shift = -np.asarray(processor.image_mean, dtype=np.float32) / std
    pixels *= scale
    pixels += shift
    # Converted before the patches repeat the frame over the temporal patch: half the values to round.
    values: np.ndarray[Any, Any] = bfloat16_bits(pixels) if dtype == "bfloat16" else pixels
    grid_h, grid_w = height // p, width // p
    # (H, W, C) -> (gh/m, m, p, gw/m, m, p, C) -> (gh/m, gw/m, m, m, C, p, p); the one frame repeated
    # over the temporal patch -> (..., C, T, p, p), flattened per patch: HF's Qwen2VL order.
    blocks = values.reshape(grid_h // m, m, p, grid_w // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
    blocks = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
    patches = np.ascontiguousarray(blocks).reshape(grid_h * grid_w, processor.patch_values)
    return PixelItem(patches, dtype, (1, grid_h, grid_w), grid_h * grid_w // (m * m))


def bfloat16_bits(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``values`` (float32) as bfloat16 bits, little-endian uint16 (round to nearest even); the
    float32 array may be overwritten."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    lsb = bits >> np.uint32(16)
    lsb &= np.uint32(1)
    bits += np.uint32(0x7FFF)
    bits += lsb
    bits >>= np.uint32(16)
    return bits.astype("<u2")


def bfloat16_bytes(values: np.ndarray[Any, Any]) -> bytes:
    """``values`` as little-endian bfloat16 bytes (round to nearest even), the encoder input's wire dtype."""
    import numpy as np

    return bfloat16_bits(np.array(values, dtype="<f4")).tobytes()


def expand_placeholders(
    input_ids: tuple[int, ...], pad_id: int, tokens: list[int]
) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """``input_ids`` with the k-th ``pad_id`` repeated ``tokens[k]`` times, and each item's
    (offset, length) in the result. Raises 400 multimodal_not_supported when the prompt does not hold
    one pad per image (a chat template without the model's image placeholder)."""
    positions = [i for i, token in enumerate(input_ids) if token == pad_id]
    if len(positions) != len(tokens):
        raise errors.multimodal_not_supported(
            f"EPD encode: the prompt holds {len(positions)} image placeholders for {len(tokens)} images"
        )
    expanded: list[int] = []
    ranges: list[tuple[int, int]] = []
    start = 0
    for position, count in zip(positions, tokens):
        expanded.extend(input_ids[start:position])
        ranges.append((len(expanded), count))
        expanded.extend([pad_id] * count)
        start = position + 1
    expanded.extend(input_ids[start:])
    return tuple(expanded), ranges
