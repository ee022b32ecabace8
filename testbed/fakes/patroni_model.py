"""What a fake Patroni member answers, for each behaviour and path: the one model both fakes play.

A fake member has a :class:`Behaviour` (a :class:`Kind` and its knobs: well-behaved leader or
replica, or one of the misbehaviours real Patroni cannot be made to show on purpose: hung,
slow, dripping, reset mid-body, garbage, oversized, redirecting, ...). :func:`reply` turns a
behaviour, the member's :class:`Identity` and the request line into a :class:`Reply`: the
steps to play on the connection (wait, send, drip, stream filler, hold) and how it ends
(close, or reset). It does no I/O, so the threaded servers of the tests
(:mod:`testbed.fakes.patroni`) and the asyncio fleet of the benchmarks
(:mod:`testbed.fakes.patroni_fast`) play the same answers, written once here.

Well-behaved members answer by path as Patroni 4.1's ``api.py`` does (``do_GET``,
``do_GET_patroni``, ``do_GET_readiness``, ``do_GET_liveness``): the same document on
every path, the status code chosen by the path and the member's role, state and lock.
The document and the response head are :mod:`testbed.fakes.patroni_wire`'s.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any

from testbed.fakes.patroni_wire import patroni_body, response_head

DRIP_INTERVAL = 0.3  # seconds between two bytes of a dripping body
MAX_DRIP_BYTES = 100  # bytes a dripping body sends at most (30 s)
HUGE_BODY = 50 * 1024 * 1024


class Kind(enum.Enum):
    """What a fake member does with a request."""

    LEADER = "leader"  # holds the lock, role primary: 200 on the leader paths
    REPLICA = "replica"  # role replica, streaming: 503 on the leader paths
    REFUSED = "refused"  # nothing listening on the address/port
    HUNG = "hung"  # reads the request, never answers until released
    DRIP = "drip"  # 200 headers, then one body byte every DRIP_INTERVAL
    RESET_MID_BODY = "reset_mid_body"  # headers + half a body, then RST (SO_LINGER 0)
    GARBAGE = "garbage"  # 200 with a body that is not JSON
    NOT_PATRONI = "not_patroni"  # 200 with JSON that is not Patroni's
    REDIRECT = "redirect"  # 302 to ``Behaviour.location``
    HUGE = "huge"  # 200 with a ``body_bytes`` body (with or without Content-Length)
    PROMOTING = "promoting"  # 200, role replica: Patroni's first answer after promotion
    STOPPING = "stopping"  # 200, state stopping: a leader that lost the DCS
    MASTER_V3 = "master_v3"  # role master, Patroni 3: 200 on the leader paths
    RECORDED = "recorded"  # ``Behaviour.status`` with ``Behaviour.document`` as it is
    RAW = "raw"  # ``Behaviour.answer`` byte for byte, whatever it is (HTTP or not)


@dataclass(frozen=True, slots=True)
class Behaviour:
    """A :class:`Kind` and its knobs; ``delay`` makes any answering kind slow."""

    kind: Kind
    #: Seconds to wait after the request before answering.
    delay: float = 0.0
    #: REDIRECT: the ``Location`` header.
    location: str = ""
    #: HUGE (and REDIRECT, which has no body if 0): body size, and whether the answer
    #: declares it in ``Content-Length``.
    body_bytes: int = HUGE_BODY
    content_length: bool = True
    #: RECORDED: the status code and the JSON text to answer with.
    status: int = 200
    document: str = ""
    #: RAW: the bytes sent, and whether the connection is then held open (as a keep-alive
    #: server would) until released, instead of closed.
    answer: bytes = b""
    hold: bool = False


LEADER = Behaviour(Kind.LEADER)
REPLICA = Behaviour(Kind.REPLICA)
REFUSED = Behaviour(Kind.REFUSED)
HUNG = Behaviour(Kind.HUNG)
DRIP = Behaviour(Kind.DRIP)
RESET_MID_BODY = Behaviour(Kind.RESET_MID_BODY)
GARBAGE = Behaviour(Kind.GARBAGE)
NOT_PATRONI = Behaviour(Kind.NOT_PATRONI)
PROMOTING = Behaviour(Kind.PROMOTING)
STOPPING = Behaviour(Kind.STOPPING)
MASTER_V3 = Behaviour(Kind.MASTER_V3)


def recorded(status: int, document: str) -> Behaviour:
    """Answer ``status`` with the JSON text ``document`` (a recorded Patroni answer)."""
    return Behaviour(Kind.RECORDED, status=status, document=document)


def raw(answer: bytes, *, hold: bool = False) -> Behaviour:
    """Send ``answer`` as it is; close then, or hold the connection if ``hold``."""
    return Behaviour(Kind.RAW, answer=answer, hold=hold)


def slow(seconds: float, answer: Behaviour = LEADER) -> Behaviour:
    """``answer``, after ``seconds``."""
    return replace(answer, delay=seconds)


def redirect(location: str, body_bytes: int = 0) -> Behaviour:
    """A 302 to ``location`` (which a prober must not follow), with a body if asked."""
    return Behaviour(Kind.REDIRECT, location=location, body_bytes=body_bytes)


def huge(size: int = HUGE_BODY, *, content_length: bool) -> Behaviour:
    """A 200 whose body is ``size`` bytes long."""
    return Behaviour(Kind.HUGE, body_bytes=size, content_length=content_length)


def behaviour_of(value: Behaviour | str) -> Behaviour:
    """A behaviour, or its kind's name (``"leader"``, ``"hung"``: what the benchmarks pass)."""
    return value if isinstance(value, Behaviour) else Behaviour(Kind(value))


