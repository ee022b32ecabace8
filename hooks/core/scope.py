"""Whether the calling Metacontroller install serves a parent: the shard-aware customize.

An install enqueues a related parent only if its ``parentResource.labelSelector`` selects
the parent or the parent carries the install's finalizer (``enqueueParentObject``,
``pkg/controller/composite/controller.go`` 385-392, v4.17.2). For any other parent its
customize answer is never used to sync, yet ``findRelatedParents`` matches every rule of
it against every Pod and Service event of the cluster. Answering no rules for those
parents leaves a cache lookup per parent per event (``manager.go`` 363-367 then an empty
rule loop). Anything in doubt (no controller in the request, an operator we do not know)
counts as served: full rules are always correct, only dearer.
"""

from __future__ import annotations

from collections.abc import Mapping

from hooks.domain.scope import CustomizeScope, ParentSelector, Requirement

#: Metacontroller's finalizer on every parent a CompositeController syncs.
FINALIZER_PREFIX = "metacontroller.io/compositecontroller-"


def serves(scope: CustomizeScope | None) -> bool:
    """True unless the install calling customize will never sync this parent."""
    if scope is None or scope.selector is None:
        return True
    if FINALIZER_PREFIX + scope.controller in scope.finalizers:
        return True
    return selects(scope.selector, scope.labels)


def selects(selector: ParentSelector, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelectorAsSelector(selector).Matches(labels)``; an empty selector
    selects everything, as there. An unknown operator selects (doubt: serve)."""
    if any(labels.get(key) != value for key, value in selector.match_labels):
        return False
    return all(_requirement(r, labels) for r in selector.expressions)


def _requirement(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    key, values = requirement.key, requirement.values
    match requirement.operator:
        case "In":
            return key in labels and labels[key] in values
        case "NotIn":
            return key not in labels or labels[key] not in values
        case "Exists":
            return key in labels
        case "DoesNotExist":
            return key not in labels
    return True  # not one of OPERATORS (the loader refuses those): in doubt, serve
