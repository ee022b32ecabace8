"""Every file of the chart (Chart.yaml, values, templates, the checks of values against each
other), and writing them or finding how the chart on disk differs from them."""

from __future__ import annotations

import difflib
import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from ops.chart.templates import object_templates
from ops.chart.values import defaults, schema, values_yaml
from ops.chart.variants import CHART_VERSION, GENERATED, REPO

#: Checks a schema cannot say (a relation between two values), with messages that name them.
VALIDATE = Path(__file__).resolve().parents[1] / "chart_validate.tpl"


def chart_yaml(app_version: str) -> str:
    return f"""# {GENERATED}
apiVersion: v2
name: pg-failover-hook
description: >-
  pg-failover-hook, a Metacontroller lambda controller that keeps each PostgreSQLCluster's
  Service on the Patroni leader: the CRD, the CompositeController and the hook (the same
  objects as deploy/). Needs Metacontroller installed first.
type: application
version: {CHART_VERSION}
appVersion: {json.dumps(app_version)}
kubeVersion: ">=1.30.0-0"
home: https://github.com/adg-io/pg-failover-hook
sources:
  - https://github.com/adg-io/pg-failover-hook
keywords: [postgresql, patroni, metacontroller, failover]
"""


def app_version() -> str:
    match = re.search(r'^version = "(.*)"', (REPO / "pyproject.toml").read_text(), re.M)
    if match is None:
        raise SystemExit("pyproject.toml has no version")
    return match.group(1)


def chart_files(kubectl: str) -> dict[str, str]:
    """Every file of the chart, relative path → text."""
    files = {
        "Chart.yaml": chart_yaml(app_version()),
        "values.yaml": values_yaml(defaults(kubectl)),
        "values.schema.json": json.dumps(schema(), indent=2) + "\n",
        ".helmignore": f"# {GENERATED}\n*.orig\n*.rej\n*~\n",
        "templates/00-validate.yaml": VALIDATE.read_text(encoding="utf-8"),
    }
    for name, text in object_templates(kubectl).items():
        files[f"templates/{name}"] = text
    return files


def write(files: Mapping[str, str], chart: Path) -> None:
    shutil.rmtree(chart, ignore_errors=True)
    for name, text in files.items():
        path = chart / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def differences(files: Mapping[str, str], chart: Path) -> list[str]:
    """What differs between ``files`` and the chart on disk (empty: identical)."""
    on_disk = {
        str(p.relative_to(chart)): p.read_text(encoding="utf-8")
        for p in sorted(chart.rglob("*"))
        if p.is_file()
    }
    out: list[str] = []
    for name in sorted(set(files) | set(on_disk)):
        if name not in on_disk:
            out.append(f"missing: {name}")
        elif name not in files:
            out.append(f"not generated (stale): {name}")
        elif files[name] != on_disk[name]:
            diff = difflib.unified_diff(
                on_disk[name].splitlines(), files[name].splitlines(), name, "generated", lineterm=""
            )
            out.append("\n".join(list(diff)[:40]))
    return out
