"""The ``chronoshard`` command: operator tasks, one small function per subcommand.

Each subcommand is a pair registered in :data:`COMMANDS`: a function that adds its
arguments to an ``argparse`` parser, and a function that runs it and returns the exit
code. Adding a subcommand means writing those two functions and one line in the table;
``main`` never changes. Subcommands with their own subcommands (``partitions ensure``)
register them the same way, one level down.

Expected failures (cannot reach PostgreSQL, a refused migration) are printed as one
readable line on stderr with exit code 1; no traceback. Environment variables are read
here, in the entry point, and nowhere else.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

DSN_ENV = "CHRONOSHARD_DSN"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class Command:
    """One subcommand: its help line, how it declares arguments, and what it runs.

    A group of subcommands (``partitions``) has no ``run``: its ``configure`` registers
    the children, and the chosen child's ``run`` is what ``main`` calls.
    """

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO], int] | None = None


def _add_dsn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV),
        help=f"PostgreSQL connection string (default: ${DSN_ENV})",
    )


def _require_dsn(args: argparse.Namespace) -> str:
    dsn: str | None = args.dsn
    if not dsn:
        raise _UsageError(f"no database given: pass --dsn or set {DSN_ENV}")
    return dsn


class _UsageError(Exception):
    """A command was called without something it needs; exit code 2."""


# --- migrate ---------------------------------------------------------------------------


def _configure_migrate(parser: argparse.ArgumentParser) -> None:
    _add_dsn(parser)


def _run_migrate(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.migrate import apply_migrations

    applied = apply_migrations(_require_dsn(args))
    if applied:
        for name in applied:
            print(f"applied {name}", file=out)
    else:
        print("schema is up to date", file=out)
    return EXIT_OK


# --- partitions ------------------------------------------------------------------------


def _configure_partitions_ensure(parser: argparse.ArgumentParser) -> None:
    from chronoshard.scheduler.migrate import DEFAULT_DAYS_AHEAD

    _add_dsn(parser)
    parser.add_argument(
        "--days-ahead",
        type=_non_negative_int,
        default=DEFAULT_DAYS_AHEAD,
        help="create day partitions from today (UTC) through this many days ahead "
        f"(default {DEFAULT_DAYS_AHEAD})",
    )


def _run_partitions_ensure(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.migrate import ensure_partitions

    created = ensure_partitions(_require_dsn(args), days_ahead=args.days_ahead)
    print(f"created {', '.join(created)}" if created else "all partitions exist", file=out)
    return EXIT_OK


def _configure_partitions_detach(parser: argparse.ArgumentParser) -> None:
    from chronoshard.scheduler.migrate import DEFAULT_RETENTION_DAYS

    _add_dsn(parser)
    parser.add_argument(
        "--retention-days",
        type=_non_negative_int,
        default=DEFAULT_RETENTION_DAYS,
        help="drop day partitions that ended more than this many days ago, unless they "
        f"still hold an unfinished or dead-lettered task (default {DEFAULT_RETENTION_DAYS})",
    )


def _run_partitions_detach(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.migrate import detach_old_partitions

    dropped = detach_old_partitions(_require_dsn(args), retention_days=args.retention_days)
    print(f"dropped {', '.join(dropped)}" if dropped else "nothing to drop", file=out)
    return EXIT_OK


PARTITION_COMMANDS: dict[str, Command] = {
    "ensure": Command(
        "create the day partitions of tasks ahead of time",
        _configure_partitions_ensure,
        _run_partitions_ensure,
    ),
    "detach": Command(
        "drop day partitions older than the retention",
        _configure_partitions_detach,
        _run_partitions_detach,
    ),
}


def _configure_partitions(parser: argparse.ArgumentParser) -> None:
    _add_subcommands(parser, PARTITION_COMMANDS, dest="partitions_command")


# --- dev ---------------------------------------------------------------------------------


def _configure_dev(parser: argparse.ArgumentParser) -> None:
    from chronoshard.dev import DEFAULT_DATA_DIR, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT

    parser.add_argument(
        "--nodes", type=_positive_int, default=1, help="scheduler nodes (default 1)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"where etcd, PostgreSQL and logs keep their state (default {DEFAULT_DATA_DIR})",
    )
    parser.add_argument("--fresh", action="store_true", help="wipe the data dir first")
    parser.add_argument(
        "--port",
        type=_non_negative_int,
        default=DEFAULT_GRPC_PORT,
        help=f"gRPC port of the first node, the next ones count up; 0 picks free ports "
        f"(default {DEFAULT_GRPC_PORT})",
    )
    parser.add_argument(
        "--metrics-port",
        type=_non_negative_int,
        default=DEFAULT_METRICS_PORT,
        help=f"metrics port of the first node (default {DEFAULT_METRICS_PORT}); 0 picks free ports",
    )
    parser.add_argument(
        "--no-worker", action="store_true", help="do not start the demo worker process"
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV),
        help=f"use this PostgreSQL instead of the embedded one (default: ${DSN_ENV})",
    )


def _run_dev(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.dev import DevOptions, run

    options = DevOptions(
        nodes=args.nodes,
        data_dir=args.data_dir,
        fresh=args.fresh,
        grpc_port=args.port,
        metrics_port=args.metrics_port,
        worker=not args.no_worker,
        dsn=args.dsn or None,
    )
    return run(options, out)


# --- tenants ----------------------------------------------------------------------------


def _configure_tenants_create(parser: argparse.ArgumentParser) -> None:
    from chronoshard.scheduler.tenant_admin import DEFAULT_MAX_CONCURRENT, DEFAULT_RATE_LIMIT_RPS

    _add_dsn(parser)
    parser.add_argument("name", help="unique tenant name")
    parser.add_argument("--rate-limit-rps", type=float, default=DEFAULT_RATE_LIMIT_RPS)
    parser.add_argument("--max-concurrent", type=_positive_int, default=DEFAULT_MAX_CONCURRENT)
    parser.add_argument(
        "--rotate", action="store_true", help="if the tenant exists, give it a new API key"
    )


def _run_tenants_create(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.tenant_admin import create_tenant

    made = create_tenant(
        _require_dsn(args),
        args.name,
        rate_limit_rps=args.rate_limit_rps,
        max_concurrent_workers=args.max_concurrent,
        if_exists="rotate" if args.rotate else "fail",
    )
    print(f"tenant {made.tenant.name} ({made.tenant.id})", file=out)
    print(f"API key: {made.api_key}", file=out)
    print("(shown once: only its hash is stored)", file=out)
    return EXIT_OK


def _configure_tenants_ls(parser: argparse.ArgumentParser) -> None:
    _add_dsn(parser)


def _run_tenants_ls(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.tenant_admin import list_tenants

    for tenant in list_tenants(_require_dsn(args)):
        print(
            f"{tenant.id}  {tenant.name:<24} rps={tenant.rate_limit_rps:g} "
            f"concurrent={tenant.max_concurrent_workers} region={tenant.home_region}",
            file=out,
        )
    return EXIT_OK


TENANT_COMMANDS: dict[str, Command] = {
    "create": Command(
        "create a tenant and print its API key", _configure_tenants_create, _run_tenants_create
    ),
    "ls": Command("list tenants", _configure_tenants_ls, _run_tenants_ls),
}


def _configure_tenants(parser: argparse.ArgumentParser) -> None:
    _add_subcommands(parser, TENANT_COMMANDS, dest="tenants_command")


# --- worker -----------------------------------------------------------------------------


def _configure_worker(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the worker to run, as pkg.module:attr")
    parser.add_argument("--target", action="append", help="scheduler address (repeatable)")


def _run_worker(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.worker._runner import main as worker_main

    argv = [args.spec]
    for target in args.target or []:
        argv += ["--target", target]
    return worker_main(argv)


# --- expect (the watchdog's expectations) -------------------------------------------------

TARGET_ENV = "CHRONOSHARD_TARGET"
API_KEY_ENV = "CHRONOSHARD_API_KEY"
DEFAULT_TARGET = "127.0.0.1:7070"
EXPECT_CALL_TIMEOUT_S = 10.0
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def _duration_s(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1.5h``, ``1d``: seconds."""
    value = text.strip().lower()
    scale = _DURATION_UNITS.get(value[-1:])
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (e.g. 90s, 5m, 1h, 1d)"
        ) from None
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}")
    return seconds


