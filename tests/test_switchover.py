"""Switchover detection per cluster (:mod:`hooks.core.switchover`), with plain dicts only.

Every case takes the app's path minus HTTP (load → plan → fake probes → reconcile), so
the mode, the condition and ``resyncAfterSeconds`` are those of a real reply. ``TIMING``
uses values nobody would pick (healthy 7 s, degraded 0.25 s) so a resync cannot match by
coincidence; the event-driven default is 30 s.

The property that matters most is checked in every case that has labels: the Service
follows Patroni's REST answer, never the label.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from hooks.core.outcome import SyncOutcome
from hooks.core.routing import Decision
from hooks.core.switchover import Detection, detect
from hooks.domain.members import MemberStatus
from hooks.domain.model import (
    MAX_POLL_SECONDS,
    MIN_POLL_SECONDS,
    ResyncTiming,
    RoleLabelSpec,
    SwitchoverSpec,
)
from hooks.loaders.schemas import load_spec
from testbed.fakes.patroni_wire import patroni_body
from tests.helpers import (
    CLUSTER,
    NOW,
    P0,
    P1,
    P2,
    POD_NAME_LABEL,
    SELECTOR,
    TIMING,
    down,
    fixture,
    leader,
    loaded_pods,
    make_pod,
    make_service,
    polled,
    replica,
    seed_spec,
    spread,
    sync_body,
    without_resync,
)
from tests.helpers import run as run_pipeline

NAMES = (P0, P1, P2)
SPILO = {"roleLabel": {"key": "spilo-role", "leaderValue": "master"}}


def annotation(role: str, state: str = "running") -> str:
    """Patroni's ``status`` annotation as touch_member writes it (compact JSON)."""
    data = {
        "conn_url": "postgres://10.244.0.10:5432/postgres",
        "api_url": "http://10.244.0.10:8008/patroni",
        "state": state,
        "role": role,
        "version": "4.1.5",
        "xlog_location": 50332016,
        "timeline": 1,
    }
    return json.dumps(data, separators=(",", ":"))


def member_pod(
    name: str,
    label: str | None,
    status: str | None = None,
    *,
    key: str = "role",
) -> dict[str, Any]:
    """A member Pod with the role label ``key=label`` (if any) and ``status`` annotation."""
    labels = {**SELECTOR, POD_NAME_LABEL: name}
    if label is not None:
        labels[key] = label
    pod = make_pod(name, labels=labels)
    if status is not None:
        pod["metadata"]["annotations"] = {"status": status}
    return pod


def k8s_dcs_pods(leading: str = P0) -> list[dict[str, Any]]:
    """What Patroni's Kubernetes DCS shows while ``leading`` holds the leader lock."""
    return [
        member_pod(n, "primary", annotation("primary"))
        if n == leading
        else member_pod(n, "replica", annotation("replica"))
        for n in NAMES
    ]


def healthy(leading: str = P0) -> dict[str, MemberStatus]:
    return {n: leader(n) if n == leading else replica(n) for n in NAMES}


def run(
    pods: Sequence[Mapping[str, Any]],
    answers: Mapping[str, MemberStatus],
    *,
    switchover: Mapping[str, Any] | None = None,
    spec: Mapping[str, Any] | None = None,
    services: Sequence[Mapping[str, Any]] = (),
    status: Mapping[str, Any] | None = None,
    timing: ResyncTiming = TIMING,
    now: datetime = NOW,
) -> SyncOutcome:
    if spec is None:
        spec = seed_spec(**({"switchover": dict(switchover)} if switchover is not None else {}))
    body = sync_body(spec=spec, pods=pods, services=services, status=status)
    return run_body(body, answers, timing=timing, now=now)


def run_body(
    body: Mapping[str, Any],
    answers: Mapping[str, MemberStatus],
    *,
    timing: ResyncTiming = TIMING,
    now: datetime = NOW,
) -> SyncOutcome:
    _, outcome = run_pipeline(body, answers, timing=timing, now=now)
    return outcome


def detection(outcome: SyncOutcome) -> tuple[str, str, str, str]:
    """``(status.switchoverDetection, condition status, reason, message)``."""
    status = outcome.body["status"]
    (cond,) = [c for c in status["conditions"] if c["type"] == "SwitchoverDetection"]
    return status["switchoverDetection"], cond["status"], cond["reason"], cond["message"]


