"""Security: caller authentication (also under real gunicorn), TLS to Patroni.

The test design notes are those of tests/test_security_requests.py.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from werkzeug.test import TestResponse

from hooks.probe.tls import PatroniTLS
from hooks.shell import auth as auth_module
from hooks.shell.app import create_app
from hooks.shell.config import AuthSettings, HookSettings, ServerTLS
from testbed.certs import Pair, TestCA
from testbed.metacontroller.gunicorn import GunicornHook, gunicorn_hook
from tests.helpers import (
    CLUSTER,
    NOW,
    FakeProber,
    make_pod,
    make_service,
    sync_body,
)

# ------------------------------------------------------------ caller authentication

GOOD = "rotation-token-current-0123456789abcdef"


OLD = "rotation-token-previous-0123456789abcdef"


def quiet_body() -> dict[str, Any]:
    """A valid sync request whose members have no IP yet: answered without any probe."""
    pods = [make_pod(f"{CLUSTER}-{i}", None) for i in range(3)]
    return sync_body(pods=pods, services=[make_service(pod=f"{CLUSTER}-0")])


def customize_body() -> dict[str, Any]:
    body = quiet_body()
    return {"controller": body["controller"], "parent": body["parent"]}


class AuthHook:
    """The real app with a token directory the test can rotate."""

    def __init__(self, tokens: Path, auth: AuthSettings) -> None:
        self.tokens = tokens
        self.prober = FakeProber()
        app = create_app(settings=HookSettings(auth=auth), prober=self.prober, clock=lambda: NOW)
        app.config["TESTING"] = True
        self.client = app.test_client()

    def call(
        self,
        authorization: str | None,
        path: str = "/sync",
        certificate: dict[str, Any] | None = None,
        body: bytes | None = None,
    ) -> TestResponse:
        headers = {} if authorization is None else {"Authorization": authorization}
        data = (
            body
            if body is not None
            else json.dumps(quiet_body() if path == "/sync" else customize_body()).encode()
        )
        environ = {"gunicorn.socket": FakeTLSSocket(certificate)} if certificate else {}
        return self.client.post(
            path,
            data=data,
            headers=headers,
            content_type="application/json",
            environ_overrides=environ,
        )


class FakeTLSSocket:
    """What gunicorn puts in the WSGI environ for an HTTPS connection: ``getpeercert()``."""

    def __init__(self, certificate: dict[str, Any] | None) -> None:
        self.certificate = certificate

    def getpeercert(self) -> dict[str, Any] | None:
        return self.certificate


def certificate(cn: str, *dns: str) -> dict[str, Any]:
    """A verified peer certificate as :meth:`ssl.SSLSocket.getpeercert` returns it."""
    return {
        "subject": ((("commonName", cn),),),
        "subjectAltName": tuple(("DNS", d) for d in dns),
    }


@pytest.fixture
def tokens_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "auth"
    directory.mkdir()
    (directory / "token").write_text(GOOD + "\n")
    return directory


@pytest.fixture
def hook(tokens_dir: Path) -> AuthHook:
    return AuthHook(tokens_dir, AuthSettings(mode="token", tokens_path=str(tokens_dir)))


def assert_refused(response: TestResponse, status: int = 401) -> None:
    assert response.status_code == status
    assert response.get_json() == {"error": "unauthorized" if status == 401 else "forbidden"}


def test_the_container_default_requires_a_token() -> None:
    settings = HookSettings.from_env({})
    assert settings.auth == AuthSettings(mode="token", tokens_path="/etc/pg-failover-hook/auth")
    assert HookSettings().auth == settings.auth


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
def test_health_and_metrics_need_no_credentials(hook: AuthHook, path: str) -> None:
    assert hook.client.get(path).status_code == 200


def test_readiness_needs_no_credentials_but_fails_without_a_usable_token(
    hook: AuthHook, tokens_dir: Path
) -> None:
    assert hook.client.get("/readyz").status_code == 200
    (tokens_dir / "token").write_text("short\n")
    response = hook.client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json() == {"status": "not ready", "reason": "no caller token loaded"}
    assert_refused(hook.call(f"Bearer {GOOD}"))
    (tokens_dir / "token").write_text(GOOD)
    assert hook.client.get("/readyz").status_code == 200


@pytest.mark.parametrize("path", ["/sync", "/customize"])
@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="no-header"),
        pytest.param("", id="empty"),
        pytest.param("Bearer", id="no-token"),
        pytest.param("Bearer ", id="blank-token"),
        pytest.param(GOOD, id="no-scheme"),
        pytest.param(f"Token {GOOD}", id="other-scheme"),
        pytest.param("Basic " + base64.b64encode(f"x:{GOOD}".encode()).decode(), id="basic"),
        pytest.param(f"Bearer {GOOD}x", id="longer"),
        pytest.param(f"Bearer {GOOD[:-1]}", id="prefix"),
        pytest.param(f"Bearer {GOOD.upper()}", id="other-case"),
        pytest.param(f"Bearer {OLD}", id="not-configured"),
        pytest.param(f"Bearer {GOOD} {GOOD}", id="twice"),
        pytest.param(
            "Bearer " + "\u00e9" * 20,
            id="non-ascii",
        ),
    ],
)
def test_a_call_without_the_right_token_is_refused_without_detail(
    hook: AuthHook, path: str, authorization: str | None
) -> None:
    response = hook.call(authorization, path)
    assert_refused(response)
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="pg-failover-hook"'
    assert hook.prober.calls == []


@pytest.mark.parametrize(
    "authorization", [f"Bearer {GOOD}", f"bearer {GOOD}", f"BEARER   {GOOD}  "]
)
@pytest.mark.parametrize("path", ["/sync", "/customize"])
def test_the_right_token_is_accepted(hook: AuthHook, path: str, authorization: str) -> None:
    assert hook.call(authorization, path).status_code == 200


def test_an_unauthenticated_call_is_refused_before_its_body_is_read(hook: AuthHook) -> None:
    huge = b"[" * (HookSettings().max_request_bytes + 1)
    assert_refused(hook.call(None, body=huge))
    assert hook.call(f"Bearer {GOOD}", body=huge).status_code == 413


def test_rotation_two_tokens_then_the_old_one_removed_without_a_restart(
    hook: AuthHook, tokens_dir: Path
) -> None:
    (tokens_dir / "token.previous").write_text(OLD)
    assert hook.call(f"Bearer {GOOD}").status_code == 200
    assert hook.call(f"Bearer {OLD}").status_code == 200
    (tokens_dir / "token.previous").unlink()
    assert_refused(hook.call(f"Bearer {OLD}"))
    assert hook.call(f"Bearer {GOOD}").status_code == 200


def test_rotation_of_a_mounted_secret_swapping_the_data_symlink(tmp_path: Path) -> None:
    # The kubelet's layout: <dir>/token -> ..data/token, ..data -> ..<timestamp>; an update
    # writes a new timestamped directory and renames a new ..data link over the old one.
    mount = tmp_path / "secret"
    mount.mkdir()

    def publish(version: str, tokens: dict[str, str]) -> None:
        data = mount / f"..{version}"
        data.mkdir()
        for key, value in tokens.items():
            (data / key).write_text(value)
            link = mount / key
            if not link.is_symlink():
                link.symlink_to(Path("..data") / key)
        (mount / "..data_tmp").symlink_to(data.name)
        (mount / "..data_tmp").replace(mount / "..data")

    publish("2026_08_20_10_00_00.1", {"token": OLD})
    hook = AuthHook(mount, AuthSettings(mode="token", tokens_path=str(mount)))
    assert hook.call(f"Bearer {OLD}").status_code == 200
    publish("2026_08_20_10_05_00.2", {"token": GOOD})
    assert hook.call(f"Bearer {GOOD}").status_code == 200
    assert_refused(hook.call(f"Bearer {OLD}"))


def test_a_tokens_file_holds_one_token_per_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# rotated 2026-08-20\n{GOOD}\n\n  {OLD}  \nshort\n")
    hook = AuthHook(path, AuthSettings(mode="token", tokens_path=str(path)))
    assert hook.call(f"Bearer {GOOD}").status_code == 200
    assert hook.call(f"Bearer {OLD}").status_code == 200
    assert_refused(hook.call("Bearer short"))
    assert_refused(hook.call("Bearer # rotated 2026-08-20"))


def test_unusable_tokens_are_ignored_and_logged_without_their_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "auth"
    directory.mkdir()
    (directory / "short").write_text("0123456789")
    (directory / "spaced").write_text("0123456789 0123456789")
    (directory / "huge").write_text("x" * 5000)
    (directory / "good").write_text(GOOD)
    with caplog.at_level(logging.INFO, logger="hooks.auth"):
        hook = AuthHook(directory, AuthSettings(mode="token", tokens_path=str(directory)))
        assert hook.call(f"Bearer {GOOD}").status_code == 200
        assert_refused(hook.call("Bearer 0123456789"))
    text = caplog.text
    assert "caller tokens loaded from" in text and ": 1" in text
    assert "shorter than 16 characters" in text and "larger than 4096 bytes" in text
    assert GOOD not in text and "0123456789" not in text


def test_a_refused_call_is_logged_and_counted_but_the_token_is_not_logged(
    hook: AuthHook, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Bearer wrong-but-long-enough-token-value"
    with caplog.at_level(logging.WARNING, logger="hooks.app"):
        assert_refused(hook.call(wrong))
    assert "refused a sync call: unknown_token" in caplog.text
    assert "wrong-but-long-enough" not in caplog.text
    metrics = hook.client.get("/metrics").get_data(as_text=True)
    assert 'pgfh_auth_failures_total{reason="unknown_token"}' in metrics
    assert "pgfh_auth_tokens 1.0" in metrics


def test_every_token_is_compared_in_constant_time_without_stopping_at_a_match(
    hook: AuthHook, tokens_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tokens_dir / "token.next").write_text(OLD)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    assert hook.call(f"Bearer {GOOD}").status_code == 200
    assert len(compared) == 2, "both tokens compared, the match did not stop the loop"
    assert all(len(a) == len(b) == 32 for a, b in compared), "digests: equal lengths"


def test_no_tokens_at_all_refuses_everything(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    hook = AuthHook(missing, AuthSettings(mode="token", tokens_path=str(missing)))
    assert_refused(hook.call(f"Bearer {GOOD}"))
    assert hook.client.get("/readyz").status_code == 503


def test_mtls_requires_a_verified_client_certificate(tmp_path: Path) -> None:
    hook = AuthHook(tmp_path, AuthSettings(mode="mtls"))
    response = hook.call(None)
    assert_refused(response)
    assert "WWW-Authenticate" not in response.headers
    assert hook.call(None, certificate=certificate("metacontroller")).status_code == 200
    assert hook.call(None, path="/customize", certificate=certificate("x")).status_code == 200
    assert hook.client.get("/readyz").status_code == 200


def test_mtls_client_names_limit_which_certificates_are_accepted(tmp_path: Path) -> None:
    names = frozenset({"metacontroller", "metacontroller.metacontroller.svc"})
    hook = AuthHook(tmp_path, AuthSettings(mode="mtls", client_names=names))
    assert hook.call(None, certificate=certificate("metacontroller")).status_code == 200
    by_san = certificate("mc-7f9c", "metacontroller.metacontroller.svc")
    assert hook.call(None, certificate=by_san).status_code == 200
    assert_refused(hook.call(None, certificate=certificate("intruder", "evil.example")), 403)


def test_token_and_mtls_require_both(tokens_dir: Path) -> None:
    hook = AuthHook(tokens_dir, AuthSettings(mode="token+mtls", tokens_path=str(tokens_dir)))
    cert = certificate("metacontroller")
    assert_refused(hook.call(f"Bearer {GOOD}"))
    assert_refused(hook.call(None, certificate=cert))
    assert_refused(hook.call("Bearer wrong-but-long-enough-token-value", certificate=cert))
    assert hook.call(f"Bearer {GOOD}", certificate=cert).status_code == 200


def test_auth_none_is_an_explicit_switch_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hooks.app"):
        app = create_app(settings=HookSettings.from_env({"PGFH_AUTH": "none"}), prober=FakeProber())
    assert "caller authentication is OFF (PGFH_AUTH=none)" in caplog.text
    response = app.test_client().post(
        "/sync", data=json.dumps(quiet_body()), content_type="application/json"
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PGFH_AUTH": "off"}, "PGFH_AUTH='off' must be one of token, mtls, token+mtls, none"),
        ({"PGFH_AUTH": "mtls"}, "PGFH_AUTH=mtls needs HTTPS with client certificates"),
        (
            {"PGFH_AUTH": "token+mtls", "PGFH_TLS_CERT_FILE": "c", "PGFH_TLS_KEY_FILE": "k"},
            "PGFH_AUTH=token+mtls needs HTTPS with client certificates",
        ),
        ({"PGFH_TLS_CERT_FILE": "c"}, "PGFH_TLS_CERT_FILE and PGFH_TLS_KEY_FILE must be set"),
        ({"PGFH_TLS_CLIENT_CA_FILE": "ca"}, "PGFH_TLS_CLIENT_CA_FILE needs PGFH_TLS_CERT_FILE"),
        ({"PGFH_AUTH_CLIENT_NAMES": "mc"}, "PGFH_AUTH_CLIENT_NAMES is only used with"),
    ],
)
def test_inconsistent_auth_settings_stop_the_start_up(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        HookSettings.from_env(env)


def test_auth_settings_are_read_from_the_environment() -> None:
    settings = HookSettings.from_env(
        {
            "PGFH_AUTH": "Token+MTLS",
            "PGFH_AUTH_TOKENS_PATH": "/run/tokens",
            "PGFH_AUTH_CLIENT_NAMES": "metacontroller, mc.example",
            "PGFH_TLS_CERT_FILE": "/tls/tls.crt",
            "PGFH_TLS_KEY_FILE": "/tls/tls.key",
            "PGFH_TLS_CLIENT_CA_FILE": "/tls/ca.crt",
        }
    )
    assert settings.auth == AuthSettings(
        "token+mtls", "/run/tokens", frozenset({"metacontroller", "mc.example"})
    )
    assert settings.server_tls == ServerTLS("/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt")


# ------------------------------------------------ authentication under real gunicorn


@pytest.fixture(scope="module")
def gunicorn_token_hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with gunicorn_hook(tmp_path_factory.mktemp("token-hook"), workers=2) as running:
        yield running


def real_sync(hook: GunicornHook, headers: dict[str, str], **kwargs: Any) -> requests.Response:
    return requests.post(
        f"{hook.url}/sync",
        data=json.dumps(quiet_body()),
        headers={"Content-Type": "application/json", **headers},
        timeout=5,
        verify=hook.verify,
        **kwargs,
    )


@pytest.mark.gunicorn
def test_bearer_token_under_gunicorn(gunicorn_token_hook: GunicornHook) -> None:
    hook = gunicorn_token_hook
    assert hook.token is not None
    refused = real_sync(hook, {})
    assert (refused.status_code, refused.json()) == (401, {"error": "unauthorized"})
    assert real_sync(hook, {"Authorization": "Bearer not-the-token-0123456789"}).status_code == 401
    assert real_sync(hook, hook.headers).status_code == 200
    for path in ("/healthz", "/readyz", "/metrics"):
        assert requests.get(f"{hook.url}{path}", timeout=5).status_code == 200


@pytest.mark.gunicorn
def test_token_rotation_under_gunicorn_reaches_every_worker_without_a_restart(
    gunicorn_token_hook: GunicornHook,
) -> None:
    hook = gunicorn_token_hook
    assert hook.tokens_dir is not None and hook.token is not None
    pid = hook.process.pid
    new = "rotated-token-for-the-gunicorn-test-0123"
    # 1. The Secret gets the new token as a second key: both are accepted.
    (hook.tokens_dir / "token.next").write_text(new)
    for _ in range(10):  # the kernel spreads these over both workers
        assert real_sync(hook, {"Authorization": f"Bearer {new}"}).status_code == 200
        assert real_sync(hook, hook.headers).status_code == 200
    # 2. The old key is removed: refused at once, by every worker.
    old = hook.headers
    (hook.tokens_dir / "token").unlink()
    (hook.tokens_dir / "token.next").replace(hook.tokens_dir / "token")
    for _ in range(10):
        assert real_sync(hook, old).status_code == 401
        assert real_sync(hook, {"Authorization": f"Bearer {new}"}).status_code == 200
    assert hook.process.pid == pid and hook.process.poll() is None
    # The gauge is the lowest count over live workers (a worker still booting shows 0).
    deadline = time.monotonic() + 10
    while "pgfh_auth_tokens 1.0" not in requests.get(f"{hook.url}/metrics", timeout=5).text:
        assert time.monotonic() < deadline, "every worker should report one token"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("pki")
    ca = TestCA(directory, "hook")
    rogue = TestCA(directory, "rogue")
    return {
        "ca": ca,
        "server": ca.issue("pg-failover-hook", ips=("127.0.0.1",), dns=("localhost",)),
        "client": ca.issue("metacontroller", client=True, server=False),
        "intruder": ca.issue("intruder", client=True, server=False),
        "rogue": rogue.issue("metacontroller-rogue", client=True, server=False),
    }


def tls_env(pki: dict[str, Any], mode: str, **extra: str) -> dict[str, str]:
    return {
        "PGFH_AUTH": mode,
        "PGFH_TLS_CERT_FILE": str(pki["server"].cert),
        "PGFH_TLS_KEY_FILE": str(pki["server"].key),
        "PGFH_TLS_CLIENT_CA_FILE": str(pki["ca"].cert_file),
        **extra,
    }


def client_cert(pair: Pair) -> tuple[str, str]:
    return (str(pair.cert), str(pair.key))


@pytest.mark.gunicorn
def test_mtls_under_gunicorn(tmp_path: Path, pki: dict[str, Any]) -> None:
    env = tls_env(pki, "mtls", PGFH_AUTH_CLIENT_NAMES="metacontroller")
    with gunicorn_hook(tmp_path, env=env, ca_file=pki["ca"].cert_file, workers=1) as hook:
        assert hook.url.startswith("https://")
        # Probes and scrapes present no certificate and still get in.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert requests.get(f"{hook.url}{path}", timeout=5, verify=hook.verify).ok
        # No certificate: TLS is fine, the app refuses.
        assert real_sync(hook, {}).status_code == 401
        # The right certificate.
        assert real_sync(hook, {}, cert=client_cert(pki["client"])).status_code == 200
        # Signed by the same CA, but not a name on PGFH_AUTH_CLIENT_NAMES.
        assert real_sync(hook, {}, cert=client_cert(pki["intruder"])).status_code == 403
        # Signed by another CA: the handshake itself fails.
        with pytest.raises(requests.exceptions.SSLError):
            real_sync(hook, {}, cert=client_cert(pki["rogue"]))
        # Plain HTTP on the HTTPS port gets no answer from the app.
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.post(hook.url.replace("https://", "http://") + "/sync", json={}, timeout=5)
        # A client that does not trust the hook's CA does not talk to it.
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"{hook.url}/healthz", timeout=5, verify=True)


@pytest.mark.gunicorn
def test_token_and_mtls_under_gunicorn(tmp_path: Path, pki: dict[str, Any]) -> None:
    tokens = tmp_path / "auth"
    tokens.mkdir()
    (tokens / "token").write_text(GOOD)
    env = tls_env(pki, "token+mtls", PGFH_AUTH_TOKENS_PATH=str(tokens))
    with gunicorn_hook(tmp_path, env=env, ca_file=pki["ca"].cert_file, workers=1) as hook:
        bearer = {"Authorization": f"Bearer {GOOD}"}
        mc = client_cert(pki["client"])
        assert real_sync(hook, bearer).status_code == 401
        assert real_sync(hook, {}, cert=mc).status_code == 401
        assert real_sync(hook, bearer, cert=mc).status_code == 200


# ------------------------------------------------------------------ TLS to Patroni


def test_tls_settings_are_read_from_the_environment() -> None:
    settings = HookSettings.from_env(
        {
            "PGFH_PATRONI_CA_FILE": "/etc/patroni-tls/ca.crt",
            "PGFH_PATRONI_CLIENT_CERT_FILE": "/etc/patroni-tls/tls.crt",
            "PGFH_PATRONI_CLIENT_KEY_FILE": "/etc/patroni-tls/tls.key",
        }
    )
    assert settings.patroni_tls == PatroniTLS(
        "/etc/patroni-tls/ca.crt", "/etc/patroni-tls/tls.crt", "/etc/patroni-tls/tls.key"
    )
    with pytest.raises(ValueError, match=r"^PGFH_PATRONI_CLIENT_CERT_FILE and"):
        HookSettings.from_env({"PGFH_PATRONI_CLIENT_CERT_FILE": "/x.crt"})
