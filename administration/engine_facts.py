"""What an engine worker reports about its model, kept as labels, and the :class:`EngineSpec` the
data plane builds for it from its model card, labels and the flags.

Registration of a gRPC worker asks the engine's GetModelInfo once and stores the answer as labels
(:func:`labels_from_model_info`), under the operator's own labels (an operator's label wins). The
spec's labels with a built-in meaning come first (served_model_name, model_path, tokenizer_path);
the others (architectures, max_context_length, model_type, eos_token_ids) are read back only by
:func:`engine_spec`.

Precedence, per fact (spec 3, model cards and labels):

- tokenizer: card ``tokenizer_path``, else labels ``tokenizer_path``, else ``model_path``. A path
  the engine reported that does not exist on this host is not used (the tokenizer registry, the
  flags and the worker's own GetTokenizer decide instead).
- parsers: card, else labels, else --tool-call-parser / --reasoning-parser, else the model family's.
- context length: card ``context_length``, else the engine's ``max_context_length``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from common.config import GatewayConfig
from inference.pipeline.parsers import ParserChoice, UnknownParser, choose_parsers
from inference.routing.workers import EngineSpec, Transport, WorkerKind, transport_of
from inference.upstreams.engine import ModelInfo

__all__ = [
    "labels_from_model_info", "engine_spec", "parser_choice", "ENGINE_LABELS", "DP_SIZE_LABEL", "dp_size_from_server_info",
    "dp_ranks", "KV_LABELS", "kv_labels_from_server_info",
]

log = logging.getLogger(__name__)

ENGINE_LABELS = (
    "served_model_name", "model_path", "tokenizer_path", "architectures", "max_context_length", "model_type",
    "eos_token_ids",
)  # fmt: skip
"""The labels registration may fill from GetModelInfo."""

DP_SIZE_LABEL = "dp_size"
"""The label registration fills, under --dp-aware, with the engine's reported data-parallel size."""

KV_LABELS = ("kv_connector", "kv_role", "kv_engine_id")
"""The labels registration fills from an engine's GetServerInfo (vLLM reports its KV connector, role
and engine id there): the engine-reported values the spec's kv_connector/kv_engine_id fields override."""


def kv_labels_from_server_info(info: Mapping[str, Any] | None) -> dict[str, str]:
    """The non-empty KV connector facts of an engine's server info (vLLM gRPC GetServerInfo)."""
    if info is None:
        return {}
    return {name: value for name in KV_LABELS if isinstance(value := info.get(name), str) and value}


def labels_from_model_info(info: ModelInfo) -> dict[str, str]:
    """GetModelInfo's answer as labels (string values; lists comma-joined; empty facts left out)."""
    found: dict[str, str] = {
        "served_model_name": info.served_model_name,
        "model_path": info.model_path,
        "tokenizer_path": info.tokenizer_path,
        "architectures": ",".join(info.architectures),
        "max_context_length": str(info.max_context_length or ""),
        "model_type": info.model_type,
        "eos_token_ids": ",".join(str(token) for token in info.eos_token_ids),
    }
    return {key: value for key, value in found.items() if value}


def dp_size_from_server_info(info: Mapping[str, Any]) -> int | None:
    """The data-parallel size an engine's server info reports, in any of the engines' shapes: SGLang
    HTTP /server_info (``dp_size`` at the top), SGLang and TokenSpeed gRPC GetServerInfo
    (``server_args.dp_size``, a Struct number), vLLM gRPC GetServerInfo (``data_parallel_size``).
    None when it reports none."""
    args = info.get("server_args")
    for value in (
        info.get("dp_size"), args.get("dp_size") if isinstance(args, Mapping) else None, info.get("data_parallel_size"),
    ):  # fmt: skip
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        size = _int(value)
        if size is not None:
            return size
    return None


def dp_ranks(url: str, kind: WorkerKind, labels: Mapping[str, Any], config: GatewayConfig) -> int:
    """The data-parallel ranks the gateway picks among per request for a worker with these labels:
    under --dp-aware its ``dp_size`` (the engine's report, or the operator's label) when above 1;
    0 otherwise (the flag off changes nothing), for a provider, and for a ZMQ worker (its ranks are
    its socket set's, chosen by its own client; one of dp_size above 1 is refused under --dp-aware)."""
    if not config.dp_aware or kind is WorkerKind.PROVIDER or transport_of(url) is Transport.ZMQ:
        return 0
    size = _int(labels.get(DP_SIZE_LABEL))
    return size if size is not None and size > 1 else 0


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    return None


def _architectures(card: Mapping[str, Any], labels: Mapping[str, Any]) -> tuple[str, ...]:
    listed = card.get("architectures") or str(labels.get("architectures") or "").split(",")
    return tuple(name for name in listed if isinstance(name, str) and name)


def _usable_location(location: str | None) -> str | None:
    """A tokenizer location this host can use: anything but an absolute path that is not here (a
    path on the engine's host)."""
    if location and os.path.isabs(location) and not os.path.exists(location):
        return None
    return location


def parser_choice(
    model: str, card: Mapping[str, Any], labels: Mapping[str, Any], config: GatewayConfig
) -> ParserChoice:
    """The parsers of a worker's model by the spec's precedence; raises UnknownParser for a name no
    parser answers to (registration fails on it)."""
    return choose_parsers(
        model,
        card=ParserChoice(_text(card.get("tool_parser")), _text(card.get("reasoning_parser"))),
        labels=ParserChoice(_text(labels.get("tool_parser")), _text(labels.get("reasoning_parser"))),
        flags=ParserChoice(config.tool_call_parser, config.reasoning_parser),
        architectures=_architectures(card, labels),
        model_type=_text(card.get("hf_model_type")) or _text(labels.get("model_type")),
    )


def engine_spec(
    model: str,
    cards: list[dict[str, Any]],
    labels: Mapping[str, Any],
    config: GatewayConfig,
    settings: Mapping[str, Any] | None = None,
) -> EngineSpec:
    """The pipeline facts of a worker serving ``model`` (its first model card, if any; its spec's
    ``settings`` for a ZMQ worker's dp_size and handshake address)."""
    card: Mapping[str, Any] = cards[0] if cards else {}
    try:
        parsers = parser_choice(model, card, labels, config)
    except UnknownParser as exc:  # checked at registration; a flag or label changed since
        log.warning("worker model %s: %s; parsing is off", model, exc)
        parsers = ParserChoice(None, None)
    tokenizer = _text(card.get("tokenizer_path")) or _usable_location(
        _text(labels.get("tokenizer_path")) or _text(labels.get("model_path"))
    )
    return EngineSpec(
        tokenizer=tokenizer,
        chat_template=_text(card.get("chat_template")),
        tool_parser=parsers.tool_parser,
        reasoning_parser=parsers.reasoning_parser,
        context_length=_int(card.get("context_length")) or _int(labels.get("max_context_length")),
        architectures=_architectures(card, labels),
        model_type=_text(card.get("hf_model_type")) or _text(labels.get("model_type")) or "",
        dp_size=_int((settings or {}).get("dp_size")),
        zmq_handshake_address=_text((settings or {}).get("zmq_handshake_address")),
    )