# ------------------------------------------------------------------- the answer


@dataclass(frozen=True, slots=True)
class Identity:
    """Who answers: the member's name, its timeline, and its cluster's member names
    (a leader's document lists one ``replication`` row per other member)."""

    name: str = "pg-0"
    timeline: int = 1
    members: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait this long before going on (a server stopping meanwhile ends the reply)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Send:
    """Write these bytes."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Drip:
    """Write ``data`` one byte per ``interval``."""

    data: bytes
    interval: float = DRIP_INTERVAL


@dataclass(frozen=True, slots=True)
class Stream:
    """Write ``size`` filler bytes as fast as the client takes them."""

    size: int


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep the connection open, answering nothing, until released (bounded by the server)."""


Step = Wait | Send | Drip | Stream | Hold


@dataclass(frozen=True, slots=True)
class Reply:
    """The steps of one answer, and whether the connection then ends with a reset (RST)
    instead of a close (FIN)."""

    steps: tuple[Step, ...]
    reset: bool = False
    #: What the server records when every step has been played.
    outcome: str = "answered"


def request_path(request_line: str) -> str:
    """The path of ``GET /primary?lag=1 HTTP/1.1`` (``/primary``); ``/`` if there is none."""
    parts = request_line.split(" ")
    target = parts[1] if len(parts) > 1 else "/"
    return target.split("?", 1)[0].split("#", 1)[0] or "/"


def handler(path: str) -> str:
    """Which of Patroni's ``do_GET_<first segment>`` handlers answers ``path`` (its
    ``parse_request``): ``patroni``, ``readiness``, ``liveness``, else ``""`` (``do_GET``)."""
    first = path.lstrip("/").split("/")[0]
    return first if first in ("patroni", "readiness", "liveness") else ""


def status_code(path: str, document: dict[str, Any], *, holds_lock: bool) -> int:
    """The status Patroni 4.1 answers on ``path`` for a member reporting ``document``.

    ``api.py`` of a cluster that is not a standby cluster: ``/patroni`` always 200,
    ``/liveness`` 200 while the heartbeat loop runs (always, here); ``/readiness`` 200 for
    the lock holder or a running replica that streams (within the lag: always, here); every
    other path goes through ``do_GET``'s choice by the words it contains (``/`` counts as
    ``/primary``), where the leader paths follow the lock, not the role reported.
    """
    role, running = document.get("role"), document.get("state") == "running"
    replica = 200 if role == "replica" and running else 503
    if handler(path) in ("patroni", "liveness"):
        return 200
    if handler(path) == "readiness":
        streaming = replica == 200 and document.get("replication_state") == "streaming"
        return 200 if holds_lock or streaming else 503
    path = "/primary" if path == "/" else path
    leader = primary = 200 if holds_lock else 503
    synchronous = document.get("sync_standby") or document.get("quorum_standby")
    if "standby_leader" in path or "standby-leader" in path:
        return 503  # not a standby cluster: nobody is its standby leader
    if "leader" in path:
        return leader
    if "master" in path or "primary" in path or "read-write" in path:
        return primary
    if "replica" in path:
        return replica
    if "read-only" in path and "sync" not in path and "quorum" not in path:
        return 200 if primary == 200 else replica
    if "health" in path:
        return 200 if running else 503
    if path in ("/async", "/asynchronous"):
        return 503 if synchronous else replica
    if path in ("/sync", "/synchronous", "/quorum"):
        return replica if synchronous else 503
    if path in ("/read-only-sync", "/read-only-synchronous", "/read-only-quorum"):
        return 200 if primary == 200 else replica if synchronous else 503
    return 503


