"""Who a client certificate names, for messages about a login by certificate (SASL EXTERNAL).

Python has no public API that decodes a certificate it is not connected with, and the package does not
depend on a crypto library for a message. So ``ssl.PEM_cert_to_DER_cert`` gives the DER bytes, and the
few structures before the subject are walked here (RFC 5280 4.1: the certificate, its to-be-signed part,
the optional version, serial number, signature algorithm, issuer and validity, then the subject). A file
that is not such a certificate gives None: the messages then say "its subject".
"""

from __future__ import annotations

import re
import ssl

__all__ = ["certificate_subject", "certificate_user", "subject_of"]

# Attribute types by OID, named as RabbitMQ and OpenSSL print a distinguished name.
_NAMES = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "0.9.2342.19200300.100.1.1": "UID",
    "0.9.2342.19200300.100.1.25": "DC",
    "1.2.840.113549.1.9.1": "emailAddress",
}
# DER string types and their encodings (UTF8String, PrintableString, T61String, IA5String, UniversalString, BMPString)
_STRINGS = {0x0C: "utf-8", 0x13: "ascii", 0x14: "latin-1", 0x16: "ascii", 0x1C: "utf-32-be", 0x1E: "utf-16-be"}
_SEQUENCE, _SET, _OID, _VERSION = 0x30, 0x31, 0x06, 0xA0
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


class _Malformed(ValueError):
    pass


def certificate_subject(path: str) -> str | None:
    """The subject of the (first) certificate in the PEM file ``path``, as ``O=acme, CN=etl``; None when it
    cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            found = _PEM.search(f.read())
        if found is None:
            return None
        return subject_of(ssl.PEM_cert_to_DER_cert(found.group(0))) or None
    except (OSError, ValueError):
        return None


def certificate_user(path: str) -> str:
    """Who an EXTERNAL login is, for messages: the certificate's CN (RabbitMQ's ssl_cert_login_from =
    common_name), else its whole subject (distinguished_name, RabbitMQ's default)."""
    subject = certificate_subject(path)
    if subject is None:
        return "the client certificate's subject"
    common = [part[3:] for part in subject.split(", ") if part.startswith("CN=")]
    return common[-1] if common else subject


def subject_of(der: bytes) -> str:
    """The subject of a DER certificate, its attributes in their order; raises ValueError if it is not one."""
    _, start, _ = _expect(der, 0, _SEQUENCE)  # Certificate
    _, pos, _ = _expect(der, start, _SEQUENCE)  # TBSCertificate
    tag, _, end = _tlv(der, pos)
    if tag == _VERSION:
        pos = end
    for _field in ("serial number", "signature algorithm", "issuer", "validity"):
        pos = _tlv(der, pos)[2]
    _, pos, name_end = _expect(der, pos, _SEQUENCE)  # subject: a sequence of sets
    parts: list[str] = []
    while pos < name_end:
        _, inner, pos = _expect(der, pos, _SET)
        while inner < pos:
            _, attribute, inner = _expect(der, inner, _SEQUENCE)
            _, oid_start, oid_end = _expect(der, attribute, _OID)
            value_tag, value_start, value_end = _tlv(der, oid_end)
            oid = _oid(der[oid_start:oid_end])
            value = der[value_start:value_end].decode(_STRINGS.get(value_tag, "utf-8"), "replace")
            parts.append(f"{_NAMES.get(oid, oid)}={value}")
    return ", ".join(parts)


def _tlv(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, where its contents start, where they end) of the DER element at ``pos``."""
    if pos + 2 > len(der):
        raise _Malformed("truncated")
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or pos + count > len(der):
            raise _Malformed("bad length")
        length = int.from_bytes(der[pos : pos + count], "big")
        pos += count
    if pos + length > len(der):
        raise _Malformed("truncated")
    return tag, pos, pos + length


def _expect(der: bytes, pos: int, tag: int) -> tuple[int, int, int]:
    found = _tlv(der, pos)
    if found[0] != tag:
        raise _Malformed(f"tag {found[0]:#x} where {tag:#x} belongs")
    return found


def _oid(raw: bytes) -> str:
    if not raw:
        raise _Malformed("empty OID")
    arcs = [*divmod(raw[0], 40)] if raw[0] < 80 else [2, raw[0] - 80]
    value = 0
    for byte in raw[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    return ".".join(map(str, arcs))
