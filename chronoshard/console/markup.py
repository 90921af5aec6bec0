"""HTML built from strings without ever trusting one: every value is escaped on the way
in unless it is already :class:`Html`.

The console renders on the server, from data that tenants control (payloads, results,
error messages, task types, schedule names). Rather than remembering to escape at each
use, the pages are written with :func:`html`, a ``str.format`` whose arguments are escaped
unless they are :class:`Html` — markup this module (or a caller, through :func:`html`)
made. So a payload holding ``<script>`` reaches the browser as text, and forgetting to
escape is not possible; marking something as markup is the explicit act.
"""

from __future__ import annotations

import html as _stdlib_html
from collections.abc import Iterable
from typing import Any


class Html(str):
    """A string that is markup already: :func:`html` inserts it as it is."""

    __slots__ = ()


def escape(value: object) -> Html:
    """``value`` as text inside HTML (element content or a quoted attribute value)."""
    if isinstance(value, Html):
        return value
    return Html(_stdlib_html.escape("" if value is None else str(value), quote=True))


def html(template: str, /, *args: Any, **values: Any) -> Html:
    """``template.format(...)`` with every argument escaped unless it is :class:`Html`.
    The template itself is markup: it must be a literal of the program, never data."""
    return Html(
        template.format(*(escape(a) for a in args), **{k: escape(v) for k, v in values.items()})
    )


def join(parts: Iterable[Html | str], separator: str = "") -> Html:
    """Parts joined; plain strings among them are escaped."""
    return Html(separator.join(escape(part) for part in parts))
