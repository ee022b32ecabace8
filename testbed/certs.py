"""Throw-away X.509 certificates, made with ``cryptography``: the test bed's one PKI.

A :class:`TestCA` signs server and client certificates; each certificate is written as
PEM files (``<name>.crt`` and ``<name>.key``) into a directory the test owns. Keys are
P-256 (fast to generate), validity is one day, and every certificate carries exactly the
names the test asks for, so a test can tell a name mismatch from an untrusted issuer. The
TLS tests, the probe-round benchmark and the control plane (:mod:`testbed.kubernetes.pki`:
its CA, users by CN and O, serving certificates) all issue through it.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    """A certificate and its key on disk."""

    cert: Path
    key: Path


def write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    """A private key as unencrypted PKCS#8 PEM, readable by its owner only."""
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class TestCA:
    """A private CA in ``directory`` (``<name>-ca.crt``, or ``cert_file``; CN ``<name> CA``,
    or ``common_name``)."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        directory: Path,
        name: str = "test",
        *,
        common_name: str | None = None,
        cert_file: Path | None = None,
    ) -> None:
        self.directory = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name or f"{name} CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_file = cert_file or directory / f"{name}-ca.crt"
        self.cert_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        *,
        ips: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        client: bool = False,
        server: bool = True,
        common_name: str | None = None,
        organizations: tuple[str, ...] = (),
    ) -> Pair:
        """A leaf certificate in ``<name>.crt``/``.key`` with CN ``name`` (or ``common_name``),
        these O attributes (Kubernetes reads them as groups) and exactly these SANs."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name or name))
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        sans += [x509.DNSName(d) for d in dns]
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(pair.key, key)
        return pair
