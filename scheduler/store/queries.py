"""Named SQL: the statements the store issues, kept in ``.sql`` files beside the code.

A file in ``chronoshard.scheduler/sql/`` is a sequence of blocks, each opened by a line
``-- name: some_name``; the block's text up to the next such line is that query
(comments and blank lines included, a trailing ``;`` dropped). Text before the first
block is the file's header and is ignored. Parameters are psycopg named placeholders
(``%(name)s``), always bound, never interpolated. The files are read once, through
``importlib.resources``, so an installed wheel works the same as the source tree.

Keeping SQL out of Python lets it be read, reviewed and ``EXPLAIN``-ed as SQL, and
keeps the SQL behind one small module (docs/architecture.md#d1) so the store could be replaced.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import LiteralString

PACKAGE = "chronoshard.scheduler.store"
SQL_DIR = "sql"

_NAME_LINE = re.compile(r"^--\s*name:\s*(?P<name>\S*)\s*$")
_VALID_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class QueryFileError(ValueError):
    """Raised when a query file is malformed: a bad or duplicate name, an empty block."""


def parse(text: str, *, source: str = "<string>") -> Mapping[str, LiteralString]:
    """The named blocks of ``text``, in file order.

    Raises:
        QueryFileError: a name is not lower_snake_case, appears twice, or has no SQL.
    """
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        match = _NAME_LINE.match(line)
        if match is None:
            if current is not None:
                current.append(line)
            continue
        name = match["name"]
        if not _VALID_NAME.match(name):
            raise QueryFileError(f"{source}:{lineno}: invalid query name {name!r}")
        if name in blocks:
            raise QueryFileError(f"{source}:{lineno}: query {name!r} defined twice")
        current = blocks[name] = []
    queries: dict[str, LiteralString] = {}
    for name, lines in blocks.items():
        body = "\n".join(lines).strip().removesuffix(";").rstrip()
        if not _has_sql(body):
            raise QueryFileError(f"{source}: query {name!r} is empty")
        # Typed LiteralString, as psycopg asks of query text: it comes from a file
        # shipped inside this package, never from a request, so it is as trusted as a
        # literal in the source. (mypy treats LiteralString as str, hence no cast.)
        queries[name] = body
    return MappingProxyType(queries)


def _has_sql(body: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in body.splitlines())


@functools.cache
def load(filename: str) -> Mapping[str, LiteralString]:
    """The queries of ``sql/<filename>`` in this package, read and parsed once."""
    text = resources.files(PACKAGE).joinpath(SQL_DIR, filename).read_text(encoding="utf-8")
    return parse(text, source=f"{SQL_DIR}/{filename}")
