"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

Started once per test run (:func:`start_control_plane`), every process in the run's directory
with its log beside it, on ports the kernel hands out (so two runs on one machine never collide),
and stopped with nothing left running (:meth:`ControlPlane.stop`; a child also dies with the
process that started it, through ``PR_SET_PDEATHSIG``, should the harness be SIGKILLed).

The flags follow controller-runtime's envtest (``pkg/internal/testing/controlplane``): secure
port only, RBAC, client certificates from our own CA, ServiceAccount issuer and keys, plus
``--endpoint-reconciler-type=none`` (kwok's choice: the apiserver's own endpoint would be a
loopback address, which Endpoints validation refuses). kube-controller-manager runs only the
controllers a kubelet-less machine can honour: EndpointSlices (the slices clients follow),
the garbage collector (owner references), namespaces and ServiceAccounts with their tokens,
and StatefulSets (their Pods stay Pending without a kubelet).
node-lifecycle and pod-gc are left out: without a kubelet they would mark every Pod NotReady
or delete it.

Every wait is bounded; a process that exits early or never becomes ready stops the run with
one line that names the cause (a taken port, a too-old etcd) and the log file to read.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.kubernetes.binaries import MIN_ETCD, Binaries, ensure_binaries, etcd_version
from testbed.kubernetes.errors import ControlPlaneError
from testbed.kubernetes.kubeconfig import write_kubeconfig
from testbed.kubernetes.pki import CertificateAuthority, KeyPair, service_account_keys
from testbed.kubernetes.rest import KubeRest

CONTROLLERS = (
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    # Only acts on StatefulSets, which no test creates except tests/test_admission_pods_real.py
    # (the admission policy must admit the controller's own Pods).
    "statefulset-controller",
)
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: How long each server may take to answer ready (a cold start on a busy 2-core machine).
READY_TIMEOUT = 90.0
#: How long a server may take to exit after SIGTERM before it is killed.
STOP_GRACE = 15.0

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Children get SIGTERM when the process that started them dies (however it dies)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


#: Lines in a server's log that name why it stopped, and what to say about them.
_KNOWN_CAUSES: Sequence[tuple[str, str]] = (
    ("address already in use", "a port it needs is taken"),
    ("bind: permission denied", "it may not bind its port"),
    ("etcdserver: mvcc: database space exceeded", "etcd's database is full"),
    ("connection refused", "it could not reach a server it needs"),
    ("no such file or directory", "a file it needs is missing"),
)


def _cause_from_log(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()[-60:]
    except OSError:
        return "no log written"
    for line in reversed(lines):
        lowered = line.lower()
        for needle, cause in _KNOWN_CAUSES:
            if needle in lowered:
                return f"{cause} ({line.strip()[:200]})"
    return lines[-1].strip()[:200] if lines else "its log is empty"


@dataclass
class Server:
    """One running program of the control plane."""

    name: str
    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, env: Mapping[str, str] | None = None) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,  # a Ctrl-C of the test run is handled by the harness
                preexec_fn=_die_with_parent,
            )

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace: float = STOP_GRACE) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)  # a paused server must hear the TERM
            self.process.terminate()
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=grace)

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing (a hung server)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def failure(self, what: str) -> ControlPlaneError:
        return ControlPlaneError(
            f"{self.name} {what}: {_cause_from_log(self.log)} (log: {self.log})"
        )

    def wait_until(self, not_ready: Callable[[], str | None], timeout: float, what: str) -> None:
        """Poll ``not_ready`` (``None`` once ready, else why not) every 0.2 s; raise naming
        this server, its log and the last answer when it exits first or ``timeout`` passes.
        ``what``: the readiness waited for, e.g. "ready at https://.../readyz"."""
        deadline = time.monotonic() + timeout
        while True:
            code = self.exited()
            if code is not None:
                raise self.failure(f"exited with code {code} before it was {what}")
            last = not_ready()
            if last is None:
                return
            if time.monotonic() >= deadline:
                raise self.failure(f"was not {what} within {timeout:.0f} s (last: {last})")
            time.sleep(0.2)


def http_refusal(url: str, context: ssl.SSLContext | None = None) -> str | None:
    """``None`` when ``url`` answers 200, else what it answered (for :meth:`Server.wait_until`)."""
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (OSError, ssl.SSLError) as error:
        return str(error)


@dataclass
class ApiserverOutage:
    """When (monotonic) a stop of kube-apiserver was asked for, it had exited, it was started
    again and it answered ready (:meth:`ControlPlane.apiserver_down`)."""

    asked: float
    exited: float = 0.0
    starting: float = 0.0
    ready: float = 0.0


