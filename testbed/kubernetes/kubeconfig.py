"""Kubeconfig files for the test control plane: by client certificate or by bearer token."""

from __future__ import annotations

from pathlib import Path

import yaml

from testbed.kubernetes.pki import KeyPair


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_file: Path,
    user: str,
    client: KeyPair | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    """One cluster, one user, one context named ``pgfh-test`` (also the current one)."""
    credentials: dict[str, str] = {}
    if client is not None:
        credentials = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    if token is not None:
        credentials["token"] = token
    context: dict[str, str] = {"cluster": "pgfh-test", "user": user}
    if namespace:
        context["namespace"] = namespace
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "pgfh-test",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "pgfh-test", "context": context}],
        "current-context": "pgfh-test",
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)
    return path
