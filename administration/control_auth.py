"""Who may call the control plane (spec 3, Authentication): the domain side, free of Django and DRF.

With control-plane auth configured (``--control-plane-api-keys``, or ``--jwt-issuer`` with
``--jwt-audience``) a caller presents a control-plane API key or a JWT signed by a key of the issuer's
JWKS; the shared ``--api-key`` is then refused. Otherwise only the shared ``--api-key`` is accepted, and
a gateway with no client keys at all leaves the control plane open. Tenant keys never pass.

Keys are held as SHA-256 digests (:class:`common.secrets.DigestTable`), so no key reaches a log, an
error or a repr. The JWKS is discovered from ``{issuer}/.well-known/openid-configuration`` unless
``--jwt-jwks-uri`` names it, fetched with httpx and cached; a token naming an unknown ``kid`` refetches
it, at most once per ``jwks_retry_secs``. While the JWKS cannot be loaded, control-plane keys keep
working and every other token gets 401.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit, urlunsplit

import httpx
import jwt

from common.secrets import DigestTable, bearer_token, header_bytes
from common.config import GatewayConfig, current_config

__all__ = [
    "ALGORITHMS",
    "ControlPlaneAuth",
    "ControlPlaneDenied",
    "Principal",
    "control_plane_auth",
    "reset_control_plane_auth",
]

logger = logging.getLogger(__name__)

ADMIN = "admin"
#: Signature algorithms accepted, chosen by the JWKS key type; never ``none``, never HS*.
ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "ES256", "ES384"})
_RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256"})
_EC_ALGORITHMS = {"P-256": frozenset({"ES256"}), "P-384": frozenset({"ES384"})}

JWKS_RETRY_SECS = 30.0  # least time between two JWKS fetches (unknown kid, or JWKS unavailable)
JWKS_MAX_AGE_SECS = 3600.0  # a cached JWKS older than this is refetched (removed keys stop working)
LEEWAY_SECS = 30.0  # clock skew allowed on exp / nbf / iat
_HTTP_TIMEOUT = httpx.Timeout(5.0, connect=2.0)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated control-plane caller. ``method``: control_plane_key, jwt, shared_key or open."""

    id: str
    name: str
    role: str
    method: str

    @property
    def is_authenticated(self) -> bool:  # what DRF and Django expect of ``request.user``
        return True


OPEN = Principal("anonymous", "anonymous", ADMIN, "open")
SHARED_KEY = Principal("shared", "shared", ADMIN, "shared_key")


class ControlPlaneDenied(Exception):
    """401 (no or an invalid credential) or 403 (a valid credential whose role does not allow it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _unauthorized(message: str = "invalid credential") -> ControlPlaneDenied:
    return ControlPlaneDenied(401, message)


class ControlPlaneAuth:
    """Authenticates control-plane requests for one :class:`GatewayConfig`. Thread-safe."""

    def __init__(
        self,
        config: GatewayConfig,
        http: httpx.Client | None = None,
        *,
        jwks_retry_secs: float = JWKS_RETRY_SECS,
        jwks_max_age_secs: float = JWKS_MAX_AGE_SECS,
        leeway_secs: float = LEEWAY_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.configured = config.control_plane_auth_enabled
        self._keys: DigestTable[Principal] = DigestTable()
        self._jwt: _JwtVerifier | None = None
        if self.configured:
            for key_id, name, role, key in config.control_plane_api_keys:
                self._keys.add(key, Principal(key_id, name, role, "control_plane_key"))
            if config.jwt_issuer and config.jwt_audience:
                self._jwt = _JwtVerifier(
                    config.jwt_issuer, config.jwt_audience, config.jwt_jwks_uri, config.jwt_role_claim, http,
                    retry_secs=jwks_retry_secs, max_age_secs=jwks_max_age_secs, leeway_secs=leeway_secs, clock=clock,
                )
        elif config.api_key:
            self._keys.add(config.api_key, SHARED_KEY)
        # Unconfigured, with tenant keys but no --api-key: the table stays empty and every call is 401.
        self.open = not self.configured and not config.auth_enabled

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind an ``Authorization`` header value. Raises :class:`ControlPlaneDenied` (401)."""
        if self.open:
            return OPEN
        token = bearer_token(header_bytes(authorization))
        if token is None:
            raise _unauthorized("missing bearer credential")
        principal = self._keys.find(token)
        if principal is not None:
            return principal
        if self._jwt is not None:
            return self._jwt.verify(token)
        raise _unauthorized()

    def authorize(self, principal: Principal, action: str = ADMIN) -> None:
        """Raise :class:`ControlPlaneDenied` (403) unless ``principal`` may perform ``action``.

        Every control-plane action needs the admin role; roles other than admin are not given rights.
        """
        if principal.role != ADMIN:
            who = f"role {principal.role!r}" if principal.role else "a credential without a role"
            raise ControlPlaneDenied(403, f"{who} may not perform {action!r}")

    def close(self) -> None:
        if self._jwt is not None:
            self._jwt.close()

    def __repr__(self) -> str:
        mode = "open" if self.open else "control-plane" if self.configured else "shared-key"
        return f"<ControlPlaneAuth {mode}: {len(self._keys)} keys, jwt={'on' if self._jwt else 'off'}>"


