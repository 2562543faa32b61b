"""TLS, both ways, built in one place (docs/DECISIONS.md D75).

The listener (``--tls-cert-path``, ``--tls-key-path``): :func:`server_certificate` holds the chain
each serving process presents, for uvicorn as a standard-library context (:meth:`ServerCertificate.
ssl_context`) and for daphne as a Twisted endpoint whose connections take pyOpenSSL's
(:meth:`ServerCertificate.twisted_endpoint`). When the files change a new context is built, and new
connections get it (uvicorn: the context's server-name callback, which OpenSSL calls for every
handshake, with or without SNI, hands the connection the newest context; daphne: each connection asks
for the newest). A chain that fails to load (a half-written file, a key of another certificate) is
logged and the last good one kept; the next check tries again.

Towards workers (``--ca-cert-paths``, ``--client-cert-path``, ``--client-key-path``): one client
context per process (:func:`client_context`: the public roots, the CA bundles, the client chain)
shared by every HTTP client that talks to workers (the relay's aiohttp sessions, the health and load
probes, the control plane's httpx clients), and gRPC channel credentials made from the same files
(:func:`grpc_credentials`). A changed client chain is loaded into that one context in place, from
bytes read once and checked on a scratch context first, so a handshake never sees half of it; a
changed CA bundle adds its certificates (one removed from a bundle stays trusted until a restart).
gRPC credentials cannot change under a channel: :func:`generation` tells the channel builder to
open a new channel for new calls.

:func:`watch` checks the files' modification stamps every :data:`CHECK_SECS` on the serving
process's event loop, outside any request. :func:`check_files` is start-up's check: a missing or
unreadable file, one without PEM certificates or key, an encrypted key or a key that does not match
its certificate is a :class:`~common.config.ConfigError` naming the flag and the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

import certifi
import httpx

from common.config import ConfigError, GatewayConfig, current_config

if TYPE_CHECKING:
    import grpc

__all__ = [
    "CHECK_SECS", "ServerCertificate", "check_files", "client_context", "generation", "grpc_credentials",
    "refresh", "reset", "server_certificate", "watch",
]  # fmt: skip

log = logging.getLogger("common.tls")

CHECK_SECS = 2.0
"""How often the certificate files' stamps are compared (a stat per file)."""

_Stamp = tuple[tuple[int, int, int], ...]  # per file: inode, size, modification time (ns)


def _stamp(paths: tuple[str, ...]) -> _Stamp | None:
    try:
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in (os.stat(path) for path in paths))
    except OSError:
        return None  # a file being replaced: compared again at the next check


class _Encrypted(Exception):
    pass


def _no_password() -> NoReturn:
    raise _Encrypted()


def _read(flag: str, path: str, marker: bytes, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot be read ({exc.strerror or exc})") from None
    if b"-----BEGIN " not in data or marker not in data:
        raise ConfigError(f"{flag} {path}: no PEM {what} in it")
    return data


@contextlib.contextmanager
def _as_files(*contents: bytes) -> Iterator[list[str]]:
    """Paths holding ``contents`` (OpenSSL's loaders read paths), never on disk where the kernel can
    make anonymous files (Linux); else in a private temporary directory, removed after."""
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create("gw-tls", 0) for _ in contents]
        try:
            for fd, data in zip(fds, contents):
                os.write(fd, data)
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="gw-tls-") as folder:
        paths = []
        for index, data in enumerate(contents):
            path = os.path.join(folder, str(index))
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out:
                out.write(data)
            paths.append(path)
        yield paths


def _load_chain(context: ssl.SSLContext, flags: tuple[str, str], paths: tuple[str, str],
                chain: bytes, key: bytes) -> None:  # fmt: skip
    """Load a certificate chain and its key (bytes read from ``paths``) into ``context``."""
    with _as_files(chain, key) as (chain_file, key_file):
        try:
            context.load_cert_chain(chain_file, key_file, password=_no_password)
        except _Encrypted:
            raise ConfigError(f"{flags[1]} {paths[1]}: the key is encrypted (give it unencrypted)") from None
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise ConfigError(f"{flags[1]} {paths[1]}: the key does not match the certificate {paths[0]}") from None
            raise ConfigError(
                f"{flags[0]} {paths[0]} and {flags[1]} {paths[1]}: cannot be loaded ({exc.reason or exc})"
            ) from None


