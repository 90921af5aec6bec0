"""The ``chronoshard`` command: one table of subcommands, and ``main``.

Each subcommand is a :class:`~chronoshard._cli.common.Command` registered in
:data:`COMMANDS`: a function that adds its arguments to an ``argparse`` parser, a function
that runs it and returns the exit code, and an epilog of examples for ``--help``. Adding a
subcommand means writing those and one line in the table; ``main`` never changes. Groups
(``tasks``, ``schedules``, ``workflows``, ``workers``, ``tenants``, ``partitions``,
``expect``) register their children the same way, one level down. The commands live in
:mod:`chronoshard._cli` by what they talk to: ``tasks`` (TaskService), ``schedules``
(ScheduleService), ``workflows`` (WorkflowService), ``admin``
(AdminService's topology and drains, metrics, WatchdogService), ``workers``
(AdminService's worker sessions), ``health`` (gRPC health and /healthz probes),
``ops`` (the database and local processes); ``output`` formats tables and JSON.

Exit codes are a contract for scripts (``EXIT_CODES_HELP``): 0 ok, 1 the server refused
or failed (the reason printed on stderr as ``CODE/REASON (field f): message``), 2 usage,
3 not found. Expected failures are one readable line on stderr, never a traceback.
Environment variables are read here, when the parser is built, and nowhere else.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from chronoshard._cli import admin as _cli_admin
from chronoshard._cli import console as _cli_console
from chronoshard._cli import health as _cli_health
from chronoshard._cli import ops as _cli_ops
from chronoshard._cli import schedules as _cli_schedules
from chronoshard._cli import tasks as _cli_tasks
from chronoshard._cli import workers as _cli_workers
from chronoshard._cli import workflows as _cli_workflows
from chronoshard._cli.common import (
    API_KEY_ENV,
    DEFAULT_TARGET,
    DSN_ENV,
    EXIT_CODES_HELP,
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    TARGET_ENV,
    Command,
    UsageError,
    duration_s,
)

__all__ = [
    "API_KEY_ENV",
    "COMMANDS",
    "DEFAULT_TARGET",
    "DSN_ENV",
    "EXIT_FAILURE",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "TARGET_ENV",
    "build_parser",
    "main",
]

# Kept under its old name: the watchdog's tests and scripts use it.
_duration_s = duration_s


def _configure_group(
    commands: dict[str, Command], dest: str
) -> Callable[[argparse.ArgumentParser], None]:
    def configure(parser: argparse.ArgumentParser) -> None:
        _add_subcommands(parser, commands, dest=dest)

    return configure


MAIN_EPILOG = f"""\
getting started:
  chronoshard dev --demo                        # a local cluster with demo tasks
  . .chronoshard/env                            # in another shell: target, API key, PATH
  chronoshard submit demo.echo --payload '{{"hello": "world"}}' --strict --wait
  chronoshard tasks ls --since 10m
  chronoshard schedules create heartbeat demo.echo --every 1m --strict
  chronoshard workflows submit etl.yaml           # a DAG of tasks from a file
  chronoshard status

Commands that call a scheduler take --target (${TARGET_ENV}, else {DEFAULT_TARGET}) and
--api-key (${API_KEY_ENV}); commands on the database take --dsn (${DSN_ENV}). Every
command that prints a result takes -o json. `chronoshard COMMAND --help` has examples.

