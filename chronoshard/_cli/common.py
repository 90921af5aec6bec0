"""What every ``chronoshard`` subcommand shares: the command record, exit codes, the
environment variables, argument types, and the connection to a scheduler node.

Kept apart from ``cli.py`` (the table and ``main``) so that the modules defining the
subcommands (``ops``, ``tasks``, ``admin``) can import it without importing
each other. Nothing here reads the environment at import time: defaults are read when a
parser is built, which is in the entry point.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from chronoshard import exact_json

if TYPE_CHECKING:
    import grpc

    from chronoshard.client import TLSConfig
    from chronoshard.sync_client import SyncClient

DSN_ENV = "CHRONOSHARD_DSN"
TARGET_ENV = "CHRONOSHARD_TARGET"
API_KEY_ENV = "CHRONOSHARD_API_KEY"
TLS_CA_ENV = "CHRONOSHARD_TLS_CA"
TLS_CERT_ENV = "CHRONOSHARD_TLS_CERT"
TLS_KEY_ENV = "CHRONOSHARD_TLS_KEY"
DEFAULT_TARGET = "127.0.0.1:7070"
CALL_TIMEOUT_S = 10.0

EXIT_OK = 0
"""The command did what it was asked."""
EXIT_FAILURE = 1
"""The server (or the database) refused or failed; the reason is printed on stderr."""
EXIT_USAGE = 2
"""The command line is wrong or incomplete (argparse uses 2 as well)."""
EXIT_NOT_FOUND = 3
"""The named task (or expectation) does not exist for this API key."""

EXIT_CODES_HELP = """\
exit codes:
  0  ok
  1  the server refused or failed the call; the reason is on stderr, e.g.
     "FAILED_PRECONDITION/TASK_ALREADY_FINISHED: task ... is already COMPLETED"
  2  usage error (bad or missing arguments, no API key)
  3  not found (no such task for this API key; another tenant's task is "not found" too)"""


@dataclass(frozen=True)
class Command:
    """One subcommand: its help line, how it declares arguments, and what it runs.

    A group of subcommands (``tasks``) has no ``run``: its ``configure`` registers the
    children, and the chosen child's ``run`` is what ``main`` calls. ``epilog`` is shown
    at the end of ``--help``: examples that teach.
    """

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO], int] | None = None
    epilog: str = ""


class UsageError(Exception):
    """A command was called without something it needs; exit code 2."""


# --- argument types ----------------------------------------------------------------------

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_DURATION = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)


def duration_s(text: str) -> float:
    """``90``, ``90s``, ``250ms``, ``5m``, ``1.5h``, ``1d``: seconds (a sign is kept)."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 5m, 1h, 1d)")
    seconds = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}")
    return seconds


def non_negative_duration_s(text: str) -> float:
    seconds = duration_s(text)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return seconds


def positive_duration_s(text: str) -> float:
    seconds = duration_s(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return seconds


def format_s(seconds: float) -> str:
    """The shortest of ``1d``, ``2h``, ``5m``, ``90s`` that is exact (and that
    :func:`duration_s` reads back: never an exponent)."""
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{_plain_number(seconds / size)}{unit}"
    return f"{_plain_number(seconds)}s"


def _plain_number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.9f}".rstrip("0")


def aware_time(text: str) -> datetime:
    """An ISO 8601 instant with a UTC offset (``2030-01-02T03:04:05Z``, ``...+02:00``).

    A time without an offset is refused: whether it meant local time or UTC is exactly
    the ambiguity that makes a task run an hour off.
    """
    value = text.strip()
    try:
        parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1:] in "zZ" else value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2030-01-02T03:04:05Z)"
        ) from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no UTC offset: add Z (UTC) or +HH:MM, or use --in"
        )
    return parsed.astimezone(UTC)


def time_bound(text: str, *, now: datetime | None = None) -> datetime:
    """A point in time for a filter: an ISO instant (see :func:`aware_time`), or a
    duration meaning that long ago (``30m``, ``2h``, ``1d``), or ``+duration`` for
    that far ahead."""
    value = text.strip()
    if _DURATION.match(value):
        seconds = duration_s(value)
        ahead = value.startswith("+")
        now = now or datetime.now(UTC)
        return now + timedelta(seconds=abs(seconds)) if ahead else now - timedelta(seconds=seconds)
    return aware_time(value)


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# --- common arguments ----------------------------------------------------------------------


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="table for people (default), json for scripts",
    )


def add_payload(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--payload JSON`` or ``--payload-file PATH``: a task's payload."""
    body = parser.add_mutually_exclusive_group()
    body.add_argument("--payload", metavar="JSON", help="the payload, a JSON object")
    body.add_argument(
        "--payload-file", metavar="PATH", help="read the JSON object from a file ('-': stdin)"
    )


def read_payload(args: argparse.Namespace) -> dict[str, Any] | None:
    """The JSON object of ``--payload`` or ``--payload-file`` (see :func:`add_payload`),
    numbers exact; None when neither was given."""
    if args.payload is not None:
        text, source = args.payload, "--payload"
    elif args.payload_file is not None:
        source = f"--payload-file {args.payload_file}"
        try:
            text = (
                sys.stdin.read()
                if args.payload_file == "-"
                else Path(args.payload_file).read_text(encoding="utf-8")
            )
        except OSError as exc:
            raise UsageError(f"{source}: {exc.strerror or exc}") from None
    else:
        return None
    try:
        value = exact_json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{source} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source} must be a JSON object ({{...}}), got {type(value).__name__}")
    return value


