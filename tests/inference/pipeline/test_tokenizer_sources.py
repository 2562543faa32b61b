"""A model-hub tokenizer source brings the model's image-processor config with it (D91): the stand-in
hub (standins.model_hub, the hub client's own file filter) serves a vision repository's
preprocessor_config.json and config.json beside the tokenizer, never the weights, and gRPC EPD finds
the processor in the directory the tokenizer loads from; a text repository without them loads as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.pipeline import tokenizer_sources
from inference.pipeline.tokenizer_sources import resolve_tokenizer_source
from inference.pipeline.tokenizers import TokenizerLoadError, load_tokenizer
from inference.upstreams.epd_pixels import load_vision_processor
from standins.fixtures import FIXTURE_MODELS
from standins.model_hub import ModelHub

QWEN = FIXTURE_MODELS / "qwen3"
VISION_CONFIG = FIXTURE_MODELS / "qwen2-vl" / "preprocessor_config.json"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelHub:
    stand_in = ModelHub(tmp_path / "repos", tmp_path / "cache")
    stand_in.install(monkeypatch, tokenizer_sources)
    return stand_in


def test_a_hub_vision_model_brings_its_image_processor_config(hub: ModelHub, tmp_path: Path) -> None:
    hub.repository("acme/qwen2-vl", {
        "tokenizer.json": QWEN / "tokenizer.json", "tokenizer_config.json": QWEN / "tokenizer_config.json",
        "preprocessor_config.json": VISION_CONFIG, "config.json": json.dumps({"image_token_id": 151655}).encode(),
        "model.safetensors": b"weights", "video_preprocessor_config.json": b"{}",
    })  # fmt: skip
    location = resolve_tokenizer_source("acme/qwen2-vl", work_dir=tmp_path / "work")
    assert hub.downloads == [["config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"]]
    assert sorted(path.name for path in location.iterdir()) == hub.downloads[0]
    assert load_tokenizer(location).path == str(location)
    processor = load_vision_processor(str(location))
    assert processor is not None and (processor.patch_size, processor.merge_size, processor.image_token_id) == (14, 2, 151655)


def test_a_hub_text_model_without_them_loads_as_before(hub: ModelHub, tmp_path: Path) -> None:
    hub.repository("acme/text", {"tokenizer.json": QWEN / "tokenizer.json", "tokenizer_config.json": QWEN / "tokenizer_config.json"})
    location = resolve_tokenizer_source("acme/text", work_dir=tmp_path / "work")
    assert hub.downloads == [["tokenizer.json", "tokenizer_config.json"]]
    assert load_tokenizer(location).vocab_size > 0
    assert load_vision_processor(str(location)) is None  # no image processor: EPD refuses images, text is served
    with pytest.raises(TokenizerLoadError, match="model hub"):
        resolve_tokenizer_source("acme/absent", work_dir=tmp_path / "work")


def test_a_hub_repository_whose_tokenizer_files_are_too_large_is_refused_before_downloading(
    hub: ModelHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files the gateway would fetch are summed from the hub's listing first (the weights never
    count): past MAX_ARCHIVE_BYTES nothing is downloaded and the load fails with the reason."""
    size = (QWEN / "tokenizer.json").stat().st_size
    hub.repository("acme/huge", {"tokenizer.json": QWEN / "tokenizer.json", "model.safetensors": b"w" * 4096})
    monkeypatch.setattr(tokenizer_sources, "MAX_ARCHIVE_BYTES", size + 4095)  # the weights would pass it
    assert load_tokenizer(resolve_tokenizer_source("acme/huge", work_dir=tmp_path / "work")).vocab_size > 0
    monkeypatch.setattr(tokenizer_sources, "MAX_ARCHIVE_BYTES", size - 1)
    with pytest.raises(TokenizerLoadError, match=f"come to {size} bytes, more than the {size - 1}"):
        resolve_tokenizer_source("acme/huge", work_dir=tmp_path / "work")
    assert hub.downloads == [["tokenizer.json"]]  # the first load's only
