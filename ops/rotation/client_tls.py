"""The ``tls`` rotation (``deploy/mtls``): the current client certificate, key and hook CA pinned
under stamped keys, every CompositeController that presents them re-pointed, older keys pruned
(:mod:`ops.rotation`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ops.rotation.cluster import (
    DEFAULT_NAMES,
    DEFAULT_TIMING,
    Cluster,
    Names,
    Report,
    RotationError,
    Timing,
    stamp_now,
)
from ops.rotation.controllers import (
    auth_locations,
    controller_name,
    controller_spec,
    json_pointer,
    repoint,
    value_at,
)


def rotate_tls(
    cluster: Cluster,
    names: Names = DEFAULT_NAMES,
    timing: Timing = DEFAULT_TIMING,
    *,
    stamp: str | None = None,
    force: bool = False,
) -> Report:
    """Pin the current client certificate and hook CA under stamped keys (``deploy/mtls``)."""
    report = Report()
    stamp = stamp or stamp_now()
    controllers = {
        controller_name(cc): (controller_spec(cc), locations)
        for cc in cluster.compositecontrollers()
        if (locations := _client_tls_locations(cc, names))
    }
    if not controllers:
        raise RotationError(
            "no CompositeController has a clientTLS naming "
            f"{names.client_namespace}/{names.client_secret} (or its pinned copy): "
            "apply deploy/mtls"
        )
    source = cluster.secret_data(names.client_namespace, names.client_secret) or {}
    crt, key = source.get("tls.crt"), source.get("tls.key")
    if not crt or not key:
        raise RotationError(
            f"Secret {names.client_namespace}/{names.client_secret} has no tls.crt/tls.key"
        )
    ca = (cluster.secret_data(names.hook_namespace, names.server_secret) or {}).get("ca.crt")
    if not ca:
        raise RotationError(f"Secret {names.hook_namespace}/{names.server_secret} has no ca.crt")

    # Current only if the entry names the pinned copy: stamped keys are never rewritten, so
    # what they hold is what Metacontroller loaded. cert-manager's own Secret changes under
    # Metacontroller's feet, so naming it says nothing about what was loaded.
    if not force and all(
        value_at(spec, (*loc, "clientTLS", "secretRef", "name")) == names.client_pinned_secret
        and _referenced(cluster, spec, loc, names) == (crt, key, ca)
        for spec, locations in controllers.values()
        for loc in locations
    ):
        report.say("every CompositeController already uses the current certificate and CA")
        return report

    crt_key, key_key, ca_key = f"tls-{stamp}.crt", f"tls-{stamp}.key", f"ca-{stamp}.crt"
    pinned = cluster.secret_data(names.client_namespace, names.client_pinned_secret) or {}
    if crt_key in pinned:
        raise RotationError(f"the stamp {stamp} was used already; use another one")
    report.new_key = crt_key
    cluster.update_secret(
        names.client_namespace, names.client_pinned_secret, {crt_key: crt, key_key: key}
    )
    cluster.update_secret(names.hook_namespace, names.ca_pinned_secret, {ca_key: ca})
    report.say(
        f"copied the client certificate to {names.client_namespace}/"
        f"{names.client_pinned_secret} ({crt_key}, {key_key}) and the CA to "
        f"{names.hook_namespace}/{names.ca_pinned_secret} ({ca_key})"
    )

    new_tls = {
        "secretRef": {"name": names.client_pinned_secret, "namespace": names.client_namespace},
        "certKey": crt_key,
        "privateKeyKey": key_key,
    }
    new_ca = {
        "secretRef": {
            "name": names.ca_pinned_secret,
            "namespace": names.hook_namespace,
            "key": ca_key,
        }
    }
    patches: dict[str, list[dict[str, Any]]] = {}
    for name, (_, locations) in sorted(controllers.items()):
        patches[name] = [
            op
            for loc in locations
            for op in (
                {
                    "op": "replace",
                    "path": json_pointer("spec", *loc, "clientTLS"),
                    "value": new_tls,
                },
                # add replaces an existing member too
                {"op": "add", "path": json_pointer("spec", *loc, "caBundle"), "value": new_ca},
            )
        ]
    count = sum(len(locations) for _, locations in controllers.values())
    what = f"clientTLS and caBundle of {count} entry(ies) at the copies"
    repoint(cluster, timing, patches, report, what)

    for ns, name, keep in (
        (names.client_namespace, names.client_pinned_secret, {crt_key, key_key}),
        (names.hook_namespace, names.ca_pinned_secret, {ca_key}),
    ):
        old = [k for k in (cluster.secret_data(ns, name) or {}) if k not in keep]
        if old:
            cluster.update_secret(ns, name, {}, old)
            report.say(f"removed {', '.join(sorted(old))} from {ns}/{name}")
    return report


def _client_tls_locations(cc: Mapping[str, Any], names: Names) -> list[tuple[str | int, ...]]:
    """Where ``cc`` presents Metacontroller's client certificate (cert-manager's Secret or
    the pinned copy): a ``clientTLS`` naming another Secret is someone else's."""
    spec = controller_spec(cc)
    ours = {names.client_secret, names.client_pinned_secret}
    return [
        loc
        for loc in auth_locations(spec)
        if value_at(spec, (*loc, "clientTLS", "secretRef", "name")) in ours
        and value_at(spec, (*loc, "clientTLS", "secretRef", "namespace")) == names.client_namespace
    ]


def _referenced(
    cluster: Cluster, spec: Mapping[str, Any], loc: tuple[str | int, ...], names: Names
) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The certificate, key and CA the entry at ``loc`` makes Metacontroller load."""
    tls_ = value_at(spec, (*loc, "clientTLS")) or {}
    ref = tls_.get("secretRef") or {}
    data = cluster.secret_data(str(ref.get("namespace", "")), str(ref.get("name", ""))) or {}
    crt = data.get(str(tls_.get("certKey") or "tls.crt"))
    key = data.get(str(tls_.get("privateKeyKey") or "tls.key"))
    ca_ref = value_at(spec, (*loc, "caBundle", "secretRef")) or {}
    ca_data = (
        cluster.secret_data(str(ca_ref.get("namespace", "")), str(ca_ref.get("name", ""))) or {}
    )
    return crt, key, ca_data.get(str(ca_ref.get("key") or "ca.crt"))