def selected(outcome: SyncOutcome) -> str | None:
    services = [c for c in outcome.body["children"] if c.get("kind") == "Service"]
    (service,) = services
    return str(service["spec"]["selector"][POD_NAME_LABEL])


# =========================================================== the event-driven mode


def test_patroni_labels_and_annotations_that_agree_make_the_cluster_event_driven() -> None:
    outcome = run(k8s_dcs_pods(P0), healthy(P0))

    assert outcome.decision is Decision.ROUTED
    assert selected(outcome) == P0
    mode, cond, reason, message = detection(outcome)
    assert (mode, cond, reason) == ("RoleLabel", "True", "RoleLabelsAgree")
    assert message == (
        "Role label: every member Pod's label role and Patroni's status annotation agree "
        "with Patroni (leader pg-orders-0), so a switchover changes a Pod"
    )
    assert outcome.body["resyncAfterSeconds"] == spread(30.0, NOW)


def test_the_event_driven_resync_is_the_spec_s() -> None:
    outcome = run(k8s_dcs_pods(P1), healthy(P1), switchover={"eventDrivenResyncSeconds": 45})
    assert detection(outcome)[0] == "RoleLabel"
    assert outcome.body["resyncAfterSeconds"] == spread(45.0, NOW)


def _led_by(
    leader: str, *, label: str, role: str
) -> tuple[list[dict[str, Any]], dict[str, MemberStatus]]:
    """Pods P0-P2 labelled and annotated by Patroni, ``leader`` answering with ``role``."""
    others = [p for p in (P0, P1, P2) if p != leader]
    pods = [member_pod(leader, label, annotation(role))]
    pods += [member_pod(p, "replica", annotation("replica")) for p in others]
    answers = {leader: MemberStatus.from_api_response(leader, 200, patroni_body(role, name=leader))}
    answers.update({p: replica(p) for p in others})
    return pods, answers


def test_patroni_3_labels_master_and_its_annotation_says_master() -> None:
    pods, answers = _led_by(P0, label="master", role="master")
    outcome = run(pods, answers, spec=seed_spec(healthCheckPath="/master"))
    assert selected(outcome) == P0
    assert detection(outcome)[:3] == ("RoleLabel", "True", "RoleLabelsAgree")


def test_patroni_4_with_leader_label_value_master_is_event_driven_too() -> None:
    # Patroni 4's documented upgrade path keeps role=master on the leader; the
    # annotation carries Patroni 4's role word.
    pods = k8s_dcs_pods(P0)
    pods[0]["metadata"]["labels"]["role"] = "master"
    assert detection(run(pods, healthy(P0)))[0] == "RoleLabel"


def test_a_standby_leader_is_labelled_with_the_leader_value() -> None:
    pods, answers = _led_by(P0, label="primary", role="standby_leader")
    outcome = run(pods, answers, spec=seed_spec(healthCheckPath="/leader"))
    assert selected(outcome) == P0
    assert detection(outcome)[0] == "RoleLabel"


def test_an_unreachable_replica_with_agreeing_label_and_annotation_stays_event_driven() -> None:
    answers = healthy(P0)
    answers[P2] = down(P2)
    outcome = run(k8s_dcs_pods(P0), answers)
    assert outcome.decision is Decision.ROUTED
    assert detection(outcome)[0] == "RoleLabel"


# ================================================================ the polled mode


def test_without_any_role_evidence_the_cluster_is_polled_at_the_operators_setting() -> None:
    pods = [member_pod(n, None) for n in NAMES]
    outcome = run(pods, healthy(P0))
    mode, cond, reason, message = detection(outcome)
    assert (mode, cond, reason) == ("Polled", "False", "RoleLabelMissing")
    assert message.startswith("Polled: no role label on ")
    assert outcome.body["resyncAfterSeconds"] == spread(TIMING.healthy, NOW)


def test_one_missing_label_makes_the_cluster_polled_and_names_the_pod() -> None:
    pods = k8s_dcs_pods(P0)
    del pods[2]["metadata"]["labels"]["role"]  # Patroni removes it on a member not running
    outcome = run(pods, healthy(P0), switchover={"pollSeconds": 2.5})
    mode, _, reason, message = detection(outcome)
    assert (mode, reason) == ("Polled", "RoleLabelMissing")
    assert P2 in message and P1 not in message
    assert outcome.body["resyncAfterSeconds"] == spread(2.5, NOW)


