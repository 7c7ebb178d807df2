"""TLS refusals fail at once and name the option to fix: what each alert means (no broker), then the TLS node
refusing client certificates over both protocols, a server certificate we cannot verify, tls.serverName and
tls.keyPassword."""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

import pytest

from spark_amqp.client.blocking import BlockingClient
from spark_amqp.client.connection import AmqpClient
from spark_amqp.errors import AmqpOptionError, AmqpSourceError, ConnectionLost, HandshakeFailed, is_transient
from spark_amqp.stream_protocol.client import StreamClient
from spark_amqp.transport.auth_options import TlsOptions
from spark_amqp.transport.tls import CERTIFICATE_ALERTS, handshake_failure, lost

from .helpers import cert, connections, options, tls_node, unique

WITH_CERT = TlsOptions(cert_file="/certs/etl.pem", key_file="/certs/etl-key.pem")


def alert(reason: str, cls: type[ssl.SSLError] = ssl.SSLError) -> ssl.SSLError:
    err = cls(1, f"[SSL: {reason}] alert")
    err.reason = reason  # type: ignore[misc]  # set by OpenSSL on a real one
    return err


@pytest.mark.parametrize("reason", sorted(CERTIFICATE_ALERTS))
def test_an_alert_about_our_certificate_is_permanent_and_names_it(reason: str) -> None:
    for err in (handshake_failure("rabbit:5671", alert(reason), WITH_CERT), lost(alert(reason), "rabbit:5671", WITH_CERT)):
        assert isinstance(err, HandshakeFailed) and not is_transient(err)
        assert "TLS: rabbit:5671 refused the client certificate in 'tls.certFile' (/certs/etl.pem)" in str(err) and reason in str(err)


def test_without_a_certificate_the_alert_asks_for_one() -> None:
    err = lost(alert("TLSV13_ALERT_CERTIFICATE_REQUIRED"), "rabbit:5671", TlsOptions())
    assert (
        isinstance(err, HandshakeFailed) and "requires a client certificate" in str(err) and "'tls.certFile' and 'tls.keyFile'" in str(err)
    )


def test_other_tls_failures() -> None:
    # After the connection opened, a TLS error that is not about a certificate is a lost connection like any other.
    assert isinstance(lost(alert("DECRYPTION_FAILED_OR_BAD_RECORD_MAC"), "rabbit:5671", WITH_CERT), ConnectionLost)
    assert isinstance(lost(None, "rabbit:5671", None), ConnectionLost)
    # A peer gone in the middle of the handshake (a restarting node, a load balancer) is worth another endpoint.
    eof = handshake_failure("rabbit:5671", alert("UNEXPECTED_EOF_WHILE_READING", ssl.SSLEOFError), WITH_CERT)
    assert isinstance(eof, ConnectionLost) and is_transient(eof)
    wrong_port = handshake_failure("rabbit:5672", alert("WRONG_VERSION_NUMBER"), None)
    assert isinstance(wrong_port, HandshakeFailed) and "is it a TLS port" in str(wrong_port)
    versions = handshake_failure("rabbit:5671", alert("TLSV1_ALERT_PROTOCOL_VERSION"), None)
    assert isinstance(versions, HandshakeFailed) and "no TLS version both sides accept" in str(versions)


def test_a_server_certificate_we_cannot_verify_names_the_option() -> None:
    mismatch = ssl.SSLCertVerificationError(1, "x")
    mismatch.verify_code, mismatch.verify_message = 62, "Hostname mismatch"
    named = handshake_failure("10.0.0.7:5671", mismatch, TlsOptions(server_name="rabbit.internal"))
    assert "it does not carry the name we checked (tls.serverName=rabbit.internal); set 'tls.serverName'" in str(named)
    unknown = ssl.SSLCertVerificationError(1, "x")
    unknown.verify_code, unknown.verify_message = 19, "self-signed certificate in certificate chain"
    assert "set 'tls.caFile' to the CA that signed it" in str(handshake_failure("rabbit:5671", unknown, None))


# -- against the TLS node -------------------------------------------------------------------------------

CLIENTS: dict[str, Any] = {"amqp": AmqpClient, "stream": StreamClient}


