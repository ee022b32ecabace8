"""Who may call ``/sync`` and ``/customize``: Metacontroller, and nobody else.

A sync reply decides where a database Service points, so a caller that could make the
hook answer (or merely make it probe) is a caller that matters. Metacontroller 4.16+
authenticates itself to webhooks in two ways, both resolved from Secrets only when it builds
the controller for the CompositeController, i.e. when its spec changes or Metacontroller
starts (``pkg/hooks/auth.go``; an annotation or a changed Secret is not noticed, so rotations
change the spec: ``ops/rotation/``):

* ``authorization``: it sends ``Authorization: <type> <value>`` where ``type`` defaults
  to ``Bearer`` and ``value`` is the Secret key's content with surrounding whitespace
  trimmed;
* ``clientTLS`` (with ``caBundle`` to verify us): a client certificate on an HTTPS
  connection.

This module checks both. Tokens live in files (a mounted Secret: one token per key), and
are re-read whenever a file changes, so a rotation (new key added, old key removed) takes
effect on the next request without a restart. Comparison is constant-time over every
accepted token, and nothing about the failure is told to the caller.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hooks.shell.config import AuthSettings

log = logging.getLogger("hooks.auth")

#: Shorter tokens are ignored (and logged): a guessable token is no authentication.
MIN_TOKEN_LENGTH = 16
#: Larger files are not tokens; they are not read.
MAX_TOKEN_FILE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one check. ``reason`` is for logs and metrics, never for the caller."""

    ok: bool
    status: int = 200
    #: A short fixed label (metric label value).
    reason: str = "ok"


ALLOWED = Verdict(True)


class TokenStore:
    """The accepted tokens, re-read whenever the files behind them change.

    Each call stats the path (and the files of a directory): a few system calls, far
    cheaper than the JSON parsing of the request they protect. Kubernetes updates a
    mounted Secret by swapping a symlink, so the stat (which follows it) sees a new
    inode and the tokens are read again. Files whose names start with ``.`` (the
    kubelet's ``..data`` machinery) are skipped.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._signature: object = None
        self._digests: tuple[bytes, ...] = ()

    def digests(self) -> tuple[bytes, ...]:
        """SHA-256 digests of the accepted tokens (empty if none could be read)."""
        signature, files = self._scan()
        with self._lock:
            if signature != self._signature:
                self._digests = self._load(files)
                self._signature = signature
                _report_loaded(self.path, len(self._digests))
            return self._digests

    def _scan(self) -> tuple[object, list[Path]]:
        try:
            if self.path.is_dir():
                files = sorted(
                    p for p in self.path.iterdir() if not p.name.startswith(".") and p.is_file()
                )
            else:
                files = [self.path] if self.path.is_file() else []
            signature = tuple(
                (f.name, st.st_ino, st.st_mtime_ns, st.st_size) for f in files for st in (f.stat(),)
            )
        except OSError:
            return ("unreadable",), []
        return signature, files

    def _load(self, files: Sequence[Path]) -> tuple[bytes, ...]:
        per_line = len(files) == 1 and files[0] == self.path
        tokens: list[str] = []
        for path in files:
            try:
                if path.stat().st_size > MAX_TOKEN_FILE_BYTES:
                    log.error("ignoring %s: larger than %d bytes", path, MAX_TOKEN_FILE_BYTES)
                    continue
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                log.error("ignoring %s: %s", path, type(error).__name__)
                continue
            values = [line.strip() for line in text.splitlines()] if per_line else [text.strip()]
            for value in values:
                if not value or (per_line and value.startswith("#")):
                    continue
                problem = _token_problem(value)
                if problem:
                    log.error("ignoring a token in %s: %s", path, problem)
                    continue
                tokens.append(value)
        return tuple(hashlib.sha256(t.encode()).digest() for t in dict.fromkeys(tokens))


def _token_problem(token: str) -> str | None:
    if len(token) < MIN_TOKEN_LENGTH:
        return f"shorter than {MIN_TOKEN_LENGTH} characters"
    if not all(33 <= ord(c) <= 126 for c in token):
        return "not printable ASCII without spaces (it could not travel in a header)"
    return None


def _report_loaded(path: Path, count: int) -> None:
    from hooks.shell import metrics  # the metric lives with the others; imported late for tests

    metrics.AUTH_TOKENS.set(count)
    if count:
        log.info("caller tokens loaded from %s: %d", path, count)
    else:
        log.error("no caller token could be loaded from %s: every sync is refused", path)


class Authenticator:
    """Checks one request's credentials against :class:`AuthSettings`."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self.tokens = TokenStore(settings.tokens_path) if settings.tokens_required else None
        if self.tokens is not None:
            self.tokens.digests()  # load now: log what was found, set the gauge per worker

    def check(self, authorization: str | None, certificate: Mapping[str, Any] | None) -> Verdict:
        """``authorization`` is the header (or ``None``); ``certificate`` the verified
        client certificate as :meth:`ssl.SSLSocket.getpeercert` returns it (or ``None``)."""
        if self.settings.certificate_required:
            if not certificate:
                return Verdict(False, 401, "no_client_certificate")
            allowed = self.settings.client_names
            if allowed and not (certificate_names(certificate) & allowed):
                return Verdict(False, 403, "client_name_not_allowed")
        if self.tokens is not None:
            return self._check_token(authorization)
        return ALLOWED

    def _check_token(self, authorization: str | None) -> Verdict:
        assert self.tokens is not None
        if not authorization:
            return Verdict(False, 401, "no_token")
        scheme, _, presented = authorization.strip().partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            return Verdict(False, 401, "not_a_bearer_token")
        digests = self.tokens.digests()
        if not digests:
            return Verdict(False, 401, "no_tokens_loaded")
        candidate = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        # Compare with every token, without stopping at a match: the time taken says
        # nothing about which token (or how much of one) matched.
        matched = False
        for digest in digests:
            matched |= hmac.compare_digest(candidate, digest)
        return ALLOWED if matched else Verdict(False, 401, "unknown_token")

    def ready_problem(self) -> str | None:
        """Why this hook cannot authenticate anyone right now (for ``/readyz``), or ``None``."""
        if self.tokens is not None and not self.tokens.digests():
            return "no caller token loaded"
        return None


def certificate_names(certificate: Mapping[str, Any]) -> frozenset[str]:
    """The subject CN and the DNS/URI subjectAltNames of a ``getpeercert()`` dict."""
    names: set[str] = set()
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(value)
    for kind, value in certificate.get("subjectAltName", ()):
        if kind in ("DNS", "URI"):
            names.add(value)
    return frozenset(names)
