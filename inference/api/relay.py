"""The data plane's POST routes: a thin handler over the request kit that runs any
:class:`~inference.api.surface.Surface`. The request is validated by the surface's validator, admitted,
routed to a worker, and handled as the surface says for that worker's kind: relayed to the same path
(HTTP workers, providers), served by the gateway (engine workers), or refused with 501; the answer
comes back through the surface's response writer.
"""

from __future__ import annotations

import asyncio
import logging
import re
from time import perf_counter
from typing import Any, Awaitable

import orjson

from common import telemetry, tracing
from common.relay_metrics import count_buffered_body
from common.secrets import bearer_token
from inference import errors
from inference.accounting import Delivered
from inference.admission import Admission
from inference.api.surface import OPENAI_HEADERS, HeaderSet, PerRequest, Relay, Serve, Surface
from inference.asgi_io import ClientDisconnected, Receive, Scope, Send, header, request_id_for
from inference.auth import Identity, IdentityKind
from inference.dataplane import DataPlane, data_plane
from inference.errors import GatewayError
from inference.kit import Passed, RoutePlan, pass_gate, run_attempts
from inference.kit.account import RequestAccount
from inference.kit.traced import TracedAdmission, close_request, selected
from inference.kit.pd_route import admit_pair, pd_pair_for, serves_by_epd, serves_by_pd
from inference.routing.dp_ranks import take_rank
from inference.routing.pd import PdPair, batch_size, choose_partner, inject_bootstrap
from inference.routing.selection import RoutingDecision, select_worker
from inference.routing.workers import WorkerHandle, WorkerKind, WorkerRecord
from inference.served import ServedAnswer, ServedRequest, ServedSurface
from inference.upstreams import RelayAnswer, RelayRequest
from inference.upstreams.checked import checked_whole
from inference.upstreams.engine import ENGINE_CLIENTS
from inference.upstreams.provider import EXTERNAL, STREAM_USAGE_PROVIDERS
from inference.writers import ResponseClock, ResponseWriter

__all__ = ["SurfaceRoute", "caller_key", "forwarded_headers"]

log = logging.getLogger(__name__)

# A value a worker's HTTP parser would refuse (a control character other than tab): not passed on.
# Servers refuse such heads before they reach us; this keeps any other way in from writing one.
_UNSENDABLE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def forwarded_headers(scope: Scope, passed: HeaderSet = OPENAI_HEADERS) -> tuple[tuple[str, str], ...]:
    """The client's headers that ``passed`` lets through, less any a worker's parser would refuse."""
    names = passed.names  # HeaderSet.passes, inline: no call per client header (D86)
    prefixes = passed.prefixes
    found = []
    for key, value in scope["headers"]:
        if (key in names or key.startswith(prefixes)) and not _UNSENDABLE.search(value):
            found.append((key.decode("latin-1"), value.decode("latin-1")))
    return tuple(found)


