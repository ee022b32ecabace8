"""Colour for the plugin's text output: when to use it, and the few ANSI codes it uses (pure).

Colour only helps on a terminal; piped into a file or another program the codes are noise.
``use_colour`` decides once per stream, and ``Style`` paints (or, without colour, returns the
text unchanged), so the renderers never test for a terminal themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO


def use_colour(mode: str, stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Colour on a terminal, plain when piped; ``NO_COLOR`` (non-empty) and ``TERM=dumb`` too.

    ``--color always`` / ``never`` override all of that (https://no-color.org: a command-line
    flag may override the variable).
    """
    if mode == "always":
        return True
    if mode == "never":
        return False
    if environ.get("NO_COLOR") or environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@dataclass(frozen=True)
class Style:
    """ANSI colour, or none at all (piped output, ``NO_COLOR``, ``--color never``)."""

    colour: bool

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour and text else text

    def good(self, text: str) -> str:
        return self._wrap("32", text)

    def bad(self, text: str) -> str:
        return self._wrap("31", text)

    def warn(self, text: str) -> str:
        return self._wrap("33", text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def condition(self, status: str, text: str) -> str:
        """Green for ``True``, red for ``False``, yellow for ``Unknown`` or anything else."""
        if status == "True":
            return self.good(text)
        if status == "False":
            return self.bad(text)
        return self.warn(text)


def plain(text: str) -> str:
    """The painter that leaves a cell as it is (a table column with no colour)."""
    return text