def test_a_label_disagreeing_with_patroni_never_moves_the_service() -> None:
    """The labels say pg-orders-1 leads; Patroni says pg-orders-0: the Service goes to 0."""
    pods = k8s_dcs_pods(P1)
    outcome = run(pods, healthy(P0), services=[make_service(pod=P2)])

    assert outcome.decision is Decision.ROUTED
    assert selected(outcome) == P0
    assert outcome.body["status"]["primary"] == P0
    mode, cond, reason, message = detection(outcome)
    assert (mode, cond, reason) == ("Polled", "False", "RoleLabelDisagrees")
    assert message == (
        "Polled: the role label disagrees with Patroni (leader pg-orders-0): "
        "pg-orders-0 has role=replica, Patroni implies role=master or role=primary; "
        "pg-orders-1 has role=primary, Patroni implies role=replica; the label is ignored"
    )
    assert outcome.body["resyncAfterSeconds"] == spread(TIMING.healthy, NOW)


def test_a_label_naming_a_leader_patroni_does_not_confirm_keeps_the_service() -> None:
    pods = k8s_dcs_pods(P1)
    answers = {n: replica(n) for n in NAMES}  # no member answers 200: no leader
    outcome = run(pods, answers, services=[make_service(pod=P0)])

    assert outcome.decision is Decision.NO_LEADER
    assert selected(outcome) == P0  # kept as observed, not moved to the labelled P1
    assert detection(outcome) == (
        "Polled",
        "False",
        "NoConfirmedLeader",
        "Polled: no leader confirmed by Patroni in this sync to compare role labels with",
    )
    assert outcome.body["resyncAfterSeconds"] == TIMING.degraded


def test_no_leader_is_polled_at_the_degraded_resync_even_with_agreeing_labels() -> None:
    pods = k8s_dcs_pods(P0)
    answers = {P0: down(P0), P1: replica(P1), P2: replica(P2)}  # the leader was killed
    outcome = run(pods, answers, services=[make_service(pod=P0)])
    assert outcome.decision is Decision.NO_LEADER
    assert detection(outcome)[2] == "NoConfirmedLeader"
    assert outcome.body["resyncAfterSeconds"] == TIMING.degraded


def test_labels_without_patronis_annotation_are_polled() -> None:
    pods = [
        member_pod(n, "primary" if n == P0 else "replica") for n in NAMES
    ]  # a look-alike label: nobody proves that Patroni keeps it
    outcome = run(pods, healthy(P0))
    mode, _, reason, message = detection(outcome)
    assert (mode, reason) == ("Polled", "StatusAnnotationMissing")
    assert message == (
        "Polled: no Patroni status annotation on pg-orders-0; pg-orders-1; pg-orders-2 (not "
        "Patroni's Kubernetes DCS: name a label kept by something else in "
        "spec.switchover.roleLabel)"
    )


@pytest.mark.parametrize(
    "bad",
    ["not json", "[]", '{"role": 3, "state": "running"}', '{"role": "primary"}', ""],
    ids=["not-json", "not-object", "role-not-string", "no-state", "empty"],
)
def test_an_annotation_that_is_not_patronis_member_json_counts_as_missing(bad: str) -> None:
    pods = k8s_dcs_pods(P0)
    pods[1]["metadata"]["annotations"]["status"] = bad
    assert detection(run(pods, healthy(P0)))[2] == "StatusAnnotationMissing"


def test_an_annotation_disagreeing_with_the_rest_answer_is_polled() -> None:
    pods = k8s_dcs_pods(P0)
    # Just promoted: the leader's annotation still says replica until its next HA cycle.
    pods[0]["metadata"]["annotations"]["status"] = annotation("replica")
    outcome = run(pods, healthy(P0))
    mode, _, reason, message = detection(outcome)
    assert (mode, reason) == ("Polled", "StatusAnnotationDisagrees")
    assert f"{P0}'s status annotation says role replica, its REST API primary" in message
    assert selected(outcome) == P0


def test_a_replica_whose_annotation_still_claims_primary_is_polled() -> None:
    pods = k8s_dcs_pods(P0)
    pods[1]["metadata"]["annotations"]["status"] = annotation("primary")
    assert detection(run(pods, healthy(P0)))[2] == "StatusAnnotationDisagrees"