def _traced(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """``headers`` with the current span's trace context for the client's under --enable-trace."""
    return tracing.outgoing(headers) if tracing.ENABLED else headers


def caller_key(scope: Scope, identity: Identity) -> str | None:
    """The caller's Authorization bearer token in open mode (no gateway keys: then it is the
    caller's own provider key, relayed to an external worker that has none); None otherwise, so a
    gateway key is never relayed."""
    if identity.kind is not IdentityKind.ANONYMOUS:
        return None
    token = bearer_token(header(scope, b"authorization"))
    return token.decode("latin-1") if token is not None else None


def _servable(record: WorkerRecord) -> bool:
    """Whether the gateway can serve a request on ``record`` itself: a provider always (by a surface
    of its own), an engine when its runtime has a client over its transport."""
    return record.kind is not WorkerKind.ENGINE or ENGINE_CLIENTS.serves(record.transport, record.runtime_type)


_USAGE_OPTION_PATHS = frozenset(("/v1/chat/completions", "/v1/completions"))


_ASK_USAGE = b'{"stream_options":{"include_usage":true},'


def path_takes_usage_option(path: str) -> bool:
    """Whether a stream on ``path`` reports usage only when asked (``stream_options.include_usage``)."""
    return path in _USAGE_OPTION_PATHS


def ranked_body(body: dict[str, Any], rank: int) -> bytes:
    """The request body for one data-parallel rank of the worker (--dp-aware): the gateway's
    choice in ``data_parallel_rank``, over any the client gave."""
    return orjson.dumps({**body, "data_parallel_rank": rank})


def _wants_logprobs(path: str, body: dict[str, Any]) -> bool:
    """Whether the prefill side's input logprobs are merged into the answer (the reference's rule)."""
    if path == "/generate":
        return bool(body.get("return_logprob"))
    if path == "/v1/completions":
        return body.get("logprobs") is not None
    return bool(body.get("logprobs"))


class SurfaceRoute:
    """The ASGI handler of one :class:`~inference.api.surface.Surface` (see the module's docstring)."""

    def __init__(self, surface: Surface) -> None:
        self.surface = surface
        self.upstream_path = surface.path
        self.validate = surface.validate
        self.framing = surface.framing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = ResponseWriter(send, request_id_for(scope), ResponseClock(perf_counter()), self.framing)
        dp = data_plane()
        span = None  # the request's span under --enable-trace (common.tracing): one check when off
        if tracing.ENABLED:
            span = tracing.request_span(scope["method"], self.upstream_path, scope["headers"])
            entered = tracing.enter(span)
        try:
            if scope["method"] != "POST":
                raise errors.method_not_allowed(scope["method"], scope["path"], "POST")
            passed = await pass_gate(dp, scope, receive, self.validate, writer.clock)
        except GatewayError as error:
            await writer.error(error)
            self._refused(dp, scope, writer, error)
            if span is not None:
                close_request(span, error.status, "", None, error)
                tracing.leave(entered)
            return
        except ClientDisconnected:
            self._refused(dp, scope, writer, None)
            if span is not None:
                close_request(span, 499, "", None)
                tracing.leave(entered)
            return
        checked = passed.checked
        if span is not None and checked.model:
            span.set_attribute("gen_ai.request.model", checked.model)
        route = telemetry.RouteTimer(self.upstream_path, checked.model, checked.stream, writer.clock.started)
        count_buffered_body()  # the body was read whole and parsed (common/relay_metrics.py)
        if checked.stream:
            writer.observer = route
        # The request's accounting (D66): the attempts loop records the answer, this route closes it.
        account = RequestAccount(dp, passed.identity, self.upstream_path, writer, route)
        watch = writer.watch(receive)
        failed: GatewayError | None = None
        cancelled = False
        try:
            try:
                admission = Admission(dp.permits, dp.media, passed.media_bytes)
                # Its span when there is an admission step (a limit on): otherwise nothing waits.
                if span is not None and (dp.permits is not None or (dp.media is not None and passed.media_bytes)):
                    admission = TracedAdmission(admission)  # type: ignore[assignment]
                async with admission:
                    await self._route(dp, scope, passed, route, writer, account)
                route.finished()
                account.finish()
            except GatewayError as error:
                failed = error
                route.failed(str(error.code), error.status)
                await writer.error(error)
                if not account.model and checked.model:
                    account.model = dp.registry.snapshot.canonical_model(checked.model)
                account.close(error)
        except asyncio.CancelledError:
            cancelled = True
            account.close(cancelled=True)
            if not watch.fired:
                raise
            # The client left: the upstream request was closed by the cancellation. Absorb it.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            log.info("client disconnected; upstream request closed (request %s)", writer.request_id.decode())
        finally:
            watch.stop()
            if span is not None:
                if cancelled:
                    tracing.fail(span, "cancelled", "the client left")
                status = failed.status if failed is not None else 499 if cancelled else account.status
                close_request(span, status, account.model, account.usage, failed)
                tracing.leave(entered)

    def _refused(self, dp: DataPlane, scope: Scope, writer: ResponseWriter, error: GatewayError | None) -> None:
        """Account a request the gate turned away (``error``) or whose client left while it was read
        (None); one that did not authenticate has no tenant and is not accounted."""
        identity = scope.get("gateway.identity")
        if identity is not None:
            RequestAccount(dp, identity, self.upstream_path, writer).close(error, cancelled=error is None)

    async def _admitted(
        self, admission: Awaitable[PdPair], dp: DataPlane, scope: Scope, passed: Passed,
        route: telemetry.RouteTimer, writer: ResponseWriter, account: RequestAccount,
    ) -> None:
        """A PD request that waited for admission (:func:`admit_pair`), routed on the pair it got."""
        await self._route(dp, scope, passed, route, writer, account, await admission)

    def _route(
        self, dp: DataPlane, scope: Scope, passed: Passed, route: telemetry.RouteTimer, writer: ResponseWriter,
        account: RequestAccount, admitted: PdPair | None = None,
    ) -> Awaitable[None]:
        """Pick the worker; the attempts that relay to it, retrying elsewhere while nothing reached the
        client, are the returned awaitable (a plain function: no coroutine frame of its own). A PD
        request refused for overload waits for PD admission first, then comes back ``admitted``."""
        checked = passed.checked
        key = header(scope, b"x-gw-routing-key")
        routing_key = key.decode("latin-1") if key else None
        model = checked.model or None
        # Prefill/decode disaggregation: the attempts run on decode workers, each with its prefill partner.
        pairs: dict[str, PdPair] = {}

        def paired(pair: PdPair) -> WorkerHandle:
            pairs[pair.decode.handle.id] = pair
            choose_partner(pair)  # an engine worker's client runs the pair (inference.served.base)
            return pair.decode.handle

        if self.surface.refuses_epd and serves_by_epd(dp, model):
            raise errors.endpoint_not_supported(self.upstream_path, "gRPC EPD")
        pd = serves_by_pd(dp, model)
        if pd:
            route.disaggregated()
            if admitted is None:
                try:
                    if tracing.ENABLED:
                        admitted = selected(lambda: pd_pair_for(dp, model, routing_key, checked.body), model)
                    else:
                        admitted = pd_pair_for(dp, model, routing_key, checked.body)
                except GatewayError as refused:
                    pick = lambda: pd_pair_for(dp, model, routing_key, checked.body)  # noqa: E731
                    return self._admitted(admit_pair(dp, pick, refused), dp, scope, passed, route, writer, account)
            pair = admitted
            canonical = dp.registry.snapshot.canonical_model(model) if model else None
            decision = RoutingDecision(paired(pair), canonical, dp.decode_policy.name if dp.decode_policy else "")
        elif tracing.ENABLED:
            decision = selected(lambda: select_worker(
                dp.registry.snapshot, model, dp.policies, routing_key=routing_key, body=checked.body
            ), model)  # fmt: skip
        else:
            decision = select_worker(dp.registry.snapshot, model, dp.policies, routing_key=routing_key, body=checked.body)
        body = checked.body
        modified = checked.modified
        if decision.model is not None and decision.model != checked.model:
            body["model"] = decision.model
            modified = True
        payload = orjson.dumps(body) if modified else passed.raw
        account.model = decision.model or checked.model or ""
        # A relayed stream is accounted from the worker's usage, asked for when the client did not
        # (its usage-only event is then not passed on): D66.
        relayed_body = body
        added_usage = False
        rewritten: list[bytes] = []  # relayed_body's bytes, written at the first relayed attempt
        if checked.stream and path_takes_usage_option(self.upstream_path):
            options = body.get("stream_options")
            if not isinstance(options, dict) or (
                options.get("include_usage") is not True and options.get("continuous_usage_stats") is not True
            ):
                given = options if isinstance(options, dict) else {}
                relayed_body = {**body, "stream_options": {**given, "include_usage": True}}
                added_usage = True
                if not modified and "stream_options" not in body and payload[:1] == b"{":
                    # The client's own bytes with the option put first (the body has no such key to
                    # repeat), not the whole body written again (D85).
                    rewritten.append(_ASK_USAGE + payload[1:])
        worker = decision.worker
        transport = worker.record.transport
        route.selected(worker.record.worker_type, transport, decision.policy, transport)
        plan = RoutePlan(
            self.upstream_path, model, routing_key, body, len(payload),
            pick_next=(lambda tried: paired(pd_pair_for(dp, model, routing_key, body, tried))) if pd else None,
        )  # fmt: skip
        path = self.upstream_path
        stream = checked.stream
        identity = passed.identity
        surface_of = self.surface
        served: ServedSurface | None = None  # made at the first worker the gateway serves itself

        async def refuse(target: WorkerHandle) -> ServedAnswer:
            raise errors.endpoint_not_supported(path, str(target.record.transport))

        async def serve(target: WorkerHandle, handling: Serve) -> ServedAnswer:
            nonlocal served
            if served is None:
                passes = handling.headers
                if passes.credentials:
                    passes = passes.for_worker(target.record, identity)
                # A surface that passes the client's own credentials sends them as they are, unconverted.
                key = None if handling.headers.credentials else caller_key(scope, identity)
                request = ServedRequest(
                    dp, body, decision.model or checked.model, checked.model, stream, writer, identity,
                    key, checked.parsed, _traced(forwarded_headers(scope, passes)), account,
                )  # fmt: skip
                served = handling.surface(request)
            return await served.open(target)

        def client_header(name: bytes) -> bytes | None:
            return header(scope, name)

        # Plain functions returning the upstream's own coroutines: no extra frame per attempt.
        def open_on(target: WorkerHandle) -> Awaitable[RelayAnswer | ServedAnswer]:
            record = target.record
            handling = surface_of.handling(record.kind)
            if type(handling) is PerRequest:
                handling = handling.pick(checked, client_header)
            if type(handling) is Relay and handling.takes(record):
                allowed = handling.headers
                if allowed.credentials:
                    allowed = allowed.for_worker(record, identity)
                headers = forwarded_headers(scope, allowed)
                if tracing.ENABLED:  # the attempt's span as the worker's parent (D74)
                    headers = tracing.outgoing(headers)
                if record.kind is WorkerKind.PROVIDER:
                    # A surface that passes the client's own credentials sends them as they are, unconverted.
                    key = None if handling.headers.credentials else caller_key(scope, identity)
                    asked = added_usage and record.provider in STREAM_USAGE_PROVIDERS  # D80
                    if asked and not rewritten:
                        rewritten.append(orjson.dumps(relayed_body))
                    opening = dp.relay_for(EXTERNAL, path).open(RelayRequest(
                        target, path, rewritten[0] if asked else payload, stream, writer.request_id, headers,
                        identity, key, added_usage=asked,
                    ))  # fmt: skip
                    if handling.whole_answer is None or stream:
                        return opening
                    return checked_whole(opening, handling.whole_answer, dp.config.max_buffered_response_bytes)
                pair = pairs.get(target.id)
                if pair is not None:
                    return open_pd(pair, target, handling.headers)
                relay = dp.relay_for(record.transport, path)
                if target.dp_rank is not None:
                    sent = ranked_body(relayed_body, target.dp_rank)
                elif added_usage:
                    if not rewritten:
                        rewritten.append(orjson.dumps(relayed_body))
                    sent = rewritten[0]
                else:
                    sent = payload
                return relay.open(RelayRequest(
                    target, path, sent, stream, writer.request_id, headers, identity, added_usage=added_usage
                ))  # fmt: skip
            if type(handling) is Serve and handling.takes(record) and _servable(record):
                return serve(target, handling)
            return refuse(target)

        def open_pd(pair: PdPair, decode: WorkerHandle, allowed: HeaderSet) -> Awaitable[RelayAnswer]:
            """Both sides of an HTTP PD pair at once, with the prefill's bootstrap in the body (and
            under --dp-aware each side's own data-parallel rank: ``decode`` carries the decode's,
            the prefill takes one here, given back when its side ends)."""
            if dp.pd_http is None:
                raise errors.endpoint_not_supported(path, "http")
            injected = inject_bootstrap(relayed_body, pair.prefill, batch_size(path, body))
            sent = orjson.dumps(injected)
            prefill = take_rank(pair.prefill.handle)

            def side(handle: WorkerHandle) -> RelayRequest:
                passes = allowed.for_worker(handle.record, identity) if allowed.credentials else allowed
                own = sent if handle.dp_rank is None else ranked_body(injected, handle.dp_rank)
                return RelayRequest(
                    handle, path, own, stream, writer.request_id, _traced(forwarded_headers(scope, passes)), identity,
                    added_usage=added_usage,
                )  # fmt: skip

            return dp.pd_http.open(side(prefill), side(decode), _wants_logprobs(path, body), decision.model)

        def deliver(answer: RelayAnswer | ServedAnswer) -> Awaitable[Delivered]:
            return answer.forward(writer)

        return run_attempts(dp, plan, route, writer.clock, worker, open_on, deliver, account)
