"""The model-family table: which family a model belongs to, and what that family needs (its
tool-call and reasoning parsers by name; the harmony pipeline for gpt-oss).

The provider-profile families (Kimi, MiniMax, GLM, DeepSeek V4) are detected by
:func:`inference.schemas.profiles.detect_profile`, whose markers stay the only ones for them; the
other families are matched here the same way (any '/'-separated segment of the model ID starts
with a marker, ignoring case), in table order, so the more specific marker comes first
(``deepseek-r1-distill-qwen`` is DeepSeek R1, ``qwen3`` before ``qwen``). When the ID says
nothing, the worker's ``architectures`` (and hf ``model_type``) decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Sequence

from inference.schemas.profiles import Profile, detect_profile

__all__ = ["FAMILIES", "FamilyInfo", "ModelFamily", "detect_family", "family_info"]


class ModelFamily(StrEnum):
    KIMI = "kimi"  # profile A (K3 included)
    MINIMAX = "minimax"  # profile B
    GLM = "glm"  # profile C (GLM-5.3 included)
    DEEPSEEK_V4 = "deepseek_v4"  # profile D
    DEEPSEEK_R1 = "deepseek_r1"
    DEEPSEEK_V31 = "deepseek_v31"
    DEEPSEEK_V32 = "deepseek_v32"
    DEEPSEEK_V3 = "deepseek_v3"
    GPT_OSS = "gpt_oss"
    QWEN3 = "qwen3"
    QWQ = "qwq"
    QWEN = "qwen"
    LLAMA4 = "llama4"
    LLAMA = "llama"
    MAGISTRAL = "magistral"
    MISTRAL = "mistral"


@dataclass(frozen=True, slots=True)
class FamilyInfo:
    family: ModelFamily
    markers: tuple[str, ...]  # model-ID segment prefixes (empty: detected by profile)
    architectures: tuple[str, ...]  # hf architectures / model_type values
    tool_parser: str | None
    reasoning_parser: str | None
    harmony: bool = False
    # Chat-template quirks (inference.pipeline.templates):
    tool_arguments_as_text: bool = False  # the template reads tool-call arguments as JSON text
    thinking_default: bool | None = None  # thinking when the request says nothing (None: template's)
    effort_levels: tuple[str, ...] = ()  # the template's own reasoning-effort levels (clamped to)


FAMILIES: tuple[FamilyInfo, ...] = (
    FamilyInfo(ModelFamily.KIMI, (), ("kimi_k2", "KimiK2ForCausalLM"), "kimik2", "kimi_k2"),
    FamilyInfo(ModelFamily.MINIMAX, (), ("minimax_m2", "MiniMaxM2ForCausalLM"), "minimax_m2", "minimax"),
    FamilyInfo(ModelFamily.GLM, (), ("glm4_moe", "Glm4MoeForCausalLM"), "glm45", "glm45"),
    FamilyInfo(
        ModelFamily.DEEPSEEK_V4, (), (), None, "deepseek_v3", tool_arguments_as_text=True, thinking_default=True
    ),
    FamilyInfo(
        ModelFamily.GPT_OSS, ("gpt-oss",), ("gpt_oss", "GptOssForCausalLM"), None, None, harmony=True,
        effort_levels=("low", "medium", "high"),
    ),
    FamilyInfo(ModelFamily.DEEPSEEK_R1, ("deepseek-r1",), (), "deepseek", "deepseek_r1", tool_arguments_as_text=True),
    FamilyInfo(
        ModelFamily.DEEPSEEK_V31, ("deepseek-v3.1", "deepseek-v3-1", "deepseek-v3_1"), (), "deepseek31", "deepseek_v3",
        tool_arguments_as_text=True,
    ),
    FamilyInfo(
        ModelFamily.DEEPSEEK_V32, ("deepseek-v3.2", "deepseek-v3-2"), (), None, "deepseek_v3", tool_arguments_as_text=True
    ),
    FamilyInfo(
        ModelFamily.DEEPSEEK_V3, ("deepseek-v3",), ("deepseek_v3", "DeepseekV3ForCausalLM"), "deepseek", None,
        tool_arguments_as_text=True,
    ),
    FamilyInfo(ModelFamily.QWEN3, ("qwen3",), ("qwen3", "qwen3_moe", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"), "qwen", "qwen3"),
    FamilyInfo(ModelFamily.QWQ, ("qwq",), (), "qwen", "qwq"),
    FamilyInfo(ModelFamily.QWEN, ("qwen",), ("qwen2", "Qwen2ForCausalLM"), "qwen", None),
    FamilyInfo(ModelFamily.LLAMA4, ("llama-4", "llama4"), ("llama4", "Llama4ForConditionalGeneration"), "pythonic", None),
    FamilyInfo(ModelFamily.LLAMA, ("llama", "meta-llama"), ("llama", "LlamaForCausalLM"), "llama", None),
    FamilyInfo(ModelFamily.MAGISTRAL, ("magistral",), (), "mistral", "mistral"),
    FamilyInfo(
        ModelFamily.MISTRAL,
        ("mistral", "mixtral", "ministral", "codestral", "devstral"),
        ("mistral", "mixtral", "MistralForCausalLM", "MixtralForCausalLM"),
        "mistral",
        None,
    ),
)
_BY_FAMILY = {info.family: info for info in FAMILIES}
_BY_PROFILE = {
    Profile.KIMI: ModelFamily.KIMI,
    Profile.KIMI_K3: ModelFamily.KIMI,
    Profile.MINIMAX: ModelFamily.MINIMAX,
    Profile.GLM: ModelFamily.GLM,
    Profile.GLM_5_3: ModelFamily.GLM,
    Profile.DEEPSEEK_V4: ModelFamily.DEEPSEEK_V4,
}


def family_info(family: ModelFamily) -> FamilyInfo:
    return _BY_FAMILY[family]


@lru_cache(maxsize=4096)
def _from_model_id(model: str) -> ModelFamily | None:
    profile = detect_profile(model)
    if profile is not None:
        return _BY_PROFILE[profile]
    segments = model.lower().split("/")
    for info in FAMILIES:
        if info.markers and any(segment.startswith(info.markers) for segment in segments):
            return info.family
    return None


def detect_family(
    model: str, *, architectures: Sequence[str] = (), model_type: str | None = None
) -> ModelFamily | None:
    """The family of a model from its ID, else from its architectures / hf model type."""
    found = _from_model_id(model)
    if found is not None:
        return found
    names = {*architectures, *((model_type,) if model_type else ())}
    for info in FAMILIES:
        if names.intersection(info.architectures):
            return info.family
    return None
