"""Exactly one Pod behind the primary Service (issue 29): the routing core, exhaustively.

Kubernetes does not reserve ``statefulset.kubernetes.io/pod-name``: anyone who may create
or label Pods in the namespace can run a Pod carrying the ``primarySelector`` labels and
the leader's pod-name value (``kubectl debug --copy-to … --keep-labels`` does it
innocently). The Service's selector would then match two Pods, and kube-proxy would send
part of the writes to the copy. :func:`hooks.core.routing.choose_leader` must never route
while its selector would match any Pod besides the leader.

Plain values only: :class:`~hooks.domain.observed.Pod` and
:class:`~hooks.domain.members.MemberStatus`. Every assignment of pod-name labels (absent,
each member's name, a foreign value) and ``primarySelector`` labels (present, absent) over
three members plus one extra Pod is enumerated, and judged by an independent oracle: the
selector the reply would set is applied to every Pod, and routing is allowed only when
exactly the leader matches it and the leader carries its own name.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest

from hooks.core.routing import Decision, choose_leader
from hooks.domain.model import POD_NAME_LABEL, ClusterSpec
from hooks.domain.observed import Pod
from tests.helpers import leader, replica

SELECTOR = {"application": "patroni", "cluster-name": "pg"}
SPEC = ClusterSpec(primary_selector=SELECTOR, service_name="pg-primary")
MEMBERS = ("pg-0", "pg-1", "pg-2")
EXTRA = "pg-debug"
LEADER = "pg-1"
#: Each Pod's pod-name label: absent, one of the members' names, or a foreign value.
POD_NAME_VALUES: tuple[str | None, ...] = (None, *MEMBERS, "elsewhere")


def _pod(name: str, pod_name: str | None, scoped: bool) -> Pod:
    labels = dict(SELECTOR) if scoped else {}
    if pod_name is not None:
        labels[POD_NAME_LABEL] = pod_name
    return Pod(name=name, labels=labels)


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _cases() -> list[tuple[dict[str, Pod], bool]]:
    """Every labelling of the three members and of one extra Pod (present or not)."""
    cases = []
    names = (*MEMBERS, EXTRA)
    for values in itertools.product(POD_NAME_VALUES, repeat=len(names)):
        for scoped in itertools.product((True, False), repeat=len(names)):
            pods = {n: _pod(n, v, s) for n, v, s in zip(names, values, scoped, strict=True)}
            cases.append((pods, True))
            cases.append(({n: p for n, p in pods.items() if n != EXTRA}, False))
    return cases


CASES = _cases()


def test_the_enumeration_covers_the_attack() -> None:
    """Sanity: the table holds the attack (a copy of the leader) and the plain cluster."""
    copied = [
        pods
        for pods, _ in CASES
        if EXTRA in pods and dict(pods[EXTRA].labels) == dict(pods[LEADER].labels)
    ]
    assert copied
    assert len(CASES) == 2 * (len(POD_NAME_VALUES) ** 4) * 2**4


@pytest.mark.parametrize("chunk", range(8))
def test_routed_only_when_the_selector_matches_the_leader_alone(chunk: int) -> None:
    members = [leader(LEADER) if n == LEADER else replica(n) for n in MEMBERS]
    members += [replica(EXTRA)]
    for pods, _ in CASES[chunk::8]:
        answered = [m for m in members if m.name in pods]
        route = choose_leader(pods, answered, SPEC)
        selector = {**SELECTOR, POD_NAME_LABEL: LEADER}
        matched = sorted(n for n, p in pods.items() if _matches(p.labels, selector))
        carriers = sorted(
            n for n, p in pods.items() if n != LEADER and p.labels.get(POD_NAME_LABEL) == LEADER
        )
        if LEADER not in matched:
            assert route.decision is Decision.LEADER_NOT_SELECTABLE, pods
        elif carriers:
            assert route.decision is Decision.SELECTOR_NOT_UNIQUE, pods
            assert route.leader is None
            for name in carriers:
                assert name in route.why
        else:
            assert matched == [LEADER]
            assert route.decision is Decision.ROUTED, pods
            assert route.leader == LEADER


def test_the_reason_names_every_impostor_and_the_label() -> None:
    pods = {
        "pg-0": _pod("pg-0", "pg-0", True),
        "pg-1": _pod("pg-1", "pg-1", True),
        "pg-1-copy": _pod("pg-1-copy", "pg-1", True),
        "zz-debug": _pod("zz-debug", "pg-1", False),
    }
    route = choose_leader(pods, [replica("pg-0"), leader("pg-1")], SPEC)
    assert route.decision is Decision.SELECTOR_NOT_UNIQUE
    assert route.decision.degraded
    assert route.why == (
        "Pods pg-1-copy, zz-debug carry statefulset.kubernetes.io/pod-name=pg-1 besides the "
        "leader pg-1: the Service's selector would match them too, so it is not moved"
    )


def test_a_long_list_of_impostors_is_cut_in_the_message() -> None:
    pods = {"pg-1": _pod("pg-1", "pg-1", True)}
    pods.update({f"copy-{i:03}": _pod(f"copy-{i:03}", "pg-1", True) for i in range(200)})
    route = choose_leader(pods, [leader("pg-1")], SPEC)
    assert route.decision is Decision.SELECTOR_NOT_UNIQUE
    assert "copy-000, copy-001" in route.why
    assert "copy-199" not in route.why
    assert "and 190 more" in route.why
    assert len(route.why) < 600
