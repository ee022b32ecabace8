"""The JSON depth guard of request bodies, run by the HTTP shell (:mod:`hooks.shell.app`).

A body that nests deeper than ``PGFH_MAX_JSON_DEPTH`` is refused before the parser sees
it; then :mod:`hooks.loaders.envelope` checks what the parsed body holds.

Pure: bytes in, a message out.
"""

from __future__ import annotations

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
