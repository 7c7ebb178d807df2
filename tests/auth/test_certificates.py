"""A client certificate's subject, read without CPython's private decoder (transport/certificates.py)."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path
from typing import Any

import pytest

from spark_amqp.transport.certificates import certificate_subject, certificate_user, subject_of

from .conftest import MadeCertificate

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.name import _ASN1Type  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def _certificate(subject: Any) -> bytes:
    """A self-signed certificate's DER with ``subject`` (an x509.Name)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    made = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer")]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    der: bytes = made.public_bytes(serialization.Encoding.DER)
    return der


def test_the_subject_of_a_made_certificate_in_its_order(made_cert: MadeCertificate) -> None:
    assert certificate_subject(str(made_cert.cert)) == "O=acme, CN=etl-user"
    assert certificate_user(str(made_cert.cert)) == "etl-user"


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ([("CN", "ü-user", _ASN1Type.UTF8String)], "CN=ü-user"),
        ([("CN", "plain", _ASN1Type.PrintableString)], "CN=plain"),
        ([("CN", "bmp-é", _ASN1Type.BMPString)], "CN=bmp-é"),
        ([("CN", "univ-ß", _ASN1Type.UniversalString)], "CN=univ-ß"),
        (
            [("C", "DE", None), ("ST", "Berlin", None), ("L", "Mitte", None), ("OU", "data", None), ("CN", "etl", None)],
            "C=DE, ST=Berlin, L=Mitte, OU=data, CN=etl",
        ),
        (
            [("UID", "u1", None), ("DC", "example", None), ("emailAddress", "a@example.com", None)],
            "UID=u1, DC=example, emailAddress=a@example.com",
        ),
        ([("OU", f"{i}" * 60, None) for i in range(4)], ", ".join(f"OU={i}" + f"{i}" * 59 for i in range(4))),  # a 2-byte length
    ],
)
def test_string_types_and_attribute_names(attributes: list[tuple[str, str, Any]], expected: str) -> None:
    oids = {
        "CN": NameOID.COMMON_NAME,
        "C": NameOID.COUNTRY_NAME,
        "ST": NameOID.STATE_OR_PROVINCE_NAME,
        "L": NameOID.LOCALITY_NAME,
        "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
        "UID": NameOID.USER_ID,
        "DC": NameOID.DOMAIN_COMPONENT,
        "emailAddress": NameOID.EMAIL_ADDRESS,
    }
    name = x509.Name([x509.NameAttribute(oids[k], v, _type=t) if t else x509.NameAttribute(oids[k], v) for k, v, t in attributes])
    assert subject_of(_certificate(name)) == expected


def test_a_multi_valued_name_and_an_unknown_attribute_by_its_oid() -> None:
    rdn = x509.RelativeDistinguishedName(
        [x509.NameAttribute(NameOID.COMMON_NAME, "etl"), x509.NameAttribute(x509.ObjectIdentifier("1.3.6.1.4.1.99999.1"), "z")]
    )
    subject = subject_of(_certificate(x509.Name([rdn])))
    assert sorted(subject.split(", ")) == ["1.3.6.1.4.1.99999.1=z", "CN=etl"]
    assert certificate_user_from(subject) == "etl"


def certificate_user_from(subject: str) -> str:
    return [p[3:] for p in subject.split(", ") if p.startswith("CN=")][-1]


def test_a_subject_without_a_common_name_is_the_user_as_a_whole(tmp_path: Path) -> None:
    pem = ssl.DER_cert_to_PEM_cert(_certificate(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "acme")])))
    (tmp_path / "c.pem").write_text(pem)
    assert certificate_user(str(tmp_path / "c.pem")) == "O=acme"


def test_the_first_certificate_of_a_chain_and_text_around_it(tmp_path: Path) -> None:
    first = ssl.DER_cert_to_PEM_cert(_certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leaf")])))
    second = ssl.DER_cert_to_PEM_cert(_certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")])))
    (tmp_path / "chain.pem").write_text("Bag Attributes\n  friendlyName: leaf\n" + first + second)
    assert certificate_subject(str(tmp_path / "chain.pem")) == "CN=leaf"


def test_what_is_not_a_certificate_gives_none(tmp_path: Path, made_cert: MadeCertificate) -> None:
    der = _certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "etl")]))
    for cut in (1, 10, 40, len(der) // 2):
        with pytest.raises(ValueError):
            subject_of(der[:cut])
    (tmp_path / "broken.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
    (tmp_path / "short.pem").write_text(ssl.DER_cert_to_PEM_cert(der[:30]))
    for path in (made_cert.key, tmp_path / "broken.pem", tmp_path / "short.pem", tmp_path / "missing.pem"):
        assert certificate_subject(str(path)) is None
    assert certificate_user(str(tmp_path / "missing.pem")) == "the client certificate's subject"