def test_a_label_disagreement_is_reported_before_an_annotation_problem() -> None:
    pods = k8s_dcs_pods(P1)
    pods[2]["metadata"]["annotations"].clear()
    assert detection(run(pods, healthy(P0)))[2] == "RoleLabelDisagrees"


def test_many_pods_are_named_up_to_three() -> None:
    names = [f"{CLUSTER}-{i}" for i in range(6)]
    pods = [member_pod(n, None) for n in names]
    answers = {n: leader(n) if n == names[0] else replica(n) for n in names}
    message = detection(run(pods, answers))[3]
    assert "(and 3 more)" in message


@pytest.mark.parametrize(
    ("count", "named"),
    [
        (3, "pg-orders-0; pg-orders-1; pg-orders-2"),
        (4, "pg-orders-0; pg-orders-1; pg-orders-2 (and 1 more)"),
    ],
)
def test_three_pods_are_named_without_a_count_and_a_fourth_is_counted(
    count: int, named: str
) -> None:
    names = [f"{CLUSTER}-{i}" for i in range(count)]
    pods = [member_pod(n, None) for n in names]
    answers = {n: leader(n) if n == names[0] else replica(n) for n in names}
    assert detection(run(pods, answers))[3] == f"Polled: no role label on {named}"


def test_an_annotation_of_up_to_64_kib_is_read_and_a_longer_one_is_not() -> None:
    def padded(length: int) -> str:
        text = annotation("replica")
        text = text[:-1] + ',"pad":""}'
        return text[:-2] + "x" * (length - len(text)) + text[-2:]

    for length, reason in ((65536, "RoleLabelsAgree"), (65537, "StatusAnnotationMissing")):
        pods = k8s_dcs_pods(P0)
        pods[1]["metadata"]["annotations"]["status"] = padded(length)
        assert len(padded(length)) == length
        assert detection(run(pods, healthy(P0)))[2] == reason, length


def test_a_leader_annotated_primary_that_answers_as_standby_leader_disagrees() -> None:
    """Both are leader roles on /leader, but the annotation must name the role Patroni
    reported over REST, not merely another leader role."""
    pods = k8s_dcs_pods(P0)
    answers = {
        P0: MemberStatus.from_api_response(P0, 200, patroni_body("standby_leader", name=P0)),
        P1: replica(P1),
        P2: replica(P2),
    }
    outcome = run(pods, answers, spec=seed_spec(healthCheckPath="/leader"))
    assert selected(outcome) == P0
    mode, _, reason, message = detection(outcome)
    assert (mode, reason) == ("Polled", "StatusAnnotationDisagrees")
    assert message == (
        "Polled: Patroni's status annotation disagrees with its REST answer: "
        f"{P0}'s status annotation says role primary, its REST API standby_leader"
    )


@pytest.mark.parametrize(
    ("path", "claimed"),
    [
        # A leader role of the path, though not the word "primary".
        ("/leader", "standby_leader"),
        # "primary" always claims the lock, even where the path's leader role is another.
        ("/standby-leader", "primary"),
    ],
)
def test_an_unreachable_replica_annotated_with_a_leader_role_disagrees(
    path: str, claimed: str
) -> None:
    leading = "standby_leader" if path == "/standby-leader" else "primary"
    pods = k8s_dcs_pods(P0)
    pods[0]["metadata"]["annotations"]["status"] = annotation(leading)
    pods[2]["metadata"]["annotations"]["status"] = annotation(claimed)
    answers = {
        P0: MemberStatus.from_api_response(P0, 200, patroni_body(leading, name=P0)),
        P1: replica(P1),
        P2: down(P2),
    }
    outcome = run(pods, answers, spec=seed_spec(healthCheckPath=path))
    assert selected(outcome) == P0
    mode, _, reason, message = detection(outcome)
    assert (mode, reason) == ("Polled", "StatusAnnotationDisagrees")
    assert message.endswith(f"{P2}'s status annotation says role {claimed}")


def test_a_replica_annotated_replica_whose_rest_api_says_primary_disagrees() -> None:
    """An old primary that lost the lock still says primary over REST (503 on /primary)."""
    pods = k8s_dcs_pods(P0)
    answers = healthy(P0)
    answers[P1] = MemberStatus.from_api_response(P1, 503, patroni_body("primary", name=P1))
    mode, _, reason, message = detection(run(pods, answers))
    assert (mode, reason) == ("Polled", "StatusAnnotationDisagrees")
    assert message.endswith(f"{P1}'s status annotation says role replica, its REST API primary")


