"""The chart's templates: one file per object of any variant, deploy/'s rendering as YAML with
the fields of :data:`~ops.chart.variants.FIELDS` turned into template expressions, and an
``if``/``else`` over the variants where an overlay changes, adds or deletes the object."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import yaml

from ops.chart.variants import (
    BASE,
    FIELDS,
    GENERATED,
    OVERLAYS,
    VARIANTS,
    Field,
    Key,
    Obj,
    field_holders,
    key_of,
    render,
)

KEEP_ANNOTATION = {"helm.sh/resource-policy": "keep"}
CRD_KEY = "CustomResourceDefinition"


def _template_of(obj: Obj, tokens: dict[str, Field]) -> str:
    """``obj`` as YAML with the fields of :data:`FIELDS` turned into template expressions."""
    obj = copy.deepcopy(obj)
    originals: dict[str, object] = {}
    for field in FIELDS:
        if obj["kind"] != field.kind or obj["metadata"]["name"] != field.name:
            continue
        holders = field_holders(obj, field.path)
        if not holders:
            raise SystemExit(f"{field.kind}/{field.name} has no {'.'.join(field.path)}")
        step = field.path[-1]
        for holder in holders:
            if field.how.startswith("optional") and step in holder:
                raise SystemExit(f"{field.kind}/{field.name}: {step} is in deploy/ already")
            if field.how == "unless" and not isinstance(holder.get(step), int | str):
                raise SystemExit(f"{field.kind}/{field.name}: {step} is not a scalar in deploy/")
            token = f"__pgfh_field_{len(tokens)}__"
            tokens[token] = field
            originals[token] = holder.get(step)
            holder[step] = token
    text = yaml.safe_dump(obj, sort_keys=False, width=1000, default_flow_style=False)
    if "{{" in text or "}}" in text:
        raise SystemExit(f"{obj['kind']}/{obj['metadata']['name']} contains template braces")
    for token, field in tokens.items():
        replace = _replacer(field, originals[token])
        text = re.sub(rf"^( *)(\S+): {token}$", replace, text, flags=re.MULTILINE)
    if "__pgfh_field_" in text:
        raise SystemExit(f"a field of {obj['kind']}/{obj['metadata']['name']} was not replaced")
    return text


def _replacer(field: Field, original: object) -> Callable[[re.Match[str]], str]:
    return lambda match: _expression(match.group(1), match.group(2), field, original)


def _expression(indent: str, key: str, field: Field, original: object = None) -> str:
    inner = len(indent) + 2
    if field.how == "scalar":
        return f"{indent}{key}: {field.expression}"
    if field.how == "unless":  # deploy/'s value, dropped while the value is true
        return (
            f"{indent}{{{{- if not {field.expression} }}}}\n"
            f"{indent}{key}: {original}\n{indent}{{{{- end }}}}"
        )
    if field.how == "block":
        return f"{indent}{key}:\n{indent}  {{{{- toYaml {field.expression} | nindent {inner} }}}}"
    if field.how == "optional-scalar":
        return (
            f"{indent}{{{{- with {field.expression} }}}}\n"
            f"{indent}{key}: {{{{ . | quote }}}}\n{indent}{{{{- end }}}}"
        )
    return (
        f"{indent}{{{{- with {field.expression} }}}}\n"
        f"{indent}{key}:\n{indent}  {{{{- toYaml . | nindent {inner} }}}}\n"
        f"{indent}{{{{- end }}}}"
    )


def _with_keep(obj: Obj) -> str:
    """The CRD's template: deploy/'s, plus the keep annotation while ``crd.keep``."""
    text = _template_of(obj, {})
    meta = "metadata:\n"
    if "  annotations:\n" in text.split("spec:\n", 1)[0]:
        raise SystemExit("the CRD has annotations in deploy/: merge the keep annotation into them")
    keep = (
        "metadata:\n  {{- if .Values.crd.keep }}\n  annotations:\n"
        "    helm.sh/resource-policy: keep\n  {{- end }}\n"
    )
    return text.replace(meta, keep, 1)


def object_templates(kubectl: str) -> dict[str, str]:
    """File name under templates/ → its text, one file per object of any variant."""
    renders = {variant.name: render(variant.target, kubectl) for variant in VARIANTS}
    by_variant = {name: {key_of(o): o for o in objs} for name, objs in renders.items()}
    order: list[Key] = []
    for variant in VARIANTS:
        order += [key_of(o) for o in renders[variant.name] if key_of(o) not in order]
    files: dict[str, str] = {}
    for index, key in enumerate(order, start=1):
        base = by_variant[BASE.name].get(key)
        branches: list[tuple[str, Obj | None]] = []
        for overlay in OVERLAYS:
            mine = by_variant[overlay.name].get(key)
            if mine != base:
                branches.append((overlay.condition, mine))
        files[f"{index:02d}-{key[1].lower()}-{key[3]}.yaml"] = _object_file(key, base, branches)
    return files


def _body(key: Key, obj: Obj | None) -> str:
    if obj is None:
        return ""
    if key[1] == CRD_KEY:
        return _with_keep(obj)
    return _template_of(obj, {})


def _object_file(key: Key, base: Obj | None, branches: list[tuple[str, Obj | None]]) -> str:
    head = f"# {GENERATED}\n# {key[1]} {key[3]}"
    if base is not None and base["kind"] == "Namespace":
        head += " (only while .Values.createNamespace)"
    lines = [head + "\n"]
    if not branches:
        body = _body(key, base)
        if base is not None and base["kind"] == "Namespace":
            return lines[0] + "{{- if .Values.createNamespace }}\n" + body + "{{- end }}\n"
        return lines[0] + body
    out = lines[0]
    for position, (condition, obj) in enumerate(branches):
        out += f"{{{{- {'if' if position == 0 else 'else if'} {condition} }}}}\n"
        out += _body(key, obj)
    if base is not None:
        out += "{{- else }}\n" + _body(key, base)
    return out + "{{- end }}\n"
