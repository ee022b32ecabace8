"""The REST API's TLS material: the files copied for the cluster user, the harness's client
context, and the ``restapi``/``ctl`` sections of ``patroni.yml`` that point at them."""

from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path
from typing import Any

from testbed.patroni.layout import RestApiTLS

#: The names the copies get in the run's ``tls/`` directory (one per :class:`RestApiTLS` file).
FILES = ("certfile", "keyfile", "cafile", "client_certfile", "client_keyfile")


def copy_files(
    restapi_tls: RestApiTLS | None, directory: Path, uid: int, gid: int
) -> dict[str, Path]:
    """The REST API's TLS files, copied into ``directory`` where the cluster user can read them."""
    if restapi_tls is None:
        return {}
    directory.mkdir(mode=0o700, exist_ok=True)
    os.chown(directory, uid, gid)
    copies: dict[str, Path] = {}
    for name in FILES:
        source: Path = getattr(restapi_tls, name)
        copy = directory / name
        shutil.copyfile(source, copy)
        copy.chmod(0o600)
        os.chown(copy, uid, gid)
        copies[name] = copy
    return copies


def client_context(files: dict[str, Path]) -> ssl.SSLContext | None:
    """What the harness uses to talk to members over HTTPS (verifies their IP SANs)."""
    if not files:
        return None
    context = ssl.create_default_context(cafile=str(files["cafile"]))
    context.load_cert_chain(files["client_certfile"], files["client_keyfile"])
    return context


def restapi_config(restapi_tls: RestApiTLS | None, directory: Path) -> dict[str, str]:
    """The TLS keys of ``patroni.yml``'s ``restapi`` section (none without TLS)."""
    if restapi_tls is None:
        return {}
    return {
        "certfile": str(directory / "certfile"),
        "keyfile": str(directory / "keyfile"),
        "cafile": str(directory / "cafile"),
        "verify_client": restapi_tls.verify_client,
    }


def ctl_config(restapi_tls: RestApiTLS | None, directory: Path) -> dict[str, Any]:
    """What members present when they call each other's REST API (the leader race)."""
    if restapi_tls is None:
        return {}
    return {
        "ctl": {
            "certfile": str(directory / "client_certfile"),
            "keyfile": str(directory / "client_keyfile"),
            "cacert": str(directory / "cafile"),
        }
    }