def test_detect_never_vouches_for_a_leader_it_cannot_check() -> None:
    """:func:`detect` on its own: a leader that is not one of the Pods, or whose answer is
    missing, and a replica without an answer."""
    spec, _ = load_spec(seed_spec())
    assert spec is not None
    pods = loaded_pods({p["metadata"]["name"]: p for p in k8s_dcs_pods(P0)})
    answers = healthy(P0)
    outsider = detect(pods, list(answers.values()), "pg-orders-9", spec)
    assert (outsider.detection, outsider.reason.value) == (Detection.POLLED, "NoConfirmedLeader")
    unanswered = detect(pods, [answers[P1], answers[P2]], P0, spec)
    assert (unanswered.reason.value, unanswered.message) == (
        "StatusAnnotationDisagrees",
        "Polled: Patroni's status annotation disagrees with its REST answer: "
        f"{P0}'s status annotation says role primary",
    )
    # A replica without an answer is compared by its label only, like an unreachable one.
    assert detect(pods, [answers[P0], answers[P1]], P0, spec).reason.value == "RoleLabelsAgree"


# ========================================================== roleLabel (Spilo)


def spilo_pods(leading: str = P0, *, annotated: bool = False) -> list[dict[str, Any]]:
    return [
        member_pod(
            n,
            "master" if n == leading else "replica",
            annotation("primary" if n == leading else "replica") if annotated else None,
            key="spilo-role",
        )
        for n in NAMES
    ]


def test_spilo_labels_are_trusted_only_when_opted_in() -> None:
    not_opted = run(spilo_pods(P0), healthy(P0))
    assert detection(not_opted)[:3] == ("Polled", "False", "RoleLabelMissing")

    opted = run(spilo_pods(P0), healthy(P0), switchover=SPILO)
    assert detection(opted)[:3] == ("RoleLabel", "True", "RoleLabelsAgree")
    assert detection(opted)[3] == (
        "Role label: every member Pod's label spilo-role agree with Patroni "
        "(leader pg-orders-0), so a switchover changes a Pod"
    )
    assert opted.body["resyncAfterSeconds"] == spread(30.0, NOW)


def test_spilo_labels_disagreeing_with_patroni_are_polled_and_never_route() -> None:
    outcome = run(spilo_pods(P2), healthy(P1), switchover=SPILO)
    assert selected(outcome) == P1
    mode, _, reason, message = detection(outcome)
    assert (mode, reason) == ("Polled", "RoleLabelDisagrees")
    assert f"{P2} has spilo-role=master, Patroni implies spilo-role=replica" in message


def test_with_role_label_patronis_own_label_is_not_what_counts() -> None:
    # Patroni's role label agrees, but the spec names spilo-role, which is missing.
    outcome = run(k8s_dcs_pods(P0), healthy(P0), switchover=SPILO)
    assert detection(outcome)[2] == "RoleLabelMissing"


# ===================================================================== resyncs


@pytest.mark.parametrize(
    ("switchover", "timing", "labels", "expected"),
    [
        (None, TIMING, False, 7.0),
        ({"pollSeconds": 3}, TIMING, False, 3.0),
        ({"pollSeconds": 0.3}, ResyncTiming(healthy=1.0, degraded=0.5, min_poll=0.3), False, 0.5),
        ({"pollSeconds": 0.3}, ResyncTiming(healthy=7.0, degraded=0.25), False, 1.0),
        ({"pollSeconds": 0.3}, ResyncTiming(healthy=7.0, degraded=0.25, min_poll=5), False, 5.0),
        ({"pollSeconds": 6}, ResyncTiming(healthy=7.0, degraded=0.25, min_poll=5), False, 6.0),
        ({"pollSeconds": 60, "eventDrivenResyncSeconds": 20}, TIMING, True, 60.0),
        ({"eventDrivenResyncSeconds": 0.3}, TIMING, True, 7.0),
        ({"pollSeconds": 300, "eventDrivenResyncSeconds": 300}, TIMING, True, 300.0),
    ],
    ids=[
        "operator-default",
        "poll-seconds",
        "never-below-degraded",
        "never-below-the-operators-floor-default-1s",
        "never-below-the-operators-floor",
        "above-the-floor-as-asked",
        "event-driven-never-below-poll",
        "event-driven-below-operator-poll",
        "upper-bound",
    ],
)
def test_the_healthy_resync(
    switchover: dict[str, Any] | None, timing: ResyncTiming, labels: bool, expected: float
) -> None:
    pods = k8s_dcs_pods(P0) if labels else [member_pod(n, None) for n in NAMES]
    outcome = run(pods, healthy(P0), switchover=switchover, timing=timing)
    assert detection(outcome)[0] == ("RoleLabel" if labels else "Polled")
    # The period, phase-spread (tests/test_sync_regressions.py has the spread's own tests).
    assert outcome.body["resyncAfterSeconds"] == max(spread(expected, NOW), timing.degraded)


