"""The Makefile as a newcomer meets it: ``make help`` and ``make serve``.

* Every ``.PHONY`` target has a ``## `` help line, ``make help`` prints each of them, and the
  README's Layout row for the Makefile names every one (a new target that nobody can find is
  the papercut this guards against).
* ``make serve`` starts the hook with caller authentication on (the production default) and a
  local token it generated, prints that token and a curl line, and the curl line's request is
  answered while a request without the token is refused.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from testbed.metacontroller.gunicorn import free_port

REPO = Path(__file__).resolve().parent.parent
MAKEFILE = REPO / "Makefile"


def phony_targets() -> list[str]:
    text = MAKEFILE.read_text(encoding="utf-8")
    match = re.search(r"^\.PHONY:(.*)$", text, re.MULTILINE)
    assert match, "the Makefile declares its .PHONY targets on one line"
    return match.group(1).split()


def help_lines() -> dict[str, str]:
    """``target -> help`` as ``make help`` prints them."""
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), "help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    lines = [re.fullmatch(r"\s*make (\S+)\s+(.+)", line) for line in out.splitlines()]
    assert all(lines), f"make help printed a line that is not `make TARGET  HELP`:\n{out}"
    return {m.group(1): m.group(2) for m in lines if m}


def test_make_help_prints_a_line_for_every_phony_target() -> None:
    printed = help_lines()
    missing = [t for t in phony_targets() if not printed.get(t, "").strip()]
    assert missing == [], f"give these targets a `## what it does` comment: {missing}"
    assert set(printed) <= set(phony_targets()), "make help lists a target that is not .PHONY"


def test_the_readme_layout_row_names_every_target() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `Makefile` |"))
    named = set(re.findall(r"`make ([a-z-]+)`", row))
    assert named == set(phony_targets()), (
        f"the README's Makefile row names {sorted(named)}, the Makefile has {phony_targets()}"
    )


@pytest.mark.gunicorn
def test_make_serve_prints_a_token_and_a_curl_line_that_works(tmp_path: Path) -> None:
    bind = f"127.0.0.1:{free_port()}"
    token_file = tmp_path / "serve-token"
    env = {**os.environ, "GUNICORN_WORKERS": "1", "GUNICORN_THREADS": "2"}
    env.pop("PGFH_AUTH", None)
    env.pop("PGFH_AUTH_TOKENS_PATH", None)
    serve = subprocess.Popen(
        ["make", "-s", "-C", str(REPO), "serve", f"SERVE_BIND={bind}", f"SERVE_TOKEN={token_file}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert serve.stdout is not None
        token_line, curl_line = serve.stdout.readline(), serve.stdout.readline()
        token = token_file.read_text(encoding="utf-8").strip()
        assert len(token) >= 32 and token in token_line
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        curl = shlex.split(curl_line.removeprefix("try:").strip())
        assert curl[0] == "curl" and f"Authorization: Bearer {token}" in curl
        url = curl[-1]
        assert url.startswith(f"http://{bind}/")
        body = (REPO / curl[curl.index("--data") + 1].removeprefix("@")).read_bytes()
        headers = {"Content-Type": "application/json"}
        deadline = time.monotonic() + 30
        while True:  # until gunicorn listens, bounded
            try:
                refused = requests.post(url, data=body, headers=headers, timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "make serve did not listen within 30 s"
                assert serve.poll() is None, "make serve exited"
                time.sleep(0.2)
        assert refused.status_code == 401, "without the token the hook refuses (auth stays on)"
        headers["Authorization"] = f"Bearer {token}"
        answered = requests.post(url, data=body, headers=headers, timeout=5)
        assert answered.status_code == 200, answered.text
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=30)
        if serve.stdout is not None:
            serve.stdout.close()
