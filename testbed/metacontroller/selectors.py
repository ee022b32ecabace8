"""Kubernetes label selectors as Metacontroller evaluates them, on plain dicts.

Pure: ``metav1.LabelSelector`` (``matchLabels`` and ``matchExpressions`` with ``In``,
``NotIn``, ``Exists``, ``DoesNotExist``), the selector of a customize rule and of
``generateSelector``'s ``controller-uid=<parent uid>``. As in ``metav1.LabelSelectorAsSelector``
a missing or empty selector selects everything (``determineSelectionType`` in
``pkg/controller/common/customize/manager.go`` relies on that for a rule without one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """Whether ``labels`` satisfy ``selector`` (``None`` or ``{}`` selects everything)."""
    labels = labels or {}
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key = expression.get("key")
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown label selector operator {operator!r}")
    return True
