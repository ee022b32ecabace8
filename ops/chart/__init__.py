"""Write the Helm chart ``charts/pg-failover-hook/`` from ``deploy/``, so the two cannot drift.

    python -m ops.chart            # rewrite the chart from deploy/ (after any change there)
    python -m ops.chart --check    # exit 1 if the chart on disk is not what deploy/ makes

Why generated and not written by hand: ``deploy/`` (kustomize) is what the tests apply to the
real API server and what the docs describe; a hand-kept second copy in Helm templates would
drift from it at the first patch. So every object of the chart is an object that
``kubectl kustomize`` renders from ``deploy/`` or one of its overlays, written out as YAML, with
a few documented fields replaced by values (:data:`FIELDS`) whose defaults are the rendered
ones. Each overlay is one values choice (:data:`VARIANTS`): an object that an overlay changes,
adds or deletes becomes an ``if``/``else`` over the variants' renderings. The chart's defaults
therefore render exactly what ``kubectl kustomize deploy/`` renders, and each overlay's values
render exactly that overlay (tests/test_chart.py proves both on parsed objects; ``--check``
fails when deploy/ changed and the chart was not regenerated).

The one deliberate difference: the CRD carries ``helm.sh/resource-policy: keep`` (value
``crd.keep``, on by default), so that ``helm uninstall`` does not delete the CRD and with it
every PostgreSQLCluster (and, through their owner references, the Services clients use).

Overlays are exclusive, as in deploy/ (there is no kustomization that combines two of them):
the chart refuses two at once with a clear message.

The parts, each a module: the variants and the fields values set (:mod:`ops.chart.variants`),
the templates (:mod:`ops.chart.templates`), the values, values.yaml and its schema
(:mod:`ops.chart.values`), every file of the chart and its check (:mod:`ops.chart.files`), and
the command line (:mod:`ops.chart.cli`). Their public names are importable from here.
"""

from __future__ import annotations

from ops.chart.cli import main
from ops.chart.files import VALIDATE, app_version, chart_files, chart_yaml, differences, write
from ops.chart.templates import CRD_KEY, KEEP_ANNOTATION, object_templates
from ops.chart.values import defaults, hook_default, schema, values_yaml
from ops.chart.variants import (
    BASE,
    CHART,
    CHART_VERSION,
    FIELDS,
    GENERATED,
    OVERLAYS,
    REPO,
    VARIANTS,
    Field,
    Key,
    Obj,
    Variant,
    field_holders,
    key_of,
    render,
)

__all__ = [
    "BASE",
    "CHART",
    "CHART_VERSION",
    "CRD_KEY",
    "FIELDS",
    "GENERATED",
    "KEEP_ANNOTATION",
    "OVERLAYS",
    "REPO",
    "VALIDATE",
    "VARIANTS",
    "Field",
    "Key",
    "Obj",
    "Variant",
    "app_version",
    "chart_files",
    "chart_yaml",
    "defaults",
    "differences",
    "field_holders",
    "hook_default",
    "key_of",
    "main",
    "object_templates",
    "render",
    "schema",
    "values_yaml",
    "write",
]