def _format_s(seconds: float) -> str:
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _add_api(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=os.environ.get(TARGET_ENV, DEFAULT_TARGET),
        help=f"a scheduler node, host:port (default: ${TARGET_ENV} or {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"the tenant's API key (default: ${API_KEY_ENV})",
    )
    parser.add_argument("--tls", action="store_true", help="use TLS with the system's roots")


def _watchdog_call(args: argparse.Namespace, method: str, request: object) -> object:
    """One WatchdogService call; a refused call raises _CallFailed with a readable line."""
    import grpc

    from chronoshard.client import channel_options
    from chronoshard.errors import from_rpc_error
    from chronoshard.v1 import watchdog_service_pb2_grpc

    if not args.api_key:
        raise _UsageError(f"no API key given: pass --api-key or set {API_KEY_ENV}")
    options = channel_options()
    if args.tls:
        channel = grpc.secure_channel(args.target, grpc.ssl_channel_credentials(), options)
    else:
        channel = grpc.insecure_channel(args.target, options)
    with channel:
        stub = watchdog_service_pb2_grpc.WatchdogServiceStub(channel)
        try:
            return getattr(stub, method)(
                request,
                timeout=EXPECT_CALL_TIMEOUT_S,
                metadata=(("authorization", f"Bearer {args.api_key}"),),
            )
        except grpc.RpcError as exc:
            # e.g. "INVALID_ARGUMENT/INVALID_ARGUMENT (field interval): interval: must be ..."
            raise _CallFailed(str(from_rpc_error(exc))) from None


