"""Patroni 4.1's own signals, as pure decisions (issue 32, item 3).

Test design: plain values only. Every ``state`` Patroni 3.0 to 4.1 can report
(``PostgresqlState`` in ``patroni/postgresql/misc.py`` at v4.1.4, lines 20-34, plus the
``initalizing`` spelling of 3.0.0 and 3.0.1) is crossed with every role, both status codes
and a Pod with or without ``spec.patroni.bootstrapLabels``, through the routing decision
(:func:`hooks.core.routing.choose_leader`) and the read-only classification
(:func:`hooks.children.readonly.classify`); the expected outcome is computed independently from
the rule (route only to 200 + running + leader role + no bootstrap labels; list only a
running replica without them). Then whole syncs (``reconcile``) for what the status says,
and failsafe mode: the leader's answer with ``failsafe_mode_is_active`` and
``cluster_unlocked`` (what Patroni sends while the DCS is down, ``get_postgresql_status`` in
``patroni/api.py`` at v4.1.4, lines 1444-1448) routes as always and says so.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from hooks.children.read_members import classify
from hooks.core.routing import Decision, bootstrap_labelled, choose_leader
from hooks.domain.members import INITIALISING_STATES, MemberStatus
from hooks.domain.model import LEADER_PATHS, POD_NAME_LABEL
from hooks.domain.observed import Pod
from hooks.loaders.schemas import load_spec
from testbed.fakes.patroni_wire import patroni_body
from tests.child_helpers import (
    LEADER_AT,
    answer,
    children_of,
    cluster_answers,
    condition,
    listed_slice,
    request_body,
    rs_spec,
)
from tests.helpers import P0, P1, P2, SELECTOR, make_pod, run, seed_spec

BOOTSTRAP = {"pgfh.example/bootstrapping": "true", "team": "db"}
#: Every state string of Patroni 3.0.0 to 4.1.4 (patroni/postgresql/misc.py at v4.1.4,
#: lines 20-34; "initalizing new cluster" is how 3.0.0 and 3.0.1 spell it, bootstrap.py:62).
PATRONI_STATES = (
    "initializing new cluster",
    "initalizing new cluster",
    "initdb failed",
    "running custom bootstrap script",
    "custom bootstrap failed",
    "creating replica",
    "running",
    "starting",
    "starting after custom bootstrap",
    "start failed",
    "restarting",
    "restart failed",
    "stopping",
    "stopped",
    "stop failed",
    "crashed",
    "unknown",
)
ROLES = ("primary", "master", "replica", "standby_leader", "uninitialized", "demoted")
#: Patroni 4.1's bootstrap_labels states (patroni/dcs/kubernetes.py at v4.1.4, 1383-1384).
BOOTSTRAP_STATES = {
    "initializing new cluster",
    "running custom bootstrap script",
    "starting after custom bootstrap",
    "creating replica",
}


def spec_with(labels: dict[str, str] | None = BOOTSTRAP, **extra: Any) -> Any:
    raw = rs_spec(**extra)
    if labels is not None:
        raw["patroni"] = {"bootstrapLabels": labels}
    spec, problems = load_spec(raw)
    assert spec is not None, problems
    return spec


def pod(name: str, *, bootstrapping: bool = False, partial: bool = False) -> Pod:
    labels = {**SELECTOR, POD_NAME_LABEL: name}
    if bootstrapping:
        labels.update(BOOTSTRAP)
    if partial:
        labels["team"] = "db"  # one of the two: not Patroni's mark
    return Pod(name=name, labels=labels)


def status(name: str, code: int, role: str, state: str) -> MemberStatus:
    body = patroni_body(role, state, name=name)
    return MemberStatus.from_api_response(
        name, code, body, health_path="/primary", leader_roles=LEADER_PATHS["/primary"]
    )


def test_the_initialising_states_are_exactly_patronis_bootstrap_label_states() -> None:
    # Plus the first one as 3.0.0 and 3.0.1 spell it: the same phase.
    assert {*BOOTSTRAP_STATES, "initalizing new cluster"} == INITIALISING_STATES
    assert set(INITIALISING_STATES) <= set(PATRONI_STATES)


@pytest.mark.parametrize("state", PATRONI_STATES)
def test_initialising_is_read_from_the_state_alone(state: str) -> None:
    for role, code in itertools.product(ROLES, (200, 503)):
        member = status(P0, code, role, state)
        assert member.initialising is (state in INITIALISING_STATES)
    assert MemberStatus.unknown(P0, "refused").initialising is False


# ------------------------------------------------------------------ writes: exhaustive


@pytest.mark.parametrize("state", PATRONI_STATES)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("code", [200, 503])
@pytest.mark.parametrize("labelled", ["none", "all", "partial"])
def test_the_primary_service_goes_only_to_a_running_leader_without_bootstrap_labels(
    state: str, role: str, code: int, labelled: str
) -> None:
    spec = spec_with()
    pods = {
        P0: pod(P0, bootstrapping=labelled == "all", partial=labelled == "partial"),
        P1: pod(P1),
    }
    members = [status(P0, code, role, state), answer(P1)]

    route = choose_leader(pods, members, spec)

    leader_role = role in ("primary", "master")  # /primary's leader roles (master → primary)
    if code == 200 and state == "running" and leader_role and labelled != "all":
        assert route.decision is Decision.ROUTED and route.leader == P0
    else:
        assert not route.routed and route.leader is None
        if code == 200 and state in INITIALISING_STATES:
            assert route.decision is Decision.LEADER_INITIALIZING
            assert f"initializing (state {state})" in route.why
        elif code == 200 and (state != "running" or not leader_role):
            assert route.decision is Decision.LEADER_NOT_READY
        elif code == 200:
            assert route.decision is Decision.LEADER_INITIALIZING
            assert "bootstrap labels (pgfh.example/bootstrapping=true,team=db)" in route.why
        else:
            assert route.decision is Decision.NO_LEADER


def test_without_bootstrap_labels_in_the_spec_no_pod_label_keeps_the_leader_out() -> None:
    spec = spec_with(None)
    assert spec.bootstrap_labels == {}
    pods = {P0: pod(P0, bootstrapping=True), P1: pod(P1)}
    route = choose_leader(pods, [answer(P0, "primary"), answer(P1)], spec)
    assert route.decision is Decision.ROUTED


def test_bootstrap_labelled_needs_every_label_with_its_value() -> None:
    spec = spec_with()
    assert bootstrap_labelled(spec, BOOTSTRAP)
    assert bootstrap_labelled(spec, {**BOOTSTRAP, "other": "x"})
    assert not bootstrap_labelled(spec, {"pgfh.example/bootstrapping": "true"})
    assert not bootstrap_labelled(spec, {**BOOTSTRAP, "team": "web"})
    assert not bootstrap_labelled(spec, {})
    assert not bootstrap_labelled(spec_with(None), BOOTSTRAP)


# ------------------------------------------------------------------- reads: exhaustive


@pytest.mark.parametrize("state", PATRONI_STATES)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("labelled", [False, True])
def test_a_replica_is_listed_only_running_and_without_bootstrap_labels(
    state: str, role: str, labelled: bool
) -> None:
    spec = spec_with()
    leader = answer(P0, "primary")
    body = patroni_body(role, state, name=P1)
    body["xlog"] = {"received_location": LEADER_AT, "replayed_location": LEADER_AT}
    body["replication_state"] = "streaming"
    member = MemberStatus.from_api_response(P1, 503, body)

    verdict = classify(member, pod(P1, bootstrapping=labelled), _ip(), leader, LEADER_AT, spec)

    if state == "running" and role == "replica" and not labelled:
        assert verdict.listed is True
    else:
        assert verdict.listed is False and not verdict.keepable
        if labelled:
            assert verdict.reason == (
                "initializing (bootstrap labels pgfh.example/bootstrapping=true,team=db)"
            )
        elif state in INITIALISING_STATES:
            assert verdict.reason == f"initializing (state {state})"


def test_a_bootstrap_labelled_replica_that_does_not_answer_is_not_kept_in_doubt() -> None:
    spec = spec_with()
    leader = answer(P0, "primary")
    silent = MemberStatus.unknown(P1, "connection refused")
    assert classify(silent, pod(P1), _ip(), leader, LEADER_AT, spec).listed is None  # in doubt
    labelled = classify(silent, pod(P1, bootstrapping=True), _ip(), leader, LEADER_AT, spec)
    assert labelled.listed is False and not labelled.keepable


def _ip() -> Any:
    import ipaddress

    return ipaddress.ip_address("10.244.1.10")


# ------------------------------------------------------------------------ whole syncs


def labelled_pod(name: str) -> dict[str, Any]:
    raw = make_pod(name)
    raw["metadata"]["labels"].update(BOOTSTRAP)
    return raw


def raw_spec(**extra: Any) -> dict[str, Any]:
    spec = rs_spec(**extra)
    spec["patroni"] = {"bootstrapLabels": dict(BOOTSTRAP)}
    return spec


def test_a_replica_being_created_leaves_the_read_only_endpoints_and_the_status_says_why() -> None:
    creating = answer(P2, state="creating replica", replication_state=None, behind=None)
    body = request_body(
        spec=raw_spec(),
        pods=[make_pod(P0), make_pod(P1), labelled_pod(P2)],
        slices=[listed_slice([P1, P2])],
    )
    _, outcome = run(body, cluster_answers(P0, **{P2: creating}))

    (slice_,) = children_of(outcome, "EndpointSlice").values()
    assert [e["targetRef"]["name"] for e in slice_["endpoints"]] == [P1]
    message = condition(outcome, "ReplicasRouted")["message"]
    assert (
        f"left out: {P2} (initializing (bootstrap labels pgfh.example/bootstrapping=true,team=db))"
        in message
    )


@pytest.mark.parametrize("fallback", ["KeepEndpoints", "UseLeader", "Empty"])
def test_no_fallback_keeps_an_initialising_member_listed(fallback: str) -> None:
    # The only listed replica is being re-created (silent, then "creating replica"):
    # whatever the fallback, it is not read from.
    for creating in (
        MemberStatus.unknown(P1, "connection refused"),
        answer(P1, state="creating replica", replication_state=None, behind=None),
    ):
        body = request_body(
            spec=raw_spec(whenNoReplica=fallback),
            pods=[make_pod(P0), labelled_pod(P1)],
            slices=[listed_slice([P1])],
        )
        _, outcome = run(body, {P0: answer(P0, "primary"), P1: creating})
        (slice_,) = children_of(outcome, "EndpointSlice").values()
        listed = [e["targetRef"]["name"] for e in slice_.get("endpoints") or []]
        assert P1 not in listed
        assert listed == ([P0] if fallback == "UseLeader" else [])


def test_a_leader_still_labelled_keeps_the_service_and_says_why() -> None:
    from tests.helpers import make_service

    body = request_body(
        spec=raw_spec(),
        pods=[make_pod(P0), labelled_pod(P1), make_pod(P2)],
        services=[make_service(pod=P0)],
    )
    _, outcome = run(body, cluster_answers(P1))

    assert outcome.decision is Decision.LEADER_INITIALIZING
    (service,) = [s for n, s in children_of(outcome, "Service").items() if "primary" in n]
    assert service["spec"]["selector"][POD_NAME_LABEL] == P0  # kept where it was
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "LeaderInitializing")
    assert "carries Patroni's bootstrap labels" in ready["message"]


def test_bootstrap_labels_must_be_labels() -> None:
    raw = seed_spec(patroni={"bootstrapLabels": {"not a key!": "x"}})
    spec, problems = load_spec(raw)
    assert spec is None
    assert [(p.field, p.message) for p in problems] == [
        ("spec.patroni.bootstrapLabels", "'not a key!' is not a valid label key")
    ]
    spec, problems = load_spec(seed_spec(patroni={"bootstrapLabels": {"a": "bad value!"}}))
    assert spec is None and problems[0].field == "spec.patroni.bootstrapLabels"


# --------------------------------------------------------------------------- failsafe


def failsafe_answers(leading: str = P1) -> dict[str, MemberStatus]:
    """What every member answers while the DCS is down and failsafe holds the leader:
    ``cluster_unlocked`` (no cluster view) and ``failsafe_mode_is_active`` on every member
    (replicas set it on ``POST /failsafe``); the leader still 200 (``is_leader()`` renewed
    by ``set_is_leader(True)`` in ``Ha._handle_dcs_error``, ha.py v4.1.4 line 2356)."""
    answers = {}
    for name in (P0, P1, P2):
        role = "primary" if name == leading else "replica"
        body = patroni_body(role, name=name)
        body["xlog"] = (
            {"location": LEADER_AT}
            if name == leading
            else {"received_location": LEADER_AT, "replayed_location": LEADER_AT}
        )
        body["cluster_unlocked"] = True
        body["failsafe_mode_is_active"] = True
        answers[name] = MemberStatus.from_api_response(name, 200 if name == leading else 503, body)
    return answers


def test_failsafe_is_read_only_when_patroni_says_true() -> None:
    body = patroni_body("primary", name=P0)
    for value, expected in ((True, True), (False, False), ("true", False), (1, False)):
        body["failsafe_mode_is_active"] = value
        assert MemberStatus.from_api_response(P0, 200, body).failsafe_active is expected
    del body["failsafe_mode_is_active"]
    assert MemberStatus.from_api_response(P0, 200, body).failsafe_active is False


def test_in_failsafe_mode_the_primary_stays_routed_and_the_status_says_so() -> None:
    from tests.helpers import make_service

    body = request_body(
        spec=rs_spec(), services=[make_service(pod=P1)], slices=[listed_slice([P0, P2])]
    )
    _, outcome = run(body, failsafe_answers(P1))

    assert outcome.decision is Decision.ROUTED and outcome.primary == P1
    ready = condition(outcome, "Ready")
    assert ready["status"] == "True" and ready["reason"] == "LeaderFound"
    routed = condition(outcome, "PrimaryRouted")
    assert "Patroni failsafe mode is active" in routed["message"]
    (slice_,) = children_of(outcome, "EndpointSlice").values()
    assert [e["targetRef"]["name"] for e in slice_["endpoints"]] == [P0, P2]
    assert condition(outcome, "ReplicasRouted")["status"] == "True"


def test_out_of_failsafe_the_message_says_nothing_of_it() -> None:
    body = request_body(spec=rs_spec())
    _, outcome = run(body, cluster_answers(P1))
    assert outcome.decision is Decision.ROUTED
    assert "failsafe" not in condition(outcome, "PrimaryRouted")["message"]


def test_when_failsafe_keeps_a_primary_that_answers_503_the_service_is_kept_and_said_why() -> None:
    """Patroni 4.1.5 on its Kubernetes DCS, API server down: the failsafe leader runs as
    primary but answers 503 on /primary (measured: tests/test_patroni_kubernetes_dcs.py)."""
    from tests.helpers import make_service

    answers = failsafe_answers(P1)
    body = patroni_body("primary", name=P1)
    body["xlog"] = {"location": LEADER_AT}
    body["failsafe_mode_is_active"] = True
    answers[P1] = MemberStatus.from_api_response(P1, 503, body)
    request = request_body(
        spec=rs_spec(), services=[make_service(pod=P1)], slices=[listed_slice([P0, P2])]
    )
    _, outcome = run(request, answers)

    assert outcome.decision is Decision.NO_LEADER
    (service,) = [s for n, s in children_of(outcome, "Service").items() if "primary" in n]
    assert service["spec"]["selector"][POD_NAME_LABEL] == P1  # kept on the primary
    message = condition(outcome, "Ready")["message"]
    assert (
        f"; Patroni failsafe mode is active and {P1} runs as primary (the DCS is unreachable)"
        in message
    )
    (slice_,) = children_of(outcome, "EndpointSlice").values()
    assert [e["targetRef"]["name"] for e in slice_["endpoints"]] == [P0, P2]  # kept too
    # Without failsafe in the answer, nothing of it is said.
    body.pop("failsafe_mode_is_active")
    answers[P1] = MemberStatus.from_api_response(P1, 503, body)
    _, outcome = run(request, answers)
    assert "failsafe" not in condition(outcome, "Ready")["message"]


def test_the_failsafe_note_is_the_leaders_own_flag_word_for_word() -> None:
    """The note is added when the *leader* says failsafe holds it, in these words; a replica
    that still reports the flag (it is set on ``POST /failsafe``) adds nothing."""
    body = request_body(spec=rs_spec())
    _, outcome = run(body, failsafe_answers(P1))
    service = outcome.body["status"]["service"]
    assert condition(outcome, "PrimaryRouted")["message"] == (
        f"Patroni reports {P1} as leader (timeline 1); Service {service} selects it; "
        "Patroni failsafe mode is active: the DCS is unreachable and every member "
        "acknowledged this leader (no failover is possible until the DCS is back)"
    )
    answers = failsafe_answers(P1)
    leader_body = patroni_body("primary", name=P1)
    leader_body["xlog"] = {"location": LEADER_AT}
    answers[P1] = MemberStatus.from_api_response(P1, 200, leader_body)
    _, outcome = run(body, answers)
    assert outcome.decision is Decision.ROUTED
    assert "failsafe" not in condition(outcome, "PrimaryRouted")["message"]
