"""The README and docs say what the tree and the code say, and keep saying it.

Each check reads its truth from the code or the tree, not from a list kept here, so a
module, setting or condition type added on any branch fails a test until the docs have it:

* **Layout**: every Python module outside ``tests/`` (``__init__.py`` aside), every
  top-level entry and every entry directly under ``deploy/`` has a row in a layout table
  (a ``| path | what |`` or ``| file | what |`` table: the README's, and the ones in
  ``testbed/bench/README.md`` and ``deploy/monitoring/README.md`` for their own directory), and
  every path such a table lists exists. A failure prints the missing rows, ready to paste,
  with the module docstring's first line as a start.
* **Settings**: ``docs/deploy.md#settings`` lists exactly the environment variables the hook
  reads: every ``PGFH_*`` name in ``hooks/`` and every name read with ``environ.get``/
  ``env.get`` there (``GUNICORN_*``, ``POD_NAME``, ...); ``HookSettings.from_env`` is run on
  a recording mapping to prove the scan sees what it reads. Any ``PGFH_*`` name a doc
  mentions is one of them.
* **Conditions**: every condition type the code can set (the scan of
  ``tests/test_troubleshooting.py``) is named in the README, in ``docs/deploy.md``'s
  ``status.conditions[]`` row, in troubleshooting's ``Conditions`` bullet and in the CRD's
  description of ``status.conditions``.
* **Printer columns**: the prose that explains ``kubectl get pgc`` names every column of the
  CRD (the sample outputs' headers are checked in ``tests/test_troubleshooting.py``).
* **Citations**: relative links in the Markdown files point at files (and headings) that
  exist in this repository; no file cites a path outside it; no "issue #N" that a reader of
  the repository cannot follow.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

import yaml

from hooks.shell.config import HookSettings
from tests.helpers import heading_anchor
from tests.test_troubleshooting import emitted, printer_columns

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DEPLOY = REPO / "docs" / "deploy.md"


@cache
def tree() -> tuple[str, ...]:
    """Every file of the working tree that git tracks or would track (not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout.decode()
    return tuple(sorted(p for p in out.split("\0") if p and (REPO / p).exists()))


def markdown_files() -> list[Path]:
    return [REPO / p for p in tree() if p.endswith(".md")]


# ------------------------------------------------------------------------------ layout

#: Documents with a layout table, and the directory their paths are relative to.
LAYOUT_TABLES = {
    "README.md": "",
    "testbed/bench/README.md": "testbed/bench/",
    "deploy/monitoring/README.md": "deploy/monitoring/",
}
#: Top-level entries that need no row: the README itself and tool dot-files.
UNLISTED = {"README.md", ".gitignore", ".dockerignore"}
ROW = re.compile(r"^\| (.+?) \| (.*) \|$")


def layout_rows(text: str) -> Iterator[tuple[list[str], str]]:
    """``(paths, what)`` of every row of every ``| path | what |`` table in ``text``."""
    in_table = False
    for line in text.splitlines():
        if re.fullmatch(r"\| (path|file) \| what \|", line.strip()):
            in_table = True
            continue
        if in_table and re.fullmatch(r"\|[-| ]+\|", line.strip()):
            continue
        match = ROW.match(line.strip()) if in_table else None
        if not match:
            in_table = False
            continue
        yield _expand(re.findall(r"`([^`]+)`", match.group(1))), match.group(2).strip()


def _expand(paths: list[str]) -> list[str]:
    """``hooks/shell/config.py``, ``logs.py`` in one cell: a bare name is in the previous one's
    directory (``hooks/shell/logs.py``)."""
    expanded: list[str] = []
    directory = ""
    for path in paths:
        if "/" not in path.rstrip("/") and directory:
            path = directory + path
        elif "/" in path.rstrip("/"):
            directory = path if path.endswith("/") else path.rsplit("/", 1)[0] + "/"
        expanded.append(path)
    return expanded


def listed() -> dict[str, str]:
    """Repo-relative path → the document whose layout table lists it."""
    found: dict[str, str] = {}
    for doc, base in LAYOUT_TABLES.items():
        for paths, _ in layout_rows((REPO / doc).read_text(encoding="utf-8")):
            for path in paths:
                found[base + path] = doc
    return found


def units() -> set[str]:
    """What needs a row: modules, top-level entries, entries directly under deploy/."""
    needed: set[str] = set()
    for path in tree():
        parts = path.split("/")
        top = parts[0] + ("/" if len(parts) > 1 else "")
        if top not in UNLISTED:
            needed.add(top)
        if parts[0] == "deploy" and len(parts) > 1:
            needed.add("/".join(parts[:2]) + ("/" if len(parts) > 2 else ""))
        if path.endswith(".py") and parts[0] != "tests" and parts[-1] != "__init__.py":
            needed.add(path)
    return needed


def covered(unit: str, paths: set[str]) -> bool:
    """A file is covered by its own row; a directory by its own row or a row below it."""
    return unit in paths or (unit.endswith("/") and any(p.startswith(unit) for p in paths))


def first_docstring_line(path: Path) -> str:
    if path.suffix != ".py":
        return "…"
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "…"
    return doc.splitlines()[0].rstrip(".")


def test_every_module_and_directory_has_a_row_in_a_layout_table() -> None:
    paths = set(listed())
    missing = sorted(u for u in units() if not covered(u, paths))
    rows = "\n".join(f"| `{u}` | {first_docstring_line(REPO / u)} |" for u in missing)
    assert missing == [], (
        f"add rows to the README's Layout table (or testbed/bench/README.md):\n{rows}"
    )


def test_every_path_a_layout_table_lists_exists() -> None:
    stale = sorted(
        f"{path} ({doc})"
        for path, doc in listed().items()
        if not (REPO / path).exists() or (path.endswith("/") and not (REPO / path).is_dir())
    )
    assert stale == [], f"layout tables list paths that do not exist: {stale}"


def test_no_path_has_two_rows() -> None:
    """One job per module: after a merge, the old row and the new one are not both kept."""
    seen: list[str] = []
    for doc, base in LAYOUT_TABLES.items():
        for paths, _ in layout_rows((REPO / doc).read_text(encoding="utf-8")):
            seen += [base + path for path in paths]
    twice = sorted({path for path in seen if seen.count(path) > 1})
    assert twice == [], f"listed more than once: {twice}"


def test_every_layout_row_says_what_it_is() -> None:
    for doc in LAYOUT_TABLES:
        for paths, what in layout_rows((REPO / doc).read_text(encoding="utf-8")):
            assert paths, f"{doc}: a layout row without a `path`"
            assert len(what) > 10, f"{doc}: {paths} needs a job, not {what!r}"


def test_the_layout_check_catches_a_new_module_and_a_stale_row() -> None:
    text = "| path | what |\n|---|---|\n| `hooks/a.py` | the a of it all |\n| `gone/` | x |\n\n"
    rows = list(layout_rows(text + "| `not/in/a/table.py` | no |\n"))
    assert rows == [(["hooks/a.py"], "the a of it all"), (["gone/"], "x")]
    shorthand = "| path | what |\n|---|---|\n| `hooks/a.py`, `b.py`, `deploy/x/`, `y.yaml` | z |\n"
    assert list(layout_rows(shorthand)) == [
        (["hooks/a.py", "hooks/b.py", "deploy/x/", "deploy/x/y.yaml"], "z")
    ]
    paths = {p for ps, _ in rows for p in ps}
    assert not covered("hooks/b.py", paths)
    assert covered("hooks/", paths) and not covered("pgfh_plugin/", paths)
    # The real tree: the README covers hooks/sync.py, testbed/bench/README.md covers
    # testbed/bench/load.py.
    assert listed()["hooks/sync.py"] == "README.md"
    assert listed()["testbed/bench/load.py"] == "testbed/bench/README.md"
    assert {
        "hooks/sync.py",
        "pgfh_plugin/cli.py",
        "deploy/base/",
        "testbed/metacontroller/apply.py",
    } <= units()


# ---------------------------------------------------------------------------- settings

NAME = re.compile(r"[A-Z][A-Z0-9_]*[A-Z0-9]")


def _string(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


#: The helpers of ``HookSettings.from_env`` that read one variable named by their first argument.
SETTINGS_READERS = frozenset({"number", "count", "parsed", "_flag", "_path"})


def names_in(source: str) -> set[str]:
    """Environment variables one module reads: ``PGFH_*`` literals, and the name given to
    ``<…environ or env>.get(NAME, …)`` or ``<…environ or env>[NAME]``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        value = _string(node) if isinstance(node, ast.Constant) else None
        if value and value.startswith("PGFH_") and NAME.fullmatch(value):
            found.add(value)
        target: ast.expr | None = None
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "get":
                target, key = node.func.value, node.args[0]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            # The settings loader's own readers: count("GUNICORN_THREADS", …), number(…).
            name = _string(node.args[0])
            if node.func.id in SETTINGS_READERS and name and NAME.fullmatch(name):
                found.add(name)
        elif isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        holder = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        name = _string(key)
        if holder in ("environ", "env") and name and NAME.fullmatch(name):
            found.add(name)
    return found


def read_by_the_hook() -> set[str]:
    """Every environment variable the hook's code reads (the plugin is a separate tool)."""
    names: set[str] = set()
    for path in tree():
        if path.startswith("hooks/") and path.endswith(".py"):
            names |= names_in((REPO / path).read_text(encoding="utf-8"))
    return names


class Recording(Mapping[str, str]):
    """An empty environment that remembers every name asked for."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        raise KeyError(key)

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(key)
        return default

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def settings_section() -> str:
    text = DEPLOY.read_text(encoding="utf-8")
    match = re.search(r"^## Settings\n(.*?)(?=^## )", text, flags=re.MULTILINE | re.DOTALL)
    assert match, "docs/deploy.md has a '## Settings' section"
    return match.group(1)


def documented_settings() -> dict[str, tuple[str, str]]:
    """``| `NAME` | default | meaning |`` rows of docs/deploy.md#settings."""
    rows: dict[str, tuple[str, str]] = {}
    for line in settings_section().splitlines():
        match = re.match(r"^\| `([A-Z][A-Z0-9_]+)` \| (.*?) \| (.*) \|$", line)
        if match:
            rows[match.group(1)] = (match.group(2).strip(), match.group(3).strip())
    return rows


def test_the_settings_list_has_every_variable_the_hook_reads() -> None:
    missing = sorted(read_by_the_hook() - set(documented_settings()))
    assert missing == [], f"add rows to docs/deploy.md#settings for: {missing}"


def test_the_settings_list_has_nothing_the_hook_does_not_read() -> None:
    stale = sorted(set(documented_settings()) - read_by_the_hook())
    assert stale == [], f"docs/deploy.md#settings lists what the hook never reads: {stale}"


def test_every_setting_has_a_default_and_a_meaning() -> None:
    for name, (default, meaning) in documented_settings().items():
        assert default, f"{name}: say the default (or 'unset')"
        assert len(meaning) > 15, f"{name}: say what it does"


def test_the_scan_sees_every_name_the_settings_loader_asks_for() -> None:
    env = Recording()
    HookSettings.from_env(env)
    assert len(env.asked) >= 20
    assert env.asked - read_by_the_hook() == set()


def test_the_settings_scan_finds_literals_and_environment_reads() -> None:
    source = """
import os
a = os.environ.get("GUNICORN_X", "1")
b = number("PGFH_Y", 2)
c = env["POD_X"]
d = request.environ.get("gunicorn.socket")
e = "PGFH_Z is not a name"
f = settings.get("NOT_ENV")
"""
    assert names_in(source) == {"GUNICORN_X", "PGFH_Y", "POD_X"}


def test_docs_mention_only_settings_that_exist() -> None:
    known = read_by_the_hook()
    # Test knobs: PGFH_FUZZ_SCALE in tests/, PGFH_CACHE_DIR in testbed/kubernetes/ (test
    # infrastructure).
    for path in tree():
        if path.startswith(("tests/", "testbed/kubernetes/")) and path.endswith(".py"):
            known |= names_in((REPO / path).read_text(encoding="utf-8"))
            known |= set(re.findall(r"PGFH_[A-Z0-9_]*[A-Z0-9]", (REPO / path).read_text()))
    for doc in markdown_files():
        for name in set(re.findall(r"\bPGFH_[A-Z0-9_]*[A-Z0-9]\b", doc.read_text())):
            assert name in known, f"{doc.relative_to(REPO)} mentions {name}, nothing reads it"


def test_the_readme_points_at_the_one_complete_list() -> None:
    assert "docs/deploy.md#settings" in README.read_text(encoding="utf-8")


# -------------------------------------------------------------------------- conditions


def condition_types() -> set[str]:
    _, types = emitted()
    assert {"Ready", "PrimaryRouted", "SpecValid", "ReplicasRouted"} <= types
    return types


def _named(types: set[str], text: str) -> list[str]:
    return sorted(t for t in types if not re.search(rf"\b{t}\b", text))


def readme_conditions() -> str:
    """The README's list of conditions: from 'Conditions (' to the end of its bullets."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^Conditions \(.*?(?=\n\n(?!- ))", text, flags=re.MULTILINE | re.DOTALL)
    assert match, "the README has a paragraph starting 'Conditions (' listing the types"
    return match.group(0)


def test_the_readme_names_every_condition_type() -> None:
    missing = _named(condition_types(), readme_conditions())
    assert missing == [], f"the README's condition list lacks {missing}"


def test_the_status_reference_names_every_condition_type() -> None:
    row = next(
        line
        for line in DEPLOY.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `status.conditions[]`")
    )
    assert _named(condition_types(), row) == []


def test_troubleshooting_names_every_condition_type_under_status() -> None:
    text = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    bullet = re.search(r"^- `Conditions`:.*?(?=^- |\n\n)", text, flags=re.MULTILINE | re.DOTALL)
    assert bullet
    assert _named(condition_types(), bullet.group(0)) == []


def test_the_crd_describes_every_condition_type() -> None:
    crd = yaml.safe_load((REPO / "metacontroller" / "crd.yaml").read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    description = status["properties"]["conditions"]["description"]
    assert _named(condition_types(), description) == []


# ------------------------------------------------------------------------ printer columns


def test_the_column_explanations_name_every_printer_column() -> None:
    text = DEPLOY.read_text(encoding="utf-8")
    match = re.search(r"^`kubectl get pgc` shows the columns.*?(?=\n\n|\Z)", text, re.M | re.S)
    assert match
    missing = [c for c in printer_columns(wide=True)[1:] if f"`{c}`" not in match.group(0)]
    assert missing == [], f"docs/deploy.md's column list lacks {missing}"


# ------------------------------------------------------------------------------ citations

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


@cache
def anchors(path: Path) -> frozenset[str]:
    found: set[str] = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"^#{1,6} (.+)$", line)):
            base = heading_anchor(match.group(1))
            name, n = base, 1
            while name in found:
                name, n = f"{base}-{n}", n + 1
            found.add(name)
    return frozenset(found)


def test_relative_links_in_the_docs_resolve_inside_the_repository() -> None:
    broken: list[str] = []
    for doc in markdown_files():
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            where = f"{doc.relative_to(REPO)} → {target}"
            if not path.is_relative_to(REPO) or not path.exists():
                broken.append(where)
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{where} (no such heading)")
    assert broken == []


#: A path outside the repository: a sibling notes tree, or this machine's work directories.
OUTSIDE = re.compile("|".join([r"\.\./shared/", r"\.\./\.\./notes/", "/wo" + r"rk/"]))


def test_nothing_cites_a_file_outside_the_repository() -> None:
    found = []
    for path in tree():
        if not path.endswith((".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt")):
            continue
        for number, line in enumerate((REPO / path).read_text(errors="replace").splitlines()):
            if OUTSIDE.search(line):
                found.append(f"{path}:{number + 1}: {line.strip()}")
    assert found == []


#: "issue #5", "Issue 11c", "issues 10 and 11": this project's tracker, which a reader of the
#: repository cannot follow. Upstream references (``metacontroller#238``) name their project.
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


#: Where a reader meets text: every Markdown file, and the product's code and manifests.
READ_BY_USERS = (
    "hooks/",
    "testbed/bench/",
    "deploy/",
    "metacontroller/",
    "testbed/metacontroller/",
    "ops/",
)


def test_no_reference_to_an_issue_number() -> None:
    found = [
        f"{path}: {match.group(0)}"
        for path in tree()
        if path.endswith(".md")
        or (path.startswith(READ_BY_USERS) and path.endswith((".py", ".yaml", ".sh")))
        for match in ISSUE.finditer((REPO / path).read_text(errors="replace"))
    ]
    assert found == [], f"say what the issue was about, not its number: {found}"


def test_every_reason_the_readme_names_exists() -> None:
    reasons, types = emitted()
    words = set(re.findall(r"`([A-Z][a-z][A-Za-z]*)`", readme_conditions()))
    stale = sorted(words - set(reasons) - types - {"True", "False", "Unknown"})
    assert stale == [], f"the README names reasons the code does not set: {stale}"
