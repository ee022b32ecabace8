"""The status stays far below etcd's object limit whatever Patroni answers (issue 29, Low).

Patroni's ``role``, ``state`` and ``patroni.name`` go into the status (``status.members``,
condition messages). A member, or whoever holds its IP, may answer strings of up to the
probe's 64 KiB body cap each; with 64 members that was 8 MiB of status, past etcd's
1.5 MiB request limit, so Metacontroller's status write failed on every sync. The strings
are capped where the answer is read (:class:`hooks.domain.members.MemberStatus`), and the
worst case of the whole status under the hook's caps is measured here.
"""

from __future__ import annotations

import json

from hooks.domain.members import MAX_FIELD_CHARS, MAX_NAME_CHARS, MemberStatus
from hooks.probe.policy import ProbePolicy
from testbed.fakes.patroni_wire import patroni_body
from tests.helpers import make_pod, make_service, run, sync_body

#: What the status of one cluster may take at most, whatever the members answer: a tenth
#: of etcd's default request limit (1.5 MiB), leaving room for the spec and metadata.
STATUS_BUDGET = 150 * 1024
HUGE = "x" * (64 * 1024 - 200)


def _hostile(name: str, http_status: int, role: str = HUGE) -> MemberStatus:
    body = patroni_body("primary", name=name)
    body.update(role=role, state=HUGE, replication_state=HUGE)
    body["patroni"].update(name=HUGE, scope=HUGE, version=HUGE)
    return MemberStatus.from_api_response(name, http_status, body)


def test_patroni_strings_are_capped_where_the_answer_is_read() -> None:
    member = _hostile("pg-0", 200)
    for value in (member.role, member.state, member.replication_state, member.patroni_scope):
        assert value is not None and len(value) <= MAX_FIELD_CHARS + 1
        assert value.endswith("…")
    assert member.patroni_name is not None and len(member.patroni_name) == MAX_NAME_CHARS + 1
    assert len(member.reason) < 300
    # A cut value never equals a real one: the ellipsis is not a character Patroni sends.
    assert not member.claims_leadership or member.verdict.value != "leader"


def test_a_real_pod_name_is_never_cut() -> None:
    name = "p" * 253  # the longest name Kubernetes allows
    body = patroni_body("primary", name=name)
    assert MemberStatus.from_api_response(name, 200, body).patroni_name == name


def test_the_whole_status_stays_within_budget_with_every_member_hostile() -> None:
    members = ProbePolicy().max_members
    names = [f"{'n' * 240}-{i:03}" for i in range(members)]  # long, valid Pod names
    pods = [make_pod(n, f"10.244.{i // 200}.{i % 200 + 1}") for i, n in enumerate(names)]
    body = sync_body(pods=pods, services=[make_service(pod=names[0])])
    for http_status in (200, 503):
        answers = {n: _hostile(n, http_status) for n in names}
        _, outcome = run(body, answers)
        size = len(json.dumps(outcome.body["status"]))
        print(f"status of {members} hostile members (HTTP {http_status}): {size:,} bytes")
        assert size < STATUS_BUDGET
        for entry in outcome.body["status"]["members"]:
            assert len(entry.get("role", "")) <= MAX_FIELD_CHARS + 1
            assert len(entry.get("state", "")) <= MAX_FIELD_CHARS + 1


def test_a_condition_message_is_cut_at_the_cap() -> None:
    from hooks.core.conditions import MAX_MESSAGE_CHARS, stamped
    from hooks.domain.model import Condition
    from hooks.loaders.envelope import load_sync_request
    from tests.helpers import NOW

    request = load_sync_request(sync_body())
    short, long = stamped(
        request,
        NOW,
        [Condition("A", "True", "R", "fine"), Condition("B", "False", "R", "m" * 100_000)],
    )
    assert short["message"] == "fine"
    assert long["message"] == "m" * MAX_MESSAGE_CHARS + "…"
