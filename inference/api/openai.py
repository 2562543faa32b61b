"""The OpenAI-compatible and native POST surfaces (spec 1): chat and text completions, embeddings,
rerank, classify, generate, tokenize and detokenize. Each is relayed to the same path on HTTP workers
and providers; on engine workers the gateway serves those it has a surface for, and the others
answer 501 there."""

from __future__ import annotations

from inference.api.surface import Serve, Surface, model_and_stream
from inference.schemas.chat import validate_chat_completion
from inference.schemas.completions import validate_completion
from inference.served.chat import ServedChat
from inference.served.completions import ServedCompletion
from inference.served.embeddings import ServedEmbeddings
from inference.served.generate import ServedGenerate
from inference.served.tokenize import ServedDetokenize, ServedTokenize

__all__ = ["OPENAI_SURFACES", "RELAYED_PATHS"]

OPENAI_SURFACES = (
    Surface("/v1/chat/completions", validate_chat_completion, engine=Serve(ServedChat)),
    Surface("/v1/completions", validate_completion, engine=Serve(ServedCompletion)),
    Surface("/v1/embeddings", engine=Serve(ServedEmbeddings)),
    Surface("/v1/rerank"),
    Surface("/rerank"),
    Surface("/v1/classify"),
    Surface("/generate", engine=Serve(ServedGenerate)),
    Surface("/v1/tokenize", engine=Serve(ServedTokenize)),
    Surface("/v1/detokenize", engine=Serve(ServedDetokenize)),
)

RELAYED_PATHS = tuple(surface.path for surface in OPENAI_SURFACES if surface.validate is model_and_stream)
"""The surfaces without a schema of their own (validated for model and stream only)."""
