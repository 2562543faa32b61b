"""Runtime types: the real engine names, and the spec's placeholder names accepted as aliases."""

from __future__ import annotations

from django.db import models

__all__ = ["RuntimeType", "normalize_runtime_type"]


class RuntimeType(models.TextChoices):
    SGLANG = "sglang", "SGLang"
    VLLM = "vllm", "vLLM"
    TRTLLM = "trtllm", "TensorRT-LLM"
    MLX = "mlx", "MLX"
    TOKENSPEED = "tokenspeed", "TokenSpeed"
    GENERIC = "generic", "Generic OpenAI-compatible"
    EXTERNAL = "external", "External provider"
    UNSPECIFIED = "unspecified", "Unspecified (auto-detect)"


_ALIASES: dict[str, str] = {
    "engine_a": RuntimeType.SGLANG,
    "engine_b": RuntimeType.VLLM,
    "engine_c": RuntimeType.TRTLLM,
    "tensorrt-llm": RuntimeType.TRTLLM,
    "engine_d": RuntimeType.MLX,
    "engine_e": RuntimeType.TOKENSPEED,
}


def normalize_runtime_type(value: str) -> RuntimeType:
    """The canonical runtime type for a real name or a spec alias. Raises ValueError when unknown."""
    lowered = value.strip().lower()
    return RuntimeType(_ALIASES.get(lowered, lowered))