class _CallFailed(Exception):
    """The server refused a call; the message says why. Exit code 1."""


def _expectation_line(exp: object) -> str:
    from chronoshard.v1 import watchdog_service_pb2

    assert isinstance(exp, watchdog_service_pb2.Expectation)
    severity = watchdog_service_pb2.Severity.Name(exp.severity).removeprefix("SEVERITY_")
    interval = exp.interval.seconds + exp.interval.nanos / 1e9
    tolerance = exp.tolerance.seconds + exp.tolerance.nanos / 1e9
    return (
        f"{exp.job_id:<32} every {_format_s(interval):<8} +{_format_s(tolerance):<8} "
        f"{severity.lower():<8} {'enabled' if exp.enabled else 'disabled':<8} "
        f"{'config' if exp.from_config else 'api':<6} {exp.description}"
    ).rstrip()


def _configure_expect_add(parser: argparse.ArgumentParser) -> None:
    _add_api(parser)
    parser.add_argument("job_id", help="the job_id the job's tasks are submitted with")
    parser.add_argument(
        "--every", required=True, type=_duration_s, help="expected interval (90s, 5m, 1h, 1d)"
    )
    parser.add_argument(
        "--tolerance", type=_duration_s, default=0.0, help="slack after the interval (default 0)"
    )
    parser.add_argument(
        "--severity", choices=("critical", "error", "warning", "info"), default="critical"
    )
    parser.add_argument("--description", default="", help="shown in the alert")
    parser.add_argument("--disabled", action="store_true", help="register it without alerting")


