"""The gateway-as-server path (docs/ARCHITECTURE.md, "pipeline/"): named stages of plain typed
functions that turn a chat request into engine requests and engine outputs into API-neutral events.

So far it holds the events (:mod:`inference.pipeline.events`) and the output parsers:
:mod:`inference.pipeline.reasoning` (``<think>`` blocks) and :mod:`inference.pipeline.tools` (tool
calls), each family registered by the names operators know, and
:mod:`inference.pipeline.parsers` which resolves a parser by name or from the model family; and
the engine-free stages: :mod:`~inference.pipeline.templates` (render),
:mod:`~inference.pipeline.tokenizers` (tokenize; the bounded tokenizer cache),
:mod:`~inference.pipeline.detokenize` and :mod:`~inference.pipeline.stops`.
"""

from __future__ import annotations

__all__: list[str] = []
