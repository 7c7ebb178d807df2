"""How a connection secures itself and logs in: TLS (CAs, a client certificate, the server name, a key
passphrase) and the login (a password over SASL ``PLAIN``, the client certificate over ``EXTERNAL``, or
OAuth 2 tokens as the password of a ``PLAIN`` login, renewed by the clients).

``options.parse_connection`` calls ``parse_tls`` and ``parse_login``; every rule about these options is
here. Secrets (the password, the client secret, the key passphrase) are kept out of ``repr``; what
messages show of a token endpoint is its address without query or credentials.
"""

from __future__ import annotations

import ipaddress
import re
import ssl
import urllib.parse
from dataclasses import dataclass, field

from ..errors import AmqpOptionError
from ..option_reader import OptionReader
from .certificates import certificate_user

__all__ = [
    "LOGIN_KEYS",
    "MECHANISMS",
    "TLS_KEYS",
    "Credentials",
    "OAuth2Options",
    "TlsOptions",
    "load_client_certificate",
    "parse_login",
    "parse_tls",
    "shown_endpoint",
]

MECHANISMS = ("PLAIN", "EXTERNAL", "ANONYMOUS")
TLS_KEYS = ("tls.caFile", "tls.certFile", "tls.keyFile", "tls.checkHostname", "tls.serverName", "tls.keyPassword")
OAUTH2_KEYS = ("oauth2.tokenEndpoint", "oauth2.clientId", "oauth2.clientSecret", "oauth2.scope", "oauth2.tokenProvider")
LOGIN_KEYS = ("authMechanism", *OAUTH2_KEYS)

# package.module:function (a dotted attribute path after the colon too, e.g. module:Class.method)
_PROVIDER = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_SERVER_NAME = re.compile(r"[\w.-]+")


@dataclass(frozen=True)
class TlsOptions:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    check_hostname: bool = True
    server_name: str | None = None  # sent (SNI) and verified instead of each endpoint's host
    key_password: str | None = field(default=None, repr=False)  # the passphrase of an encrypted key_file


@dataclass(frozen=True)
class OAuth2Options:
    """Where tokens come from: a token endpoint (client-credentials grant) or a function of the user's."""

    token_endpoint: str | None
    client_id: str | None
    client_secret: str | None = field(repr=False)
    scope: str | None
    token_provider: str | None  # "package.module:function", imported where a connection opens
    ca_file: str | None = None  # tls.caFile, trusted beside the system's CAs for an https token endpoint

    @property
    def source(self) -> str:
        """Where tokens come from, for messages (never the secret, nor the endpoint's query)."""
        if self.token_provider is not None:
            return f"option 'oauth2.tokenProvider' ({self.token_provider})"
        return f"the token endpoint {shown_endpoint(self.token_endpoint or '')} (option 'oauth2.tokenEndpoint')"


@dataclass(frozen=True)
class Credentials:
    mechanism: str  # "PLAIN", "EXTERNAL" or "ANONYMOUS"
    username: str  # for EXTERNAL without a user in the uri: the certificate's (its CN), shown in messages only
    password: str = field(repr=False)  # unused with EXTERNAL and OAuth 2
    oauth2: OAuth2Options | None = None


def parse_tls(r: OptionReader, tls_scheme: bool) -> TlsOptions | None:
    """The tls.* options; None for a uri without TLS (which takes none of them)."""
    if not tls_scheme:
        given = [r.name(k) for k in TLS_KEYS if r.text(k) is not None]
        if given:
            raise AmqpOptionError(f"tls.* options need an amqps:// uri (or rabbitmq-stream+tls://); got option '{given[0]}'")
        return None
    server_name = r.text("tls.serverName")
    if server_name is not None:
        server_name = server_name.strip()
        if not _SERVER_NAME.fullmatch(server_name):
            raise AmqpOptionError(
                f"option 'tls.serverName' must be a host name (the name the broker's certificate carries), got {server_name!r}"
            )
    tls = TlsOptions(
        r.readable_file("tls.caFile"),
        r.readable_file("tls.certFile"),
        r.readable_file("tls.keyFile"),
        r.boolean("tls.checkHostname", True),
        server_name,
        r.text("tls.keyPassword"),
    )
    if (tls.cert_file is None) != (tls.key_file is None):
        raise AmqpOptionError("options 'tls.certFile' and 'tls.keyFile' go together: give both or neither")
    if tls.key_password is not None and tls.key_file is None:
        raise AmqpOptionError(
            "option 'tls.keyPassword' is the passphrase of the key in 'tls.keyFile': give tls.certFile and tls.keyFile too"
        )
    if tls.cert_file is not None:
        load_client_certificate(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), tls)  # a wrong passphrase fails here, not on an executor
    return tls


class _Encrypted(Exception):
    """OpenSSL asked for a passphrase that the options do not have."""


def load_client_certificate(context: ssl.SSLContext, tls: TlsOptions) -> None:
    """``tls.certFile`` and ``tls.keyFile`` into ``context``. OpenSSL never prompts (on an executor's stderr,
    where nobody answers): an encrypted key gets ``tls.keyPassword`` or fails naming it."""
    assert tls.cert_file is not None and tls.key_file is not None
    asked: list[bool] = []

    def passphrase() -> bytes:
        asked.append(True)
        if tls.key_password is None:
            raise _Encrypted
        return tls.key_password.encode("utf-8")

    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=passphrase)
    except _Encrypted:
        raise AmqpOptionError(
            f"option 'tls.keyFile' ({tls.key_file}) holds an encrypted key: give its passphrase in option 'tls.keyPassword'"
        ) from None
    except (OSError, ssl.SSLError) as err:
        if asked:
            raise AmqpOptionError(
                f"option 'tls.keyPassword' does not decrypt the key in 'tls.keyFile' ({tls.key_file}): check the passphrase"
            ) from None
        raise AmqpOptionError(
            f"options 'tls.certFile' ({tls.cert_file}) and 'tls.keyFile' ({tls.key_file}): cannot load the client certificate: {err}"
        ) from None