def _server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    chain = _read("--tls-cert-path", cert_path, b"CERTIFICATE-----", "certificate")
    key = _read("--tls-key-path", key_path, b"PRIVATE KEY-----", "private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, ("--tls-cert-path", "--tls-key-path"), (cert_path, key_path), chain, key)
    return context


def _twisted_context(cert_path: str, key_path: str) -> Any:
    """The listener's pyOpenSSL context (daphne), with the same checks as the standard library's."""
    from OpenSSL import SSL

    _server_context(cert_path, key_path)  # the checks and their messages
    context = SSL.Context(SSL.TLS_SERVER_METHOD)
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    context.set_options(SSL.OP_NO_COMPRESSION)
    context.set_passwd_cb(lambda *_: b"")
    try:
        context.use_certificate_chain_file(cert_path)
        context.use_privatekey_file(key_path)
        context.check_privatekey()
    except SSL.Error as exc:  # the files changed since the check
        raise ConfigError(f"--tls-cert-path {cert_path} and --tls-key-path {key_path}: cannot be loaded ({exc})") from None
    return context


class ServerCertificate:
    """The listener's certificate chain in this process: the newest that loaded."""

    def __init__(self, cert_path: str, key_path: str) -> None:
        self.paths = (cert_path, key_path)
        self._stamp = _stamp(self.paths)
        self._refused: _Stamp | None = None
        self._stdlib: ssl.SSLContext | None = None
        self._front: ssl.SSLContext | None = None
        self._twisted: Any = None
        self.reloads = 0  # chains loaded after the first

    def ssl_context(self) -> ssl.SSLContext:
        """The listener's context (uvicorn): the first chain, handing each handshake the newest."""
        if self._front is None:
            front = self._stdlib = _server_context(*self.paths)

            def newest(connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
                if self._stdlib is not None and self._stdlib is not front:
                    connection.context = self._stdlib

            front.sni_callback = newest
            self._front = front
        return self._front

    def twisted_endpoint(self, reactor: Any, host: str, port: int, fd: int | None) -> Any:
        """The listening endpoint for daphne: on ``host``:``port``, or on the inherited socket ``fd``;
        every connection it accepts takes the newest chain."""
        from twisted.internet import endpoints
        from twisted.internet import ssl as twisted_ssl
        from twisted.internet.interfaces import IOpenSSLServerConnectionCreator, IStreamServerEndpoint
        from twisted.internet.defer import execute
        from zope.interface import implementer  # type: ignore[import-untyped]
        from OpenSSL import SSL

        self._twisted = _twisted_context(*self.paths)
        certificate = self

        @implementer(IOpenSSLServerConnectionCreator)
        class Newest:
            def serverConnectionForTLS(self, protocol: Any) -> Any:
                return SSL.Connection(certificate._twisted, None)

        if fd is None:
            return endpoints.SSL4ServerEndpoint(reactor, port, Newest(), backlog=2048, interface=host)
        inherited = fd

        @implementer(IStreamServerEndpoint)
        class Adopted:
            """A TLS port on the listening socket the supervisor bound (Twisted adopts plain ones only)."""

            def listen(self, factory: Any) -> Any:
                def start() -> Any:
                    sock = socket.socket(fileno=os.dup(inherited))
                    sock.setblocking(False)
                    listening = twisted_ssl.Port(None, factory, Newest(), 2048, sock.getsockname()[0], reactor)
                    listening.addressFamily = sock.family
                    listening._preexistingSocket = sock
                    listening.startListening()
                    return listening

                return execute(start)

        return Adopted()

    def refresh(self) -> bool:
        """Load the files again if they changed since the last load; True when a new chain loaded."""
        stamp = _stamp(self.paths)
        if stamp is None or stamp == self._stamp or stamp == self._refused:
            return False
        try:
            if self._front is not None:
                self._stdlib = _server_context(*self.paths)
            if self._twisted is not None:
                self._twisted = _twisted_context(*self.paths)
        except ConfigError as exc:
            self._refused = stamp
            log.warning("listener certificate not reloaded, the previous one stays: %s", exc)
            return False
        self._stamp, self._refused = stamp, None
        self.reloads += 1
        log.info("listener certificate reloaded from %s", self.paths[0])
        return True


class _ClientTls:
    """What the gateway trusts and shows towards workers, and the one context that carries it."""

    def __init__(self, config: GatewayConfig) -> None:
        self.ca_paths = config.ca_cert_paths
        self.chain_paths: tuple[str, str] | None = (
            (config.client_cert_path, config.client_key_path)
            if config.client_cert_path and config.client_key_path else None
        )  # fmt: skip
        self.context = httpx.create_ssl_context()  # certifi's roots, verification and host names checked
        self.roots: list[bytes] = []
        self.chain: tuple[bytes, bytes] | None = None
        self.generation = 0
        self._stamps: dict[tuple[str, ...], _Stamp | None] = {}
        self._refused: dict[tuple[str, ...], _Stamp] = {}
        for path in self.ca_paths:
            self._stamps[(path,)] = _stamp((path,))
            self.roots.append(self._add_roots(self.context, path))
        if self.chain_paths is not None:
            self._stamps[self.chain_paths] = _stamp(self.chain_paths)
            self.chain = self._load_client_chain(self.context)

    @staticmethod
    def _add_roots(context: ssl.SSLContext, path: str) -> bytes:
        data = _read("--ca-cert-paths", path, b"CERTIFICATE-----", "certificate")
        try:
            context.load_verify_locations(cadata=data.decode("ascii", "replace"))
        except ssl.SSLError as exc:
            raise ConfigError(f"--ca-cert-paths {path}: cannot be loaded ({exc.reason or exc})") from None
        return data

    def _load_client_chain(self, context: ssl.SSLContext) -> tuple[bytes, bytes]:
        assert self.chain_paths is not None
        cert_path, key_path = self.chain_paths
        chain = _read("--client-cert-path", cert_path, b"CERTIFICATE-----", "certificate")
        key = _read("--client-key-path", key_path, b"PRIVATE KEY-----", "private key")
        flags = ("--client-cert-path", "--client-key-path")
        _load_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), flags, self.chain_paths, chain, key)  # checked first
        _load_chain(context, flags, self.chain_paths, chain, key)
        return chain, key

    def refresh(self) -> bool:
        changed = False
        for paths in list(self._stamps):
            stamp = _stamp(paths)
            if stamp is None or stamp == self._stamps[paths] or stamp == self._refused.get(paths):
                continue
            try:
                if paths == self.chain_paths:
                    self.chain = self._load_client_chain(self.context)
                else:
                    self.roots[self.ca_paths.index(paths[0])] = self._add_roots(self.context, paths[0])
            except ConfigError as exc:
                self._refused[paths] = stamp
                log.warning("worker TLS file not reloaded, the previous one stays: %s", exc)
                continue
            self._stamps[paths] = stamp
            self._refused.pop(paths, None)
            changed = True
            log.info("worker TLS reloaded from %s", paths[0])
        if changed:
            self.generation += 1
        return changed