{EXIT_CODES_HELP}"""

COMMANDS: dict[str, Command] = {
    "dev": Command(
        "run a local development cluster (etcd, PostgreSQL, schedulers, watchdog, a demo worker)",
        _cli_ops.configure_dev,
        _cli_ops.run_dev,
        _cli_ops.DEV_EPILOG,
    ),
    "submit": Command(
        "submit a task",
        _cli_tasks.configure_submit,
        _cli_tasks.run_submit,
        _cli_tasks.SUBMIT_EPILOG,
    ),
    "tasks": Command(
        "inspect, list, cancel and retry tasks",
        _configure_group(_cli_tasks.TASK_COMMANDS, "tasks_command"),
    ),
    "schedules": Command(
        "create, inspect, change, pause, trigger and backfill recurring schedules",
        _configure_group(_cli_schedules.SCHEDULE_COMMANDS, "schedules_command"),
    ),
    "workflows": Command(
        "submit, inspect, list, cancel and retry workflows (DAGs of tasks)",
        _configure_group(_cli_workflows.WORKFLOW_COMMANDS, "workflows_command"),
    ),
    "status": Command(
        "nodes, shard owners and epochs, wheel sizes, worker sessions, dispatch lateness "
        "(an operator key; another key sees the nodes)",
        _cli_admin.configure_status,
        _cli_admin.run_status,
        _cli_admin.STATUS_EPILOG,
    ),
    "workers": Command(
        "list the worker sessions: which worker is connected to which node, serving what",
        _configure_group(_cli_workers.WORKER_COMMANDS, "workers_command"),
    ),
    "drain": Command(
        "drain a scheduler node (operator key)",
        _cli_admin.configure_drain,
        _cli_admin.run_drain,
        _cli_admin.DRAIN_EPILOG,
    ),
    "undrain": Command(
        "put a drained scheduler node back to work (operator key)",
        _cli_admin.configure_undrain,
        _cli_admin.run_undrain,
        _cli_admin.UNDRAIN_EPILOG,
    ),
    "console": Command(
        "serve the web console for a cluster (log in with an API key)",
        _cli_console.configure_console,
        _cli_console.run_console,
        _cli_console.CONSOLE_EPILOG,
    ),
    "health": Command(
        "check a scheduler node's gRPC health (or a watchdog's /healthz): exit 0 if SERVING",
        _cli_health.configure_health,
        _cli_health.run_health,
        _cli_health.HEALTH_EPILOG,
    ),
    "worker": Command(
        "run a worker defined in your code (pkg.module:attr)",
        _cli_ops.configure_worker,
        _cli_ops.run_worker,
        _cli_ops.WORKER_EPILOG,
    ),
    "tenants": Command(
        "create, update and list tenants: their API keys and quotas",
        _configure_group(_cli_ops.TENANT_COMMANDS, "tenants_command"),
    ),
    "expect": Command(
        "register, list and remove the watchdog's expectations (dead man's switch)",
        _configure_group(_cli_admin.EXPECT_COMMANDS, "expect_command"),
    ),
    "migrate": Command(
        "apply pending schema migrations (idempotent)",
        _cli_ops.configure_migrate,
        _cli_ops.run_migrate,
    ),
    "partitions": Command(
        "maintain the day partitions of the tasks table",
        _configure_group(_cli_ops.PARTITION_COMMANDS, "partitions_command"),
    ),
}


def _add_subcommands(
    parser: argparse.ArgumentParser, commands: dict[str, Command], *, dest: str
) -> None:
    sub = parser.add_subparsers(dest=dest, metavar="COMMAND", required=True)
    for name, command in commands.items():
        child = sub.add_parser(
            name,
            help=command.help,
            description=command.help,
            epilog=(command.epilog + "\n\n" + EXIT_CODES_HELP) if command.run else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.configure(child)
        if command.run is not None:
            child.set_defaults(run_command=command.run, command_path=child.prog)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chronoshard",
        description="Chronoshard: a distributed, durable task scheduler. Operator and "
        "developer commands.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_subcommands(parser, COMMANDS, dest="command")
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit code.

    A malformed command line exits through argparse (``SystemExit(2)``), as it always did.
    """
    from chronoshard.errors import ChronoshardError, NotFoundError
    from chronoshard.scheduler.errors import SchedulerError, TaskNotFound, TenantNotFound

    stdout = sys.stdout if out is None else out
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace, TextIO], int] = args.run_command
    name = str(args.command_path)
    try:
        return run(args, stdout)
    except UsageError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ChronoshardError as exc:  # a call the server (or the connection) refused
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND if isinstance(exc, NotFoundError) else EXIT_FAILURE
    except SchedulerError as exc:  # a command run against the database
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND if isinstance(exc, TaskNotFound | TenantNotFound) else EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
