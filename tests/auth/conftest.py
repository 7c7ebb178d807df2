"""Fixtures of the login tests: a client certificate made on the spot (for the tests without a broker)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import NamedTuple

import pytest


class MadeCertificate(NamedTuple):
    cert: Path
    key: Path
    encrypted_key: Path
    passphrase: str


@pytest.fixture(scope="session")
def made_cert(tmp_path_factory: pytest.TempPathFactory) -> MadeCertificate:
    """A self-signed client certificate (subject O=acme, CN=etl-user), its key, and the key encrypted."""
    pytest.importorskip("cryptography")  # in the [test] extra, not in every lane's venv
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = tmp_path_factory.mktemp("client-cert")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "acme"), x509.NameAttribute(NameOID.COMMON_NAME, "etl-user")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    passphrase = "correct horse battery"
    made = MadeCertificate(folder / "client.pem", folder / "client-key.pem", folder / "client-key-encrypted.pem", passphrase)
    made.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    plain = serialization.NoEncryption()
    made.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, plain))
    locked = serialization.BestAvailableEncryption(passphrase.encode())
    made.encrypted_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, locked))
    return made
