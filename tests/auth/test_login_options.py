"""How a connection logs in, from its options, without a broker: EXTERNAL when a certificate and no password is
given, OAuth 2 options, tls.serverName and tls.keyPassword; every refused combination names the option,
and no secret reaches a repr, an error or Spark's plan."""

from __future__ import annotations

import re

import pytest

from spark_amqp.errors import AmqpOptionError
from spark_amqp.queues.options import parse_source_options
from spark_amqp.sink.options import parse_sink_options

from .conftest import MadeCertificate
from .helpers import options

SECRET = "cl1ent-s3cret"
ENDPOINT = "https://idp.example/oauth2/token"


def certificate(made: MadeCertificate, encrypted: bool = False) -> dict[str, str]:
    return {"tls.certFile": str(made.cert), "tls.keyFile": str(made.encrypted_key if encrypted else made.key)}


def oauth2(**extra: str) -> dict[str, str]:
    return {"oauth2.tokenEndpoint": ENDPOINT, "oauth2.clientId": "etl", "oauth2.clientSecret": SECRET, **extra}


def test_a_certificate_without_a_password_logs_in_with_external_as_the_certificates_user(made_cert: MadeCertificate) -> None:
    c = options("amqps://rabbit.example/prod", **certificate(made_cert))
    assert (c.mechanism, c.username, c.password, c.oauth2) == ("EXTERNAL", "etl-user", "", None)
    assert c.display_uri == "amqps://etl-user@rabbit.example:5671/prod"  # never guest
    named = options("rabbitmq-stream+tls://svc@rabbit.example/prod", authMechanism="external", **certificate(made_cert))
    assert (named.mechanism, named.username) == ("EXTERNAL", "svc")


def test_a_password_beside_a_certificate_logs_in_with_plain(made_cert: MadeCertificate) -> None:
    by_option = options("amqps://alice@h/v", password="pw", **certificate(made_cert))
    in_uri = options("amqps://alice:pw@h/v", **certificate(made_cert))
    assert (by_option.mechanism, by_option.username, by_option.password) == ("PLAIN", "alice", "pw")
    assert (in_uri.mechanism, in_uri.password) == ("PLAIN", "pw")


def test_no_certificate_and_no_password_is_still_guest() -> None:
    for uri in ("amqp://h/v", "amqps://h/v", "rabbitmq-stream+tls://h/v"):
        c = options(uri)
        assert (c.mechanism, c.username, c.password) == ("PLAIN", "guest", "guest")


@pytest.mark.parametrize(
    ("uri", "extra", "fragment"),
    [
        ("amqps://h/v", {"authMechanism": "EXTERNAL"}, "authMechanism=EXTERNAL logs in with a client certificate"),
        ("amqp://h/v", {"authMechanism": "EXTERNAL"}, "it needs an amqps:// (or rabbitmq-stream+tls://) uri"),
        ("amqps://h/v", {"authMechanism": "EXTERNAL", "password": "pw", "cert": "y"}, "not a password: drop option 'password'"),
        ("amqps://u:pw@h/v", {"authMechanism": "external", "cert": "y"}, "not a password: drop option 'password'"),
        ("amqps://h/v", {"authMechanism": "PLAIN", "cert": "y"}, "authMechanism=PLAIN needs a password"),
        ("amqps://h/v", {"authMechanism": "kerberos"}, "option 'authMechanism' must be PLAIN, EXTERNAL or ANONYMOUS, got 'kerberos'"),
        ("amqp://h/v", {**oauth2(), "password": "pw"}, "drop option 'password'"),
        ("amqp://u:pw@h/v", oauth2(), "drop option 'password' (and any password in the uri)"),
        ("amqps://h/v", {**oauth2(), "authMechanism": "EXTERNAL", "cert": "y"}, "drop authMechanism=EXTERNAL"),
        ("amqp://h/v", {"oauth2.tokenEndpoint": ENDPOINT}, "needs options 'oauth2.clientId' and 'oauth2.clientSecret'"),
        (
            "amqp://h/v",
            {"oauth2.tokenEndpoint": ENDPOINT, "oauth2.clientId": "etl"},
            "needs options 'oauth2.clientId' and 'oauth2.clientSecret'",
        ),
        ("amqp://h/v", {"oauth2.clientId": "etl", "oauth2.clientSecret": SECRET}, "need 'oauth2.tokenEndpoint'"),
        ("amqp://h/v", {**oauth2(), "oauth2.tokenProvider": "m:f"}, "'oauth2.tokenEndpoint' and 'oauth2.tokenProvider' exclude each other"),
        ("amqp://h/v", {"oauth2.tokenProvider": "just_a_module"}, "must be package.module:function, got 'just_a_module'"),
        ("amqp://h/v", {"oauth2.tokenProvider": "a.b:c()"}, "must be package.module:function"),
        ("amqp://h/v", {"oauth2.tokenProvider": "a.b:c", "oauth2.scope": "x"}, "'oauth2.scope' goes with 'oauth2.tokenEndpoint'"),
        ("amqp://h/v", oauth2(**{"oauth2.tokenEndpoint": "http://idp.example/token"}), "must be an https:// url: over http://"),
        (
            "amqp://h/v",
            oauth2(**{"oauth2.tokenEndpoint": "ftp://idp.example/token"}),
            "must be an https:// url, got 'ftp://idp.example/token'",
        ),
        (
            "amqp://h/v",
            {"tls.serverName": "rabbit.internal"},
            "tls.* options need an amqps:// uri (or rabbitmq-stream+tls://); got option 'tls.serverName'",
        ),
        ("rabbitmq-stream://h/v", {"tls.keyPassword": "x"}, "got option 'tls.keyPassword'"),
        ("amqps://h/v", {"tls.keyPassword": "x"}, "option 'tls.keyPassword' is the passphrase of the key in 'tls.keyFile'"),
        ("amqps://h/v", {"tls.serverName": "two words"}, "option 'tls.serverName' must be a host name"),
    ],
)
def test_refused_combinations_name_the_option(made_cert: MadeCertificate, uri: str, extra: dict[str, str], fragment: str) -> None:
    given = dict(extra)
    if given.pop("cert", None):
        given.update(certificate(made_cert))
    with pytest.raises(AmqpOptionError) as info:
        options(uri, **given)
    assert fragment in str(info.value)
    assert SECRET not in str(info.value) and "pw@" not in str(info.value)