_server: ServerCertificate | None = None
_client: _ClientTls | None = None
_grpc: tuple[int, Any] | None = None
_lock = threading.Lock()


def server_certificate(config: GatewayConfig) -> ServerCertificate | None:
    """This process's listener certificate (None without --tls-cert-path)."""
    global _server
    if not (config.tls_cert_path and config.tls_key_path):
        return None
    if _server is None or _server.paths != (config.tls_cert_path, config.tls_key_path):
        _server = ServerCertificate(config.tls_cert_path, config.tls_key_path)
    return _server


def _client_tls() -> _ClientTls:
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                _client = _ClientTls(current_config())
    return _client


def client_context() -> ssl.SSLContext:
    """The one TLS context of every HTTP client to workers in this process (made on first use)."""
    return _client_tls().context


def generation() -> int:
    """How many times the worker TLS files were reloaded in this process."""
    return _client.generation if _client is not None else 0


def grpc_credentials() -> grpc.ChannelCredentials:
    """grpcs:// channel credentials: the public roots and the CA bundles, the client chain."""
    global _grpc
    import grpc

    tls = _client_tls()
    if _grpc is None or _grpc[0] != tls.generation:
        roots = b"".join([Path(certifi.where()).read_bytes(), *tls.roots]) if tls.roots else None
        key, chain = (tls.chain[1], tls.chain[0]) if tls.chain is not None else (None, None)
        _grpc = (tls.generation, grpc.ssl_channel_credentials(roots, key, chain))
    return _grpc[1]


def check_files(config: GatewayConfig) -> None:
    """Start-up: every TLS file the flags name loads (ConfigError naming the flag and file if not)."""
    if config.tls_cert_path and config.tls_key_path:
        _server_context(config.tls_cert_path, config.tls_key_path)
    _ClientTls(config)


def reset() -> None:
    """Forget this process's TLS state: the next use builds it from the installed configuration
    (tests, which install one configuration after another)."""
    global _server, _client, _grpc
    _server = _client = _grpc = None


def refresh() -> None:
    """Reload what changed (the listener's chain, the worker TLS files)."""
    if _server is not None:
        _server.refresh()
    if _client is not None:
        _client.refresh()


async def watch(interval_secs: float = CHECK_SECS) -> None:
    """Reload changed certificate files every ``interval_secs`` until cancelled."""
    while True:
        await asyncio.sleep(interval_secs)
        try:
            refresh()
        except Exception:  # never stop checking: a file system error is retried next time
            log.exception("checking the TLS files failed")
