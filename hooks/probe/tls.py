"""TLS towards the members: the files to use, and one client context built from them."""

from __future__ import annotations

import os
import ssl
import threading
from dataclasses import dataclass

from hooks.probe.transport import CutOffTLSSocket, ProbeFailure


@dataclass(frozen=True, slots=True)
class PatroniTLS:
    """How ``https`` members are verified, and the certificate the hook presents to them.

    For Patroni's ``restapi.verify_client: required`` the hook needs a client certificate
    its ``restapi.cafile`` trusts. Files come from a mounted Secret.
    """

    #: CA bundle that signs the members' REST API certificates (``None``: system CAs).
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None


class TLSContexts:
    """One client :class:`ssl.SSLContext` for the files of a :class:`PatroniTLS`.

    Built on first use, and again whenever a file's inode, size or mtime changes (a Secret
    volume swaps a symlink to a new directory: a new inode), so a renewed CA bundle or client
    certificate is used from the next probe on. Building costs 0.25 ms with a CA file,
    0.8 ms with a client certificate, ~20 ms with the system roots: once per change, not
    once per connection. A file that cannot be read or loaded is every https probe's
    reason, naming the setting, until it is fixed.
    """

    def __init__(self, tls: PatroniTLS) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._built: tuple[tuple[object, ...], ssl.SSLContext | str] | None = None

    def context(self) -> ssl.SSLContext:
        """The context for the files as they are now; :class:`ProbeFailure` if unusable."""
        signature = self._signature()
        if isinstance(signature, str):
            raise ProbeFailure(signature)
        built = self._built
        if built is None or built[0] != signature:
            with self._lock:
                built = self._built
                if built is None or built[0] != signature:
                    built = (signature, self._build())
                    self._built = built
        if isinstance(built[1], str):
            raise ProbeFailure(built[1])
        return built[1]

    def problem(self) -> str | None:
        """Why https probes fail with these files, or ``None`` (start-up check)."""
        try:
            self.context()
        except ProbeFailure as failure:
            return failure.reason
        return None

    def _files(self) -> list[tuple[str, str]]:
        tls = self.tls
        files = [("PGFH_PATRONI_CA_FILE", tls.ca_file)]
        if tls.client_cert_file and tls.client_key_file:
            files += [
                ("PGFH_PATRONI_CLIENT_CERT_FILE", tls.client_cert_file),
                ("PGFH_PATRONI_CLIENT_KEY_FILE", tls.client_key_file),
            ]
        return [(setting, path) for setting, path in files if path]

    def _signature(self) -> tuple[object, ...] | str:
        signature: list[object] = []
        for setting, path in self._files():
            try:
                stat = os.stat(path)
            except OSError as error:
                return f"TLS: cannot read {setting} {path} ({error.strerror})"
            signature.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
        return tuple(signature)

    def _build(self) -> ssl.SSLContext | str:
        tls = self.tls
        try:
            context = ssl.create_default_context(cafile=tls.ca_file)
        except (OSError, ssl.SSLError):
            return f"TLS: no CA certificate could be loaded from PGFH_PATRONI_CA_FILE {tls.ca_file}"
        if tls.client_cert_file and tls.client_key_file:
            try:
                context.load_cert_chain(tls.client_cert_file, tls.client_key_file)
            except (OSError, ssl.SSLError):
                return (
                    "TLS: the client certificate could not be loaded "
                    "(PGFH_PATRONI_CLIENT_CERT_FILE / PGFH_PATRONI_CLIENT_KEY_FILE)"
                )
        # check_hostname stays on (the default): OpenSSL checks the pod IP, or the
        # serverName sent as SNI, while it verifies the chain. urllib3 only checks names
        # itself when asked to assert another one, and it would switch check_hostname
        # off on this shared context to do so.
        context.sslsocket_class = CutOffTLSSocket
        return context