def _run_expect_add(args: argparse.Namespace, out: TextIO) -> int:
    from google.protobuf import duration_pb2

    from chronoshard.v1 import watchdog_service_pb2

    def duration(seconds: float) -> duration_pb2.Duration:
        # Sign-consistent seconds/nanos for negative values too: the server must see the
        # value the operator typed to refuse it by name.
        value = duration_pb2.Duration()
        whole = int(seconds)
        value.seconds, value.nanos = whole, round((seconds - whole) * 1e9)
        return value

    request = watchdog_service_pb2.CreateExpectationRequest(
        job_id=args.job_id,
        interval=duration(args.every),
        tolerance=duration(args.tolerance),
        severity=f"SEVERITY_{args.severity.upper()}",
        enabled=not args.disabled,
        description=args.description,
    )
    try:
        response = _watchdog_call(args, "CreateExpectation", request)
    except _CallFailed as exc:
        print(f"chronoshard expect add: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    assert isinstance(response, watchdog_service_pb2.CreateExpectationResponse)
    print(("created " if response.created else "updated ") + args.job_id, file=out)
    print(_expectation_line(response.expectation), file=out)
    return EXIT_OK


def _configure_expect_ls(parser: argparse.ArgumentParser) -> None:
    _add_api(parser)


def _run_expect_ls(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.v1 import watchdog_service_pb2

    token = ""
    while True:
        request = watchdog_service_pb2.ListExpectationsRequest(page_size=1000, page_token=token)
        try:
            page = _watchdog_call(args, "ListExpectations", request)
        except _CallFailed as exc:
            print(f"chronoshard expect ls: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        assert isinstance(page, watchdog_service_pb2.ListExpectationsResponse)
        for exp in page.expectations:
            print(_expectation_line(exp), file=out)
        if not page.next_page_token:
            return EXIT_OK
        token = page.next_page_token


def _configure_expect_rm(parser: argparse.ArgumentParser) -> None:
    _add_api(parser)
    parser.add_argument("job_id")


def _run_expect_rm(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.v1 import watchdog_service_pb2

    request = watchdog_service_pb2.DeleteExpectationRequest(job_id=args.job_id)
    try:
        _watchdog_call(args, "DeleteExpectation", request)
    except _CallFailed as exc:
        print(f"chronoshard expect rm: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"removed {args.job_id}", file=out)
    return EXIT_OK


EXPECT_COMMANDS: dict[str, Command] = {
    "add": Command(
        "watch a job: alert when it has not completed for longer than --every + --tolerance",
        _configure_expect_add,
        _run_expect_add,
    ),
    "ls": Command("list the tenant's expectations", _configure_expect_ls, _run_expect_ls),
    "rm": Command("stop watching a job", _configure_expect_rm, _run_expect_rm),
}


def _configure_expect(parser: argparse.ArgumentParser) -> None:
    _add_subcommands(parser, EXPECT_COMMANDS, dest="expect_command")


# --- the table -------------------------------------------------------------------------

COMMANDS: dict[str, Command] = {
    "migrate": Command(
        "apply pending schema migrations (idempotent)", _configure_migrate, _run_migrate
    ),
    "partitions": Command(
        "maintain the day partitions of the tasks table",
        _configure_partitions,
    ),
    "dev": Command(
        "run a local development cluster (etcd, PostgreSQL, schedulers, a demo worker)",
        _configure_dev,
        _run_dev,
    ),
    "tenants": Command("create and list tenants (API keys)", _configure_tenants),
    "worker": Command(
        "run a worker defined in your code (pkg.module:attr)", _configure_worker, _run_worker
    ),
    "expect": Command(
        "register, list and remove the watchdog's expectations (dead man's switch)",
        _configure_expect,
    ),
}


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _add_subcommands(
    parser: argparse.ArgumentParser, commands: dict[str, Command], *, dest: str
) -> None:
    sub = parser.add_subparsers(dest=dest, metavar="COMMAND", required=True)
    for name, command in commands.items():
        child = sub.add_parser(name, help=command.help, description=command.help)
        command.configure(child)
        if command.run is not None:
            child.set_defaults(run_command=command.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chronoshard", description="Chronoshard operator commands."
    )
    _add_subcommands(parser, COMMANDS, dest="command")
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit code."""
    from chronoshard.scheduler.errors import SchedulerError

    stdout = sys.stdout if out is None else out
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace, TextIO], int] = args.run_command
    try:
        return run(args, stdout)
    except _UsageError as exc:
        print(f"chronoshard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SchedulerError as exc:
        print(f"chronoshard {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
