"""TLS (common/tls.py, D75) with certificates made here: the flags, start-up's refusal of files that
do not load, the listener's chain reloaded for new connections, mutual TLS to an HTTP worker through
the relay, grpcs:// to the gRPC stand-in with a client certificate."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.core.management import CommandError, call_command

from common import tls
from common.config import ConfigError, parse_gateway_args
from inference.upstreams.grpc.channel import WorkerChannel
from inference.upstreams.grpc.detect import detect_runtime
from inference.upstreams.failures import UpstreamFailure
from standins.mock_worker import MockWorkerConfig, build_app
from tests.conftest import GatewayFactory, record_for

# --- certificates made in the test ----------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


@dataclass
class Issued:
    cert: Path
    key: Path
    serial: int


class Authority:
    """A CA of the test's own, issuing server and client certificates for localhost and 127.0.0.1."""

    def __init__(self, folder: Path, name: str = "test-ca") -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )  # fmt: skip
        self.path = folder / f"{name}.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, client: bool = False, cert: Path | None = None, key: Path | None = None) -> Issued:
        """A certificate (server, or client) written to ``name``.crt/.key (or the paths given, replaced
        whole, as a certificate manager does)."""
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        issued = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject).public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )  # fmt: skip
        cert_path, key_path = cert or self.folder / f"{name}.crt", key or self.folder / f"{name}.key"
        for path, data in ((key_path, _pem_key(leaf_key)), (cert_path, issued.public_bytes(serialization.Encoding.PEM))):
            staged = path.with_name(path.name + ".new")
            staged.write_bytes(data)
            os.replace(staged, path)  # whole files swapped in, never seen half-written
        return Issued(cert_path, key_path, issued.serial_number)

    def client_context(self, issued: Issued | None = None) -> ssl.SSLContext:
        """A client trusting this CA (presenting ``issued``, if given)."""
        context = ssl.create_default_context(cafile=str(self.path))
        if issued is not None:
            context.load_cert_chain(issued.cert, issued.key)
        return context

    def server_context(self, issued: Issued, *, require_client: bool = True) -> ssl.SSLContext:
        """A server presenting ``issued``, asking clients for a certificate of this CA."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(issued.cert, issued.key)
        if require_client:
            context.load_verify_locations(cafile=str(self.path))
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def serial_of(der: bytes | None) -> int:
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


@pytest.fixture(autouse=True)
def _fresh_tls() -> Iterator[None]:
    tls.reset()
    yield
    tls.reset()


# --- flags and start-up ---------------------------------------------------------------------------


def test_flags_keep_the_reference_names_and_pairs() -> None:
    config = parse_gateway_args([
        "--tls-cert-path", "/s.crt", "--tls-key-path", "/s.key", "--client-cert-path", "/c.crt",
        "--client-key-path", "/c.key", "--ca-cert-paths", "/ca/one.pem", "--ca-cert-paths", "/ca/two.pem", "/ca/3.pem",
    ])  # fmt: skip
    assert (config.tls_cert_path, config.tls_key_path) == ("/s.crt", "/s.key")
    assert (config.client_cert_path, config.client_key_path) == ("/c.crt", "/c.key")
    assert config.ca_cert_paths == ("/ca/one.pem", "/ca/two.pem", "/ca/3.pem")  # repeated: accumulated, as smg
    with pytest.raises(ConfigError, match="--tls-cert-path and --tls-key-path go together"):
        parse_gateway_args(["--tls-cert-path", "/s.crt"])
    with pytest.raises(ConfigError, match="--client-cert-path and --client-key-path go together"):
        parse_gateway_args(["--client-key-path", "/c.key"])


def test_files_that_do_not_load_stop_start_up_with_the_flag_and_file(ca: Authority, tmp_path: Path) -> None:
    one, two = ca.issue("one"), ca.issue("two")
    text = tmp_path / "notes.txt"
    text.write_text("not a certificate\n")
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(_pem_key(ec.generate_private_key(ec.SECP256R1()), b"secret"))
    cases = [
        (["--tls-cert-path", str(tmp_path / "missing.crt"), "--tls-key-path", str(one.key)],
         r"--tls-cert-path .*missing\.crt: cannot be read \(No such file or directory\)"),
        (["--tls-cert-path", str(text), "--tls-key-path", str(one.key)], r"--tls-cert-path .*notes\.txt: no PEM certificate"),
        (["--tls-cert-path", str(one.cert), "--tls-key-path", str(one.cert)], r"--tls-key-path .*one\.crt: no PEM private key"),
        (["--tls-cert-path", str(one.cert), "--tls-key-path", str(two.key)],
         r"--tls-key-path .*two\.key: the key does not match the certificate .*one\.crt"),
        (["--tls-cert-path", str(one.cert), "--tls-key-path", str(encrypted)], r"--tls-key-path .*encrypted\.key: the key is encrypted"),
        (["--client-cert-path", str(one.cert), "--client-key-path", str(two.key)],
         r"--client-key-path .*two\.key: the key does not match the certificate .*one\.crt"),
        (["--ca-cert-paths", str(ca.path), str(text)], r"--ca-cert-paths .*notes\.txt: no PEM certificate"),
        (["--ca-cert-paths", str(tmp_path)], r"--ca-cert-paths .*: cannot be read"),
    ]  # fmt: skip
    for argv, message in cases:
        with pytest.raises(ConfigError, match=message):
            tls.check_files(parse_gateway_args(argv))
    tls.check_files(parse_gateway_args([
        "--tls-cert-path", str(one.cert), "--tls-key-path", str(one.key), "--ca-cert-paths", str(ca.path),
        "--client-cert-path", str(two.cert), "--client-key-path", str(two.key),
    ]))  # fmt: skip


def test_rungateway_refuses_a_bad_key_before_serving(ca: Authority) -> None:
    one, two = ca.issue("one"), ca.issue("two")
    with pytest.raises(CommandError, match="the key does not match the certificate") as refused:
        call_command("rungateway", "--tls-cert-path", str(one.cert), "--tls-key-path", str(two.key))
    assert refused.value.__cause__ is None and "Traceback" not in str(refused.value)


# --- the listener: reloaded for new connections ---------------------------------------------------


async def _served_serial(port: int, ca: Authority) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ca.client_context(), server_hostname="localhost")
    serial = serial_of(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
    writer.close()
    await writer.wait_closed()
    return serial


async def test_a_replaced_listener_chain_is_presented_to_new_connections(
    ca: Authority, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = ca.issue("listener")
    certificate = tls.ServerCertificate(str(first.cert), str(first.key))

    async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_server(hello, "127.0.0.1", 0, ssl=certificate.ssl_context())
    port = server.sockets[0].getsockname()[1]
    try:
        assert await _served_serial(port, ca) == first.serial
        assert not certificate.refresh()  # nothing changed
        # A key of another certificate in place (a rotation caught half done): refused, the old chain stays.
        stray = ca.issue("stray")
        os.replace(stray.key, first.key)
        with caplog.at_level(logging.WARNING, logger="common.tls"):
            assert not certificate.refresh()
        assert "the key does not match the certificate" in caplog.text
        assert await _served_serial(port, ca) == first.serial
        second = ca.issue("listener", cert=first.cert, key=first.key)  # the rotation completed
        assert certificate.refresh() and certificate.reloads == 1
        assert await _served_serial(port, ca) == second.serial
        # Without SNI (a client connecting by address) the new chain too.
        plain = ca.client_context()
        plain.check_hostname = False
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=plain, server_hostname="")
        assert serial_of(writer.get_extra_info("ssl_object").getpeercert(binary_form=True)) == second.serial
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()


# --- towards workers: mutual TLS ------------------------------------------------------------------


@pytest.fixture
async def mtls_worker(ca: Authority) -> AsyncIterator[str]:
    """The mock worker over TLS, refusing any client without a certificate of the test CA."""
    runner = web.AppRunner(build_app(MockWorkerConfig(model="mock-model")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ca.server_context(ca.issue("worker")))
    await site.start()
    yield f"https://localhost:{runner.addresses[0][1]}"
    await runner.cleanup()


CHAT: dict[str, Any] = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


async def test_the_relay_presents_the_client_certificate_to_an_https_worker(
    make_gateway: GatewayFactory, mtls_worker: str, ca: Authority
) -> None:
    client = ca.issue("gateway-client", client=True)
    gateway = make_gateway(
        [record_for(mtls_worker, "mock-model")], ca_cert_paths=(str(ca.path),),
        client_cert_path=str(client.cert), client_key_path=str(client.key),
    )  # fmt: skip
    answer = await gateway.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    streamed = await gateway.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    # The control plane's clients share the context: a health probe through httpx.
    from common.http_clients import aclose_http_client, http_client

    probe = await http_client().get(mtls_worker + "/health")
    assert probe.status_code == 200
    await aclose_http_client()


async def test_without_a_client_certificate_the_worker_refuses_the_relay(
    make_gateway: GatewayFactory, mtls_worker: str, ca: Authority
) -> None:
    gateway = make_gateway([record_for(mtls_worker, "mock-model")], ca_cert_paths=(str(ca.path),), disable_retries=True)
    answer = await gateway.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code >= 500
    assert answer.json()["error"]


async def test_an_untrusted_worker_certificate_is_refused(make_gateway: GatewayFactory, mtls_worker: str, ca: Authority) -> None:
    client = ca.issue("gateway-client", client=True)  # a client chain, but no --ca-cert-paths: public roots only
    gateway = make_gateway(
        [record_for(mtls_worker, "mock-model")], client_cert_path=str(client.cert), client_key_path=str(client.key),
        disable_retries=True,
    )  # fmt: skip
    answer = await gateway.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code >= 500


# --- towards workers: grpcs:// --------------------------------------------------------------------


async def test_grpcs_worker_with_client_certificate_and_a_rotated_chain(ca: Authority) -> None:
    from common.config import GatewayConfig, install_config
    from standins.fixtures import FIXTURE_MODELS
    from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer

    served = ca.issue("engine")
    credentials = grpc.ssl_server_credentials(
        [(served.key.read_bytes(), served.cert.read_bytes())], root_certificates=ca.path.read_bytes(),
        require_client_auth=True,
    )  # fmt: skip
    engine = GrpcEngineServer(GrpcEngineConfig(runtime="sglang", tokenizer=str(FIXTURE_MODELS / "qwen3")))
    port = await engine.start(credentials=credentials)
    url = f"grpcs://localhost:{port}"
    client = ca.issue("gateway-client", client=True)
    try:
        install_config(GatewayConfig(ca_cert_paths=(str(ca.path),)), export=False)  # no client chain
        refused = WorkerChannel(url)
        with pytest.raises(UpstreamFailure, match="UNAVAILABLE"):  # the engine wants a client certificate
            await detect_runtime(refused, timeout=5)
        await refused.close()
        tls.reset()
        install_config(GatewayConfig(
            ca_cert_paths=(str(ca.path),), client_cert_path=str(client.cert), client_key_path=str(client.key),
        ), export=False)  # fmt: skip
        channel = WorkerChannel(url)
        assert await detect_runtime(channel, timeout=5) == "sglang"
        assert channel.opened == 1
        ca.issue("gateway-client-2", client=True, cert=client.cert, key=client.key)  # rotated in place
        tls.refresh()
        assert tls.generation() == 1
        assert await detect_runtime(channel, timeout=5) == "sglang"
        assert channel.opened == 2  # new calls on a channel made with the new chain
        await channel.close()
    finally:
        install_config(GatewayConfig(), export=False)
        await engine.stop()
