"""Control-plane authentication (spec 3, Authentication): keys, the shared key, JWTs from a local
issuer on loopback, the JWKS cache, and the DRF adapters."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from django.test import override_settings
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from administration.api.auth import ControlPlaneAuthentication, IsControlPlaneAdmin
from administration.api.errors import exception_handler
from administration.control_auth import (
    ControlPlaneAuth,
    ControlPlaneDenied,
    Principal,
    control_plane_auth,
    reset_control_plane_auth,
)
from common.config import GatewayConfig, current_config, install_config
from tests.conftest import ALICE, SHARED_KEY

AUDIENCE = "gateway-admin"
ADMIN_KEY = "cp-admin-key-0001"
USER_KEY = "cp-user-key-0002"
CP_KEYS = (("ops", "Ops team", "admin", ADMIN_KEY), ("viewer", "Viewer", "user", USER_KEY))
CLIENT_KEYS: dict[str, Any] = {"api_key": SHARED_KEY, "tenant_api_keys": ((ALICE.tenant_id, ALICE.key),)}


def bearer(token: str) -> str:
    return f"Bearer {token}"


# --- a local JWT issuer ---------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


KEYS: dict[str, Any] = {
    "rsa-1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ec-256": ec.generate_private_key(ec.SECP256R1()),
    "ec-384": ec.generate_private_key(ec.SECP384R1()),
}


class Issuer:
    """An OpenID provider on 127.0.0.1: discovery document, JWKS (RSA and EC keys), token minting."""

    def __init__(self) -> None:
        self.private: dict[str, Any] = dict(KEYS)
        self.published = ["rsa-1", "ec-256", "ec-384"]
        self.extra_jwks: list[dict[str, Any]] = []
        self.available = True
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid in self.published:
            public = self.private[kid].public_key()
            entry = (RSAAlgorithm if isinstance(public, rsa.RSAPublicKey) else ECAlgorithm).to_jwk(public, as_dict=True)
            keys.append({**entry, "kid": kid, "use": "sig"})
        return {"keys": keys + self.extra_jwks}

    def add_key(self, kid: str) -> None:
        self.private[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def token(self, kid: str | None = "rsa-1", alg: str = "RS256", key: Any = None, **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": self.url, "aud": AUDIENCE, "sub": "user-42", "name": "Ada", "iat": now,
                   "exp": now + 300, "role": "admin", **claims}
        payload = {k: v for k, v in payload.items() if v is not None}
        headers = {"kid": kid} if kid else None
        return jwt.encode(payload, key if key is not None else self.private.get(kid or "rsa-1", self.private["rsa-1"]), algorithm=alg,
                          headers=headers)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                issuer.requests.append(self.path)
                if not issuer.available:
                    self.send_error(503)
                    return
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks"}
                elif self.path in ("/jwks", "/other-jwks"):
                    body = issuer.jwks()
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    server = Issuer()
    yield server
    server.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_auth(clock: Clock) -> Iterator[Any]:
    made: list[ControlPlaneAuth] = []

    def make(**config: Any) -> ControlPlaneAuth:
        auth = ControlPlaneAuth(GatewayConfig(**config), jwks_retry_secs=30.0, clock=clock)
        made.append(auth)
        return auth

    yield make
    for auth in made:
        auth.close()


@pytest.fixture
def jwt_auth(make_auth: Any, issuer: Issuer) -> ControlPlaneAuth:
    return make_auth(control_plane_api_keys=CP_KEYS, jwt_issuer=issuer.url, jwt_audience=AUDIENCE, **CLIENT_KEYS)


def denied(auth: ControlPlaneAuth, authorization: str | None) -> ControlPlaneDenied:
    with pytest.raises(ControlPlaneDenied) as caught:
        auth.authenticate(authorization)
    return caught.value


def admitted(auth: ControlPlaneAuth, authorization: str | None) -> Principal:
    principal = auth.authenticate(authorization)
    auth.authorize(principal)
    return principal


def forbidden(auth: ControlPlaneAuth, authorization: str | None) -> ControlPlaneDenied:
    principal = auth.authenticate(authorization)
    with pytest.raises(ControlPlaneDenied) as caught:
        auth.authorize(principal)
    assert caught.value.status == 403
    return caught.value


# --- with control-plane auth configured -----------------------------------------------------------


def test_admin_control_plane_key_is_admitted(make_auth: Any) -> None:
    auth = make_auth(control_plane_api_keys=CP_KEYS, **CLIENT_KEYS)
    assert admitted(auth, bearer(ADMIN_KEY)) == Principal("ops", "Ops team", "admin", "control_plane_key")


def test_non_admin_control_plane_key_gets_403(make_auth: Any) -> None:
    auth = make_auth(control_plane_api_keys=CP_KEYS, **CLIENT_KEYS)
    assert auth.authenticate(bearer(USER_KEY)).role == "user"
    assert "user" in forbidden(auth, bearer(USER_KEY)).message


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic b3BzOnB3", ADMIN_KEY, bearer("nope"),
                                    bearer(SHARED_KEY), bearer(ALICE.key), bearer(ADMIN_KEY + "x")])
def test_configured_refuses_missing_unknown_shared_and_tenant_keys(make_auth: Any, header: str | None) -> None:
    auth = make_auth(control_plane_api_keys=CP_KEYS, **CLIENT_KEYS)
    assert denied(auth, header).status == 401


def test_jwt_only_configuration_refuses_the_shared_key(make_auth: Any, issuer: Issuer) -> None:
    auth = make_auth(jwt_issuer=issuer.url, jwt_audience=AUDIENCE, **CLIENT_KEYS)
    assert denied(auth, bearer(SHARED_KEY)).status == 401
    assert denied(auth, bearer(ALICE.key)).status == 401
    assert admitted(auth, bearer(issuer.token())).method == "jwt"


def test_bearer_scheme_is_case_insensitive(make_auth: Any) -> None:
    auth = make_auth(control_plane_api_keys=CP_KEYS)
    assert admitted(auth, f"bearer  {ADMIN_KEY} ").id == "ops"


# --- without control-plane auth -------------------------------------------------------------------


def test_unconfigured_accepts_only_the_shared_key(make_auth: Any) -> None:
    auth = make_auth(**CLIENT_KEYS)
    assert admitted(auth, bearer(SHARED_KEY)) == Principal("shared", "shared", "admin", "shared_key")
    for header in (bearer(ALICE.key), bearer("nope"), None, bearer(ADMIN_KEY)):
        assert denied(auth, header).status == 401


def test_tenant_keys_without_shared_key_refuse_everything(make_auth: Any) -> None:
    auth = make_auth(tenant_api_keys=((ALICE.tenant_id, ALICE.key),))
    for header in (bearer(ALICE.key), bearer(SHARED_KEY), None, ""):
        assert denied(auth, header).status == 401


@pytest.mark.parametrize("header", [None, "", bearer("anything"), "Basic xyz"])
def test_no_keys_at_all_leaves_the_control_plane_open(make_auth: Any, header: str | None) -> None:
    principal = admitted(make_auth(), header)
    assert principal.method == "open" and principal.role == "admin"


def test_principal_looks_authenticated_to_drf() -> None:
    assert Principal("a", "b", "admin", "jwt").is_authenticated is True


# --- JWTs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kid", "alg"), [("rsa-1", "RS256"), ("rsa-1", "RS384"), ("rsa-1", "RS512"),
                                          ("rsa-1", "PS256"), ("ec-256", "ES256"), ("ec-384", "ES384")])
def test_admin_jwt_is_admitted(jwt_auth: ControlPlaneAuth, issuer: Issuer, kid: str, alg: str) -> None:
    principal = admitted(jwt_auth, bearer(issuer.token(kid=kid, alg=alg)))
    assert principal == Principal("user-42", "Ada", "admin", "jwt")


def test_jwt_with_another_role_gets_403(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    forbidden(jwt_auth, bearer(issuer.token(role="user")))


def test_jwt_without_a_role_gets_403(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    forbidden(jwt_auth, bearer(issuer.token(role=None)))


def test_role_claim_may_be_a_list(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    assert admitted(jwt_auth, bearer(issuer.token(role=["viewer", "admin"]))).role == "admin"
    forbidden(jwt_auth, bearer(issuer.token(role=["viewer", "auditor"])))


def test_role_claim_name_is_configurable_and_may_be_nested(make_auth: Any, issuer: Issuer) -> None:
    auth = make_auth(jwt_issuer=issuer.url, jwt_audience=AUDIENCE, jwt_role_claim="realm_access.roles")
    assert admitted(auth, bearer(issuer.token(role=None, realm_access={"roles": ["admin"]}))).role == "admin"
    forbidden(auth, bearer(issuer.token(role="admin")))  # the top-level "role" is not the configured claim
    groups = make_auth(jwt_issuer=issuer.url, jwt_audience=AUDIENCE, jwt_role_claim="groups")
    assert admitted(groups, bearer(issuer.token(role=None, groups="admin"))).role == "admin"


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"aud": "someone-else"}, "audience"),
        ({"iss": "https://evil.example"}, "issuer"),
        ({"exp": int(time.time()) - 120}, "expired"),
        ({"nbf": int(time.time()) + 600}, "not yet valid"),
        ({"exp": None}, "exp"),
        ({"aud": None}, "aud"),
    ],
)
def test_jwt_with_bad_claims_gets_401(jwt_auth: ControlPlaneAuth, issuer: Issuer, claims: dict, reason: str) -> None:
    refusal = denied(jwt_auth, bearer(issuer.token(**claims)))
    assert refusal.status == 401 and reason in refusal.message


def test_small_clock_skew_is_tolerated(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    admitted(jwt_auth, bearer(issuer.token(exp=int(time.time()) - 5)))


def test_issuer_with_trailing_slash_and_audience_list_are_accepted(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    admitted(jwt_auth, bearer(issuer.token(iss=issuer.url + "/", aud=["other", AUDIENCE])))


def test_jwt_with_bad_signature_gets_401(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    forged = issuer.token(key=rsa.generate_private_key(public_exponent=65537, key_size=2048))  # claims kid rsa-1
    assert "signature" in denied(jwt_auth, bearer(forged)).message
    head, payload, signature = issuer.token().split(".")
    tampered = _b64(json.dumps({**json.loads(base64.urlsafe_b64decode(payload + "==")), "role": "admin",
                                "sub": "mallory"}).encode())
    assert denied(jwt_auth, bearer(f"{head}.{tampered}.{signature}")).status == 401


def test_jwt_without_kid_is_checked_against_every_suitable_key(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    assert admitted(jwt_auth, bearer(issuer.token(kid=None, key=issuer.private["ec-256"], alg="ES256"))).role == "admin"
    stranger = ec.generate_private_key(ec.SECP256R1())
    assert denied(jwt_auth, bearer(issuer.token(kid=None, key=stranger, alg="ES256"))).status == 401


def test_alg_none_is_rejected(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    claims = jwt.decode(issuer.token(), options={"verify_signature": False})
    unsigned = jwt.encode(claims, None, algorithm="none", headers={"kid": "rsa-1"})
    assert denied(jwt_auth, bearer(unsigned)).message == "token algorithm is not accepted"
    head = _b64(json.dumps({"alg": "None", "kid": "rsa-1"}).encode())
    assert denied(jwt_auth, bearer(f"{head}.{unsigned.split('.')[1]}.")).status == 401


def test_hmac_signed_with_the_public_key_is_rejected(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    public_pem = issuer.private["rsa-1"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    claims = jwt.decode(issuer.token(), options={"verify_signature": False})
    signing_input = f"{_b64(json.dumps({'alg': 'HS256', 'kid': 'rsa-1', 'typ': 'JWT'}).encode())}." \
                    f"{_b64(json.dumps(claims).encode())}"
    signature = _b64(hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest())
    assert denied(jwt_auth, bearer(f"{signing_input}.{signature}")).status == 401


def test_symmetric_keys_in_the_jwks_are_ignored(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    secret = b"a-shared-secret-that-is-long-enough-for-hs256"
    issuer.extra_jwks.append({"kty": "oct", "kid": "hmac", "k": _b64(secret), "alg": "HS256"})
    assert denied(jwt_auth, bearer(issuer.token(kid="hmac", alg="HS256", key=secret))).status == 401


def test_algorithm_must_fit_the_key_type(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    # an ES384 token naming the P-256 key, and an RS256 token naming an EC key
    assert denied(jwt_auth, bearer(issuer.token(kid="ec-256", alg="ES384", key=issuer.private["ec-384"]))).status == 401
    assert denied(jwt_auth, bearer(issuer.token(kid="ec-256", alg="RS256", key=issuer.private["rsa-1"]))).status == 401


def test_garbage_tokens_get_401(jwt_auth: ControlPlaneAuth) -> None:
    for token in ("not-a-jwt", "a.b.c", "eyJhbGciOlsiUlMyNTYiXX0.e30.", "é"):
        assert denied(jwt_auth, bearer(token)).status == 401


# --- the JWKS cache -------------------------------------------------------------------------------


def test_jwks_is_discovered_once_and_cached(jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    for _ in range(3):
        admitted(jwt_auth, bearer(issuer.token()))
    assert issuer.requests == ["/.well-known/openid-configuration", "/jwks"]


def test_unknown_kid_refetches_the_rotated_jwks(jwt_auth: ControlPlaneAuth, issuer: Issuer, clock: Clock) -> None:
    admitted(jwt_auth, bearer(issuer.token()))
    issuer.add_key("rsa-2")
    rotated = issuer.token(kid="rsa-2")
    # within the retry interval the JWKS is not fetched again, whatever kids tokens name
    assert denied(jwt_auth, bearer(rotated)).message == "token signing key is unknown"
    assert denied(jwt_auth, bearer(issuer.token(kid="made-up"))).status == 401
    assert issuer.requests.count("/jwks") == 1
    clock.now += 31
    assert denied(jwt_auth, bearer(rotated)).status == 401  # refetched, but not published yet
    issuer.published.append("rsa-2")
    assert denied(jwt_auth, bearer(rotated)).status == 401  # backoff again
    clock.now += 31
    assert admitted(jwt_auth, bearer(rotated)).role == "admin"
    assert admitted(jwt_auth, bearer(issuer.token())).role == "admin"  # old key still published
    assert issuer.requests.count("/jwks") == 3


def test_stale_jwks_is_refetched_and_removed_keys_stop_working(make_auth: Any, issuer: Issuer, clock: Clock) -> None:
    auth = make_auth(jwt_issuer=issuer.url, jwt_audience=AUDIENCE)
    admitted(auth, bearer(issuer.token(kid="ec-256", alg="ES256")))
    issuer.published.remove("ec-256")
    clock.now += 3601
    assert denied(auth, bearer(issuer.token(kid="ec-256", alg="ES256"))).status == 401
    admitted(auth, bearer(issuer.token()))


def test_jwks_unreachable_keeps_keys_working_then_recovers(
    jwt_auth: ControlPlaneAuth, issuer: Issuer, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="administration.control_auth")
    issuer.available = False
    token = issuer.token()
    assert denied(jwt_auth, bearer(token)).message == "token verification is unavailable"
    assert admitted(jwt_auth, bearer(ADMIN_KEY)).id == "ops"
    assert denied(jwt_auth, bearer(token)).status == 401
    assert issuer.requests == ["/.well-known/openid-configuration"]  # no retry within the backoff
    clock.now += 31
    assert denied(jwt_auth, bearer(token)).status == 401  # retried, still down
    assert len(issuer.requests) == 2
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()  # logged once
    issuer.available = True
    assert denied(jwt_auth, bearer(token)).status == 401  # the backoff still holds
    clock.now += 31
    assert admitted(jwt_auth, bearer(token)).method == "jwt"
    assert "loaded" in caplog.records[-1].getMessage()
    for record in caplog.records:
        text = record.getMessage()
        assert token not in text and ADMIN_KEY not in text and SHARED_KEY not in text


def test_issuer_that_does_not_listen_gives_401_to_tokens_only(make_auth: Any, issuer: Issuer) -> None:
    auth = make_auth(control_plane_api_keys=CP_KEYS, jwt_issuer="http://127.0.0.1:9", jwt_audience=AUDIENCE)
    assert denied(auth, bearer(issuer.token())).status == 401
    assert admitted(auth, bearer(ADMIN_KEY)).method == "control_plane_key"


def test_jwks_uri_flag_skips_discovery(make_auth: Any, issuer: Issuer) -> None:
    auth = make_auth(jwt_issuer=issuer.url, jwt_audience=AUDIENCE, jwt_jwks_uri=f"{issuer.url}/other-jwks")
    admitted(auth, bearer(issuer.token()))
    assert issuer.requests == ["/other-jwks"]


# --- secrets stay out -----------------------------------------------------------------------------


def test_keys_and_tokens_never_appear_in_reprs_or_errors(
    jwt_auth: ControlPlaneAuth, issuer: Issuer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = issuer.token(aud="someone-else")
    messages = [denied(jwt_auth, bearer(h)).message for h in (SHARED_KEY, ALICE.key, token, "sk-guess")]
    messages.append(forbidden(jwt_auth, bearer(USER_KEY)).message)
    texts = [repr(jwt_auth), repr(jwt_auth.__dict__), repr(jwt_auth.config), caplog.text, *messages]
    for secret in (ADMIN_KEY, USER_KEY, SHARED_KEY, ALICE.key, token, "sk-guess"):
        assert not any(secret in text for text in texts)


# --- the process-wide instance --------------------------------------------------------------------


@pytest.fixture
def restore_config() -> Iterator[None]:
    previous = current_config()
    yield
    install_config(previous, export=False)
    reset_control_plane_auth()


def test_process_instance_follows_the_installed_config(restore_config: None, make_auth: Any) -> None:
    install_config(GatewayConfig(api_key=SHARED_KEY), export=False)
    first = control_plane_auth()
    assert control_plane_auth() is first and first.authenticate(bearer(SHARED_KEY)).method == "shared_key"
    install_config(GatewayConfig(control_plane_api_keys=CP_KEYS), export=False)
    assert control_plane_auth() is not first
    assert control_plane_auth().authenticate(bearer(ADMIN_KEY)).id == "ops"
    pinned = make_auth()
    reset_control_plane_auth(pinned)
    assert control_plane_auth() is pinned
    reset_control_plane_auth()
    assert control_plane_auth() is not pinned


# --- the DRF adapters -----------------------------------------------------------------------------


class WhoAmI(APIView):
    authentication_classes = [ControlPlaneAuthentication]
    permission_classes = [IsControlPlaneAdmin]

    def get(self, request: Any) -> Response:
        return Response({"id": request.user.id, "method": request.user.method})


REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "administration.api.errors.exception_handler",
}


@pytest.fixture
def call_view(restore_config: None) -> Iterator[Any]:
    def call(authorization: str | None = None) -> Any:
        headers = {"HTTP_AUTHORIZATION": authorization} if authorization is not None else {}
        response = WhoAmI.as_view()(APIRequestFactory().get("/workers", **headers))
        response.render()
        return response

    with override_settings(REST_FRAMEWORK=REST_FRAMEWORK):
        yield call


def use(auth: ControlPlaneAuth) -> None:
    install_config(auth.config, export=False)
    reset_control_plane_auth(auth)


def test_drf_admits_an_admin(call_view: Any, jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    use(jwt_auth)
    assert call_view(bearer(ADMIN_KEY)).data == {"id": "ops", "method": "control_plane_key"}
    assert call_view(bearer(issuer.token())).data == {"id": "user-42", "method": "jwt"}


@pytest.mark.parametrize("header", [None, bearer("nope"), bearer(SHARED_KEY)])
def test_drf_answers_401_in_the_admin_envelope(call_view: Any, jwt_auth: ControlPlaneAuth, header: str | None) -> None:
    use(jwt_auth)
    response = call_view(header)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    body = json.loads(response.content)
    assert body["error"]["type"] == "unauthorized" and set(body["error"]) == {"message", "type"}


def test_drf_answers_403_to_a_non_admin(call_view: Any, jwt_auth: ControlPlaneAuth, issuer: Issuer) -> None:
    use(jwt_auth)
    for header in (bearer(USER_KEY), bearer(issuer.token(role="user"))):
        response = call_view(header)
        assert response.status_code == 403
        assert json.loads(response.content)["error"]["type"] == "forbidden"


def test_drf_open_and_shared_key_modes(call_view: Any, make_auth: Any) -> None:
    use(make_auth())
    assert call_view().data == {"id": "anonymous", "method": "open"}
    use(make_auth(**CLIENT_KEYS))
    assert call_view(bearer(SHARED_KEY)).data["method"] == "shared_key"
    assert call_view(bearer(ALICE.key)).status_code == 401


def test_other_errors_are_left_to_drf() -> None:
    response = exception_handler(exceptions.ValidationError({"url": ["required"]}), {})
    assert response is not None and response.status_code == 400 and response.data == {"url": ["required"]}
    assert exception_handler(ValueError("boom"), {}) is None
    from django.core.exceptions import PermissionDenied

    response = exception_handler(PermissionDenied("no"), {})
    assert response is not None and response.status_code == 403
    assert response.data == {"error": {"message": "no", "type": "forbidden"}}