def node_uri(protocol: str) -> str:
    amqps, stream, _ = tls_node()
    return amqps if protocol == "amqp" else stream


async def connect(protocol: str, uri: str, name: str, **extra: object) -> Any:
    client = await CLIENTS[protocol].connect(options(uri, **extra), name)
    await client.close()
    return client


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
@pytest.mark.parametrize(("which", "meaning"), [("untrusted", "TLSV1_ALERT_UNKNOWN_CA"), ("expired", "SSLV3_ALERT_CERTIFICATE_EXPIRED")])
def test_a_refused_client_certificate_fails_within_seconds(protocol: str, which: str, meaning: str) -> None:
    _, _, tls_dir = tls_node()
    started = time.monotonic()
    with pytest.raises(HandshakeFailed) as info:
        asyncio.run(connect(protocol, node_uri(protocol), unique(which), connectionTimeout=30, **cert(tls_dir, which)))
    elapsed = time.monotonic() - started
    assert elapsed < 5.0, f"{elapsed:.1f}s: retried as a network fault"
    assert f"refused the client certificate in 'tls.certFile' ({tls_dir}/{which}.pem)" in str(info.value) and meaning in str(info.value)
    assert not is_transient(info.value)


def test_a_caller_that_retries_network_faults_gives_up_on_a_refused_certificate_at_once() -> None:
    """The loop planning and the sink use: a transient fault would be retried for connectionTimeout (30 s)."""
    _, stream, tls_dir = tls_node()
    client: BlockingClient[Any] = BlockingClient(
        options(stream, connectionTimeout=30, **cert(tls_dir, "untrusted")), "t", StreamClient.connect
    )
    started = time.monotonic()
    try:
        with pytest.raises(AmqpSourceError, match=r"refused the client certificate in 'tls.certFile'"):
            client.run(lambda c: c.metadata("s"), "stream 's'")
    finally:
        client.close()
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
def test_a_server_certificate_from_an_unknown_ca_names_tls_cafile(protocol: str) -> None:
    _, _, tls_dir = tls_node()
    own = {k: v for k, v in cert(tls_dir, "certuser").items() if k != "tls.caFile"}  # the system's CAs only
    with pytest.raises(HandshakeFailed, match=r"failed verification \(.*\); set 'tls.caFile' to the CA that signed it"):
        asyncio.run(connect(protocol, node_uri(protocol), unique("noca"), **own))


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
def test_tls_server_name_is_sent_and_verified(protocol: str) -> None:
    uri = node_uri(protocol)
    _, _, tls_dir = tls_node()
    assert "127.0.0.1" in uri
    name = unique("servername")
    # The server certificate names localhost and 127.0.0.1: a name it carries passes with the name check on…
    asyncio.run(connect(protocol, uri, name, **{"tls.serverName": "localhost"}, **cert(tls_dir, "certuser")))
    # …one it does not carry fails at once, naming the option.
    with pytest.raises(HandshakeFailed, match=r"does not carry the name we checked \(tls.serverName=rabbit.example\)"):
        asyncio.run(connect(protocol, uri, name, **{"tls.serverName": "rabbit.example"}, **cert(tls_dir, "certuser")))


@pytest.mark.parametrize("protocol", ["amqp", "stream"])
def test_an_encrypted_key_with_its_passphrase_logs_in(protocol: str) -> None:
    _, _, tls_dir = tls_node()
    with open(f"{tls_dir}/key-password.txt") as f:
        passphrase = f.read().strip()
    encrypted = {**cert(tls_dir, "certuser"), "tls.keyFile": f"{tls_dir}/certuser-key-encrypted.pem"}
    with pytest.raises(AmqpOptionError, match=r"holds an encrypted key: give its passphrase in option 'tls.keyPassword'"):
        options(node_uri(protocol), **encrypted)

    async def logged_in() -> list[tuple[str, str]]:
        name = unique("keypassword")
        client = await CLIENTS[protocol].connect(options(node_uri(protocol), **{"tls.keyPassword": passphrase}, **encrypted), name)
        try:
            return await asyncio.get_running_loop().run_in_executor(None, connections, name, protocol == "stream")
        finally:
            await client.close()

    assert asyncio.run(logged_in()) == [("EXTERNAL", "certuser")]
