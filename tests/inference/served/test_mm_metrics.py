"""The multimodal metrics (spec 3: gw_mm_tensors_total, gw_mm_tensor_bytes_total,
gw_mm_processing_total; common/mm_metrics.py) on gRPC EPD, through the gateway with the stand-in
encoder and pair of test_epd_served: each tensor the gateway sends counts inline with its payload's
bytes (an encode item's patches and grid, the prefill leg's grid per item), and each image the
gateway preprocessed counts once under router / epd; a text request counts nothing."""

from __future__ import annotations

from pathlib import Path

from common.telemetry import REGISTRY as METRICS
from tests.conftest import GatewayFactory
from tests.inference.served.conftest import QWEN_MODEL
from tests.inference.served.test_epd_served import JPEG, PNG, epd, image_chat

TENSORS = {"runtime": "tokenspeed", "path": "inline"}
PROCESSED = {"model": QWEN_MODEL, "mode": "router", "reason": "epd"}


def _counts() -> tuple[float, float, float]:
    return (
        METRICS.get_sample_value("gw_mm_tensors_total", TENSORS) or 0.0,
        METRICS.get_sample_value("gw_mm_tensor_bytes_total", TENSORS) or 0.0,
        METRICS.get_sample_value("gw_mm_processing_total", PROCESSED) or 0.0,
    )


async def test_epd_counts_each_tensor_sent_and_each_image_the_gateway_preprocessed(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    async with epd(make_gateway, tmp_path) as fleet:
        tensors, sent, processed = _counts()
        answer = await fleet.sdk().chat.completions.create(model=QWEN_MODEL, messages=image_chat(PNG, JPEG))
        assert answer.choices[0].message.content
        # Per image: the encode item's patches (bfloat16, [t*h*w, 1176]) and grid (int64 [1, 3]), and the
        # prefill leg's grid: 16 and 308 patches of 1176 values, two bytes each.
        assert _counts() == (tensors + 6, sent + (16 + 308) * 1176 * 2 + 4 * 24, processed + 2)

        stream = await fleet.sdk().chat.completions.create(
            model=QWEN_MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        assert [c async for c in stream][-1].choices[0].finish_reason is not None
        assert _counts() == (tensors + 6, sent + (16 + 308) * 1176 * 2 + 4 * 24, processed + 2)