def document(kind: Kind, identity: Identity) -> dict[str, Any]:
    """The JSON document a member of this kind reports (on every path)."""
    role = {
        Kind.REPLICA: "replica",
        Kind.PROMOTING: "replica",
        Kind.MASTER_V3: "master",
    }.get(kind, "primary")
    state = "stopping" if kind is Kind.STOPPING else "running"
    body = patroni_body(role, state, identity.timeline, identity.name, members=identity.members)
    if kind is Kind.MASTER_V3:
        body["patroni"]["version"] = "3.3.2"
    return body


def reply(behaviour: Behaviour, identity: Identity, request_line: str) -> Reply:
    """What a member with ``behaviour`` answers to ``request_line``."""
    kind = behaviour.kind
    if kind is Kind.REFUSED:
        raise ValueError("a refused member accepts no connection, so it answers nothing")
    if kind is Kind.HUNG:
        return Reply((Hold(),), outcome="released")
    if kind is Kind.RAW:
        steps: tuple[Step, ...] = (Send(behaviour.answer),)
        return Reply((*steps, Hold()) if behaviour.hold else steps, outcome="answered")
    wait: tuple[Step, ...] = (Wait(behaviour.delay),) if behaviour.delay else ()
    body = _json(document(Kind.LEADER, identity))
    if kind is Kind.DRIP:
        drip = Drip(body[:MAX_DRIP_BYTES])
        return Reply((*wait, Send(response_head(200)), drip), outcome="dripped")
    if kind is Kind.RESET_MID_BODY:
        half = Send(response_head(200) + body[: len(body) // 2])
        return Reply((*wait, half), reset=True, outcome="reset sent")
    if kind is Kind.HUGE:
        head = Send(response_head(200, _length(behaviour)))
        return Reply((*wait, head, Stream(behaviour.body_bytes)))
    if kind is Kind.REDIRECT:
        location = [("Location", behaviour.location)]
        if not behaviour.body_bytes:
            return Reply((*wait, Send(response_head(302, location))))
        head = Send(response_head(302, location + _length(behaviour)))
        return Reply((*wait, head, Stream(behaviour.body_bytes)))
    path = request_path(request_line)
    status, payload = _payload(behaviour, identity, path)
    if kind in _BY_PATH and handler(path) in ("readiness", "liveness"):
        # ``_write_status_code_only``: the status line and a blank line, nothing else.
        line = f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\n\r\n"
        return Reply((*wait, Send(line.encode())))
    return Reply((*wait, Send(response_head(status) + payload)))


#: The kinds that answer as Patroni does on every path; the others answer alike everywhere.
_BY_PATH = (Kind.LEADER, Kind.REPLICA, Kind.MASTER_V3)


def _payload(behaviour: Behaviour, identity: Identity, path: str) -> tuple[int, bytes]:
    kind = behaviour.kind
    if kind in _BY_PATH:
        body = document(kind, identity)
        return status_code(path, body, holds_lock=kind is not Kind.REPLICA), _json(body)
    if kind in (Kind.PROMOTING, Kind.STOPPING):
        return 200, _json(document(kind, identity))
    if kind is Kind.GARBAGE:
        return 200, b"<html><body>502 Bad Gateway</body></html>\n"
    if kind is Kind.NOT_PATRONI:
        return 200, _json({"hello": 1})
    if kind is Kind.RECORDED:
        return behaviour.status, behaviour.document.encode()
    raise AssertionError(f"{kind} has no plain payload")


def _length(behaviour: Behaviour) -> list[tuple[str, str]]:
    return [("Content-Length", str(behaviour.body_bytes))] if behaviour.content_length else []


def _json(document: object) -> bytes:
    return json.dumps(document).encode()
