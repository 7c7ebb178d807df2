"""Logging in with a client certificate (SASL EXTERNAL) over both protocols: on the TLS node, and on the
embedded broker behind TLS, which offers no EXTERNAL (and so the login fails at once, naming what it offers)."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.client.connection import AmqpClient
from spark_amqp.errors import LoginRefused, explain, is_transient
from spark_amqp.stream_protocol.client import StreamClient

from .helpers import TlsFront, cert, connections, options, tls_node, unique

CLIENTS: dict[str, Any] = {"amqp": AmqpClient, "stream": StreamClient}


def node_uri(protocol: str) -> str:
    amqps, stream, _ = tls_node()
    return amqps if protocol == "amqp" else stream


async def logged_in_as(protocol: str, uri: str, **extra: object) -> list[tuple[str, str]]:
    """Connect, do one thing on the connection, and say how the broker sees it: [(mechanism, user)]."""
    name = unique("login")
    client = await CLIENTS[protocol].connect(options(uri, **extra), name)
    try:
        if protocol == "amqp":
            await client.channel()
        else:
            await client.metadata("no-such-stream")
        return await asyncio.get_running_loop().run_in_executor(None, connections, name, protocol == "stream")
    finally:
        await client.close()


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
def test_a_certificate_and_no_password_logs_in_with_external(protocol: str) -> None:
    _, _, tls_dir = tls_node()
    assert asyncio.run(logged_in_as(protocol, node_uri(protocol), **cert(tls_dir, "certuser"))) == [("EXTERNAL", "certuser")]


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
def test_no_certificate_and_no_password_is_still_guest_with_plain(protocol: str) -> None:
    _, _, tls_dir = tls_node()
    assert asyncio.run(logged_in_as(protocol, node_uri(protocol), **{"tls.caFile": f"{tls_dir}/ca.pem"})) == [("PLAIN", "guest")]


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
def test_a_password_beside_the_certificate_logs_in_with_it(protocol: str) -> None:
    _, _, tls_dir = tls_node()
    got = asyncio.run(logged_in_as(protocol, node_uri(protocol).replace("://", "://guest@"), password="guest", **cert(tls_dir, "certuser")))
    assert got == [("PLAIN", "guest")]


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A certificate the node's CA signed for a CN that is no user of the node."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    _, _, tls_dir = tls_node()
    ca_cert = x509.load_pem_x509_certificate(Path(f"{tls_dir}/ca.pem").read_bytes())
    ca_key: Any = serialization.load_pem_private_key(Path(f"{tls_dir}/ca-key.pem").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    made = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"nobody-{uuid.uuid4().hex[:6]}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("stranger")
    (folder / "c.pem").write_bytes(made.public_bytes(serialization.Encoding.PEM))
    plain = serialization.NoEncryption()
    (folder / "k.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, plain))
    return {"tls.caFile": f"{tls_dir}/ca.pem", "tls.certFile": str(folder / "c.pem"), "tls.keyFile": str(folder / "k.pem")}


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
def test_a_certificate_of_no_user_is_refused_clearly(protocol: str, stranger: dict[str, str]) -> None:
    opts = options(node_uri(protocol), connectionTimeout=30, **stranger)
    started = time.monotonic()
    with pytest.raises(LoginRefused) as info:
        asyncio.run(CLIENTS[protocol].connect(opts, unique("stranger")))
    assert time.monotonic() - started < 10.0  # RabbitMQ answers a refused login a few seconds late; never retried
    said = explain(info.value, opts.display_uri, opts.username, opts.vhost)
    assert "refused the login by client certificate (SASL EXTERNAL) of CN=nobody-" in said and "'tls.certFile'" in said
    assert opts.display_uri.startswith(f"{opts.display_uri.split('://')[0]}://nobody-") and "guest" not in said
    assert not is_transient(info.value)


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
def test_a_broker_that_offers_no_external_is_refused_at_once_naming_what_it_offers(protocol: str) -> None:
    _, _, tls_dir = tls_node()
    with EmbeddedBroker() as broker, TlsFront(broker.port if protocol == "amqp" else broker.stream_port, tls_dir) as front:
        scheme = "amqps" if protocol == "amqp" else "rabbitmq-stream+tls"
        opts = options(f"{scheme}://localhost:{front.port}/%2F", connectionTimeout=30, **cert(tls_dir, "certuser"))
        assert opts.mechanism == "EXTERNAL"
        started = time.monotonic()
        with pytest.raises(LoginRefused) as info:
            asyncio.run(CLIENTS[protocol].connect(opts, unique("no-external")))
        elapsed = time.monotonic() - started
        offered = "PLAIN, ANONYMOUS, AMQPLAIN"  # as RabbitMQ 4.3.6 offers them, over either protocol
        # Refused before any login was sent: never guest, never another mechanism.
        assert f"the broker offers the SASL mechanisms {offered}, not EXTERNAL" in str(info.value) and elapsed < 2.0