# --- JWT -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _SigningKey:
    kid: str | None
    key: Any  # a cryptography public key
    algorithms: frozenset[str]


class _JwksUnavailable(Exception):
    pass


class _JwtVerifier:
    """Verifies issuer-signed JWTs against a cached JWKS; fetches it lazily, with a retry backoff."""

    def __init__(
        self, issuer: str, audience: str, jwks_uri: str | None, role_claim: str, http: httpx.Client | None, *,
        retry_secs: float, max_age_secs: float, leeway_secs: float, clock: Callable[[], float],
    ) -> None:
        self._issuer = issuer
        # The flag is stored without a trailing slash; some issuers (Auth0) put one in ``iss``.
        self._issuers = (issuer, issuer + "/")
        self._audience = audience
        self._jwks_uri_override = jwks_uri
        self._role_claim = role_claim
        self._http = http
        self._owns_http = http is None
        self._retry_secs = retry_secs
        self._max_age_secs = max_age_secs
        self._leeway = leeway_secs
        self._clock = clock
        self._lock = threading.Lock()
        self._jwks_uri: str | None = jwks_uri
        self._signing_keys: tuple[_SigningKey, ...] | None = None
        self._loaded_at = 0.0
        self._next_fetch_at = float("-inf")
        self._failing = False

    def verify(self, token: bytes) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise _unauthorized() from None
        algorithm = header.get("alg")
        kid = header.get("kid")
        if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
            raise _unauthorized("token algorithm is not accepted")
        if kid is not None and not isinstance(kid, str):
            raise _unauthorized()
        candidates = self._candidates(kid, algorithm)
        claims = self._decode(token, algorithm, candidates)
        return self._principal(claims)

    def _candidates(self, kid: str | None, algorithm: str) -> list[_SigningKey]:
        keys = self._signing_keys
        if keys is None or self._clock() - self._loaded_at >= self._max_age_secs:
            keys = self._refresh()
        if keys is None:
            raise _unauthorized("token verification is unavailable")
        found = _matching(keys, kid, algorithm)
        if not found and kid is not None and not any(k.kid == kid for k in keys):
            keys = self._refresh() or keys  # an unknown kid: the issuer may have rotated its keys
            found = _matching(keys, kid, algorithm)
        if not found:
            raise _unauthorized("token signing key is unknown")
        return found

    def _decode(self, token: bytes, algorithm: str, candidates: list[_SigningKey]) -> dict[str, Any]:
        for candidate in candidates:
            try:
                return jwt.decode(
                    token, key=candidate.key, algorithms=[algorithm], audience=self._audience,
                    issuer=self._issuers, leeway=self._leeway, options={"require": ["exp", "iss", "aud"]},
                )
            except jwt.InvalidSignatureError:
                continue  # without a kid, another key of the set may have signed it
            except jwt.PyJWTError as exc:
                logger.debug("control-plane JWT rejected: %s", type(exc).__name__)
                raise _unauthorized(_reason(exc)) from None
        logger.debug("control-plane JWT rejected: bad signature")
        raise _unauthorized("token signature is invalid")

    def _principal(self, claims: dict[str, Any]) -> Principal:
        roles = _roles(claims, self._role_claim)
        role = ADMIN if ADMIN in roles else (roles[0] if roles else "")
        subject = claims.get("sub")
        subject = subject if isinstance(subject, str) else ""
        name = next(
            (v for v in (claims.get(c) for c in ("name", "preferred_username", "client_id", "azp"))
             if isinstance(v, str) and v),
            subject,
        )
        return Principal(subject, name, role, "jwt")

    # --- the JWKS cache ---

    def _refresh(self) -> tuple[_SigningKey, ...] | None:
        """Fetch the JWKS unless a fetch was tried within the retry interval; the keys now cached."""
        with self._lock:
            now = self._clock()
            if now < self._next_fetch_at:
                return self._signing_keys
            self._next_fetch_at = now + self._retry_secs
            try:
                keys = self._load()
            except _JwksUnavailable as exc:
                if not self._failing:
                    self._failing = True
                    logger.warning(
                        "control-plane JWKS for issuer %s unavailable (%s); JWTs get 401 until it loads "
                        "(next try in %.0f s), control-plane keys keep working",
                        _safe_url(self._issuer), exc, self._retry_secs,
                    )
                return self._signing_keys
            if self._failing:
                logger.warning("control-plane JWKS for issuer %s loaded", _safe_url(self._issuer))
            self._failing = False
            self._signing_keys = keys
            self._loaded_at = now
            return keys

    def _load(self) -> tuple[_SigningKey, ...]:
        if self._jwks_uri is None:
            discovery = self._get_json(f"{self._issuer}/.well-known/openid-configuration", "discovery")
            uri = discovery.get("jwks_uri")
            if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
                raise _JwksUnavailable("discovery document has no jwks_uri")
            self._jwks_uri = uri
        try:
            jwks = self._get_json(self._jwks_uri, "JWKS")
        except _JwksUnavailable:
            if self._jwks_uri_override is None:
                self._jwks_uri = None  # discover again next time
            raise
        entries = jwks.get("keys")
        if not isinstance(entries, list):
            raise _JwksUnavailable("JWKS has no keys list")
        keys = tuple(k for k in map(_signing_key, entries) if k is not None)
        if not keys:
            raise _JwksUnavailable("JWKS has no usable signing key")
        return keys

    def _get_json(self, url: str, what: str) -> dict[str, Any]:
        if self._http is None:
            self._http = httpx.Client(timeout=_HTTP_TIMEOUT, follow_redirects=True)
        try:
            response = self._http.get(url, headers={"Accept": "application/json"})
            response.raise_for_status()
            data = response.json()
        except httpx.HTTPStatusError as exc:
            raise _JwksUnavailable(f"{what} answered {exc.response.status_code}") from None
        except httpx.HTTPError as exc:
            raise _JwksUnavailable(f"{what} fetch failed: {type(exc).__name__}") from None
        except ValueError:
            raise _JwksUnavailable(f"{what} is not JSON") from None
        if not isinstance(data, dict):
            raise _JwksUnavailable(f"{what} is not a JSON object")
        return data

    def close(self) -> None:
        if self._owns_http and self._http is not None:
            self._http.close()
            self._http = None