@dataclass
class ControlPlane:
    """A running control plane; ``admin_kubeconfig`` is ``system:masters``."""

    run_dir: Path
    binaries: Binaries
    bind_address: str
    etcd: Server
    apiserver: Server
    controller_manager: Server
    etcd_url: str
    server_url: str
    ca: CertificateAuthority
    admin: KeyPair
    admin_kubeconfig: Path
    service_account_key: KeyPair
    started_seconds: float
    _stopped: bool = field(default=False, repr=False)

    @property
    def ca_file(self) -> Path:
        return self.ca.cert_file

    def servers(self) -> tuple[Server, Server, Server]:
        return (self.etcd, self.apiserver, self.controller_manager)

    def env(self) -> dict[str, str]:
        """The environment for a program that should talk to this control plane as admin."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.admin_kubeconfig),
            "PATH": f"{self.binaries.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the control plane's own kubectl (the pinned version) as admin."""
        result = subprocess.run(
            [str(self.binaries.path("kubectl")), *args],
            input=input_text,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): "
                f"{result.stderr.strip()[:2000]}"
            )
        return result

    def user_kubeconfig(self, name: str, *groups: str) -> Path:
        """A kubeconfig for the user ``name`` in ``groups``, by client certificate."""
        pair = self.ca.issue(f"user-{name}", common_name=name, organizations=groups)
        return write_kubeconfig(
            self.run_dir / f"{name}.kubeconfig",
            server=self.server_url,
            ca_file=self.ca_file,
            user=name,
            client=pair,
        )

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        _wait_http_ok(self.etcd, f"{self.etcd_url}/health", None, timeout)
        self._wait_apiserver_ready(timeout)

    def restart_apiserver(self) -> float:
        """Stop kube-apiserver and start it again on the same port; seconds until ready."""
        started = time.monotonic()
        with self.apiserver_down():
            pass
        return time.monotonic() - started

    @contextlib.contextmanager
    def apiserver_down(self) -> Iterator[ApiserverOutage]:
        """kube-apiserver stopped (SIGTERM, until it has exited) for the block, then started
        again on the same port and waited for until ``/readyz`` answers 200, however the
        block ends. The outage's times are filled in as they happen."""
        outage = ApiserverOutage(time.monotonic())
        self.apiserver.stop()
        outage.exited = time.monotonic()
        try:
            yield outage
        finally:
            outage.starting = time.monotonic()
            self.apiserver.start()
            self._wait_apiserver_ready(READY_TIMEOUT)
            outage.ready = time.monotonic()

    @contextlib.contextmanager
    def etcd_paused(self, limit: float = 60.0) -> Iterator[float]:
        """etcd stopped with SIGSTOP for the block (a hung etcd: its sockets stay open, it
        answers nothing), resumed with SIGCONT on exit however the block ends, and at the
        latest after ``limit`` seconds (a timer), so a test that hangs cannot leave the
        control plane frozen for the rest of the session. Yields the pause's start
        (monotonic)."""
        started = time.monotonic()
        self.etcd.pause()
        timer = threading.Timer(limit, self.etcd.resume)
        timer.daemon = True
        timer.start()
        try:
            yield started
        finally:
            timer.cancel()
            self.etcd.resume()

    def _wait_apiserver_ready(self, timeout: float) -> None:
        """``/readyz`` answered 200, asked as the admin through the one Kubernetes client."""
        rest = KubeRest.from_kubeconfig(self.admin_kubeconfig)
        try:
            self.apiserver.wait_until(rest.readiness, timeout, f"ready at {self.server_url}/readyz")
        finally:
            rest.close()

    def check_alive(self) -> None:
        """Raise naming the first server that is no longer running."""
        for server in self.servers():
            code = server.exited()
            if code is not None:
                raise server.failure(f"exited with code {code}")

    def stop(self) -> None:
        """Stop everything, the controllers first and etcd last; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for server in (self.controller_manager, self.apiserver, self.etcd):
            server.stop()


def _wait_http_ok(server: Server, url: str, context: ssl.SSLContext | None, timeout: float) -> None:
    server.wait_until(lambda: http_refusal(url, context), timeout, f"ready at {url}")


def start_control_plane(
    run_dir: Path | None = None,
    *,
    bind_address: str = "127.0.0.1",
    extra_sans: tuple[str, ...] = (),
    log: Callable[[str], None] = print,
) -> ControlPlane:
    """Build (once per machine) and start a control plane; stopped by :meth:`ControlPlane.stop`."""
    binaries = ensure_binaries(log)
    found = etcd_version(binaries.path("etcd"))
    if found is None or found < MIN_ETCD:
        shown = ".".join(map(str, found)) if found else "unknown"
        wanted = ".".join(map(str, MIN_ETCD))
        raise ControlPlaneError(
            f"etcd {shown} at {binaries.path('etcd')} is too old for kube-apiserver "
            f"(watch progress requests need etcd {wanted} or newer)"
        )
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="pgfh-controlplane-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pki = run_dir / "pki"
    pki.mkdir(exist_ok=True)
    ca = CertificateAuthority(pki)
    sans_ips = tuple(dict.fromkeys(("127.0.0.1", bind_address, "10.96.0.1", *extra_sans)))
    serving = ca.issue(
        "apiserver",
        common_name="kube-apiserver",
        ips=sans_ips,
        dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        server=True,
    )
    admin = ca.issue("admin", common_name="pgfh-admin", organizations=("system:masters",))
    kcm = ca.issue("kube-controller-manager", common_name="system:kube-controller-manager")
    # The aggregation layer's front proxy: its CA is what delegated authentication (the
    # controller manager's own /healthz) reads from extension-apiserver-authentication.
    front_proxy = ca.issue("front-proxy-client", common_name="front-proxy-client")
    sa_keys = service_account_keys(pki)

    etcd_port, etcd_peer = free_port(), free_port()
    api_port, kcm_port = free_port(bind_address), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    server_url = f"https://{bind_address}:{api_port}"
    admin_kubeconfig = write_kubeconfig(
        run_dir / "admin.kubeconfig",
        server=server_url,
        ca_file=ca.cert_file,
        user="admin",
        client=admin,
    )
    kcm_kubeconfig = write_kubeconfig(
        run_dir / "kube-controller-manager.kubeconfig",
        server=server_url,
        ca_file=ca.cert_file,
        user="system:kube-controller-manager",
        client=kcm,
    )
    etcd = Server(
        "etcd",
        [
            str(binaries.path("etcd")),
            "--name=pgfh-test",
            f"--data-dir={run_dir / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=pgfh-test=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync",  # a test's etcd: nothing to keep across a power cut
            "--log-level=warn",
        ],
        run_dir / "etcd.log",
    )
    apiserver = Server(
        "kube-apiserver",
        [
            str(binaries.path("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={bind_address}",
            f"--advertise-address={bind_address}",
            f"--secure-port={api_port}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={ca.cert_file}",
            f"--requestheader-client-ca-file={ca.cert_file}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={front_proxy.cert}",
            f"--proxy-client-key-file={front_proxy.key}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={sa_keys.cert}",
            f"--service-account-signing-key-file={sa_keys.key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={pki}",
            "--profiling=false",
            "--v=1",
        ],
        run_dir / "kube-apiserver.log",
    )
    controller_manager = Server(
        "kube-controller-manager",
        [
            str(binaries.path("kube-controller-manager")),
            f"--kubeconfig={kcm_kubeconfig}",
            f"--authentication-kubeconfig={kcm_kubeconfig}",
            f"--authorization-kubeconfig={kcm_kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={sa_keys.key}",
            f"--root-ca-file={ca.cert_file}",
            "--use-service-account-credentials=true",  # each controller as its own account
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={kcm_port}",
            f"--cert-dir={pki / 'kcm'}",
            "--v=1",
        ],
        run_dir / "kube-controller-manager.log",
    )
    plane = ControlPlane(
        run_dir=run_dir,
        binaries=binaries,
        bind_address=bind_address,
        etcd=etcd,
        apiserver=apiserver,
        controller_manager=controller_manager,
        etcd_url=etcd_url,
        server_url=server_url,
        ca=ca,
        admin=admin,
        admin_kubeconfig=admin_kubeconfig,
        service_account_key=sa_keys,
        started_seconds=0.0,
    )
    try:
        etcd.start()
        _wait_http_ok(etcd, f"{etcd_url}/health", None, READY_TIMEOUT)
        apiserver.start()
        plane._wait_apiserver_ready(READY_TIMEOUT)
        controller_manager.start()
        _wait_http_ok(
            controller_manager, f"https://127.0.0.1:{kcm_port}/healthz", _insecure(), READY_TIMEOUT
        )
    except BaseException:
        plane.stop()
        raise
    plane.started_seconds = time.monotonic() - started
    return plane


def _insecure() -> ssl.SSLContext:
    """kube-controller-manager serves /healthz with a self-signed certificate of its own."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@contextlib.contextmanager
def running_control_plane(**kwargs: object) -> Iterator[ControlPlane]:
    plane = start_control_plane(**kwargs)  # type: ignore[arg-type]
    try:
        yield plane
    finally:
        plane.stop()
