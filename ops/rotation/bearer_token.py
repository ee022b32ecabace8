"""The ``token`` rotation: a new bearer token under a new key, accepted by every hook pod, then
every CompositeController re-pointed at it, then the old keys removed (:mod:`ops.rotation`)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from ops.rotation.cluster import (
    DEFAULT_NAMES,
    DEFAULT_TIMING,
    STABLE_TOKEN_KEY,
    TOKEN_KEY_PREFIX,
    Cluster,
    Names,
    Report,
    RotationError,
    Timing,
    stamp_now,
    wait_until,
)
from ops.rotation.controllers import (
    auth_locations,
    controller_name,
    controller_spec,
    json_pointer,
    repoint,
    value_at,
)


def _token_refs(cc: Mapping[str, Any], names: Names) -> list[tuple[str | int, ...]]:
    """Where ``cc`` names the token Secret (``authorization.secretRef``)."""
    spec = controller_spec(cc)
    return [
        loc
        for loc in auth_locations(spec)
        if value_at(spec, (*loc, "authorization", "secretRef", "name")) == names.token_secret
        and value_at(spec, (*loc, "authorization", "secretRef", "namespace"))
        == names.hook_namespace
    ]


def rotate_token(
    cluster: Cluster,
    names: Names = DEFAULT_NAMES,
    timing: Timing = DEFAULT_TIMING,
    *,
    token: str | None = None,
    stamp: str | None = None,
    keep_old: bool = False,
    pod_check: str = "exec",
) -> Report:
    """Rotate (or set for the first time) the bearer token; the steps: :mod:`ops.rotation`."""
    report = Report()
    token = token if token is not None else secrets.token_hex(32)
    if len(token) < 16 or not all(33 <= ord(c) <= 126 for c in token):
        raise RotationError("the token must be 16+ printable ASCII characters without spaces")
    new_key = TOKEN_KEY_PREFIX + (stamp or stamp_now())
    report.new_key = new_key
    ns, secret = names.hook_namespace, names.token_secret

    controllers = {
        controller_name(cc): (cc, refs)
        for cc in cluster.compositecontrollers()
        if (refs := _token_refs(cc, names))
    }
    if not controllers:
        raise RotationError(
            f"no CompositeController has an authorization.secretRef naming {ns}/{secret}; "
            "nothing to rotate"
        )
    existing = cluster.secret_data(ns, secret) or {}
    if new_key in existing:
        raise RotationError(f"{ns}/{secret} already has the key {new_key}; use another stamp")

    # 1. The new token under a new key: from now on the hook accepts old and new.
    cluster.update_secret(ns, secret, {new_key: token.encode()})
    report.say(f"added key {new_key} to Secret {ns}/{secret}")

    # 2. Every running hook pod must accept it before Metacontroller sends it.
    if pod_check == "sleep":
        cluster.sleep(timing.kubelet_delay)
        report.say(f"waited {timing.kubelet_delay:.0f} s for the kubelets to refresh the mount")
    else:
        path = f"{names.token_mount.rstrip('/')}/{new_key}"

        def every_pod_has_it() -> bool:
            have, total = cluster.hook_pods_with_file(names, path)
            return total > 0 and have == total

        wait_until(
            cluster, timing.pods_timeout, timing.poll, every_pod_has_it, f"{path} in every hook pod"
        )
        report.say(f"every running hook pod has {path}")

    # 3. The spec change that makes Metacontroller read the Secret again, in every
    # CompositeController that names it.
    patches: dict[str, list[dict[str, Any]]] = {}
    for name, (cc, refs) in sorted(controllers.items()):
        patch: list[dict[str, Any]] = []
        for loc in refs:
            path_ = json_pointer("spec", *loc, "authorization", "secretRef", "key")
            old = value_at(controller_spec(cc), (*loc, "authorization", "secretRef", "key"))
            patch.append({"op": "test", "path": path_, "value": old})
            patch.append({"op": "replace", "path": path_, "value": new_key})
        patches[name] = patch
    count = sum(len(refs) for _, refs in controllers.values())
    what = f"{count} authorization.secretRef(s) at key {new_key}"
    repoint(cluster, timing, patches, report, what)
    # 4. Metacontroller rebuilt every controller: each sends the new token now.

    # A CompositeController applied meanwhile (a new shard, deploy/ re-applied) may still
    # send an old key: removing it, or rewriting "token", would lock it out.
    behind = sorted(
        controller_name(cc)
        for cc in cluster.compositecontrollers()
        for loc in _token_refs(cc, names)
        if value_at(controller_spec(cc), (*loc, "authorization", "secretRef", "key")) != new_key
    )
    if behind:
        raise RotationError(
            f"CompositeController(s) {', '.join(sorted(set(behind)))} name an older key of "
            f"{ns}/{secret} (changed during the rotation); nothing old was removed: "
            "run the rotation again"
        )

    # 5. "token" holds the current token; the old ones go.
    old_keys = [
        k
        for k in (cluster.secret_data(ns, secret) or {})
        if k != new_key and k != STABLE_TOKEN_KEY and k.startswith(STABLE_TOKEN_KEY)
    ]
    remove = [] if keep_old else old_keys
    cluster.update_secret(ns, secret, {STABLE_TOKEN_KEY: token.encode()}, remove)
    report.say(
        f"key {STABLE_TOKEN_KEY} now holds the new token"
        + (f"; removed {', '.join(sorted(remove))}" if remove else "; no old key removed")
    )
    return report
