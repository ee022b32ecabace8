"""The one bounded JSON parser of the hook: every JSON text it reads goes through it.

:func:`bounded_loads` refuses a text larger than its size limit or nesting deeper than its
depth limit *before* the parser sees it, and turns every parser error into
:class:`JsonRefused` with a message. Four kinds of text go through it: the request body
(:mod:`hooks.shell.app`, ``PGFH_MAX_JSON_DEPTH``), a Pod's Patroni ``status`` annotation
and a child's last-applied record (:mod:`hooks.loaders.observed`: JSON inside strings of
the request, which the body's own depth check cannot see), and a member's Patroni answer
(:mod:`hooks.probe.answer`). Without the limit, 5,000 nested brackets in an
annotation raised ``RecursionError`` and every sync of that cluster answered 500.

Pure: text in, a value or a message out.
"""

from __future__ import annotations

import json

#: Deepest nesting accepted by default. Real requests nest about 15 levels (managedFields
#: inside related Pods); Patroni's answer and its member JSON about 3; a last-applied
#: record about 12 (a CronJob's Pod template). Anything far deeper is hostile.
MAX_JSON_DEPTH = 64


class JsonRefused(ValueError):
    """A JSON text the hook does not parse; the message completes "<what> …"."""


def bounded_loads(text: str | bytes, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> object:
    """``text`` parsed as strict JSON (no NaN/Infinity), within both limits, or
    :class:`JsonRefused` saying why ("is larger than …", "nests deeper than …", "is not
    valid JSON: …", "is not UTF-8"). Never ``RecursionError``: depth is refused by an
    explicit rule (:func:`nesting_problem`), linear in the size, before parsing."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if len(raw) > max_bytes:
        raise JsonRefused(f"is larger than {max_bytes} bytes")
    problem = nesting_problem(raw, max_depth)
    if problem is not None:
        raise JsonRefused(problem)
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:  # not reachable after the depth check; kept as a last resort
        raise JsonRefused("nests too deeply") from None
    except UnicodeDecodeError:
        raise JsonRefused("is not UTF-8") from None
    except ValueError as error:
        raise JsonRefused(f"is not valid JSON: {error}") from None


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


#: Every byte but the four structural brackets and the quote, for ``bytes.translate``.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')


def nesting_problem(raw: bytes, limit: int) -> str | None:
    """Why ``raw`` must not reach the JSON parser (it "nests deeper than …"), or ``None``.

    The check runs *before* parsing so that depth is refused by an explicit rule, not by
    the parser's recursion limit (``RecursionError`` depends on the thread's stack and on
    the interpreter, and a parser that recurses 100 000 levels first has already spent
    the work). It is linear and runs at C speed: strings are cut out, everything but the
    brackets is dropped, then each pass removes one level of innermost ``[]``/``{}``
    pairs; ``limit`` passes at most. Brackets that never pair up cannot be JSON.
    """
    skeleton = bracket_skeleton(raw)
    for _ in range(limit):
        if not skeleton:
            return None
        # One level per pass: a pair is first replaced by a marker, so removing "[]"
        # cannot make a new "{}" pair appear within the same pass.
        reduced = skeleton.replace(b"[]", b"\0").replace(b"{}", b"\0").replace(b"\0", b"")
        if reduced == skeleton:
            return "is not valid JSON: its brackets do not balance"
        skeleton = reduced
    if skeleton:
        return f"nests deeper than {limit} levels"
    return None


def bracket_skeleton(raw: bytes) -> bytes:
    """The brackets of JSON text outside its strings, in order (exact for valid JSON).

    Only ``bytes`` methods, each a C loop (a regular expression over every string of a
    26 KB request cost more than parsing the request): escaped backslashes go first, then
    escaped quotes, so every quote left opens or closes a string; everything but quotes
    and brackets is dropped; two adjacent quotes enclose or separate nothing and go
    (most strings hold no bracket); of what is left, every other piece between quotes
    is outside the strings. UTF-8 never has a quote or a backslash byte inside a
    multi-byte character.
    """
    # Any replacement the translate below drops would do as well as b"" (so: no mutants).
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # pragma: no mutate
    structure = unescaped.translate(None, _NOT_STRUCTURE)
    # Dropping "" first is only faster: the split below gives the same skeleton without it.
    skeleton = structure.replace(b'""', b"")  # pragma: no mutate
    if b'"' in skeleton:
        skeleton = b"".join(skeleton.split(b'"')[::2])
    return skeleton
