"""A throwaway certificate authority and a server certificate for 127.0.0.1 and localhost: what
the simulator's HTTPS services (ARM's acknowledge, bridge.simulator.arm) and the tests' HTTPS
doubles serve with. `cryptography` is a dependency of every se-bridge install (command signing).

Clients trust the CA through a PEM bundle (for requests and azure-core: `REQUESTS_CA_BUNDLE`),
so the code under test verifies the certificate exactly as it would in production. The CA and
the server certificate are separate, with the extensions a strict verifier expects (Python 3.13
turns on `VERIFY_X509_STRICT` by default), so the setup stays valid as the stack tightens.
"""

from __future__ import annotations

import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509


@dataclass(frozen=True)
class ServerCertificate:
    """The files of one throwaway CA and the server certificate it signed."""

    ca_bundle: Path  # the CA certificate alone (PEM): what clients are told to trust
    cert_chain: Path  # the server certificate, then the CA (PEM)
    key: Path  # the server's private key (PEM, unencrypted)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_chain, self.key)
        return context


class ThrowawayCertificate:
    """`make_server_certificate` in a temporary directory that `cleanup()` removes, and the
    server's TLS context: what an HTTPS double holds for its life."""

    def __init__(self, prefix: str, host_name: str = "localhost") -> None:
        self._tempdir = tempfile.TemporaryDirectory(prefix=prefix)
        try:
            self.files = make_server_certificate(Path(self._tempdir.name), host_name)
            self.context = self.files.server_context()
        except BaseException:
            self._tempdir.cleanup()
            raise

    @property
    def ca_bundle(self) -> Path:
        """The PEM file holding the CA that signed the server certificate."""
        return self.files.ca_bundle

    def cleanup(self) -> None:
        self._tempdir.cleanup()


def _name(common_name: str) -> x509.Name:
    # cryptography loads only when a certificate is made: the command line (which imports the
    # demo, which imports this) starts an agent without it.
    from cryptography import x509  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "se-bridge simulator"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def make_server_certificate(directory: Path, host_name: str = "localhost") -> ServerCertificate:
    """Write a fresh CA and a server certificate for `host_name` and 127.0.0.1 into `directory`."""
    from cryptography import x509  # noqa: PLC0415 - as in _name
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID  # noqa: PLC0415

    now = datetime.now(timezone.utc)
    not_before, not_after = now - timedelta(minutes=5), now + timedelta(days=2)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("se-bridge simulator CA")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(signs_certificates=True),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(host_name))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(host_name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            _key_usage(signs_certificates=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    ca_pem = ca_cert.public_bytes(pem)
    paths = ServerCertificate(
        ca_bundle=directory / "ca.pem",
        cert_chain=directory / "server-chain.pem",
        key=directory / "server-key.pem",
    )
    paths.ca_bundle.write_bytes(ca_pem)
    paths.cert_chain.write_bytes(cert.public_bytes(pem) + ca_pem)
    paths.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    paths.key.chmod(0o600)
    return paths


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures always; certificate and CRL signing only for the CA."""
    from cryptography import x509  # noqa: PLC0415 - as in _name

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )
