"""Operator commands that act on the database or run processes: ``migrate``,
``partitions ensure|detach``, ``tenants create|update|ls``, ``dev`` and ``worker``.

``migrate``, ``partitions`` and ``tenants`` talk to PostgreSQL directly (``--dsn`` or
``CHRONOSHARD_DSN``): they are what an operator runs before any scheduler node exists, and
creating a tenant or an operator key is not something an API key should be able to do.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from chronoshard._cli import output
from chronoshard._cli.common import (
    API_KEY_ENV,
    DSN_ENV,
    EXIT_OK,
    TARGET_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    Command,
    UsageError,
    add_dsn,
    add_output,
    add_tls,
    non_negative_int,
    positive_int,
    require_dsn,
)

if TYPE_CHECKING:
    from chronoshard.scheduler.core.models import Tenant

# --- migrate ---------------------------------------------------------------------------


def configure_migrate(parser: argparse.ArgumentParser) -> None:
    add_dsn(parser)
    add_output(parser)


def run_migrate(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.store.migrate import apply_migrations

    applied = apply_migrations(require_dsn(args))
    if args.output == "json":
        print(output.dumps({"applied": applied}), file=out)
    elif applied:
        for name in applied:
            print(f"applied {name}", file=out)
    else:
        print("schema is up to date", file=out)
    return EXIT_OK


# --- partitions ------------------------------------------------------------------------


def configure_partitions_ensure(parser: argparse.ArgumentParser) -> None:
    from chronoshard.scheduler.store.partitions import DEFAULT_DAYS_AHEAD

    add_dsn(parser)
    parser.add_argument(
        "--days-ahead",
        type=non_negative_int,
        default=DEFAULT_DAYS_AHEAD,
        help="create day partitions from today (UTC) through this many days ahead "
        f"(default {DEFAULT_DAYS_AHEAD})",
    )
    add_output(parser)


def run_partitions_ensure(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.store.partitions import ensure_partitions

    created = ensure_partitions(require_dsn(args), days_ahead=args.days_ahead)
    if args.output == "json":
        print(output.dumps({"created": created}), file=out)
    else:
        print(f"created {', '.join(created)}" if created else "all partitions exist", file=out)
    return EXIT_OK


def configure_partitions_detach(parser: argparse.ArgumentParser) -> None:
    from chronoshard.scheduler.config import DEFAULT_RETENTION_DAYS

    add_dsn(parser)
    parser.add_argument(
        "--retention-days",
        type=non_negative_int,
        default=DEFAULT_RETENTION_DAYS,
        help="drop day partitions that ended more than this many days ago, unless they "
        f"still hold an unfinished or dead-lettered task (default {DEFAULT_RETENTION_DAYS})",
    )
    add_output(parser)


def run_partitions_detach(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.store.partitions import detach_old_partitions

    dropped = detach_old_partitions(require_dsn(args), retention_days=args.retention_days)
    if args.output == "json":
        print(output.dumps({"dropped": dropped}), file=out)
    else:
        print(f"dropped {', '.join(dropped)}" if dropped else "nothing to drop", file=out)
    return EXIT_OK


PARTITION_COMMANDS: dict[str, Command] = {
    "ensure": Command(
        "create the day partitions of tasks ahead of time",
        configure_partitions_ensure,
        run_partitions_ensure,
        "Run daily (cron, a Kubernetes CronJob); it is idempotent.",
    ),
    "detach": Command(
        "drop day partitions older than the retention",
        configure_partitions_detach,
        run_partitions_detach,
        "Partitions that still hold an unfinished or dead-lettered task are kept.",
    ),
}


# --- tenants ----------------------------------------------------------------------------

TENANTS_CREATE_EPILOG = f"""\
examples:
  chronoshard tenants create acme                    # prints acme's API key, once
  chronoshard tenants create acme --rotate           # a new key for acme; the old one stops
  chronoshard tenants create ops --operator          # a key that may also drain nodes
  chronoshard tenants create acme --rate-limit-rps 50 --max-concurrent 20

Only the key's SHA-256 is stored: copy it now. Clients and workers send it as
'authorization: Bearer <key>' (the CLI reads ${API_KEY_ENV}). The limits hold for the
whole cluster (docs/operations.md#tenants-and-quotas); with --rotate, the limits given
are set on the existing tenant too (others stay), as 'tenants update' would."""

TENANTS_UPDATE_EPILOG = """\
examples:
  chronoshard tenants update acme --rate-limit-rps 200       # dispatches per second
  chronoshard tenants update acme --max-concurrent 50        # tasks in flight at once
  chronoshard tenants update acme --submit-rate-limit-rps 1000
  chronoshard tenants update acme --no-submit-rate-limit     # submits unlimited again

Live: every node hears of the change at once (PostgreSQL NOTIFY; at the latest at its
next 10 s refresh), and every dispatch round checks the limits as they are in the
database, so the next round already applies them. Limits not named stay as they are."""


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _add_limits(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The quota flags of ``tenants create`` (``defaults``: say what a new tenant gets)
    and ``tenants update``."""
    from chronoshard.scheduler.store.tenants import DEFAULT_MAX_CONCURRENT, DEFAULT_RATE_LIMIT_RPS

    new_rate = f" (default {DEFAULT_RATE_LIMIT_RPS:g})" if defaults else ""
    new_concurrent = f" (default {DEFAULT_MAX_CONCURRENT})" if defaults else ""
    parser.add_argument(
        "--rate-limit-rps",
        type=positive_float,
        help=f"dispatches per second, cluster-wide{new_rate}",
    )
    parser.add_argument(
        "--max-concurrent",
        type=positive_int,
        help=f"tasks dispatched or running at once, cluster-wide{new_concurrent}",
    )
    parser.add_argument(
        "--submit-rate-limit-rps",
        type=positive_float,
        help="tasks submitted per second, cluster-wide (split over the nodes; over it a "
        "submit is refused with RESOURCE_EXHAUSTED and a retry delay)"
        + (" (default: no limit)" if defaults else ""),
    )
    parser.add_argument(
        "--home-region",
        help="the region whose clusters serve the tenant; any other refuses its calls "
        "with WRONG_REGION naming this one" + (" (default: local)" if defaults else ""),
    )


def configure_tenants_create(parser: argparse.ArgumentParser) -> None:
    add_dsn(parser)
    parser.add_argument("name", help="unique tenant name")
    _add_limits(parser, defaults=True)
    parser.add_argument(
        "--rotate",
        action="store_true",
        help="if the tenant exists, give it a new API key (and the limits given)",
    )
    parser.add_argument(
        "--operator",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the key may also call operator-only admin operations (drain a node); "
        "--no-operator takes that away",
    )
    add_output(parser)


def run_tenants_create(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.store.tenants import create_tenant

    made = create_tenant(
        require_dsn(args),
        args.name,
        rate_limit_rps=args.rate_limit_rps,
        max_concurrent_workers=args.max_concurrent,
        submit_rate_limit_rps=args.submit_rate_limit_rps,
        home_region=args.home_region,
        if_exists="rotate" if args.rotate else "fail",
        operator=args.operator,
    )
    tenant = made.tenant
    if args.output == "json":
        data = {
            "id": tenant.id,
            "name": tenant.name,
            "api_key": made.api_key,
            "operator": tenant.operator,
        }
        print(output.dumps(data), file=out)
        return EXIT_OK
    role = " (operator)" if tenant.operator else ""
    print(f"tenant {tenant.name} ({tenant.id}){role}", file=out)
    print(f"API key: {made.api_key}", file=out)
    print("(shown once: only its hash is stored)", file=out)
    return EXIT_OK


def configure_tenants_update(parser: argparse.ArgumentParser) -> None:
    add_dsn(parser)
    parser.add_argument("name", help="the tenant's name")
    _add_limits(parser, defaults=False)
    parser.add_argument(
        "--no-submit-rate-limit",
        action="store_true",
        help="take the submit rate limit away",
    )
    add_output(parser)


def run_tenants_update(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.store.tenants import update_tenant

    if args.no_submit_rate_limit and args.submit_rate_limit_rps is not None:
        raise UsageError("--submit-rate-limit-rps and --no-submit-rate-limit contradict")
    if not args.no_submit_rate_limit and all(
        value is None
        for value in (
            args.rate_limit_rps,
            args.max_concurrent,
            args.submit_rate_limit_rps,
            args.home_region,
        )
    ):
        raise UsageError(
            "nothing to change: give --rate-limit-rps, --max-concurrent, "
            "--submit-rate-limit-rps, --no-submit-rate-limit or --home-region"
        )
    tenant = update_tenant(
        require_dsn(args),
        args.name,
        rate_limit_rps=args.rate_limit_rps,
        max_concurrent_workers=args.max_concurrent,
        submit_rate_limit_rps=args.submit_rate_limit_rps,
        clear_submit_rate=args.no_submit_rate_limit,
        home_region=args.home_region,
    )
    if args.output == "json":
        print(output.dumps(_tenant_limits(tenant)), file=out)
        return EXIT_OK
    submits = "unlimited" if tenant.submit_rate_limit_rps is None else tenant.submit_rate_limit_rps
    print(
        f"tenant {tenant.name}: {tenant.rate_limit_rps:g} dispatches/s, "
        f"{tenant.max_concurrent_workers} at once, submits/s {submits}, "
        f"home region {tenant.home_region}",
        file=out,
    )
    return EXIT_OK


def _tenant_limits(tenant: Tenant) -> dict[str, object]:
    return {
        "id": tenant.id,
        "name": tenant.name,
        "rate_limit_rps": tenant.rate_limit_rps,
        "max_concurrent_workers": tenant.max_concurrent_workers,
        "submit_rate_limit_rps": tenant.submit_rate_limit_rps,
        "home_region": tenant.home_region,
    }


def configure_tenants_ls(parser: argparse.ArgumentParser) -> None:
    add_dsn(parser)
    add_output(parser)


def run_tenants_ls(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.scheduler.store.tenants import list_tenants

    tenants = list_tenants(require_dsn(args))
    if args.output == "json":
        data = [
            {
                "id": t.id,
                "name": t.name,
                "tier": t.tier,
                "rate_limit_rps": t.rate_limit_rps,
                "max_concurrent_workers": t.max_concurrent_workers,
                "submit_rate_limit_rps": t.submit_rate_limit_rps,
                "home_region": t.home_region,
                "operator": t.operator,
                "created_at": t.created_at,
            }
            for t in tenants
        ]
        print(output.dumps(data), file=out)
        return EXIT_OK
    rows: list[list[object]] = [
        [
            t.id,
            t.name,
            t.rate_limit_rps,
            t.max_concurrent_workers,
            "" if t.submit_rate_limit_rps is None else t.submit_rate_limit_rps,
            t.home_region,
            "yes" if t.operator else "",
        ]
        for t in tenants
    ]
    headers = ("ID", "NAME", "RATE/S", "CONCURRENT", "SUBMITS/S", "REGION", "OPERATOR")
    print(output.table(headers, rows) if rows else "no tenants", file=out)
    return EXIT_OK


TENANT_COMMANDS: dict[str, Command] = {
    "create": Command(
        "create a tenant and print its API key",
        configure_tenants_create,
        run_tenants_create,
        TENANTS_CREATE_EPILOG,
    ),
    "update": Command(
        "change a tenant's quotas, live",
        configure_tenants_update,
        run_tenants_update,
        TENANTS_UPDATE_EPILOG,
    ),
    "ls": Command("list tenants", configure_tenants_ls, run_tenants_ls),
}


# --- dev ---------------------------------------------------------------------------------

DEV_EPILOG = """\
examples:
  chronoshard dev --demo            # a cluster, a demo worker, and a few hundred demo tasks
  chronoshard dev --fresh           # start from an empty database and etcd
  chronoshard dev --nodes 3 --port 0 --metrics-port 0

Prints the gRPC and metrics addresses, the API key and the data directory, and writes
them to DATA_DIR/cluster.json; `. DATA_DIR/env` sets CHRONOSHARD_TARGET,
CHRONOSHARD_API_KEY and PATH for the other commands. Ctrl-C stops every process.
DEVELOPMENT ONLY: no TLS, PostgreSQL trusts every local connection."""


def configure_dev(parser: argparse.ArgumentParser) -> None:
    from chronoshard._dev.cluster import (
        DEFAULT_DATA_DIR,
        DEFAULT_GRPC_PORT,
        DEFAULT_METRICS_PORT,
        DEFAULT_NODES,
    )

    parser.add_argument(
        "--nodes",
        type=positive_int,
        default=DEFAULT_NODES,
        help=f"scheduler nodes (default {DEFAULT_NODES})",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="submit a few hundred demo tasks and show them completing, with their lateness",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"where etcd, PostgreSQL and logs keep their state (default ./{DEFAULT_DATA_DIR})",
    )
    parser.add_argument("--fresh", action="store_true", help="wipe the data dir first")
    parser.add_argument(
        "--port",
        type=non_negative_int,
        default=DEFAULT_GRPC_PORT,
        help=f"gRPC port of the first node, the next ones count up; 0 picks free ports "
        f"(default {DEFAULT_GRPC_PORT})",
    )
    parser.add_argument(
        "--metrics-port",
        type=non_negative_int,
        default=DEFAULT_METRICS_PORT,
        help=f"metrics port of the first node (default {DEFAULT_METRICS_PORT}); the watchdog "
        "takes the one after the last node's; 0 picks free ports",
    )
    parser.add_argument(
        "--no-worker", action="store_true", help="do not start the demo worker process"
    )
    parser.add_argument("--no-watchdog", action="store_true", help="do not start the watchdog")
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV),
        help=f"use this PostgreSQL database instead of the embedded server (default: ${DSN_ENV})",
    )


def run_dev(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard._dev.cluster import DevOptions, run

    options = DevOptions(
        nodes=args.nodes,
        data_dir=args.data_dir,
        fresh=args.fresh,
        grpc_port=args.port,
        metrics_port=args.metrics_port,
        worker=not args.no_worker,
        watchdog=not args.no_watchdog,
        demo=args.demo,
        dsn=args.dsn or None,
    )
    return run(options, out)


# --- worker -----------------------------------------------------------------------------

WORKER_EPILOG = f"""\
examples:
  chronoshard worker hello_worker:worker          # hello_worker.py in the current directory
  chronoshard worker myapp.tasks:build_worker --target sched-1:7070,sched-2:7070

SPEC names a chronoshard.worker.Worker (or a function returning one). The worker finds
the other nodes through the ones given; SIGTERM/Ctrl-C drains it (running tasks finish or
checkpoint). Addresses default to ${TARGET_ENV}, the key to ${API_KEY_ENV}; TLS
(--tls-ca, --tls-cert, --tls-key) to ${TLS_CA_ENV}, ${TLS_CERT_ENV}, ${TLS_KEY_ENV}."""


def configure_worker(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the worker to run, as pkg.module:attr")
    parser.add_argument(
        "--target",
        action="append",
        help=f"scheduler address(es), host:port[,host:port] (repeatable; default: ${TARGET_ENV})",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"API key the worker presents (default: ${API_KEY_ENV})",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve the worker's Prometheus /metrics there "
        "(default: $CHRONOSHARD_WORKER_METRICS_LISTEN, else none)",
    )
    add_tls(parser)
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )


def run_worker(args: argparse.Namespace, out: TextIO) -> int:
    from chronoshard.worker._runner import main as worker_main

    given = args.target or [os.environ.get(TARGET_ENV, "")]
    argv = [args.spec, "--log-level", args.log_level]
    for target in (t.strip() for group in given for t in group.split(",")):
        if target:
            argv += ["--target", target]
    if args.api_key:
        argv += ["--api-key", args.api_key]
    if args.metrics_listen:
        argv += ["--metrics-listen", args.metrics_listen]
    if args.tls:
        argv.append("--tls")
    for flag, path in (
        ("--tls-ca", args.tls_ca),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
    ):
        if path:
            argv += [flag, path]
    return worker_main(argv)
