"""TLS for both clients: the context the options ask for, and what a TLS failure means.

A broker that refuses our client certificate says so with an alert. Under TLS 1.2 it comes during the
handshake, in the connect call; under TLS 1.3 the client's side of the handshake is over before the
broker has checked the certificate, so the alert comes on the first read, as the socket's loss. Both are
permanent (the same certificate is refused by every node, every time) and name the option to fix; a TLS
failure that is not about a certificate after the connection opened is a lost connection like any other.
"""

from __future__ import annotations

import asyncio
import ssl

from ..errors import AmqpOptionError, AmqpProtocolError, ConnectionLost, HandshakeFailed
from .auth_options import load_client_certificate
from .options import ConnectionOptions, TlsOptions

__all__ = ["handshake_failure", "lost", "peer", "tls_context"]

# OpenSSL's reason for an alert the broker sends about the client certificate: what the broker means.
CERTIFICATE_ALERTS = {
    "TLSV1_ALERT_UNKNOWN_CA": "it does not trust the CA that signed it",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "it has expired or is not valid yet",
    "SSLV3_ALERT_BAD_CERTIFICATE": "it is not acceptable (bad certificate)",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "it was revoked",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "it cannot accept it (certificate unknown)",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "it does not support its kind",
    "TLSV1_ALERT_ACCESS_DENIED": "it denies access to its holder",
    "TLSV1_ALERT_DECRYPT_ERROR": "the key's signature did not verify: does tls.keyFile belong to tls.certFile?",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "it requires a client certificate",
}
# Other refusals in the handshake, the same on every attempt.
HANDSHAKE_ALERTS = {
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "no TLS version and cipher both sides accept, or it requires a client certificate (tls.certFile, tls.keyFile)",
    "TLSV1_ALERT_PROTOCOL_VERSION": "no TLS version both sides accept",
    "TLSV1_ALERT_INSUFFICIENT_SECURITY": "no cipher strong enough for it",
    "TLSV1_UNRECOGNIZED_NAME": "it does not know the server name we sent (tls.serverName, else the uri's host)",
}
# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH: the certificate does not name the host we asked for.
_HOSTNAME_MISMATCH = 62


def tls_context(options: ConnectionOptions) -> ssl.SSLContext | None:
    tls = options.tls
    if tls is None:
        return None
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as err:
        raise AmqpOptionError(f"option 'tls.caFile' ({tls.ca_file}): cannot load CA certificates: {err}") from None
    context.check_hostname = tls.check_hostname
    if not tls.check_hostname and tls.ca_file is None:
        context.verify_mode = ssl.CERT_NONE  # no CA and no name check: encryption only, as asked
    if tls.cert_file and tls.key_file:
        load_client_certificate(context, tls)
    return context


def handshake_failure(where: str, err: ssl.SSLError, tls: TlsOptions | None) -> AmqpProtocolError:
    """What a TLS error while connecting means, with the option to fix; transient only for a peer that went away."""
    if isinstance(err, ssl.SSLCertVerificationError):
        if err.verify_code == _HOSTNAME_MISMATCH:
            named = f"tls.serverName={tls.server_name}" if tls and tls.server_name else "the host in option 'uri'"
            return HandshakeFailed(
                f"TLS: the certificate of {where} failed verification ({err.verify_message}): it does not carry the name "
                f"we checked ({named}); set 'tls.serverName' to a name it carries, or tls.checkHostname=false"
            )
        return HandshakeFailed(
            f"TLS: the certificate of {where} failed verification ({err.verify_message}); set 'tls.caFile' to the CA that "
            "signed it, or tls.checkHostname=false if only the name differs"
        )
    refusal = _alert(where, err, tls)
    if refusal is not None:
        return refusal
    reason = getattr(err, "reason", None)  # OpenSSL's name for it; absent from an SSLError made in Python
    if isinstance(err, ssl.SSLEOFError | ssl.SSLZeroReturnError) or reason == "UNEXPECTED_EOF_WHILE_READING":
        return ConnectionLost(f"{where} closed the connection during the TLS handshake ({reason or err})")
    return HandshakeFailed(f"TLS handshake with {where} failed ({reason or err}); is it a TLS port (amqps, usually 5671)?")


def lost(exc: Exception | None, where: str, tls: TlsOptions | None) -> AmqpProtocolError:
    """Why the socket to ``where`` closed (``connection_lost``): a certificate alert is a permanent refusal
    (under TLS 1.3 it comes on the first read, after the connect call); anything else a lost connection."""
    if isinstance(exc, ssl.SSLError):
        refusal = _alert(where, exc, tls)
        if refusal is not None:
            return refusal
    return ConnectionLost(f"socket closed: {exc}" if exc else "socket closed by the broker")


def _alert(where: str, err: ssl.SSLError, tls: TlsOptions | None) -> HandshakeFailed | None:
    reason = str(getattr(err, "reason", None) or "")
    has_certificate = tls is not None and tls.cert_file is not None
    if reason in CERTIFICATE_ALERTS:
        if not has_certificate:
            return HandshakeFailed(f"TLS: {where} requires a client certificate ({reason}): give options 'tls.certFile' and 'tls.keyFile'")
        assert tls is not None
        return HandshakeFailed(
            f"TLS: {where} refused the client certificate in 'tls.certFile' ({tls.cert_file}): {CERTIFICATE_ALERTS[reason]} "
            f"({reason}); fix options 'tls.certFile' and 'tls.keyFile': a certificate valid now, signed by a CA the broker trusts"
        )
    if reason in HANDSHAKE_ALERTS:
        return HandshakeFailed(f"TLS: {where} refused the handshake: {HANDSHAKE_ALERTS[reason]} ({reason})")
    return None


def peer(transport: asyncio.BaseTransport) -> str:
    """``host:port`` of the other end, as errors name it (read when connected: a closed transport forgets it)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return "the broker"