def test_oauth2_logs_in_with_plain_as_the_client_and_keeps_secrets_out_of_repr() -> None:
    c = options("amqps://h/v", **oauth2(**{"oauth2.scope": " rabbitmq.read:*/* "}))
    assert (c.mechanism, c.username, c.password) == ("PLAIN", "etl", "")
    assert c.oauth2 is not None and (c.oauth2.client_id, c.oauth2.scope, c.oauth2.token_provider) == ("etl", "rabbitmq.read:*/*", None)
    assert SECRET not in repr(c) and SECRET not in repr(parse_sink_options({"uri": "amqps://h/v", "exchange": "x", **oauth2()}))
    assert options("amqp://svc@h/v", **oauth2()).username == "svc"  # the uri's user is kept
    provided = options("amqp://h/v", **{"oauth2.tokenProvider": "corp.identity:rabbit_token"})
    assert provided.oauth2 is not None and provided.username == "spark-amqp"
    assert provided.oauth2.source == "option 'oauth2.tokenProvider' (corp.identity:rabbit_token)"
    loopback = options("amqp://h/v", **oauth2(**{"oauth2.tokenEndpoint": "http://127.0.0.1:8080/token?tenant=x"}))
    assert loopback.oauth2 is not None and "tenant" not in loopback.oauth2.source  # a query may hold a key


def test_an_encrypted_key_takes_its_passphrase_and_never_prompts(made_cert: MadeCertificate, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(AmqpOptionError, match=r"holds an encrypted key: give its passphrase in option 'tls.keyPassword'"):
        options("amqps://h/v", **certificate(made_cert, encrypted=True))
    with pytest.raises(AmqpOptionError, match=r"option 'tls.keyPassword' does not decrypt the key in 'tls.keyFile'"):
        options("amqps://h/v", **{"tls.keyPassword": "wrong"}, **certificate(made_cert, encrypted=True))
    c = options("amqps://h/v", **{"tls.keyPassword": made_cert.passphrase}, **certificate(made_cert, encrypted=True))
    assert c.mechanism == "EXTERNAL" and c.tls is not None and c.tls.key_password == made_cert.passphrase
    assert made_cert.passphrase not in repr(c)
    assert "PEM pass phrase" not in capfd.readouterr().err  # OpenSSL was never left to ask


def test_server_name_is_kept(made_cert: MadeCertificate) -> None:
    c = options("amqps://10.0.0.7/v", password="pw", **{"tls.serverName": " rabbit.internal "})
    assert c.tls is not None and c.tls.server_name == "rabbit.internal"


def test_spark_redacts_every_secret_option_in_explain() -> None:
    """Spark's explain() shows data source options but redacts those whose name matches spark.redaction.regex."""
    spark_default = re.compile(r"(?i)secret|password|token|access[.]?key")
    for key in ("password", "oauth2.clientSecret", "tls.keyPassword", "oauth2.tokenEndpoint", "oauth2.tokenProvider"):
        assert spark_default.search(key), key
    # Neither holds a secret (a user name, a scope, a file name), and Spark shows them.
    for key in ("oauth2.clientId", "oauth2.scope", "tls.keyFile", "authMechanism"):
        assert not spark_default.search(key), key


def test_every_new_option_is_taken_by_both_modes_and_the_sink(made_cert: MadeCertificate) -> None:
    base = {"authMechanism": "EXTERNAL", "tls.serverName": "localhost", **certificate(made_cert)}
    assert parse_source_options({"uri": "amqps://h/v", "queue": "q", **base}).connection.mechanism == "EXTERNAL"
    assert parse_sink_options({"uri": "rabbitmq-stream+tls://h/v", "stream": "s", **base}).connection.mechanism == "EXTERNAL"
    from spark_amqp.streams.options import parse_stream_options

    assert parse_stream_options({"uri": "amqps://h/v", "stream": "s", **oauth2()}).connection.oauth2 is not None
