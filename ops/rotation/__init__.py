"""Rotate the credentials Metacontroller presents to the hook, as a change of the
CompositeController's **spec** — the only thing that makes Metacontroller read them again.

Why a spec change (Metacontroller 4.17.2): the caller credentials (``authorization``,
``clientTLS``, ``caBundle``) are resolved from their Secrets once, in
``newParentController`` (``pkg/controller/composite/controller.go`` →
``hooks.ResolveEndpointConfig`` → ``pkg/hooks/auth.go``). Nothing watches those Secrets, and
``reconcileCompositeController`` (``pkg/controller/composite/metacontroller.go``) returns early
while ``apiequality.Semantic.DeepEqual(cc.Spec, pc.cc.Spec)``: an annotation, a label or a
changed Secret rebuilds nothing. A changed ``secretRef.key`` does — the controller is stopped
and rebuilt (Events ``Stopped`` and ``Started`` on the CompositeController, or
``CreateError`` if a Secret or key is missing; the old controller is then already stopped).

So every rotation writes the new credential under a **new key** (``token-<stamp>``,
``tls-<stamp>.crt`` …), makes sure the hook accepts it, points the CompositeControllers at
that key, waits for Metacontroller's ``Started`` Event on each, and only then removes what is
old.

Which CompositeControllers: **every one whose spec names the Secret** being rotated, found by
listing them all. One install has one (``pg-failover-hook``); the sharded install
(``deploy/sharding``) has one per shard (``pg-failover-hook-<k>``), each run by its own
Metacontroller install that records its own Events. They share the Secret, so they are
rotated together: removing an old key that one of them still sends would lock that shard out.
The Secret reference is the criterion (not a name, label or hook URL) because it is exactly
what makes a controller depend on the keys this removes.


``token``
    1. add ``token-<stamp>`` to ``pg-failover-hook-auth`` (the hook accepts every key of its
       mounted Secret, so old and new both work from the moment the kubelet has refreshed
       the mount, within about a minute);
    2. wait until every running hook pod sees the new file (``kubectl exec``; or a fixed
       wait with ``--pod-check sleep``);
    3. point every ``authorization.secretRef`` that names the Secret, in every
       CompositeController, at ``token-<stamp>`` (one JSON patch per controller, with
       ``test`` ops: a concurrent change makes it fail instead of being overwritten);
    4. wait for each controller's ``Started`` Event (each now sends the new token);
    5. check that no CompositeController names an old key any more (one applied meanwhile
       stops the rotation here, before anything is removed), then write the new token
       under ``token`` too and remove the other ``token*`` keys (unless ``--keep-old``).
       ``token`` always holds the current token because the manifests name it:
       re-applying ``deploy/`` points Metacontroller back at ``token``, a spec change that
       rebuilds with the current token instead of a stale or missing one.

``tls`` (with ``deploy/mtls``)
    cert-manager renews ``metacontroller/metacontroller-client-tls`` in place, which
    Metacontroller never notices. This copies the current client certificate and key, and
    the hook's CA (``ca.crt`` of ``pg-failover-hook-tls``), into pinned Secrets under
    stamped keys, points ``clientTLS`` and ``caBundle`` of every CompositeController whose
    ``clientTLS`` names the client certificate (or its pinned copy) at them, waits for
    ``Started`` on each and prunes older stamped keys. It does nothing when the pinned copy
    is already current, so it can run from a daily CronJob: cert-manager renews at two thirds
    of a certificate's lifetime, which leaves the last third for this to pick the renewal up.

The procedure talks to the cluster through :class:`Cluster`; :class:`KubectlCluster` runs
``kubectl``, and the stand-in's model (``testbed/metacontroller/credentials.py``) runs the same
procedure against a simulated Metacontroller in the tests. Standard library only: run it from a
checkout with ``deploy/rotate-credentials.sh token`` (or ``tls``), which runs
``python3 -m ops.rotation``.

The parts, each a module: the :class:`Cluster` interface and the words both rotations use
(:mod:`ops.rotation.cluster`), reading and re-pointing CompositeControllers
(:mod:`ops.rotation.controllers`), the token rotation (:mod:`ops.rotation.bearer_token`), the
TLS rotation (:mod:`ops.rotation.client_tls`), ``kubectl`` (:mod:`ops.rotation.kubectl`) and the
command line (:mod:`ops.rotation.cli`). Every public name an operator's script or the tests need
is importable from this package.
"""

from __future__ import annotations

from ops.rotation.bearer_token import rotate_token
from ops.rotation.client_tls import rotate_tls
from ops.rotation.cluster import (
    EVENT_CREATE_ERROR,
    EVENT_STARTED,
    STABLE_TOKEN_KEY,
    TOKEN_KEY_PREFIX,
    Cluster,
    Names,
    Report,
    RotationError,
    Timing,
    stamp_now,
)
from ops.rotation.kubectl import KubectlCluster

__all__ = [
    "EVENT_CREATE_ERROR",
    "EVENT_STARTED",
    "STABLE_TOKEN_KEY",
    "TOKEN_KEY_PREFIX",
    "Cluster",
    "KubectlCluster",
    "Names",
    "Report",
    "RotationError",
    "Timing",
    "rotate_tls",
    "rotate_token",
    "stamp_now",
]
