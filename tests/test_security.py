"""Security properties of the hook: request limits, caller authentication, probe targets.

Test design notes:

* Limits are checked on the real app (Flask test client): each limit gives a clear 4xx
  JSON answer, and none of them depends on the parser's recursion limit.
* The JSON depth pre-check is pure; a property test compares it with the real depth of
  random JSON documents, so it can neither refuse a legal document nor let a deeper one
  through.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.app import create_app
from hooks.config import HookSettings
from hooks.schemas import nesting_problem
from tests.conftest import NOW
from tests.helpers import SYNC_FIXTURES, FakeProber, fixture

# ------------------------------------------------------------------ request limits


def depth(value: object) -> int:
    """Bracket nesting depth of a decoded JSON value (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n,:'),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(alphabet='[]{}"\\k'), children, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_the_depth_check_agrees_with_the_real_depth(value: Any) -> None:
    raw = json.dumps(value).encode()
    real = depth(value)
    assert nesting_problem(raw, max(real, 1)) is None
    if real > 1:
        assert nesting_problem(raw, real - 1) == f"nests deeper than {real - 1} levels"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        pytest.param(b"[" * 65 + b"]" * 65, "nests deeper than 64 levels", id="65-levels"),
        pytest.param(b"[" * 64 + b"]" * 64, None, id="64-levels"),
        pytest.param(b'{"a": "' + b"[" * 10_000 + b'"}', None, id="brackets-in-a-string"),
        pytest.param(b'["\\"[[[[[", 1]', None, id="escaped-quote"),
        pytest.param(b'{"a":[{"b":[{"c":{}}]}]}', None, id="mixed"),
        pytest.param(b"[" * 100_000, "is not valid JSON: its brackets do not balance", id="open"),
        pytest.param(b"[}", "is not valid JSON: its brackets do not balance", id="mismatched"),
        pytest.param(b"", None, id="empty"),
    ],
)
def test_the_depth_check_on_edge_cases(raw: bytes, problem: str | None) -> None:
    assert nesting_problem(raw, 64) == problem


@pytest.mark.parametrize("name", SYNC_FIXTURES)
def test_real_requests_stay_far_below_the_depth_limit(name: str) -> None:
    body = fixture(name)
    assert depth(body) <= 20, "the default limit (64) must leave a wide margin"
    assert nesting_problem(json.dumps(body).encode(), HookSettings().max_json_depth) is None


def _client(settings_: HookSettings) -> FlaskClient:
    app = create_app(settings=settings_, prober=FakeProber(), clock=lambda: NOW)
    app.config["TESTING"] = True
    return app.test_client()


def test_the_depth_limit_is_a_400_before_any_parsing_and_is_configurable() -> None:
    shallow = _client(HookSettings(max_json_depth=3))
    body = json.dumps({"parent": {"metadata": {"labels": {}}}, "children": {}}).encode()
    response = shallow.post("/sync", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json() == {"error": "request body nests deeper than 3 levels"}
    assert HookSettings.from_env({"PGFH_MAX_JSON_DEPTH": "3"}).max_json_depth == 3


def test_client_chosen_paths_do_not_become_metric_labels() -> None:
    client = _client(HookSettings())
    for index in range(20):
        assert client.post(f"/no-such-path-{index}", data=b"{}").status_code == 404
    text = client.get("/metrics").get_data(as_text=True)
    assert "no-such-path" not in text
    assert 'pgfh_bad_requests_total{endpoint="other"}' in text
