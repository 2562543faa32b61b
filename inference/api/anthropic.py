"""The Anthropic Messages API's POST surfaces (spec 1, "Messages-style API", "Token counting",
"Endpoints"), framed as Messages events (no [DONE]; an error after the stream started is an
``error`` event).

- POST /v1/messages: relayed to an HTTP worker's own /v1/messages with the messages header set;
  on external workers only to the Anthropic provider, with only its credential and version headers,
  its whole answers parsed into the messages schema and re-serialized (other providers: 501); with
  ``X-GW-MCP: enabled`` and an mcp_toolset the gateway runs the MCP tool loop against that provider
  instead (inference/mcp/messages_loop.py).
- POST /v1/messages/count_tokens: relayed to an HTTP worker's own route; 501 on external providers.

On engine workers the gateway is the Messages server: it serves /v1/messages through its own
pipeline (inference/served/messages.py) and counts tokens with the model's tokenizer
(inference/served/count_tokens.py).
"""

from __future__ import annotations

from inference.api.surface import HeaderSet, PerRequest, Relay, Serve, Surface
from inference.mcp.messages_loop import MessagesMcpLoop, runs_mcp_loop
from inference.schemas.message_answer import reserialize_message
from inference.schemas.messages import validate_count_tokens, validate_messages
from inference.served.count_tokens import ServedCountTokens
from inference.served.messages import ServedMessages
from inference.writers import ANTHROPIC_SSE

__all__ = ["ANTHROPIC_SURFACES", "MESSAGES_HEADERS", "PROVIDER_MESSAGES_HEADERS"]

_CREDENTIALS = frozenset((b"authorization", b"x-api-key"))
_VERSIONS = frozenset((b"anthropic-version", b"anthropic-beta"))

MESSAGES_HEADERS = HeaderSet(
    frozenset((
        b"authorization", *_VERSIONS, b"x-correlation-id", b"traceparent", b"tracestate", b"x-gw-routing-key",
    )),
    (b"x-request-id-",),
    credentials=frozenset((b"authorization",)),
)  # fmt: skip
"""What HTTP workers get of the client's headers for messages (x-request-id is the gateway's own;
x-api-key and everything else dropped)."""

PROVIDER_MESSAGES_HEADERS = HeaderSet(_CREDENTIALS | _VERSIONS, credentials=_CREDENTIALS)
"""What the Anthropic provider gets of them: only its credential and version headers."""

_ANTHROPIC = frozenset(("anthropic",))

ANTHROPIC_SURFACES = (
    Surface(
        "/v1/messages", validate_messages, ANTHROPIC_SSE,
        relayed=Relay(MESSAGES_HEADERS),
        engine=Serve(ServedMessages),
        provider=PerRequest(
            runs_mcp_loop,  # X-GW-MCP: enabled with an mcp_toolset: the gateway runs the MCP tool loop
            Serve(MessagesMcpLoop, PROVIDER_MESSAGES_HEADERS, _ANTHROPIC),
            Relay(PROVIDER_MESSAGES_HEADERS, _ANTHROPIC, whole_answer=reserialize_message),
        ),
    ),
    Surface(
        "/v1/messages/count_tokens", validate_count_tokens, ANTHROPIC_SSE,
        relayed=Relay(MESSAGES_HEADERS), engine=Serve(ServedCountTokens), provider=None,
    ),
)  # fmt: skip