# =================================================================== the status


def test_the_status_converges_in_both_modes() -> None:
    """Fed back as Metacontroller writes it, the next reply is the same, byte for byte."""
    for pods in (k8s_dcs_pods(P0), [member_pod(n, None) for n in NAMES]):
        first = run(pods, healthy(P0))
        again = run(
            pods,
            healthy(P0),
            services=[c for c in first.body["children"] if c["kind"] == "Service"],
            status=first.body["status"],
            now=NOW + timedelta(minutes=5),
        )
        second = run(
            pods,
            healthy(P0),
            services=[c for c in first.body["children"] if c["kind"] == "Service"],
            status=again.body["status"],
            now=NOW + timedelta(minutes=9),
        )
        # Byte for byte but the resync, which moves with the clock (never the status).
        assert json.dumps(without_resync(again.body), sort_keys=True) == json.dumps(
            without_resync(second.body), sort_keys=True
        )


def test_a_mode_change_moves_the_conditions_transition_time() -> None:
    first = run(k8s_dcs_pods(P0), healthy(P0))
    later = NOW + timedelta(minutes=3)
    pods = k8s_dcs_pods(P0)
    del pods[1]["metadata"]["labels"]["role"]
    second = run(pods, healthy(P0), status=first.body["status"], now=later)
    (cond,) = [c for c in second.body["status"]["conditions"] if c["type"] == "SwitchoverDetection"]
    assert cond["lastTransitionTime"] == later.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_an_invalid_spec_keeps_the_last_mode_and_condition() -> None:
    first = run(k8s_dcs_pods(P0), healthy(P0))
    broken = seed_spec(switchover={"pollSeconds": 0.1})
    outcome = run(k8s_dcs_pods(P0), healthy(P0), spec=broken, status=first.body["status"])
    assert outcome.decision is Decision.INVALID_SPEC
    assert detection(outcome)[:3] == ("RoleLabel", "True", "RoleLabelsAgree")
    assert outcome.body["resyncAfterSeconds"] == TIMING.healthy


def test_a_finalize_keeps_the_last_mode_and_condition() -> None:
    first = run(k8s_dcs_pods(P0), healthy(P0))
    body = sync_body(pods=k8s_dcs_pods(P0), status=first.body["status"], finalizing=True)
    outcome = run_body(body, healthy(P0))
    assert detection(outcome)[:3] == ("RoleLabel", "True", "RoleLabelsAgree")


# ==================================================== the recorded fixtures (contract)


def test_the_recorded_kubernetes_dcs_request_is_event_driven() -> None:
    """The fixtures come from a Kubernetes-DCS cluster: role labels and status annotations."""
    body = fixture("sync-service-selects-old-leader.json")
    outcome = run_body(body, {"pg-orders-0": replica(P0), P1: leader(P1), P2: replica(P2)})
    assert selected(outcome) == P1
    assert detection(outcome)[:3] == ("RoleLabel", "True", "RoleLabelsAgree")
    assert outcome.body["resyncAfterSeconds"] == spread(30.0, NOW, body)

    stripped = run_body(polled(body), {P0: replica(P0), P1: leader(P1), P2: replica(P2)})
    assert detection(stripped)[:3] == ("Polled", "False", "RoleLabelMissing")
    assert stripped.body["resyncAfterSeconds"] == spread(TIMING.healthy, NOW, polled(body))


def test_the_recorded_request_with_patroni_naming_another_leader_is_polled() -> None:
    body = fixture("sync-service-selects-old-leader.json")  # labels: pg-orders-1 leads
    outcome = run_body(body, {P0: leader(P0), P1: replica(P1), P2: replica(P2)})
    assert selected(outcome) == P0
    assert detection(outcome)[2] == "RoleLabelDisagrees"


# ================================================================== bad input