def _matching(keys: tuple[_SigningKey, ...], kid: str | None, algorithm: str) -> list[_SigningKey]:
    return [k for k in keys if algorithm in k.algorithms and (kid is None or k.kid == kid)]


def _signing_key(entry: object) -> _SigningKey | None:
    """A JWKS entry usable for signatures, with the algorithms its key type allows; else None."""
    if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
        return None
    kty, crv, declared = entry.get("kty"), entry.get("crv"), entry.get("alg")
    if kty == "RSA":
        algorithms = _RSA_ALGORITHMS
    elif kty == "EC" and isinstance(crv, str):
        algorithms = _EC_ALGORITHMS.get(crv, frozenset())
    else:
        return None  # oct (HMAC) and other key types are never accepted
    if declared is not None:
        algorithms = algorithms & {declared} if isinstance(declared, str) else frozenset()
    if not algorithms:
        return None
    try:
        key = jwt.PyJWK(entry, algorithm=min(algorithms)).key
    except jwt.PyJWTError:
        return None
    kid = entry.get("kid")
    return _SigningKey(kid if isinstance(kid, str) else None, key, algorithms)


def _roles(claims: dict[str, Any], claim: str) -> list[str]:
    """The role claim as a list of strings; a dotted name (``realm_access.roles``) walks nested objects."""
    value: Any = claims.get(claim)
    if value is None and "." in claim:
        value = claims
        for part in claim.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _reason(exc: jwt.PyJWTError) -> str:
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "token has expired"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "token is not yet valid"
    if isinstance(exc, jwt.InvalidAudienceError):
        return "token audience is not accepted"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "token issuer is not accepted"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"token lacks the {exc.claim} claim"
    return "invalid token"


def _safe_url(url: str) -> str:
    """``url`` without credentials, query or fragment, for logs."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", "")) if host else "?"


# --- the process-wide instance -------------------------------------------------------------------

_lock = threading.Lock()
_instance: ControlPlaneAuth | None = None
_pinned = False


def control_plane_auth() -> ControlPlaneAuth:
    """This process's :class:`ControlPlaneAuth`, built lazily from ``current_config()`` (and rebuilt
    when another config is installed, unless a test pinned one with :func:`reset_control_plane_auth`)."""
    global _instance
    config = current_config()
    instance = _instance
    if instance is not None and (_pinned or instance.config is config):
        return instance
    with _lock:
        if _instance is None or (not _pinned and _instance.config is not config):
            if _instance is not None:
                _instance.close()
            _instance = ControlPlaneAuth(config)
        return _instance


def reset_control_plane_auth(replacement: ControlPlaneAuth | None = None) -> None:
    """Forget the process-wide instance (tests); with ``replacement``, use that one until the next reset."""
    global _instance, _pinned
    with _lock:
        if _instance is not None and _instance is not replacement:
            _instance.close()
        _instance = replacement
        _pinned = replacement is not None
