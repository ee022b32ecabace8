"""The rotation's :class:`ops.rotation.cluster.Cluster` through ``kubectl``: the only I/O of
:mod:`ops.rotation` (the tests run the same procedure against the stand-in's model)."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ops.rotation.cluster import Names, RotationError


class KubectlCluster:
    """:class:`Cluster` through ``kubectl`` (the current context, or ``--context``)."""

    def __init__(self, kubectl: Sequence[str] = ("kubectl",)) -> None:
        self.kubectl = list(kubectl)

    def _run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [*self.kubectl, *args], input=stdin, capture_output=True, text=True, check=False
        )
        if check and result.returncode != 0:
            raise RotationError(f"kubectl {' '.join(args[:4])} …: {result.stderr.strip()}")
        return result.stdout if result.returncode == 0 else ""

    def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        out = self._run("-n", namespace, "get", "secret", name, "-o", "json", check=False)
        if not out:
            return None
        data = json.loads(out).get("data") or {}
        return {k: base64.b64decode(v) for k, v in data.items()}

    def update_secret(
        self, namespace: str, name: str, put: Mapping[str, bytes], remove: Iterable[str] = ()
    ) -> None:
        if self.secret_data(namespace, name) is None:
            self._run("-n", namespace, "create", "secret", "generic", name)
        data: dict[str, str | None] = {k: base64.b64encode(v).decode() for k, v in put.items()}
        data.update({k: None for k in remove})  # null removes a key in a merge patch
        if data:
            # On stdin, never on the command line: /proc/<pid>/cmdline is world-readable and
            # the patch carries the new token.
            patch = json.dumps({"data": data})
            self._run(
                "-n",
                namespace,
                "patch",
                "secret",
                name,
                "--type",
                "merge",
                "--patch-file",
                "/dev/stdin",
                stdin=patch,
            )

    def compositecontrollers(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(
            self._run("get", "compositecontrollers", "-o", "json")
        ).get("items", [])
        return items

    def patch_compositecontroller(self, name: str, patch: list[dict[str, Any]]) -> None:
        self._run("patch", "compositecontroller", name, "--type", "json", "-p", json.dumps(patch))

    def events(self, name: str) -> list[tuple[str, str, int]]:
        out = self._run(
            "get",
            "events",
            "--all-namespaces",
            "--field-selector",
            f"involvedObject.kind=CompositeController,involvedObject.name={name}",
            "-o",
            "json",
        )
        return [
            (str(e.get("reason", "")), str(e.get("message", "")), int(e.get("count") or 1))
            for e in json.loads(out).get("items", [])
        ]

    def hook_pods_with_file(self, names: Names, path: str) -> tuple[int, int]:
        pods = json.loads(
            self._run(
                "-n", names.hook_namespace, "get", "pods", "-l", names.hook_selector, "-o", "json"
            )
        ).get("items", [])
        running = [
            p["metadata"]["name"]
            for p in pods
            if p.get("status", {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        check = "import os, sys; sys.exit(0 if os.path.isfile(sys.argv[1]) else 1)"
        have = 0
        for pod in running:
            result = subprocess.run(
                [
                    *self.kubectl,
                    "-n",
                    names.hook_namespace,
                    "exec",
                    pod,
                    "-c",
                    names.hook_container,
                    "--",
                    "python",
                    "-c",
                    check,
                    path,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            have += result.returncode == 0
        return have, len(running)

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
