"""User text that reaches a terminal: names in contracts hold no control characters, and
every message shows the ones it quotes as escapes, so that a file or an argument can never
change a window's title, colour the terminal or hide part of a line."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character (ESC, BEL, newline, ...) written as its escape."""
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


def _without_control(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError(f"'{printable(value)}' holds control characters; use printable text")
    return value


# A name a contract holds and the CLI prints (a cluster's, a strategy's, a platform's).
Name = Annotated[str, AfterValidator(_without_control)]
