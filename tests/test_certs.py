"""The test bed's one PKI (testbed/certs.py) and the control plane's use of it
(testbed/kubernetes/pki.py): names, usages and issuers are exactly what was asked for."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.certs import TestCA
from testbed.kubernetes.pki import CertificateAuthority, service_account_keys


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_a_test_ca_issues_a_server_certificate_with_exactly_the_names_asked_for(
    tmp_path: Path,
) -> None:
    ca = TestCA(tmp_path, "probe")
    pair = ca.issue("member", ips=("127.0.0.2",), dns=("pg-0",))
    cert, ca_cert = _load(pair.cert), _load(ca.cert_file)
    assert ca.cert_file == tmp_path / "probe-ca.crt"
    assert ca_cert.subject.rfc4514_string() == "CN=probe CA"
    assert cert.subject.rfc4514_string() == "CN=member"
    cert.verify_directly_issued_by(ca_cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.2"]
    assert sans.get_values_for_type(x509.DNSName) == ["pg-0"]
    assert _usages(cert) == {ExtendedKeyUsageOID.SERVER_AUTH}
    assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600


def test_the_control_planes_ca_issues_users_by_cn_and_groups_and_serving_certificates(
    tmp_path: Path,
) -> None:
    ca = CertificateAuthority(tmp_path)
    admin = ca.issue("admin", common_name="kubernetes-admin", organizations=("system:masters",))
    serving = ca.issue("apiserver", common_name="kube-apiserver", ips=("127.0.0.1",), server=True)
    ca_cert = _load(ca.cert_file)
    assert ca.cert_file == tmp_path / "ca.crt"
    assert ca_cert.subject.rfc4514_string() == "CN=pgfh-test-kubernetes-ca"
    user = _load(admin.cert)
    user.verify_directly_issued_by(ca_cert)
    assert user.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kubernetes-admin"
    groups = user.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [g.value for g in groups] == ["system:masters"]
    assert _usages(user) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    server = _load(serving.cert)
    server.verify_directly_issued_by(ca_cert)
    assert _usages(server) == {ExtendedKeyUsageOID.SERVER_AUTH}
    assert (admin.key.name, serving.key.name) == ("admin.key", "apiserver.key")


def test_the_service_account_keys_are_a_private_key_and_its_public_half(tmp_path: Path) -> None:
    pair = service_account_keys(tmp_path)
    assert pair.key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert pair.cert.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600
