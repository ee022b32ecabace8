"""Slow clients cannot starve the hook's probes, metrics or syncs (issue 29).

Test design: one real gunicorn with the production config, 1 worker × 2 threads (the
smallest pool, so two stalled connections are enough to show starvation), on loopback.
A "half-sent" request is a connection that sent part of a request and then nothing: what
a slowloris client, or a scraper in a bad state, does. Every wait is bounded.

* On the sync port, two half-sent requests hold both threads: that is gunicorn's gthread
  worker (no read deadline once a request's first byte arrived) and is why only
  Metacontroller may reach that port (deploy/base/networkpolicy.yaml). The test shows it
  (the reproduction of the finding) and that the operations port still answers meanwhile.
* On the operations port (hooks/shell/ops.py), many half-sent requests starve neither the
  operations port itself nor /sync, and each is cut at its deadline.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from hooks.shell import ops
from testbed.metacontroller.gunicorn import GunicornHook, free_port, gunicorn_hook
from tests.test_gunicorn import EPHEMERAL_PORTS, sync_body

pytestmark = pytest.mark.gunicorn

#: Half a request: a request line and one header, never the blank line that ends them.
HALF = b"GET /healthz HTTP/1.1\r\nHost: hook\r\n"


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with gunicorn_hook(
        tmp_path_factory.mktemp("slow"), env=EPHEMERAL_PORTS, workers=1, threads=2
    ) as running:
        yield running


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def half_sent(stack: ExitStack, url: str, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = stack.enter_context(socket.create_connection(_address(url), timeout=5))
        sock.sendall(HALF)
        sockets.append(sock)
    time.sleep(0.5)  # the worker has handed each to a thread (its first byte has arrived)
    return sockets


def answers_within(url: str, seconds: float) -> float | None:
    """Seconds until ``GET url`` answered 200, or ``None`` if it did not within ``seconds``."""
    started = time.monotonic()
    try:
        response = requests.get(url, timeout=seconds)
    except requests.RequestException:
        return None
    return time.monotonic() - started if response.status_code == 200 else None


def test_the_operations_port_answers_while_the_sync_port_is_stalled(hook: GunicornHook) -> None:
    assert hook.ops_url, "the rig runs the hook with its operations port"
    with ExitStack() as stack:
        half_sent(stack, hook.url, 2)
        # The finding, reproduced: both sync threads are held, /healthz there does not answer.
        assert answers_within(f"{hook.url}/healthz", 3.0) is None
        # The kubelet's and Prometheus' port answers at once.
        for path in ("/healthz", "/readyz", "/metrics"):
            took = answers_within(f"{hook.ops_url}{path}", 2.0)
            assert took is not None, path
            print(f"\n{path} on the operations port with the sync port stalled: {took:.3f} s")
    # Once the stalled clients have gone, the sync port serves again.
    assert answers_within(f"{hook.url}/healthz", 5.0) is not None


def test_stalled_scrapers_starve_neither_sync_nor_the_probes(hook: GunicornHook) -> None:
    with ExitStack() as stack:
        stalled = half_sent(stack, hook.ops_url, 20)  # 10x the sync pool's threads
        started = time.monotonic()
        response = requests.post(
            f"{hook.url}/sync", json=sync_body(), timeout=5, headers=hook.headers
        )
        took = time.monotonic() - started
        assert response.status_code == 200
        print(f"\n/sync with 20 stalled operations-port clients: {took:.3f} s")
        assert answers_within(f"{hook.ops_url}/healthz", 2.0) is not None
        # Each stalled client is cut at its deadline (the server closes: recv returns b"").
        cut = []
        for sock in stalled:
            sock.settimeout(ops.DEADLINE_SECONDS + 5)
            started = time.monotonic()
            try:
                data = sock.recv(1024)
            except OSError:
                data = b""
            cut.append(data == b"" or data.startswith(b"HTTP/1.0 400"))
        assert all(cut)


def test_the_operations_port_serves_only_health_and_metrics(hook: GunicornHook) -> None:
    response = requests.post(f"{hook.ops_url}/sync", json=sync_body(), timeout=5)
    assert response.status_code == 404
    assert requests.get(f"{hook.ops_url}/customize", timeout=5).status_code == 404


def test_metrics_on_the_operations_port_count_the_sync_ports_requests(hook: GunicornHook) -> None:
    requests.post(f"{hook.url}/sync", json=sync_body(), timeout=5, headers=hook.headers)
    text = requests.get(f"{hook.ops_url}/metrics", timeout=5).text
    assert "pgfh_" in text


def test_listen_parses_addresses_and_listens_dual_stack(tmp_path: Path) -> None:
    assert ops.parse_bind("[::]:9090") == ("::", 9090)
    assert ops.parse_bind("127.0.0.1:1") == ("127.0.0.1", 1)
    with pytest.raises(ValueError, match="host:port"):
        ops.parse_bind("9090")
    with ops.listen("[::]:0") as listener:
        assert listener.family in (socket.AF_INET6, socket.AF_INET)
        if listener.family == socket.AF_INET6:  # dual-stack: IPv4 clients connect too
            port = listener.getsockname()[1]
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                pass


def test_the_default_binds_are_dual_stack(tmp_path: Path) -> None:
    """[::] on both ports: IPv4 and IPv6 clients reach /sync's port and the operations port."""
    if not socket.has_ipv6:
        pytest.skip("this host has no IPv6: the fallback to 0.0.0.0 is tested below")
    from hooks.shell.gunicorn_conf import wildcard

    assert wildcard(8080) == "[::]:8080"
    port, ops_port = free_port(), free_port()
    env = {
        **EPHEMERAL_PORTS,
        "GUNICORN_BIND": wildcard(port),
        "GUNICORN_OPS_BIND": wildcard(ops_port),
    }
    with gunicorn_hook(tmp_path, env=env, port=port, workers=1, threads=2) as running:
        for host in ("127.0.0.1", "[::1]"):
            url = f"http://{host}:{port}/sync"
            assert (
                requests.post(url, json=sync_body(), timeout=5, headers=running.headers).status_code
                == 200
            )
            assert requests.get(f"http://{host}:{ops_port}/readyz", timeout=5).status_code == 200


def test_without_ipv6_the_default_bind_is_ipv4(monkeypatch: pytest.MonkeyPatch) -> None:
    from hooks.shell import gunicorn_conf

    class NoIPv6:
        def __init__(self, *args: object) -> None:
            raise OSError(97, "Address family not supported by protocol")

    monkeypatch.setattr(gunicorn_conf.socket, "socket", NoIPv6)
    assert gunicorn_conf.wildcard(8080) == "0.0.0.0:8080"