def parse_login(r: OptionReader, uri_user: str | None, uri_password: str | None, tls: TlsOptions | None) -> Credentials:
    """Who logs in, and how: EXTERNAL when a client certificate is given and no password (or when asked
    for), OAuth 2 tokens when an oauth2.* option is given, else a password (guest/guest by default)."""
    asked = r.text("authMechanism")
    mechanism = asked.strip().upper() if asked is not None else None
    if mechanism is not None and mechanism not in MECHANISMS:
        raise AmqpOptionError(f"option 'authMechanism' must be PLAIN, EXTERNAL or ANONYMOUS, got {asked!r}")
    password = r.text("password")
    has_password = password is not None or uri_password is not None
    certificate = tls is not None and tls.cert_file is not None
    if any(r.text(k) is not None for k in OAUTH2_KEYS):
        if has_password:
            raise AmqpOptionError(
                "oauth2.* options log in with a token in place of a password: drop option 'password' (and any password in the uri)"
            )
        if mechanism in ("EXTERNAL", "ANONYMOUS"):
            raise AmqpOptionError(f"oauth2.* options log in with a token (SASL PLAIN): drop authMechanism={mechanism}")
        oauth2 = _parse_oauth2(r, tls)
        return Credentials("PLAIN", uri_user or oauth2.client_id or "spark-amqp", "", oauth2)
    if mechanism == "ANONYMOUS":
        if has_password:
            raise AmqpOptionError(
                "authMechanism=ANONYMOUS logs in without credentials: drop option 'password' (and any password in the uri)"
            )
        return Credentials("ANONYMOUS", uri_user or "anonymous", "")
    if mechanism is None:
        mechanism = "EXTERNAL" if certificate and not has_password else "PLAIN"
    if mechanism == "EXTERNAL":
        if not certificate:
            raise AmqpOptionError(
                "authMechanism=EXTERNAL logs in with a client certificate: it needs an amqps:// (or rabbitmq-stream+tls://) uri "
                "and options tls.certFile and tls.keyFile"
            )
        if has_password:
            raise AmqpOptionError(
                "authMechanism=EXTERNAL logs in with the client certificate, not a password: drop option 'password' "
                "(and any password in the uri), or log in with it by leaving authMechanism out"
            )
        assert tls is not None and tls.cert_file is not None
        return Credentials("EXTERNAL", uri_user or certificate_user(tls.cert_file), "")
    if certificate and not has_password:
        raise AmqpOptionError(
            "authMechanism=PLAIN needs a password (option 'password'); to log in with the client certificate leave authMechanism out"
        )
    secret = password if password is not None else uri_password if uri_password is not None else "guest"
    return Credentials("PLAIN", uri_user or "guest", secret)


def _parse_oauth2(r: OptionReader, tls: TlsOptions | None) -> OAuth2Options:
    endpoint = r.text("oauth2.tokenEndpoint")
    provider = r.text("oauth2.tokenProvider")
    client_id, secret, scope = r.text("oauth2.clientId"), r.text("oauth2.clientSecret"), r.text("oauth2.scope")
    if endpoint is not None and provider is not None:
        raise AmqpOptionError("options 'oauth2.tokenEndpoint' and 'oauth2.tokenProvider' exclude each other: give one")
    if provider is not None:
        provider = provider.strip()
        if not _PROVIDER.fullmatch(provider):
            raise AmqpOptionError(f"option 'oauth2.tokenProvider' must be package.module:function, got {provider!r}")
        extra = [k for k in ("oauth2.clientId", "oauth2.clientSecret", "oauth2.scope") if r.text(k) is not None]
        if extra:
            raise AmqpOptionError(f"option '{extra[0]}' goes with 'oauth2.tokenEndpoint', not with 'oauth2.tokenProvider'")
        return OAuth2Options(None, None, None, None, provider)
    if endpoint is None:
        raise AmqpOptionError(
            "oauth2.* options need 'oauth2.tokenEndpoint' (with oauth2.clientId and oauth2.clientSecret) or 'oauth2.tokenProvider'"
        )
    endpoint = endpoint.strip()
    _check_endpoint(endpoint)
    if not client_id or not client_id.strip() or not secret:
        raise AmqpOptionError("option 'oauth2.tokenEndpoint' needs options 'oauth2.clientId' and 'oauth2.clientSecret'")
    return OAuth2Options(
        endpoint, client_id.strip(), secret, scope.strip() if scope and scope.strip() else None, None, tls.ca_file if tls else None
    )


def _check_endpoint(endpoint: str) -> None:
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise AmqpOptionError(f"option 'oauth2.tokenEndpoint' must be an https:// url, got {shown_endpoint(endpoint)!r}")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise AmqpOptionError(
            "option 'oauth2.tokenEndpoint' must be an https:// url: over http:// the client secret and the tokens "
            "would travel in clear (http:// is taken for this machine only: localhost, 127.0.0.1, [::1])"
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shown_endpoint(endpoint: str) -> str:
    """A token endpoint for messages: scheme, host, port and path; no credentials, query or fragment."""
    try:
        parts = urllib.parse.urlsplit(endpoint)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<not a url>"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else "<not a url>"