@pytest.mark.parametrize(
    ("switchover", "field"),
    [
        ({"pollSeconds": 0.29}, "spec.switchover.pollSeconds"),
        ({"pollSeconds": 0}, "spec.switchover.pollSeconds"),
        ({"pollSeconds": -1}, "spec.switchover.pollSeconds"),
        ({"pollSeconds": 300.5}, "spec.switchover.pollSeconds"),
        ({"pollSeconds": 1e9}, "spec.switchover.pollSeconds"),
        ({"pollSeconds": "1"}, "spec.switchover.pollSeconds"),
        ({"pollSeconds": True}, "spec.switchover.pollSeconds"),
        ({"pollSeconds": math.nan}, "spec.switchover.pollSeconds"),
        ({"pollSeconds": math.inf}, "spec.switchover.pollSeconds"),
        ({"eventDrivenResyncSeconds": 0.2}, "spec.switchover.eventDrivenResyncSeconds"),
        ({"eventDrivenResyncSeconds": 3600}, "spec.switchover.eventDrivenResyncSeconds"),
        ({"roleLabel": {}}, "spec.switchover.roleLabel.key"),
        ({"roleLabel": {"key": "bad key"}}, "spec.switchover.roleLabel.key"),
        ({"roleLabel": {"key": "-x"}}, "spec.switchover.roleLabel.key"),
        ({"roleLabel": {"key": "Example.com/x"}}, "spec.switchover.roleLabel.key"),
        (
            {"roleLabel": {"key": "x", "leaderValue": "a b"}},
            "spec.switchover.roleLabel.leaderValue",
        ),
        (
            {"roleLabel": {"key": "x", "leaderValue": "replica"}},
            "spec.switchover.roleLabel.replicaValue",
        ),
        ({"roleLabel": {"key": "cluster-name"}}, "spec.switchover"),
    ],
)
def test_bad_switchover_settings_are_refused_in_the_spec(
    switchover: dict[str, Any], field: str
) -> None:
    spec, problems = load_spec(seed_spec(switchover=switchover))
    assert spec is None
    assert field in [p.field for p in problems], problems


def test_an_invalid_switchover_setting_keeps_the_service_and_says_why() -> None:
    outcome = run(
        k8s_dcs_pods(P1),
        healthy(P1),
        switchover={"pollSeconds": 0.01},
        services=[make_service(pod=P0)],
    )
    assert outcome.decision is Decision.INVALID_SPEC
    assert selected(outcome) == P0
    spec_valid = [c for c in outcome.body["status"]["conditions"] if c["type"] == "SpecValid"]
    assert "spec.switchover.pollSeconds" in spec_valid[0]["message"]


def test_the_spec_loads_with_every_default() -> None:
    spec, _ = load_spec(seed_spec())
    assert spec is not None and spec.switchover == SwitchoverSpec()
    spec, _ = load_spec(seed_spec(switchover={}))
    assert spec is not None and spec.switchover == SwitchoverSpec()
    spec, _ = load_spec(seed_spec(switchover={"roleLabel": {"key": "spilo-role"}}))
    assert spec is not None
    assert spec.switchover.role_label == RoleLabelSpec("spilo-role", "primary", "replica")
    assert spec.switchover.event_driven_resync_seconds == 30.0
    assert spec.switchover.poll_seconds is None


def test_the_bounds_are_the_crds() -> None:
    from tests.manifest_helpers import crd_schema

    node = crd_schema()["properties"]["spec"]["properties"]["switchover"]["properties"]
    for name in ("pollSeconds", "eventDrivenResyncSeconds"):
        assert node[name]["minimum"] == MIN_POLL_SECONDS == ResyncTiming().degraded
        assert node[name]["maximum"] == MAX_POLL_SECONDS
    assert (
        node["eventDrivenResyncSeconds"]["default"] == SwitchoverSpec().event_driven_resync_seconds
    )
    assert "default" not in node["pollSeconds"]  # unset: the operator's setting
    role = node["roleLabel"]["properties"]
    assert role["leaderValue"]["default"] == RoleLabelSpec("k").leader_value
    assert role["replicaValue"]["default"] == RoleLabelSpec("k").replica_value


def test_detection_values_are_the_crds_enum() -> None:
    from tests.manifest_helpers import crd_schema

    enum = crd_schema()["properties"]["status"]["properties"]["switchoverDetection"]["enum"]
    assert enum == [d.value for d in Detection]
