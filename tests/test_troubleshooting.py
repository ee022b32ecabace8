"""docs/troubleshooting.md documents every condition reason and type the code can emit,
and the sample ``kubectl get pgc`` outputs match the CRD's printer columns.

The reasons are read out of ``hooks/`` (not from a list kept here), so a reason added on
any branch — a new enum member, a new condition built with a literal reason — fails this
test until the troubleshooting table has a row for it:

* every member value of an ``Enum`` class named ``Decision`` or ``*Reason``;
* the reason of every condition the code builds: a 4-tuple
  ``(<…CONDITION…>, status, reason, message)``, a ``Condition(…)`` call (third positional
  argument or ``reason=``), or a dict literal with ``"type"`` and ``"reason"`` keys, when
  the reason is a string literal (an enum attribute is covered by its enum);

and every condition type: a module-level ``…CONDITION… = "<Type>"`` constant.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "troubleshooting.md"


def _is_condition_name(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and "CONDITION" in name.upper()


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def enum_reasons(tree: ast.Module) -> set[str]:
    """The values of every ``Decision`` or ``*Reason`` enum defined in one module."""
    reasons: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (
            node.name == "Decision" or node.name.endswith("Reason")
        ):
            bases = {
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            }
            if bases & {"Enum", "StrEnum"}:
                for statement in node.body:
                    if isinstance(statement, ast.Assign) and _literal(statement.value):
                        reasons.add(str(_literal(statement.value)))
    return reasons


def scan(source: str) -> tuple[set[str], set[str]]:
    """``(reasons, condition types)`` that one module's source can emit."""
    tree = ast.parse(source)
    reasons = enum_reasons(tree)
    types: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and len(node.elts) == 4:
            if _is_condition_name(node.elts[0]) and (reason := _literal(node.elts[2])):
                reasons.add(reason)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "Condition":
                found = _literal(node.args[2]) if len(node.args) > 2 else None
                for keyword in node.keywords:
                    if keyword.arg == "reason":
                        found = _literal(keyword.value) or found
                if found:
                    reasons.add(found)
        elif isinstance(node, ast.Dict):
            keys = [_literal(k) if k is not None else None for k in node.keys]
            if "type" in keys and "reason" in keys:
                value = _literal(node.values[keys.index("reason")])
                if value:
                    reasons.add(value)
    reasons |= _passed_as_reason(tree)
    for statement in tree.body:
        targets = (
            statement.targets
            if isinstance(statement, ast.Assign)
            else [statement.target]
            if isinstance(statement, ast.AnnAssign)
            else []
        )
        value = getattr(statement, "value", None)
        for target in targets:
            if isinstance(target, ast.Name) and _is_condition_name(target) and _literal(value):
                types.add(str(_literal(value)))
    return reasons, types


#: Kubernetes condition reasons are UpperCamelCase (API conventions); other "reason"
#: strings in hooks/ (auth refusals like ``no_token``, a member's "connection refused")
#: are not, so the by-parameter rule below does not pick them up.
CAMEL_CASE = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*")


