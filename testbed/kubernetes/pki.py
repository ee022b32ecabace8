"""The control plane's throw-away PKI: one CA, serving and client certificates, SA keys.

kube-apiserver authenticates clients by certificate (``--client-ca-file``): the user is the
certificate's CN and its groups the O attributes, so the admin is ``O=system:masters`` and
kube-controller-manager is ``CN=system:kube-controller-manager`` (the name the bootstrap RBAC
roles bind). ServiceAccount tokens are signed with an RSA key (``--service-account-*``).
The certificates come from the test bed's one PKI (:mod:`testbed.certs`: P-256 keys, valid for
a day); everything lives in the run's directory.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from testbed.certs import Pair, TestCA, write_key

#: A certificate and its key on disk (the name the control plane's modules use).
KeyPair = Pair


class CertificateAuthority:
    """A CA whose certificate is ``<directory>/ca.crt``; its leaves are client certificates
    unless ``server`` (a certificate here is one or the other, as kubeadm makes them)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._ca = TestCA(
            directory, common_name="pgfh-test-kubernetes-ca", cert_file=directory / "ca.crt"
        )
        self.cert_file = self._ca.cert_file

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        organizations: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        server: bool = False,
    ) -> KeyPair:
        """A leaf certificate: a client one, or a serving one (``server``) with these SANs."""
        return self._ca.issue(
            name,
            common_name=common_name,
            organizations=organizations,
            ips=ips,
            dns=dns,
            server=server,
            client=not server,
        )


def service_account_keys(directory: Path) -> KeyPair:
    """The RSA key pair that signs and verifies ServiceAccount tokens (``sa.key``/``sa.pub``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    write_key(pair.key, key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