def add_dsn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV),
        help=f"PostgreSQL connection string (default: ${DSN_ENV})",
    )


def require_dsn(args: argparse.Namespace) -> str:
    dsn: str | None = args.dsn
    if not dsn:
        raise UsageError(f"no database given: pass --dsn or set {DSN_ENV}")
    return dsn


def add_target(group: argparse._ActionsContainer) -> None:
    """``--target``: the scheduler node(s) to call, from ``$CHRONOSHARD_TARGET`` by default."""
    group.add_argument(
        "--target",
        default=os.environ.get(TARGET_ENV, DEFAULT_TARGET),
        help=f"scheduler node(s), host:port[,host:port...] (default: ${TARGET_ENV}, "
        f"else {DEFAULT_TARGET})",
    )


def add_api(parser: argparse.ArgumentParser) -> None:
    """``--target``, ``--api-key``, ``--tls``, ``--timeout-s`` and ``--output``."""
    group = parser.add_argument_group("connection")
    add_target(group)
    group.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"the tenant's API key (default: ${API_KEY_ENV})",
    )
    add_tls(group)
    group.add_argument(
        "--call-timeout",
        type=positive_duration_s,
        default=CALL_TIMEOUT_S,
        metavar="DURATION",
        help=f"deadline of each call (default {format_s(CALL_TIMEOUT_S)})",
    )
    add_output(parser)


def add_tls(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--tls``, ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (docs/operations.md#tls);
    any of the files implies TLS. :func:`tls_config` reads them."""
    parser.add_argument(
        "--tls", action="store_true", help="use TLS (with the system's roots unless --tls-ca)"
    )
    parser.add_argument(
        "--tls-ca",
        metavar="PATH",
        default=os.environ.get(TLS_CA_ENV) or None,
        help=f"PEM bundle of the CA(s) the node's certificate must chain to; implies --tls "
        f"(default: ${TLS_CA_ENV})",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="PATH",
        default=os.environ.get(TLS_CERT_ENV) or None,
        help=f"client certificate (PEM) for nodes that require one, with --tls-key "
        f"(default: ${TLS_CERT_ENV})",
    )
    parser.add_argument(
        "--tls-key",
        metavar="PATH",
        default=os.environ.get(TLS_KEY_ENV) or None,
        help=f"the client certificate's private key (PEM) (default: ${TLS_KEY_ENV})",
    )


def tls_config(args: argparse.Namespace) -> TLSConfig | None:
    """The TLS of :func:`add_tls`'s flags, files read; None for plaintext."""
    from chronoshard.client import TLSConfig

    ca, cert, key = args.tls_ca, args.tls_cert, args.tls_key
    if (cert is None) != (key is None):
        raise UsageError(
            f"--tls-cert and --tls-key go together (or ${TLS_CERT_ENV} and ${TLS_KEY_ENV})"
        )
    if not (args.tls or ca or cert):
        return None
    files: dict[str, bytes | None] = {}
    for flag, path in (("--tls-ca", ca), ("--tls-cert", cert), ("--tls-key", key)):
        try:
            files[flag] = None if path is None else Path(path).read_bytes()
        except OSError as exc:
            raise UsageError(f"{flag} {path}: {exc.strerror or exc}") from None
    return TLSConfig(files["--tls-ca"], files["--tls-cert"], files["--tls-key"])


def targets(args: argparse.Namespace) -> list[str]:
    found = [t.strip() for t in str(args.target or "").split(",") if t.strip()]
    if not found:
        raise UsageError(f"no scheduler address: pass --target or set {TARGET_ENV}")
    return found


def require_api_key(args: argparse.Namespace) -> str:
    key: str | None = args.api_key
    if not key:
        raise UsageError(
            f"no API key given: pass --api-key or set {API_KEY_ENV} "
            "(`chronoshard dev` prints one; `chronoshard tenants create NAME` makes one)"
        )
    return key


@contextmanager
def client(args: argparse.Namespace) -> Iterator[SyncClient]:
    """A blocking client for the command's ``--target`` and ``--api-key``."""
    from chronoshard.sync_client import SyncClient

    with SyncClient(
        targets(args),
        api_key=require_api_key(args),
        tls=tls_config(args) or False,
        timeout_s=args.call_timeout,
    ) as opened:
        yield opened


def grpc_channel(address: str, *, tls: TLSConfig | None) -> grpc.Channel:
    """A blocking channel to one node, with the client's options (docs/architecture.md#d12)
    and, with ``tls`` (:func:`tls_config`), TLS: how every command that makes its own calls
    (not through :func:`client`) connects."""
    import grpc

    from chronoshard.client import channel_options

    options = channel_options(server_name=None if tls is None else tls.server_name)
    if tls is not None:
        return grpc.secure_channel(address, tls.credentials(), options)
    return grpc.insecure_channel(address, options)


def call_metadata(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {require_api_key(args)}"),)


_Item = TypeVar("_Item")


def first_of(items: Iterable[_Item], limit: int) -> tuple[list[_Item], bool]:
    """The first ``limit`` of ``items`` and whether more exist. Callers page with
    ``page_size = limit + 1``: the one row more tells, in the same call."""
    found: list[_Item] = []
    for item in items:
        if len(found) == limit:
            return found, True
        found.append(item)
    return found, False