def _passed_as_reason(tree: ast.Module) -> set[str]:
    """UpperCamelCase literals passed, in this module, as the ``reason`` of a function or a
    dataclass that has one (``_polled("NoRoleLabel", …)``, ``Verdict(kind, "X", …)``)."""
    slots: dict[str, int | None] = {}  # callable name -> positional index of "reason"
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
            if "reason" in names or any(a.arg == "reason" for a in node.args.kwonlyargs):
                slots[node.name] = names.index("reason") if "reason" in names else None
        elif isinstance(node, ast.ClassDef):
            fields = [
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
            if "reason" in fields:
                slots[node.name] = fields.index("reason")
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name not in slots:
            continue
        index = slots[name]
        candidates = [node.args[index]] if index is not None and len(node.args) > index else []
        candidates += [k.value for k in node.keywords if k.arg == "reason"]
        for candidate in candidates:
            value = _literal(candidate)
            if value and CAMEL_CASE.fullmatch(value):
                found.add(value)
    return found


def emitted() -> tuple[dict[str, str], set[str]]:
    """Every reason (with the file that emits it) and condition type in ``hooks/``."""
    reasons: dict[str, str] = {}
    types: set[str] = set()
    for path in sorted((REPO / "hooks").rglob("*.py")):
        found, kinds = scan(path.read_text(encoding="utf-8"))
        for reason in found:
            reasons.setdefault(reason, str(path.relative_to(REPO)))
        types |= kinds
    return reasons, types


def documented_reasons(text: str) -> set[str]:
    """Reasons that have a row of their own in a table: ``| `Reason` | …``."""
    return set(re.findall(r"^\| `([A-Za-z]+)` \|", text, flags=re.MULTILINE))


def documented_types(text: str) -> set[str]:
    """Condition types with a heading: ``### `Type` …`` (several may share one)."""
    headings = re.findall(r"^### (.+)$", text, flags=re.MULTILINE)
    return {t for heading in headings for t in re.findall(r"`([A-Za-z]+)`", heading)}


def test_every_reason_the_code_can_emit_has_a_row() -> None:
    reasons, _ = emitted()
    text = DOC.read_text(encoding="utf-8")
    missing = sorted(
        f"{r} ({where})" for r, where in reasons.items() if r not in documented_reasons(text)
    )
    assert missing == [], f"add a row to docs/troubleshooting.md for: {missing}"


def test_no_row_for_a_reason_the_code_no_longer_emits() -> None:
    reasons, _ = emitted()
    stale = sorted(documented_reasons(DOC.read_text(encoding="utf-8")) - set(reasons))
    assert stale == [], f"docs/troubleshooting.md documents reasons nothing emits: {stale}"


def test_every_condition_type_has_a_section() -> None:
    _, types = emitted()
    missing = sorted(types - documented_types(DOC.read_text(encoding="utf-8")))
    assert missing == [], f"add a section to docs/troubleshooting.md for: {missing}"


def test_the_scan_finds_what_the_code_emits() -> None:
    """The scanner is not vacuous: it finds reasons of every kind of source in hooks/."""
    reasons, types = emitted()
    assert {"Ready", "PrimaryRouted", "SpecValid"} <= types
    assert len(types) >= 5 and len(reasons) >= 20
    # The enums of the routing decision, the hook's own conditions, each part and the
    # switchover detection (literals are found too: see the test below).
    assert {Path(where).name for where in reasons.values()} >= {
        "routing.py",
        "conditions.py",
        "readonly.py",
        "backup.py",
        "switchover.py",
    }


def test_every_reason_is_a_member_of_a_reason_enum() -> None:
    """No bare-string reasons: each one the code can emit is a ``*Reason``/``Decision`` member,
    so a condition's reasons are listed in one place (the enum a part declares)."""
    for path in sorted((REPO / "hooks").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        reasons, _ = scan(source)
        bare = reasons - enum_reasons(ast.parse(source))
        assert bare == set(), f"{path.relative_to(REPO)}: use a *Reason enum for {sorted(bare)}"


def test_the_scan_and_the_check_catch_a_new_reason() -> None:
    source = """
import enum
CONDITION_X = "Frobbed"
class FrobReason(enum.Enum):
    OK = "FrobOk"
class Other(enum.Enum):
    NOT_A_REASON = "Whatever"
def plan():
    a = (CONDITION_X, "False", "FrobLiteral", "message")
    b = Condition("Frobbed", "True", "FrobCall", "m")
    c = Condition(type="Frobbed", status="True", reason="FrobKeyword", message="m")
    d = {"type": "Frobbed", "status": "True", "reason": "FrobDict"}
    e = ("x", "y", "NotACondition", "z")
    f = _polled("FrobPolled", "why")
    g = Verdict(False, 401, "not_camel_case")
def _polled(reason, why):
    return 1
@dataclass
class Verdict:
    ok: bool
    status: int
    reason: str
"""
    reasons, types = scan(source)
    assert reasons == {"FrobOk", "FrobLiteral", "FrobCall", "FrobKeyword", "FrobDict", "FrobPolled"}
    assert types == {"Frobbed"}
    text = "### `Frobbed`\n\n| reason |\n|---|\n| `FrobOk` | x |\n"
    assert reasons - documented_reasons(text) == {
        "FrobLiteral",
        "FrobCall",
        "FrobKeyword",
        "FrobDict",
        "FrobPolled",
    }
    assert documented_types(text) == {"Frobbed"}


# ------------------------------------------------------------ `kubectl get pgc` samples


def printer_columns(wide: bool = False) -> list[str]:
    crd = yaml.safe_load((REPO / "metacontroller" / "crd.yaml").read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    columns = version["additionalPrinterColumns"]
    return ["NAME"] + [c["name"].upper() for c in columns if wide or not c.get("priority", 0)]


def test_sample_kubectl_get_pgc_outputs_have_the_crds_columns() -> None:
    expected = printer_columns()
    samples = 0
    for doc in (REPO / "README.md", REPO / "docs" / "deploy.md"):
        lines = doc.read_text(encoding="utf-8").splitlines()
        for line in lines:
            if line.startswith("NAME ") and "PRIMARY" in line:
                samples += 1
                assert re.split(r"\s{2,}", line.strip()) == expected, f"{doc.name}: {line}"
    assert samples >= 2
